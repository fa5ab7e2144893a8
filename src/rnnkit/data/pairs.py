"""Parallel data for transduction: ``source<TAB>target`` lines → id pairs → padded batches.

One pair per non-blank line; the line must hold exactly one tab, with a non-empty source
before it and a non-empty target after it. Anything else is a ``DataError`` naming the
file and line. A trailing ``\\r`` (Windows line ends) is dropped; other whitespace is
kept (it is a character of a char-unit side).

A batch holds the source ``(B, S)`` with its mask, and the target in teacher-forcing form:
decoder inputs ``<s> y_1 … y_m`` and targets ``y_1 … y_m </s>``.
"""

from __future__ import annotations

from collections.abc import Sequence
from os import PathLike
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from rnnkit.data.batching import SequenceBatcher, pad_sequences, to_device
from rnnkit.data.text import read_numbered_lines
from rnnkit.data.vocab import BOS_ID, EOS_ID, PAD_ID, Vocabulary
from rnnkit.errors import DataError

__all__ = [
    "Pair",
    "PairBatch",
    "PairBatcher",
    "encode_pairs",
    "make_pair_batch",
    "parse_pair_line",
    "read_pairs",
]


class Pair(NamedTuple):
    """One example: the source and target text, and the line it came from."""

    source: str
    target: str
    line: int = 0


def parse_pair_line(
    line: str, path: str | PathLike[str] | None = None, number: int | None = None
) -> Pair:
    """Split one ``source<TAB>target`` line; errors name ``path:number``.

    >>> parse_pair_line("abc\\tcba\\r")
    Pair(source='abc', target='cba', line=0)
    >>> parse_pair_line("abc cba", "train.tsv", 7)
    Traceback (most recent call last):
    ...
    rnnkit.errors.DataError: train.tsv:7: no tab: expected source<TAB>target
    """
    if line.endswith("\r"):
        line = line[:-1]
    fields = line.split("\t")
    if len(fields) == 1:
        raise DataError("no tab: expected source<TAB>target", path, number)
    if len(fields) > 2:
        raise DataError(
            f"{len(fields) - 1} tabs: expected exactly one (source<TAB>target)", path, number
        )
    source, target = fields
    if not source.strip():
        raise DataError("empty source before the tab", path, number)
    if not target.strip():
        raise DataError("empty target after the tab", path, number)
    return Pair(source, target, number or 0)


def read_pairs(path: str | PathLike[str], *, max_line_chars: int | None = None) -> list[Pair]:
    """All pairs of a ``source<TAB>target`` file (blank lines skipped).

    Raises:
        DataError: a missing or non-UTF-8 file, a malformed line (``file:line``), a line
            over ``max_line_chars`` (default 1,048,576; :mod:`rnnkit.data.limits`), or a
            file without any pair.

    >>> import tempfile, pathlib
    >>> with tempfile.TemporaryDirectory() as d:
    ...     p = pathlib.Path(d) / "pairs.tsv"
    ...     _ = p.write_text("ab\\tba\\n\\nxyz\\tzyx\\n")
    ...     [(s, t, n) for s, t, n in read_pairs(p)]
    [('ab', 'ba', 1), ('xyz', 'zyx', 3)]
    """
    lines = read_numbered_lines(path, max_line_chars=max_line_chars)
    pairs = [parse_pair_line(line, path, number) for number, line in lines]
    if not pairs:
        raise DataError("no source<TAB>target line", path)
    return pairs


def encode_pairs(
    pairs: Sequence[Pair],
    source_vocab: Vocabulary,
    target_vocab: Vocabulary,
    path: str | PathLike[str] | None = None,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Token ids of every pair (no specials); a side with no token is a ``DataError``.

    >>> v = Vocabulary(["a", "b"])
    >>> src, tgt = encode_pairs([Pair("ab", "ba")], v, v)
    >>> src[0].tolist(), tgt[0].tolist()
    ([4, 5], [5, 4])
    """
    sources, targets = [], []
    for pair in pairs:
        s = source_vocab.encode_array(pair.source, dtype=np.int64)
        t = target_vocab.encode_array(pair.target, dtype=np.int64)
        if len(s) == 0 or len(t) == 0:
            side = "source" if len(s) == 0 else "target"
            raise DataError(f"the {side} has no token", path, pair.line or None)
        sources.append(s)
        targets.append(t)
    return sources, targets


class PairBatch(NamedTuple):
    """A padded batch of ``B`` pairs.

    Attributes:
        source: ``(B, S)`` int64 source ids, padded with ``<pad>``.
        source_mask: ``(B, S)`` bool, True at real source positions.
        target_in: ``(B, T)`` decoder inputs ``<s> y_1 … y_m`` (padded).
        target_out: ``(B, T)`` targets ``y_1 … y_m </s>`` (padded).
        target_mask: ``(B, T)`` bool, True at real target positions.
        indices: ``(B,)`` positions of the pairs in the batcher's list.
    """

    source: Tensor
    source_mask: Tensor
    target_in: Tensor
    target_out: Tensor
    target_mask: Tensor
    indices: Tensor

    def to(self, device: torch.device | str) -> PairBatch:
        """The same batch on ``device`` (to a GPU without waiting: :func:`to_device`)."""
        return PairBatch(*(to_device(t, device) for t in self))


def make_pair_batch(
    sources: Sequence[np.ndarray],
    targets: Sequence[np.ndarray] | None,
    indices: Sequence[int] | None = None,
) -> PairBatch:
    """Pad ``sources`` and the teacher-forcing form of ``targets`` into one batch.

    Without targets (decoding), ``target_*`` hold one ``<s>`` column and an empty mask.

    >>> b = make_pair_batch([np.array([4, 5]), np.array([6])], [np.array([7]), np.array([8, 9])])
    >>> b.target_in.tolist(), b.target_out.tolist(), b.target_mask.tolist()
    ([[2, 7, 0], [2, 8, 9]], [[7, 3, 0], [8, 9, 3]], [[True, True, False], [True, True, True]])
    """
    source, source_mask = pad_sequences(list(sources), PAD_ID)
    B = len(sources)
    if targets is None:
        target_in = torch.full((B, 1), BOS_ID, dtype=torch.long)
        target_out = torch.full((B, 1), EOS_ID, dtype=torch.long)
        target_mask = torch.zeros(B, 1, dtype=torch.bool)
    else:
        ins = [np.concatenate([[BOS_ID], t]).astype(np.int64) for t in targets]
        outs = [np.concatenate([t, [EOS_ID]]).astype(np.int64) for t in targets]
        target_in, target_mask = pad_sequences(ins, PAD_ID)
        target_out, _ = pad_sequences(outs, PAD_ID)
    idx = torch.arange(B) if indices is None else torch.as_tensor(np.asarray(indices))
    return PairBatch(source, source_mask, target_in, target_out, target_mask, idx.long())


class PairBatcher(SequenceBatcher):
    """Resumable padded batches of pairs, bucketed by source + target length.

    Every option is ``SequenceBatcher``'s (the order of epoch ``e`` depends only on
    ``(seed, e)``; ``state_dict`` / ``load_state_dict`` for exact resume).

    Args:
        sources: ``n`` id arrays.  targets: ``n`` id arrays (no specials).

    >>> src = [np.array([4] * n) for n in (3, 1, 2)]
    >>> b = PairBatcher(src, src, batch_size=2, shuffle=False)
    >>> [batch.source.shape[1] for batch in b]
    [2, 3]
    """

    def __init__(
        self, sources: Sequence[np.ndarray], targets: Sequence[np.ndarray], **options: Any
    ) -> None:
        if len(sources) != len(targets):
            raise DataError(f"{len(targets)} targets for {len(sources)} sources")
        super().__init__(list(sources), None, **options)
        self._pair_targets = [np.asarray(t, dtype=np.int64) for t in targets]
        # Bucket on both sides: the decoder's time loop is as long as the longest target.
        self.lengths = self.lengths + np.array([len(t) + 1 for t in targets], dtype=np.int64)

    def _batch(self, index: int) -> PairBatch:  # type: ignore[override]
        idx = self.plan(self.epoch)[index]
        return make_pair_batch(
            [self._inputs[i] for i in idx], [self._pair_targets[i] for i in idx], idx.tolist()
        )
