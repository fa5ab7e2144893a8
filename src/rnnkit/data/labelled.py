"""Labelled examples (``label<TAB>text`` lines) and label sets for classification and tagging.

``read_labelled`` reads one example per non-blank line: exactly one tab between the label
and the text. A line without a tab, with a second tab (a third column: an ``id<TAB>label
<TAB>text`` file would otherwise train on ids as labels), an empty label or an empty text
is a ``DataError`` naming the file and line. ``LabelSet`` is the fixed, ordered list of
classes (or tags) a model predicts, saved as JSON beside the vocabulary; ``split_holdout``
holds out a seeded random share of examples for validation (a label-sorted file would
otherwise lose whole classes to the tail).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Hashable, Iterable, Sequence
from os import PathLike
from typing import Any, NamedTuple, TypeVar

import numpy as np

from rnnkit.data.files import atomic_write_bytes, read_run_file
from rnnkit.data.limits import loads_json
from rnnkit.data.text import read_numbered_lines
from rnnkit.errors import DataError

__all__ = [
    "LabelSet",
    "LabelledExample",
    "parse_labelled_line",
    "read_labelled",
    "split_holdout",
]

PathLikeStr = str | PathLike[str]
T = TypeVar("T")

_FORMAT = "rnnkit.labels"
_VERSION = 1


class LabelledExample(NamedTuple):
    """One example: its ``label``, its ``text`` and its 1-based ``line`` in the file."""

    label: str
    text: str
    line: int = 0


def parse_labelled_line(
    line: str, path: PathLikeStr | None = None, number: int | None = None
) -> LabelledExample:
    """Split one ``label<TAB>text`` line; surrounding whitespace of the label is dropped.

    >>> parse_labelled_line("pos\\tgreat film")
    LabelledExample(label='pos', text='great film', line=0)
    >>> parse_labelled_line("pos\\tgreat film\\tfun", "r.tsv", 3)
    Traceback (most recent call last):
    ...
    rnnkit.errors.DataError: r.tsv:3: 3 tab-separated columns, expected 2 (label<TAB>text; \
a tab inside the text: write a space)
    >>> parse_labelled_line("pos great film", "r.tsv", 7)
    Traceback (most recent call last):
    ...
    rnnkit.errors.DataError: r.tsv:7: line has no tab (expected label<TAB>text)
    """
    label, tab, text = line.partition("\t")
    if not tab:
        raise DataError("line has no tab (expected label<TAB>text)", path, number)
    if "\t" in text:
        columns = text.count("\t") + 2
        raise DataError(
            f"{columns} tab-separated columns, expected 2 (label<TAB>text; a tab inside the "
            "text: write a space)",
            path,
            number,
        )
    label = label.strip()
    if not label:
        raise DataError("empty label (expected label<TAB>text)", path, number)
    if not text.strip():
        raise DataError("empty text (expected label<TAB>text)", path, number)
    return LabelledExample(label, text, number or 0)


def read_labelled(path: PathLikeStr, *, max_line_chars: int | None = None) -> list[LabelledExample]:
    """All examples of a ``label<TAB>text`` file (strict UTF-8; blank lines skipped).

    A line over ``max_line_chars`` (default 1,048,576; :mod:`rnnkit.data.limits`) is a
    ``DataError`` naming it.

    >>> import tempfile, pathlib
    >>> with tempfile.TemporaryDirectory() as d:
    ...     p = pathlib.Path(d) / "c.tsv"
    ...     _ = p.write_text("a\\tx y\\n\\nb\\tz\\n")
    ...     read_labelled(p)
    [LabelledExample(label='a', text='x y', line=1), LabelledExample(label='b', text='z', line=3)]
    """
    lines = read_numbered_lines(path, max_line_chars=max_line_chars)
    return [parse_labelled_line(line, path, n) for n, line in lines]


def split_holdout(
    items: Sequence[T], fraction: float, seed: int = 0, path: str | None = None
) -> tuple[list[T], list[T]]:
    """A seeded random ``fraction`` of ``items`` (at least one) for validation; ``path``,
    the file they were read from, is named when they are too few to split.

    Returns ``(train, held_out)``, each in the original order.

    >>> split_holdout(list(range(10)), 0.2, seed=0)
    ([0, 1, 2, 3, 4, 5, 8, 9], [6, 7])
    """
    n = len(items)
    k = max(1, round(n * fraction))
    if n < 2 or k >= n:
        raise DataError(
            f"{n} example{'s are' if n != 1 else ' is'} too few to hold out {fraction:.0%} for "
            "validation; pass --valid",
            path,
        )
    rng = np.random.default_rng(seed % 2**64)  # a negative seed read as torch reads it
    held = np.zeros(n, dtype=bool)
    held[rng.choice(n, size=k, replace=False)] = True
    return [x for x, h in zip(items, held, strict=True) if not h], [
        x for x, h in zip(items, held, strict=True) if h
    ]


class LabelSet:
    """The ordered classes of a model: ``labels[i]`` is output ``i``.

    Args:
        labels: distinct non-empty strings.

    >>> ls = LabelSet.from_data(["b", "a", "b"])
    >>> ls.labels, ls.index("b"), ls.get("zzz"), len(ls)
    (['a', 'b'], 1, None, 2)
    """

    def __init__(self, labels: Iterable[str]) -> None:
        self.labels: list[str] = list(labels)
        # Types first: a list among the labels of a labels.json would not even hash.
        if any(not isinstance(x, str) or not x for x in self.labels):
            raise DataError("labels must be non-empty strings")
        self._index = {label: i for i, label in enumerate(self.labels)}
        if len(self._index) != len(self.labels):
            raise DataError("label set holds a duplicate label")
        if not self.labels:
            raise DataError("a label set needs at least one label")

    @classmethod
    def from_data(cls, labels: Iterable[Hashable]) -> LabelSet:
        """The distinct labels of the data, sorted (a pure function of the label set)."""
        return cls(sorted(Counter(str(x) for x in labels)))

    def __len__(self) -> int:
        return len(self.labels)

    def __contains__(self, label: object) -> bool:
        return label in self._index

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LabelSet) and self.labels == other.labels

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"LabelSet({self.labels!r})"

    def index(self, label: str) -> int:
        """Output index of ``label`` (``KeyError`` if unknown)."""
        return self._index[label]

    def get(self, label: str) -> int | None:
        """Output index of ``label``, or None if the model does not know it."""
        return self._index.get(label)

    def to_dict(self) -> dict[str, Any]:
        return {"format": _FORMAT, "version": _VERSION, "labels": self.labels}

    def save(self, path: PathLikeStr) -> None:
        """Write the JSON atomically (temporary file in the same folder, then rename)."""
        text = json.dumps(self.to_dict(), ensure_ascii=False, indent=1) + "\n"
        atomic_write_bytes(path, text.encode("utf-8"))

    @classmethod
    def load(cls, path: PathLikeStr) -> LabelSet:
        """Read :meth:`save` output; anything malformed is a ``DataError`` naming the file.

        >>> import tempfile, pathlib
        >>> with tempfile.TemporaryDirectory() as d:
        ...     p = pathlib.Path(d) / "labels.json"
        ...     LabelSet(["x", "y"]).save(p)
        ...     LabelSet.load(p)
        LabelSet(['x', 'y'])
        """
        raw = read_run_file(path)
        try:
            doc = loads_json(raw, path)
        except DataError as exc:
            raise DataError(f"not a label set: {exc.message}", path, exc.line) from None
        if (
            not isinstance(doc, dict)
            or doc.get("format") != _FORMAT
            or doc.get("version") != _VERSION
            or not isinstance(doc.get("labels"), list)
        ):
            raise DataError(f"not a label set of format {_FORMAT} v{_VERSION}", path)
        try:
            return cls(doc["labels"])
        except DataError as exc:
            raise DataError(exc.message, path) from None
