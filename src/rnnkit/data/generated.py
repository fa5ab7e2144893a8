"""Tasks with exact answers, made from text that ships with the platform or generated.

Nothing is downloaded or copied in; every answer is computed, never annotated by hand:

* **Python token tagging** (:func:`python_token_sentences`): the sentences are logical
  lines of Python source (the standard library's own, or any text given), the tags come
  from the standard ``tokenize`` module, refined by context:

  - ``scheme="types"``: ``KEYWORD``, ``OP``, ``NUMBER``, ``STRING``, ``COMMENT``, and
    names by role — ``DEF`` (the name after ``def``/``class``), ``CALL`` (a name
    followed by ``(``), ``ATTR`` (a name after ``.``), otherwise ``NAME``. A role can
    depend on the next token, so a bidirectional reader helps; strings and numbers are
    mostly unseen words, so a character-level encoder helps.
  - ``scheme="bio"``: spans of dotted names (``os.path.join``: a name, then as many
    ``. name`` pairs as follow) typed ``CALL`` when a ``(`` follows the span and ``REF``
    otherwise; every other token is ``O`` (``B-CALL I-CALL I-CALL I-CALL I-CALL O …``),
    for span-level F1. In ``"".join(x)`` the span is ``join`` alone.

* **Which package a line comes from** (:func:`stdlib_package_examples`): each non-blank
  source line of a few standard-library packages (indentation stripped), labelled with
  its package. Lines that occur in more than one package are dropped, so every answer is
  exact (though some lines are genuinely hard to place).
* **Majority letter** (:func:`majority_letter_examples`): random strings over ``abcxyz``;
  the label is whichever of ``a``, ``b``, ``c`` occurs most often (ties never occur).
* **Previous-word tags** (:func:`previous_word_sentences`): random words; each word's tag
  is the group of the word before it, so a word's own most frequent tag is right about
  half the time and one step of context is right every time.
* **Letter order** (:func:`letter_order_examples`): random strings over ``wxyz`` with one
  ``a`` and one ``b`` inserted; the label says which comes first. Every class has the same
  letters (a bag of them cannot tell) and the two are rarely next to each other (a bag of
  bigrams seldom can); reading in order always can.

:func:`python_tagging_corpus` and :func:`stdlib_classification_corpus` write
``train/valid/test`` files in the formats ``rnnkit train`` reads; they split by source
file (every 10th file validation, every 10th + 5 test), so no file is in two parts.
"""

from __future__ import annotations

import io
import keyword
import sysconfig
import tokenize
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from rnnkit.data.labelled import LabelledExample
from rnnkit.data.tagged import TaggedSentence
from rnnkit.errors import ConfigError, DataError

__all__ = [
    "CLASSIFY_PACKAGES",
    "SCHEMES",
    "letter_order_examples",
    "majority_letter_examples",
    "previous_word_sentences",
    "python_tagging_corpus",
    "python_token_sentences",
    "stdlib_classification_corpus",
    "stdlib_files",
    "stdlib_package_examples",
    "write_labelled",
    "write_token_tags",
]

SCHEMES: tuple[str, ...] = ("types", "bio")
CLASSIFY_PACKAGES: tuple[str, ...] = ("asyncio", "email", "multiprocessing", "unittest", "xml")
_SKIP_PARTS = {"test", "tests", "idlelib", "site-packages", "dist-packages", "__pycache__"}
_LAYOUT = {
    tokenize.NEWLINE,
    tokenize.NL,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENDMARKER,
    tokenize.ENCODING,
}
# Python 3.12 splits f-strings into parts; they are all string material.
_STRING_TYPES = {
    getattr(tokenize, name)
    for name in ("STRING", "FSTRING_START", "FSTRING_MIDDLE", "FSTRING_END")
    if hasattr(tokenize, name)
}
_SPLITS = ("train", "valid", "test")


def stdlib_root() -> Path:
    """The folder of the running interpreter's standard library sources."""
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(packages: Sequence[str] | None = None) -> list[Path]:
    """Sorted ``.py`` files of the standard library (tests and vendored code left out).

    Args:
        packages: top-level packages to take (e.g. ``["json"]``); None = all files.

    >>> [p.name for p in stdlib_files(["json"])][:2]
    ['__init__.py', 'decoder.py']
    """
    root = stdlib_root()
    roots = [root] if packages is None else [root / p for p in packages]
    files: list[Path] = []
    for base in roots:
        if not base.is_dir():
            raise DataError(f"no package {base.name!r} in the standard library at {root}")
        for path in sorted(base.rglob("*.py")):
            if not _SKIP_PARTS.intersection(path.relative_to(root).parts):
                files.append(path)
    return files


def _split_of(index: int) -> str:
    return "valid" if index % 10 == 0 else "test" if index % 10 == 5 else "train"


# -- tagging -------------------------------------------------------------------------------


def _logical_lines(source: str) -> Iterable[list[tokenize.TokenInfo]]:
    line: list[tokenize.TokenInfo] = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.NEWLINE:
                if line:
                    yield line
                line = []
            elif tok.type == tokenize.NL and all(t.type == tokenize.COMMENT for t in line):
                line = []  # a comment on a line of its own: not part of the next statement
            elif tok.type not in _LAYOUT:
                line.append(tok)
    except (tokenize.TokenError, SyntaxError):
        return  # a file this Python cannot tokenize: keep the lines read so far
    if line:
        yield line


def _type_tags(toks: list[tokenize.TokenInfo]) -> list[str]:
    tags = []
    for i, tok in enumerate(toks):
        prev = toks[i - 1].string if i else ""
        nxt = toks[i + 1].string if i + 1 < len(toks) else ""
        if tok.type == tokenize.NAME:
            if keyword.iskeyword(tok.string):
                tags.append("KEYWORD")
            elif prev in ("def", "class"):
                tags.append("DEF")
            elif nxt == "(":
                tags.append("CALL")
            elif prev == ".":
                tags.append("ATTR")
            else:
                tags.append("NAME")
        elif tok.type in _STRING_TYPES:
            tags.append("STRING")
        elif tok.type == tokenize.NUMBER:
            tags.append("NUMBER")
        elif tok.type == tokenize.COMMENT:
            tags.append("COMMENT")
        else:
            tags.append("OP")
    return tags


def _is_name(tok: tokenize.TokenInfo) -> bool:
    return tok.type == tokenize.NAME and not keyword.iskeyword(tok.string)


def _bio_tags(toks: list[tokenize.TokenInfo]) -> list[str]:
    tags = ["O"] * len(toks)
    i = 0
    while i < len(toks):
        if not _is_name(toks[i]):
            i += 1
            continue
        end = i + 1  # extend over ". name" pairs
        while end + 1 < len(toks) and toks[end].string == "." and _is_name(toks[end + 1]):
            end += 2
        kind = "CALL" if end < len(toks) and toks[end].string == "(" else "REF"
        tags[i] = f"B-{kind}"
        for j in range(i + 1, end):
            tags[j] = f"I-{kind}"
        i = end
    return tags


def python_token_sentences(
    source: str, scheme: str = "types", max_tokens: int = 80
) -> list[TaggedSentence]:
    """The logical lines of Python ``source`` as tagged sentences (see the module doc).

    Lines holding a token with a newline, tab or carriage return (multi-line strings)
    are left out — a ``token<TAB>tag`` line cannot hold them — and so are lines of more
    than ``max_tokens`` tokens. ``line`` is the source line where the sentence starts.

    Args:
        source: Python source text.
        scheme: ``"types"`` or ``"bio"``.
        max_tokens: longest sentence kept.

    >>> s = python_token_sentences("x = os.path.join(a, 'b')  # c\\n")[0]
    >>> list(zip(s.tokens, s.tags))[:6]
    [('x', 'NAME'), ('=', 'OP'), ('os', 'NAME'), ('.', 'OP'), ('path', 'ATTR'), ('.', 'OP')]
    >>> s.tags[6:]
    ['CALL', 'OP', 'NAME', 'OP', 'STRING', 'OP', 'COMMENT']
    >>> python_token_sentences("y = os.path.join(a)\\n", scheme="bio")[0].tags
    ['B-REF', 'O', 'B-CALL', 'I-CALL', 'I-CALL', 'I-CALL', 'I-CALL', 'O', 'B-REF', 'O']
    """
    if scheme not in SCHEMES:
        raise ConfigError(f"scheme must be one of {', '.join(SCHEMES)}, got {scheme!r}")
    tag_fn = _type_tags if scheme == "types" else _bio_tags
    out = []
    for toks in _logical_lines(source):
        if len(toks) > max_tokens:
            continue
        if any(set(t.string) & {"\n", "\t", "\r"} or not t.string.strip() for t in toks):
            continue
        out.append(TaggedSentence([t.string for t in toks], tag_fn(toks), toks[0].start[0]))
    return out


def write_token_tags(sentences: Iterable[TaggedSentence], path: str | Path) -> int:
    """Write ``token<TAB>tag`` lines, a blank line after each sentence; return the count."""
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for s in sentences:
            f.writelines(f"{tok}\t{tag}\n" for tok, tag in zip(s.tokens, s.tags, strict=True))
            f.write("\n")
            n += 1
    return n


def python_tagging_corpus(
    out_dir: str | Path,
    packages: Sequence[str] | None = ("asyncio", "email", "json", "logging", "unittest"),
    scheme: str = "types",
    max_sentences: int = 20000,
) -> dict[str, Path]:
    """Write ``train.tsv``, ``valid.tsv``, ``test.tsv`` of tagged logical lines of the
    standard library (split by file; at most ``max_sentences`` per part).

    Returns:
        ``{"train": path, "valid": path, "test": path}``.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    parts: dict[str, list[TaggedSentence]] = {name: [] for name in _SPLITS}
    for index, path in enumerate(stdlib_files(packages)):
        part = parts[_split_of(index)]
        if len(part) < max_sentences:
            sentences = python_token_sentences(path.read_text(encoding="utf-8"), scheme)
            part.extend(sentences[: max_sentences - len(part)])
    paths = {}
    for name, sentences in parts.items():
        paths[name] = out_dir / f"{name}.tsv"
        write_token_tags(sentences, paths[name])
    return paths


# -- classification ------------------------------------------------------------------------


def stdlib_package_examples(
    packages: Sequence[str] = CLASSIFY_PACKAGES, min_chars: int = 12
) -> dict[str, list[LabelledExample]]:
    """Source lines of each package labelled with the package, per split.

    Lines are stripped of indentation; lines shorter than ``min_chars`` and lines that
    occur in two or more packages are dropped; a line is kept once per package.

    Returns:
        ``{"train": [...], "valid": [...], "test": [...]}``; ``line`` is the line number
        in the source file.
    """
    seen: dict[str, set[str]] = defaultdict(set)  # line -> packages
    found: list[tuple[str, str, str, int]] = []  # (split, package, text, line)
    for package in packages:
        for index, path in enumerate(stdlib_files([package])):
            split = _split_of(index)
            for number, raw in enumerate(path.read_text(encoding="utf-8").split("\n"), 1):
                text = raw.strip()
                if len(text) < min_chars:
                    continue
                seen[text].add(package)
                found.append((split, package, text, number))
    out: dict[str, list[LabelledExample]] = {name: [] for name in _SPLITS}
    kept: set[tuple[str, str]] = set()
    for split, package, text, number in found:
        if len(seen[text]) > 1 or (package, text) in kept:
            continue
        kept.add((package, text))
        out[split].append(LabelledExample(package, text, number))
    return out


def write_labelled(examples: Iterable[LabelledExample], path: str | Path) -> int:
    """Write ``label<TAB>text`` lines; return the count. Texts must not hold newlines."""
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for ex in examples:
            if "\n" in ex.text or "\r" in ex.text or "\t" in ex.text:
                raise DataError(
                    f"example {n}: a label<TAB>text line cannot hold a newline or a second tab"
                )
            f.write(f"{ex.label}\t{ex.text}\n")
            n += 1
    return n


def stdlib_classification_corpus(
    out_dir: str | Path,
    packages: Sequence[str] = CLASSIFY_PACKAGES,
    per_class: int = 2000,
    seed: int = 0,
) -> dict[str, Path]:
    """Write ``train/valid/test.tsv`` of :func:`stdlib_package_examples`, shuffled: at
    most ``per_class`` examples per package in ``train``, ``per_class // 4`` in ``valid``
    and ``test`` (seeded samples).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    paths = {}
    for name, examples in stdlib_package_examples(packages).items():
        chosen: list[LabelledExample] = []
        cap = per_class if name == "train" else max(1, per_class // 4)
        for package in packages:
            mine = [e for e in examples if e.label == package]
            if len(mine) > cap:
                keep = np.sort(rng.choice(len(mine), size=cap, replace=False))
                mine = [mine[i] for i in keep]
            chosen.extend(mine)
        order = rng.permutation(len(chosen))
        paths[name] = out_dir / f"{name}.tsv"
        write_labelled([chosen[i] for i in order], paths[name])
    return paths


def majority_letter_examples(
    n: int, seed: int = 0, min_len: int = 4, max_len: int = 12
) -> list[LabelledExample]:
    """``n`` random strings over ``abcxyz`` labelled with the most frequent of ``a b c``.

    >>> majority_letter_examples(3, seed=1)
    [LabelledExample(label='a', text='xyzaayzb', line=0), \
LabelledExample(label='a', text='xaazyzxyb', line=0), \
LabelledExample(label='a', text='yabaczac', line=0)]
    """
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcxyz"))
    out: list[LabelledExample] = []
    while len(out) < n:
        text = "".join(rng.choice(letters, size=int(rng.integers(min_len, max_len + 1))))
        counts = sorted(((text.count(c), c) for c in "abc"), reverse=True)
        if counts[0][0] > counts[1][0]:  # a unique winner
            out.append(LabelledExample(counts[0][1], text))
    return out


#: The words of :func:`previous_word_sentences` and their groups (the tags).
PREVIOUS_WORD_GROUPS = {"ant": "A", "bee": "A", "cat": "A", "dog": "A",
                        "eel": "B", "fox": "B", "gnu": "B", "hen": "B"}  # fmt: skip


def previous_word_sentences(
    n: int, seed: int = 0, min_len: int = 3, max_len: int = 10, noise: float = 0.0
) -> list[TaggedSentence]:
    """``n`` sentences of random words of :data:`PREVIOUS_WORD_GROUPS`; the tag of a word
    is the group of the word before it (``START`` for the first word). With ``noise``, each
    tag after the first is replaced by a random group with that probability (the answer
    is then right only on average, as with real annotation).

    >>> s = previous_word_sentences(1, seed=0)[0]
    >>> list(zip(s.tokens, s.tags))[:3]
    [('fox', 'START'), ('eel', 'B'), ('cat', 'B')]
    """
    rng = np.random.default_rng(seed)
    words = list(PREVIOUS_WORD_GROUPS)
    groups = sorted(set(PREVIOUS_WORD_GROUPS.values()))
    out = []
    for _ in range(n):
        length = int(rng.integers(min_len, max_len + 1))
        tokens = [words[i] for i in rng.integers(len(words), size=length)]
        tags = ["START"] + [PREVIOUS_WORD_GROUPS[w] for w in tokens[:-1]]
        if noise:
            flip = rng.random(length) < noise
            tags = [
                groups[int(rng.integers(len(groups)))] if f and i else t
                for i, (t, f) in enumerate(zip(tags, flip, strict=True))
            ]
        out.append(TaggedSentence(tokens, tags))
    return out


def letter_order_examples(
    n: int, seed: int = 0, min_len: int = 6, max_len: int = 12, noise: float = 0.0
) -> list[LabelledExample]:
    """``n`` strings over ``wxyz`` (``min_len`` … ``max_len`` letters in all) holding one
    ``a`` and one ``b`` at random places; the label is ``ab`` if ``a`` comes first, else
    ``ba``. The classes are balanced. With ``noise``, each label is replaced by a random
    one with that probability.

    >>> letter_order_examples(2, seed=0)
    [LabelledExample(label='ab', text='yyxxwabwzyz', line=0), \
LabelledExample(label='ba', text='byyzxzywazy', line=0)]
    """
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        length = int(rng.integers(min_len, max_len + 1))
        letters = list(rng.choice(list("wxyz"), size=length))
        first, second = sorted(rng.choice(length, size=2, replace=False).tolist())
        label = "ab" if i % 2 == 0 else "ba"
        letters[first], letters[second] = label[0], label[1]
        if noise and rng.random() < noise:
            label = ("ab", "ba")[int(rng.integers(2))]
        out.append(LabelledExample(label, "".join(str(c) for c in letters)))
    return out
