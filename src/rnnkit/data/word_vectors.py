"""Pretrained word vectors in the word2vec / GloVe text format.

One word per line followed by its ``d`` numbers, separated by spaces::

    the 0.418 0.24968 -0.41242 …
    , 0.013441 0.23682 -0.16899 …

word2vec's text files start with a header line ``N d`` (two integers), which is skipped.
Every vector must have ``dim`` numbers (the model's ``--embedding``), all finite and
within float32's range (the embedding is float32: ``1e39`` would be ``inf`` there), else a
:class:`~rnnkit.errors.DataError` names the file and line; a file without any vector
(empty, blank lines only) is refused too. Only the words asked for are kept, so a large
file streams through in constant memory. The first occurrence of a word wins.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from rnnkit.data.limits import MAX_LINE_CHARS
from rnnkit.data.lines import open_binary, text_lines
from rnnkit.errors import DataError

__all__ = ["read_word_vectors"]

#: The largest finite float32: a value beyond it becomes ``inf`` in the embedding.
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def read_word_vectors(
    path: str | Path, dim: int, wanted: Iterable[str] | None = None
) -> dict[str, np.ndarray]:
    """``{word: vector (dim,) float32}`` for the words of ``wanted`` found in ``path``
    (all words when ``wanted`` is None)."""
    keep = None if wanted is None else set(wanted)
    out: dict[str, np.ndarray] = {}
    vectors = 0
    with open_binary(path) as f:
        for number, line in text_lines(f, str(path), MAX_LINE_CHARS):
            parts = line.rstrip("\r\n").split(" ")
            parts = [p for p in parts if p != ""]
            if not parts:
                continue
            if number == 1 and len(parts) == 2 and all(p.isdigit() for p in parts):
                continue  # word2vec's "N d" header
            vectors += 1
            word, values = parts[0], parts[1:]
            if len(values) != dim:
                raise DataError(
                    f"the vector of {word!r} has {len(values)} numbers, the embedding "
                    f"is {dim} wide (--embedding)",
                    str(path),
                    number,
                )
            if (keep is not None and word not in keep) or word in out:
                continue
            try:
                vector = [float(v) for v in values]
            except ValueError:
                bad = next(v for v in values if not _is_float(v))
                raise DataError(f"not a number: {bad!r}", str(path), number) from None
            if not all(math.isfinite(v) for v in vector):
                raise DataError(f"the vector of {word!r} is not finite", str(path), number)
            if any(abs(v) > _FLOAT32_MAX for v in vector):
                raise DataError(
                    f"the vector of {word!r} is out of float32's range (±3.4e38)",
                    str(path),
                    number,
                )
            out[word] = np.array(vector, dtype=np.float32)
    if not vectors:
        raise DataError("holds no word vectors", str(path))
    return out


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
