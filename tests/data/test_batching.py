"""Bucketed sequence batching: exact contents, coverage, determinism, resume; the stream
batcher's names at their old place."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rnnkit.data import batching, streams
from rnnkit.data.batching import SequenceBatcher, lm_pairs, pad_sequences
from rnnkit.errors import CheckpointError, ConfigError, DataError

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


def test_stream_names_still_import_from_batching():
    assert batching.StreamBatcher is streams.StreamBatcher
    assert batching.StreamBatch is streams.StreamBatch


def test_to_device_on_the_cpu_is_the_tensor_itself():
    from rnnkit.data.batching import to_device

    t = torch.arange(6).view(2, 3)
    assert to_device(t, "cpu") is t
    assert to_device(t, torch.device("cpu")) is t


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_to_device_to_a_gpu_copies_without_waiting_and_the_values_arrive():
    from rnnkit.data.batching import to_device

    t = torch.arange(10_000).view(100, 100)
    torch.cuda.set_sync_debug_mode("error")  # a synchronizing copy would raise here
    try:
        on_gpu = to_device(t, "cuda")
    finally:
        torch.cuda.set_sync_debug_mode("default")
    t.zero_()  # the source may change at once: the copy came from a pinned copy of it
    assert on_gpu.device.type == "cuda" and not t.is_pinned()
    assert torch.equal(on_gpu.cpu(), torch.arange(10_000).view(100, 100))


def test_a_negative_seed_is_read_as_torch_reads_it():
    # ``--seed -1`` reaches the batcher of every task; torch takes it as 2**64 - 1
    seqs = [np.arange(n) for n in (3, 1, 4, 1, 5, 9, 2, 6)]
    orders = [
        [b.indices.tolist() for b in SequenceBatcher(seqs, batch_size=2, seed=seed)]
        for seed in (-1, 2**64 - 1, 0)
    ]
    assert orders[0] == orders[1] != orders[2]
    with pytest.raises(ConfigError, match="seed must be an integer"):
        SequenceBatcher(seqs, batch_size=2, seed=1.5)
