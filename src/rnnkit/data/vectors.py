"""Real-valued vector sequences for the ``regress`` task and for ``classify --inputs
vectors``: readers with errors naming the file and line.

Two formats:

* **JSON lines** (``.jsonl`` / ``.json``, or any file not ending in ``.csv``): one sequence
  per line, ``{"seq": [[x11, x12, …], [x21, …], …]}`` (a list of scalars is a sequence of
  one-dimensional vectors) and, for sequence-to-value targets, ``"y": [y1, …]`` (or one
  number). Blank lines are skipped.
* **CSV** (``.csv``): ONE sequence per file, one time step per row, one column per
  dimension (``csv`` module dialect: commas, optional quotes). A first row that is not
  numeric is a header and skipped. A directory holds one sequence per ``*.csv`` file (in
  name order).

Labelled sequences (``labelled=True``, for classification) carry a class instead of a
target: ``{"seq": [...], "label": "walk"}`` (a non-empty string; no ``"y"``), or, for CSV,
a directory with one folder per class, ``DIR/walk/*.csv``: the folder's name is the
label of every sequence in it.

Every value must be a finite number within float32's range (the model computes in
float32: ``1e300`` would be ``inf`` there) and every step of every sequence must have the
same width (``D``), else a :class:`~rnnkit.errors.DataError` names the file and line.

Reads are bounded (:mod:`rnnkit.data.limits`): a JSON line of more than
``max_json_line_bytes`` (10 MiB), a CSV row of more than ``max_line_chars`` characters, or a
file of more than ``max_file_bytes`` is refused as it is read, so ``--train /dev/zero``
fails at once. A leading UTF-8 byte-order mark is dropped, as the other readers do.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

import numpy as np

from rnnkit.data.limits import (
    MAX_FILE_BYTES,
    MAX_JSON_LINE_BYTES,
    MAX_LINE_CHARS,
    MAX_SEQ_LEN,
    Limit,
    loads_json,
)
from rnnkit.data.lines import open_binary, text_lines
from rnnkit.errors import DataError

#: The largest finite float32: a value beyond it becomes ``inf`` in the model.
_FLOAT32_MAX = float(np.finfo(np.float32).max)

# Said where a line is not a sequence's JSON object at all: what the file must hold.
_FORMAT_HINT = (
    'each line is one sequence, a JSON object such as {"seq": [[0.5, 1.0], [0.7, 0.9]]} '
    "(one list of values a step; a .csv file holds one sequence, one step a row)"
)

__all__ = ["VectorSequence", "parse_vector_line", "read_vector_sequences"]


@dataclass(frozen=True)
class VectorSequence:
    """One sequence: ``values (T, D)`` float32, an optional target ``y (K,)``, and where it
    came from (``path``, ``line``: 1-based, of the JSON line or the first data row)."""

    values: np.ndarray
    target: np.ndarray | None
    path: str
    line: int
    label: str | None = None


def _number(value: Any, path: str, line: int, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise DataError(f"{what} is not a number: {value!r}", path, line)
    too_big = f"{what} is out of float32's range (±3.4e38): {_short(value)}"
    try:
        out = float(value)
    except OverflowError:  # an integer of hundreds of digits
        raise DataError(too_big, path, line) from None
    if not math.isfinite(out):
        raise DataError(f"{what} is not finite: {_short(value)}", path, line)
    if abs(out) > _FLOAT32_MAX:
        raise DataError(too_big, path, line)
    return out


def _short(value: Any) -> str:
    """``repr(value)``, cut: a 400-digit integer is not worth 400 characters of message."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def parse_vector_line(text: str, path: str, line: int, labelled: bool = False) -> VectorSequence:
    """One JSON line ``{"seq": [...], "y": ...}`` (``labelled``: ``{"seq": [...], "label":
    "walk"}``) as a :class:`VectorSequence`."""
    if text.startswith("\ufeff"):
        text = text[1:]  # a byte-order mark from a Windows editor is not content
    try:
        data = loads_json(text, path, line, only_text=True)
    except DataError as exc:
        reason = exc.message.removeprefix("invalid JSON: ")
        # a line that is no JSON object at all (numbers, CSV): say what the file holds
        hint = "" if text.lstrip(" \t").startswith("{") else f"; {_FORMAT_HINT}"
        raise DataError(f"not valid JSON ({reason}){hint}", path, line) from None
    if not isinstance(data, dict) or "seq" not in data:
        raise DataError(f"expected {_FORMAT_HINT.removeprefix('each line is ')}", path, line)
    seq = data["seq"]
    if not isinstance(seq, list) or not seq:
        raise DataError('"seq" must be a non-empty list of steps', path, line)
    limit = MAX_SEQ_LEN.value()
    if len(seq) > limit:
        raise DataError(MAX_SEQ_LEN.exceeded(f"seq of {len(seq)} steps", limit), path, line)
    rows = []
    width = None
    for t, step in enumerate(seq):
        values = step if isinstance(step, list) else [step]
        if not values:
            raise DataError(f"step {t + 1} of seq is empty", path, line)
        if width is not None and len(values) != width:
            raise DataError(
                f"step {t + 1} of seq has {len(values)} values, the steps before {width}",
                path,
                line,
            )
        width = len(values)
        rows.append([_number(v, path, line, f"step {t + 1} of seq: a value") for v in values])
    target, label = None, None
    if labelled:
        label = data.get("label")
        if not isinstance(label, str) or not label.strip():
            raise DataError('"label" must be a non-empty string (the class)', path, line)
    elif "y" in data:
        y = data["y"] if isinstance(data["y"], list) else [data["y"]]
        if not y:
            raise DataError('"y" must be a number or a non-empty list of numbers', path, line)
        target = np.array([_number(v, path, line, '"y": a value') for v in y], dtype=np.float32)
    keys = {"seq", "label"} if labelled else {"seq", "y"}
    unknown = sorted(set(data) - keys)
    if unknown:
        raise DataError(
            f"unknown keys {unknown} (expected {' and '.join(sorted(keys))})", path, line
        )
    return VectorSequence(np.array(rows, dtype=np.float32), target, path, line, label)


def _lines(f: IO[bytes], path: Path, limit: Limit) -> Iterator[tuple[int, str]]:
    """The numbered lines of a file, decoded one by one (invalid UTF-8 names its own line)
    and bounded as they are read (``/dev/zero`` is refused after one read)."""
    return text_lines(f, str(path), limit, file_limit=MAX_FILE_BYTES.value())


def _read_jsonl(path: Path, labelled: bool = False) -> list[VectorSequence]:
    out = []
    with open_binary(path) as f:
        for number, text in _lines(f, path, MAX_JSON_LINE_BYTES):
            if text.strip():
                out.append(parse_vector_line(text, str(path), number, labelled))
    return out


def _read_csv(path: Path) -> VectorSequence:
    rows: list[list[float]] = []
    limit = MAX_SEQ_LEN.value()
    first = 0
    width = None
    try:
        with open_binary(path) as f:
            lines = (text for _, text in _lines(f, path, MAX_LINE_CHARS))
            for number, fields in enumerate(csv.reader(lines), start=1):
                if not fields or all(not x.strip() for x in fields):
                    continue
                try:
                    values = [float(x) for x in fields]
                except ValueError:
                    if not rows and number == 1:  # a header row
                        continue
                    bad = next(x for x in fields if not _is_float(x))
                    raise DataError(f"not a number: {bad!r}", str(path), number) from None
                if not all(math.isfinite(v) for v in values):
                    raise DataError("a value is not finite", str(path), number)
                if any(abs(v) > _FLOAT32_MAX for v in values):
                    raise DataError(
                        "a value is out of float32's range (±3.4e38)", str(path), number
                    )
                if width is not None and len(values) != width:
                    raise DataError(
                        f"row has {len(values)} values, the rows before {width}", str(path), number
                    )
                width = len(values)
                first = first or number
                rows.append(values)
                if len(rows) > limit:
                    raise DataError(MAX_SEQ_LEN.exceeded(f"{len(rows)} rows", limit), path, number)
    except csv.Error as exc:
        raise DataError(f"not CSV ({exc})", str(path)) from None
    if not rows:
        raise DataError("no numeric rows (one sequence per CSV file)", str(path))
    return VectorSequence(np.array(rows, dtype=np.float32), None, str(path), first)


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _read_labelled_csv(p: Path) -> list[VectorSequence]:
    """``DIR/LABEL/*.csv``: one folder per class (in name order), one sequence per file."""
    if not p.is_dir():
        raise DataError(
            "a labelled CSV sequence is read from a folder named by its label: give the "
            "directory that holds LABEL/*.csv",
            str(p),
        )
    seqs = []
    for folder in sorted(q for q in p.iterdir() if q.is_dir()):
        seqs += [replace(_read_csv(f), label=folder.name) for f in sorted(folder.glob("*.csv"))]
    if not seqs:
        raise DataError("a directory of labelled sequences must hold LABEL/*.csv files", str(p))
    return seqs


def read_vector_sequences(path: str | Path, labelled: bool = False) -> list[VectorSequence]:
    """All sequences of a JSON-lines file, a CSV file (one sequence) or a directory of CSV
    files; every step of every sequence of the same width ``D``. ``labelled``: each with
    its class (see the module doc)."""
    p = Path(path)
    if labelled and (p.is_dir() or p.suffix.lower() == ".csv"):
        seqs = _read_labelled_csv(p)
    elif p.is_dir():
        files = sorted(p.glob("*.csv"))
        if not files:
            raise DataError("a directory of sequences must hold *.csv files", str(p))
        seqs = [_read_csv(f) for f in files]
    elif p.suffix.lower() == ".csv":
        seqs = [_read_csv(p)]
    else:
        seqs = _read_jsonl(p, labelled)
    if not seqs:
        raise DataError("no sequences", str(p))
    width = seqs[0].values.shape[1]
    for s in seqs:
        if s.values.shape[1] != width:
            raise DataError(
                f"steps have {s.values.shape[1]} values, the first sequence's {width}",
                s.path,
                s.line,
            )
    return seqs
