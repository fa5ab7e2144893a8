"""The default corpus: text that ships with the platform, never downloaded or copied in.

Python's own standard library sources (code, docstrings and comments) are on every
machine that runs rnnkit. ``stdlib_corpus`` concatenates a deterministic selection of
them into a training and a validation file (every ``valid_every``-th file goes to
validation, so the two never share a file).
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

from rnnkit.data.files import atomic_write_bytes
from rnnkit.errors import DataError

__all__ = ["stdlib_corpus"]

SKIP_PARTS = {
    "test",
    "tests",
    "idlelib",
    "site-packages",
    "dist-packages",
    "lib2to3",
    "turtledemo",
    "__pycache__",
    "ensurepip",
    "encodings",
}


def _sources(root: Path) -> list[Path]:
    files = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if SKIP_PARTS.intersection(rel.parts):
            continue
        files.append(path)
    return files


def stdlib_corpus(
    out_dir: str | Path, max_chars: int = 2_000_000, valid_every: int = 20
) -> tuple[Path, Path]:
    """Write ``train.txt`` and ``valid.txt`` from the standard library's sources.

    Args:
        out_dir: where to write the two files.
        max_chars: stop adding files to the training text past this many characters.
        valid_every: every n-th file goes to validation.

    Returns:
        ``(train_path, valid_path)``.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    train: list[str] = []
    valid: list[str] = []
    n_train = 0
    for index, path in enumerate(_sources(root)):
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # a file that is not clean UTF-8 is skipped, not guessed
        if index % valid_every == valid_every - 1:
            if sum(map(len, valid)) < max_chars // 30:
                valid.append(text)
        elif n_train < max_chars:
            train.append(text)
            n_train += len(text)
        if n_train >= max_chars and sum(map(len, valid)) >= max_chars // 30:
            break
    if not train or not valid:
        raise DataError(f"no standard-library sources found under {root}")
    out = Path(out_dir)
    train_path, valid_path = out / "train.txt", out / "valid.txt"
    atomic_write_bytes(train_path, "\n".join(train).encode("utf-8"))
    atomic_write_bytes(valid_path, "\n".join(valid).encode("utf-8"))
    return train_path, valid_path
