"""Readers of tagged sentences for sequence labelling: CoNLL-U and ``token<TAB>tag`` files.

Both return a list of :class:`TaggedSentence` (tokens, tags, and the 1-based line of the
sentence's first token, for messages). Every problem is a ``DataError`` naming the file
and the line:

* **CoNLL-U** (Universal Dependencies): ten tab-separated columns
  ``id form lemma upos xpos feats head deprel deps misc``; ``#`` comment lines are skipped,
  and so are multiword-token ranges (``1-2``) and empty nodes (``1.1``), which are not
  words of the sentence; a blank line ends a sentence. The token is the ``form`` column,
  the tag the column chosen by name (``upos`` by default). A line with another number of
  columns, an id that is not a positive integer, or an empty tag field is an error.
* **token<TAB>tag**: one token per line, exactly two tab-separated fields (a token may
  hold spaces, never a tab), a blank line between sentences.

:func:`read_tagged` picks the format from the file's first lines
(:func:`detect_tagged_format`): a ``#`` comment means CoNLL-U, and so does a first data
line of ten columns; a ``#`` line of two tab-separated fields (``#1<TAB>NUM``) is a
``token<TAB>tag`` line whose token starts with ``#``, and the line after it decides. A
``token<TAB>tag`` line met in a file a ``#`` line made CoNLL-U (a header above the
tokens) is an error that says so and names that line.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from os import PathLike
from typing import Any, NamedTuple

from rnnkit.data.limits import MAX_LINE_CHARS, MAX_SEQ_LEN
from rnnkit.data.text import checked_lines, read_text
from rnnkit.errors import ConfigError, DataError

__all__ = [
    "CONLLU_COLUMNS",
    "TaggedSentence",
    "check_tag_column",
    "detect_tagged_format",
    "parse_conllu",
    "parse_token_tags",
    "read_conllu",
    "read_tagged",
    "read_token_tags",
    "tagged_sentence",
]

CONLLU_COLUMNS: tuple[str, ...] = (
    "id",
    "form",
    "lemma",
    "upos",
    "xpos",
    "feats",
    "head",
    "deprel",
    "deps",
    "misc",
)
FORMATS: tuple[str, ...] = ("conllu", "tsv")

PathLikeStr = str | PathLike[str]

_WRONG_COLUMNS = "malformed CoNLL-U line: expected 10 tab-separated columns"


class TaggedSentence(NamedTuple):
    """One sentence: ``tokens[i]`` carries ``tags[i]``; ``line`` is where it starts (1-based)."""

    tokens: list[str]
    tags: list[str]
    line: int = 0


def tagged_sentence(
    tokens: Sequence[str],
    tags: Sequence[str],
    path: PathLikeStr | None = None,
    line: int | None = None,
) -> TaggedSentence:
    """A checked :class:`TaggedSentence`: as many tags as tokens, none empty.

    Args:
        tokens: the words.
        tags: one tag per word.
        path, line: where the sentence comes from, for the error message.

    >>> tagged_sentence(["a", "dog"], ["DET", "NOUN"]).tags
    ['DET', 'NOUN']
    >>> tagged_sentence(["a", "dog"], ["DET"], "x.tsv", 4)
    Traceback (most recent call last):
    ...
    rnnkit.errors.DataError: x.tsv:4: tag sequence of the wrong length: 2 tokens but 1 tags
    """
    if len(tokens) != len(tags):
        raise DataError(
            f"tag sequence of the wrong length: {len(tokens)} tokens but {len(tags)} tags",
            path,
            line,
        )
    if not tokens:
        raise DataError("empty sentence", path, line)
    for what, items in (("token", tokens), ("tag", tags)):
        for item in items:
            if not isinstance(item, str) or not item.strip():
                raise DataError(f"empty {what}", path, line)
    return TaggedSentence(list(tokens), list(tags), line or 0)


def _lines(text: str) -> Iterator[tuple[int, str]]:
    # split("\n") keeps line numbers in step with an editor (see data/text.py).
    return enumerate(text.split("\n"), start=1)


def check_tag_column(column: str, argument: str = "column") -> int:
    """The index of the CoNLL-U tag column ``column``; any other name is a ``ConfigError``
    naming ``argument``: the readers' Python argument (the default) or ``rnnkit``'s
    ``--tag-column``, which the ``tag`` task checks first.

    >>> check_tag_column("xpos"), check_tag_column("upos", "--tag-column")
    (4, 3)
    """
    if column not in CONLLU_COLUMNS or column == "id":
        options = ", ".join(c for c in CONLLU_COLUMNS if c != "id")
        raise ConfigError(f"{argument} must be one of {options}, got {column!r}")
    return CONLLU_COLUMNS.index(column)


_column_index = check_tag_column


def parse_conllu(
    text: str,
    column: str = "upos",
    path: PathLikeStr | None = None,
    *,
    max_line_chars: int | None = None,
    max_seq_len: int | None = None,
) -> list[TaggedSentence]:
    """Sentences of CoNLL-U ``text`` with the tags of ``column`` (see the module doc).

    Args:
        text: the file's content.
        column: the tag column by name: ``form lemma upos xpos feats head deprel deps misc``.
        path: the file name for error messages.
        max_line_chars, max_seq_len: size limits (:mod:`rnnkit.data.limits`): the longest
            line and the most tokens of one sentence.

    >>> rows = ["# text = I go", "1-2\\tIgo\\t_\\t_\\t_\\t_\\t_\\t_\\t_\\t_",
    ...         "1\\tI\\tI\\tPRON\\tPRP\\t_\\t2\\tnsubj\\t_\\t_",
    ...         "2\\tgo\\tgo\\tVERB\\tVBP\\t_\\t0\\troot\\t_\\t_",
    ...         "2.1\\tgone\\tgo\\tVERB\\tVBN\\t_\\t_\\t_\\t2:x\\t_", ""]
    >>> parse_conllu("\\n".join(rows))
    [TaggedSentence(tokens=['I', 'go'], tags=['PRON', 'VERB'], line=3)]
    >>> parse_conllu("\\n".join(rows), column="deprel")[0].tags
    ['nsubj', 'root']
    >>> parse_conllu("1\\tI\\tPRON\\n", path="bad.conllu")
    Traceback (most recent call last):
    ...
    rnnkit.errors.DataError: bad.conllu:1: malformed CoNLL-U line: expected 10 \
tab-separated columns, got 3
    """
    col = _column_index(column)
    too_long = _sentence_check(path, max_seq_len)
    sentences: list[TaggedSentence] = []
    tokens: list[str] = []
    tags: list[str] = []
    start = 0

    def flush() -> None:
        nonlocal tokens, tags
        if tokens:
            sentences.append(TaggedSentence(tokens, tags, start))
        tokens, tags = [], []

    for number, line in checked_lines(text, path, max_line_chars):
        if not line.strip():
            flush()
            continue
        if line.startswith("#"):
            continue
        fields = line.split("\t")
        if len(fields) != len(CONLLU_COLUMNS):
            raise DataError(
                f"{_WRONG_COLUMNS}, got {len(fields)}",
                path,
                number,
            )
        word_id = fields[0]
        if "-" in word_id or "." in word_id:
            continue  # multiword token range or empty node: not a word of the sentence
        if not word_id.isdigit() or int(word_id) < 1:
            raise DataError(
                f"malformed CoNLL-U line: id must be a positive integer, got {word_id!r}",
                path,
                number,
            )
        form, tag = fields[1], fields[col].strip()
        if not form:
            raise DataError("malformed CoNLL-U line: empty form column", path, number)
        if not tag:
            raise DataError(f"malformed CoNLL-U line: empty {column} column", path, number)
        if not tokens:
            start = number
        tokens.append(form)
        tags.append(tag)
        too_long(tokens, start)
    flush()
    return sentences


def parse_token_tags(
    text: str,
    path: PathLikeStr | None = None,
    *,
    max_line_chars: int | None = None,
    max_seq_len: int | None = None,
) -> list[TaggedSentence]:
    """Sentences of ``token<TAB>tag`` lines, blank lines between sentences; size limits as
    for :func:`parse_conllu`.

    >>> parse_token_tags("The\\tDET\\ncat\\tNOUN\\n\\nRuns\\tVERB\\n")
    [TaggedSentence(tokens=['The', 'cat'], tags=['DET', 'NOUN'], line=1), \
TaggedSentence(tokens=['Runs'], tags=['VERB'], line=4)]
    >>> parse_token_tags("The\\tDET\\ncat NOUN\\n", path="t.tsv")
    Traceback (most recent call last):
    ...
    rnnkit.errors.DataError: t.tsv:2: line has no tab (expected token<TAB>tag)
    """
    sentences: list[TaggedSentence] = []
    tokens: list[str] = []
    tags: list[str] = []
    start = 0
    too_long = _sentence_check(path, max_seq_len)
    for number, line in checked_lines(text, path, max_line_chars):
        if not line.strip():
            if tokens:
                sentences.append(TaggedSentence(tokens, tags, start))
            tokens, tags = [], []
            continue
        fields = line.split("\t")
        if len(fields) == 1:
            raise DataError("line has no tab (expected token<TAB>tag)", path, number)
        if len(fields) != 2:
            raise DataError(
                f"expected token<TAB>tag, got {len(fields)} tab-separated fields", path, number
            )
        # spaces around a token are no part of it: a sentence to tag is split at
        # whitespace, so "cat  " would never be met again
        token, tag = fields[0].strip(), fields[1].strip()
        if not token:
            raise DataError("empty token (expected token<TAB>tag)", path, number)
        if not tag:
            raise DataError("empty tag (expected token<TAB>tag)", path, number)
        if not tokens:
            start = number
        tokens.append(token)
        tags.append(tag)
        too_long(tokens, start)
    if tokens:
        sentences.append(TaggedSentence(tokens, tags, start))
    return sentences


def _sentence_check(path: PathLikeStr | None, max_seq_len: int | None) -> Callable[..., None]:
    """A check that a growing sentence is within ``max_seq_len`` tokens."""
    limit = MAX_SEQ_LEN.value(max_seq_len)

    def check(tokens: list[str], start: int) -> None:
        # A file without blank lines is one sentence; a million tokens of it would be one
        # sequence of a million time steps.
        if len(tokens) > limit:
            found = f"sentence of more than {limit:,} tokens (no blank line)"
            raise DataError(MAX_SEQ_LEN.exceeded(found, limit), path, start)

    return check


def detect_tagged_format(text: str) -> str:
    """The format of a tagged file, ``"conllu"`` or ``"tsv"``, read from its lines in order.

    * A ``#`` line with exactly two tab-separated non-empty fields may be either a
      ``token<TAB>tag`` line whose token starts with ``#`` (a hashtag, ``#1``) or a
      CoNLL-U comment holding one tab: it decides nothing, the next line is read.
    * Any other ``#`` line is a CoNLL-U comment (``# sent_id = 1``): ``"conllu"``.
    * The first other non-blank line decides: ten tab-separated columns is ``"conllu"``,
      anything else ``"tsv"``.

    A file of nothing but two-field ``#`` lines (or of nothing) is ``"tsv"``.

    >>> detect_tagged_format("# sent_id = 1\\n"), detect_tagged_format("a\\tDET\\n")
    ('conllu', 'tsv')
    >>> detect_tagged_format("#rnnkit\\tHASHTAG\\nrocks\\tVERB\\n")
    'tsv'
    """
    return _detect(text)[0]


def _detect(text: str) -> tuple[str, int | None]:
    """:func:`detect_tagged_format` with the line of the ``#`` comment that made the file
    CoNLL-U (None when another line decided), for the message of a file misread so."""
    for number, line in _lines(text):
        if not line.strip():
            continue
        fields = line.split("\t")
        if line.startswith("#"):
            # A token<TAB>tag line is two fields, both non-empty; a CoNLL-U comment line
            # rarely holds a tab at all, so only this shape is ambiguous.
            if len(fields) == 2 and all(f.strip() for f in fields):
                continue
            return "conllu", number
        return ("conllu" if len(fields) == len(CONLLU_COLUMNS) else "tsv"), None
    return "tsv", None


def _nonempty(sentences: list[TaggedSentence], path: PathLikeStr) -> list[TaggedSentence]:
    if not sentences:
        raise DataError("no tagged sentence in the file", path)
    return sentences


def read_conllu(path: PathLikeStr, column: str = "upos", **limits: Any) -> list[TaggedSentence]:
    """Read a CoNLL-U file (strict UTF-8); see :func:`parse_conllu`."""
    text = read_text(path, max_line_chars=MAX_LINE_CHARS.value(limits.get("max_line_chars")))
    return _nonempty(parse_conllu(text, column, path, **limits), path)


def read_token_tags(path: PathLikeStr, **limits: Any) -> list[TaggedSentence]:
    """Read a ``token<TAB>tag`` file (strict UTF-8); see :func:`parse_token_tags`."""
    text = read_text(path, max_line_chars=MAX_LINE_CHARS.value(limits.get("max_line_chars")))
    return _nonempty(parse_token_tags(text, path, **limits), path)


def read_tagged(
    path: PathLikeStr,
    column: str = "upos",
    fmt: str | None = None,
    *,
    max_line_chars: int | None = None,
    max_seq_len: int | None = None,
) -> tuple[list[TaggedSentence], str]:
    """Read a tagged file in either format.

    Args:
        path: the file.
        column: the CoNLL-U tag column (ignored for ``token<TAB>tag`` files).
        fmt: ``"conllu"`` or ``"tsv"``; None detects it (:func:`detect_tagged_format`).
        max_line_chars, max_seq_len: size limits (:mod:`rnnkit.data.limits`).

    Returns:
        ``(sentences, format)``.

    >>> import tempfile, pathlib
    >>> with tempfile.TemporaryDirectory() as d:
    ...     p = pathlib.Path(d) / "t.tsv"
    ...     _ = p.write_text("x\\tNOUN\\n")
    ...     read_tagged(p)
    ([TaggedSentence(tokens=['x'], tags=['NOUN'], line=1)], 'tsv')
    """
    _column_index(column)
    # The line limit applies while reading: `--train /dev/zero`-like input fails at once.
    text = read_text(path, max_line_chars=MAX_LINE_CHARS.value(max_line_chars))
    comment = None
    if fmt is None:
        fmt, comment = _detect(text)
    if fmt not in FORMATS:
        raise ConfigError(f"tagged format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    limits = {"max_line_chars": max_line_chars, "max_seq_len": max_seq_len}
    if fmt == "conllu":
        try:
            sentences = parse_conllu(text, column, path, **limits)
        except DataError as exc:
            if comment is None or exc.message != f"{_WRONG_COLUMNS}, got 2":
                raise
            # a token<TAB>tag line in a file a "# header" line made CoNLL-U: say why it
            # was read so, or "expected 10 columns" reads as a broken file of that kind
            raise DataError(
                f"{exc.message} (the file was read as CoNLL-U because line {comment} starts "
                "with '#'; for a token<TAB>tag file remove that line, else give a CoNLL-U "
                "file)",
                exc.path,
                exc.line,
            ) from None
    else:
        sentences = parse_token_tags(text, path, **limits)
    return _nonempty(sentences, path), fmt
