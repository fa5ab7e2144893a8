"""Stream and bucketed sequence batching: exact contents, coverage, determinism, resume."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch

from rnnkit.data.batching import (
    SequenceBatcher,
    StreamBatcher,
    lm_pairs,
    pad_sequences,
)
from rnnkit.errors import CheckpointError, ConfigError, DataError

# ---- StreamBatcher -----------------------------------------------------------------------


def test_stream_batches_are_exact_for_arange():
    # N = 10, B = 2: L = (10 - 1) // 2 = 4 inputs per row; rows 0-3 and 4-7, targets +1.
    batches = list(StreamBatcher(np.arange(10), batch_size=2, segment_len=3))
    assert len(batches) == 2
    first, last = batches
    assert first.inputs.tolist() == [[0, 1, 2], [4, 5, 6]]
    assert first.targets.tolist() == [[1, 2, 3], [5, 6, 7]]
    assert last.inputs.tolist() == [[3], [7]]  # shorter last segment, no padding
    assert last.targets.tolist() == [[4], [8]]
    for b in batches:
        assert b.inputs.dtype == b.targets.dtype == torch.int64
        assert b.mask.dtype == b.starts.dtype == b.reset.dtype == torch.bool
        assert b.mask.all()
    assert first.starts.tolist() == [[True, False, False], [True, False, False]]
    assert first.reset.tolist() == [True, True]
    assert not last.starts.any() and not last.reset.any()


def test_stream_rows_are_contiguous_and_every_target_is_the_next_token():
    ids = np.random.default_rng(0).integers(0, 50, size=1001)
    batcher = StreamBatcher(ids, batch_size=4, segment_len=7)
    inputs = torch.cat([b.inputs for b in batcher], dim=1)  # (B, L)
    targets = torch.cat([b.targets for b in batcher], dim=1)
    assert inputs.shape == (4, 250) and len(batcher) == 36
    assert inputs.flatten().tolist() == ids[:1000].tolist()
    assert targets.flatten().tolist() == ids[1:1001].tolist()


def test_document_boundaries_mark_resets_inside_segments():
    eos = 3
    ids = np.array([5, 6, eos, 7, 8, 9, eos, 5, eos, 6, 7, 8, 9])
    first, second = list(StreamBatcher(ids, batch_size=2, segment_len=4, boundary_id=eos))
    # rows: [5 6 3 7 8 9] and [3 5 3 6 7 8]
    assert first.starts.tolist() == [[True, False, True, False], [True, False, True, False]]
    assert second.starts.tolist() == [[False, False], [False, False]]
    assert second.reset.tolist() == [False, False]
    ids2 = np.array([5, 6, 7, eos, 9, 5, 6, 7, 8])
    _, b2 = list(StreamBatcher(ids2, batch_size=2, segment_len=3, boundary_id=eos))
    assert b2.inputs.tolist() == [[eos], [7]] and b2.reset.tolist() == [True, False]


def test_stream_resume_equals_uninterrupted_run_across_epochs():
    ids = np.arange(200)
    reference = StreamBatcher(ids, batch_size=3, segment_len=8)
    expected = [b.inputs for _ in range(2) for b in reference]  # two whole epochs
    for stop in (0, 1, 5, len(reference)):
        first = StreamBatcher(ids, batch_size=3, segment_len=8)
        got = [b.inputs for b in itertools.islice(first, stop)]
        resumed = StreamBatcher(ids, batch_size=3, segment_len=8)
        resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
        while len(got) < len(expected):
            got += [b.inputs for b in resumed]  # the rest of the epoch, then whole epochs
        assert len(got) == len(expected)
        assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
        assert (resumed.epoch, resumed.position) == (2, 0)


def test_stream_state_mismatch_and_bad_arguments():
    state = StreamBatcher(np.arange(50), 2, 5).state_dict()
    with pytest.raises(CheckpointError, match="segment_len"):
        StreamBatcher(np.arange(50), 2, 6).load_state_dict(state)
    with pytest.raises(CheckpointError, match="position"):
        StreamBatcher(np.arange(50), 2, 5).load_state_dict({**state, "position": 99})
    with pytest.raises(DataError, match="too short"):
        StreamBatcher(np.arange(4), batch_size=4, segment_len=2)
    with pytest.raises(DataError, match="1-D"):
        StreamBatcher(np.zeros((3, 3), dtype=int), 1, 1)
    with pytest.raises(DataError, match="integer"):
        StreamBatcher(np.zeros(9), 1, 1)
    with pytest.raises(ConfigError, match="segment_len"):
        StreamBatcher(np.arange(9), 1, 0)


# ---- helpers -------------------------------------------------------------------------------


def test_lm_pairs_and_pad_sequences():
    x, y = lm_pairs(np.array([9, 8, 7]), bos=2, eos=3)
    assert x.tolist() == [2, 9, 8, 7] and y.tolist() == [9, 8, 7, 3]
    assert x.dtype == y.dtype == np.int64
    x0, y0 = lm_pairs([], bos=2, eos=3)
    assert x0.tolist() == [2] and y0.tolist() == [3]
    ids, mask = pad_sequences([np.array([1]), np.array([4, 5, 6])], pad_id=0)
    assert ids.tolist() == [[1, 0, 0], [4, 5, 6]]
    assert mask.tolist() == [[True, False, False], [True, True, True]]


# ---- SequenceBatcher -----------------------------------------------------------------------


def _sequences(n: int = 103, seed: int = 1) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(4, 30, size=int(k)) for k in rng.integers(1, 40, size=n)]


def _epoch(batcher: SequenceBatcher) -> list[list[int]]:
    return [b.indices.tolist() for b in batcher]


def test_every_sequence_appears_exactly_once_per_epoch_with_correct_padding():
    seqs = _sequences()
    pairs = [lm_pairs(s, bos=2, eos=3) for s in seqs]
    batcher = SequenceBatcher(
        [x for x, _ in pairs], [y for _, y in pairs], batch_size=8, seed=3, chunk_size=20
    )
    assert batcher.chunk_size == 24  # rounded up to whole batches
    assert len(batcher) == 13  # ceil(103 / 8)
    for _ in range(3):
        seen = []
        sizes = []
        for b in batcher:
            idx = b.indices.tolist()
            seen += idx
            sizes.append(len(idx))
            assert b.inputs.shape == b.targets.shape == b.mask.shape
            assert b.lengths.tolist() == [len(pairs[i][0]) for i in idx]
            assert b.mask.sum(1).tolist() == b.lengths.tolist()
            assert b.inputs.shape[1] == max(b.lengths.tolist())
            for row, i in enumerate(idx):
                n = len(pairs[i][0])
                assert b.inputs[row, :n].tolist() == pairs[i][0].tolist()
                assert b.targets[row, :n].tolist() == pairs[i][1].tolist()
                assert not b.inputs[row, n:].any() and not b.targets[row, n:].any()
        assert sorted(seen) == list(range(len(seqs)))
        assert sorted(sizes) == [7] + [8] * 12  # only one partial batch per epoch
    assert batcher.epoch == 3


def test_sequence_order_is_deterministic_under_seed_and_varies_by_epoch():
    seqs = _sequences()
    a = SequenceBatcher(seqs, batch_size=8, seed=11)
    b = SequenceBatcher(seqs, batch_size=8, seed=11)
    c = SequenceBatcher(seqs, batch_size=8, seed=12)
    a0, a1 = _epoch(a), _epoch(a)
    assert a0 == _epoch(b) and a1 == _epoch(b)
    assert a0 != a1 and a0 != _epoch(c)
    plain = SequenceBatcher(seqs, batch_size=8, shuffle=False, bucket=False)
    assert _epoch(plain) == [list(range(i, min(i + 8, 103))) for i in range(0, 103, 8)]


def test_bucketing_reduces_padding():
    seqs = _sequences(n=400)
    bucketed = SequenceBatcher(seqs, batch_size=16, seed=0)
    random = SequenceBatcher(seqs, batch_size=16, seed=0, bucket=False)
    real = sum(len(s) for s in seqs)
    padded = sum(b.mask.numel() for b in bucketed)
    assert bucketed.padding_efficiency(epoch=0) == pytest.approx(real / padded)
    assert bucketed.padding_efficiency(epoch=0) > 0.9
    assert random.padding_efficiency(epoch=0) < 0.7


def test_sequence_resume_mid_epoch_equals_uninterrupted_run():
    seqs = _sequences()
    expected = []
    reference = SequenceBatcher(seqs, batch_size=8, seed=5)
    for _ in range(2):
        expected += _epoch(reference)
    interrupted = SequenceBatcher(seqs, batch_size=8, seed=5)
    got = []
    for i, b in enumerate(interrupted):
        got.append(b.indices.tolist())
        if i == 4:
            state = interrupted.state_dict()
            break
    assert state["position"] == 5 and state["epoch"] == 0
    resumed = SequenceBatcher(seqs, batch_size=8, seed=5)
    resumed.load_state_dict(state)
    got += _epoch(resumed) + _epoch(resumed)
    assert got == expected


def test_sequence_drop_last_and_bad_inputs():
    seqs = _sequences()
    batcher = SequenceBatcher(seqs, batch_size=8, drop_last=True, seed=0)
    assert len(batcher) == 12
    assert all(len(b.indices) == 8 for b in batcher)
    state = batcher.state_dict()
    with pytest.raises(CheckpointError, match="seed"):
        SequenceBatcher(seqs, batch_size=8, drop_last=True, seed=1).load_state_dict(state)
    with pytest.raises(DataError, match="sequence 1 is empty"):
        SequenceBatcher([[1], [], [2]], batch_size=2)
    with pytest.raises(DataError, match="sequence 0: 1 targets for 2 inputs"):
        SequenceBatcher([[1, 2]], [[1]], batch_size=1)
    with pytest.raises(DataError, match="no sequences"):
        SequenceBatcher([], batch_size=2)
    with pytest.raises(ConfigError, match="batch_size"):
        SequenceBatcher([[1]], batch_size=0)
    without = next(iter(SequenceBatcher([[1, 2]], batch_size=1)))
    assert without.targets is None
