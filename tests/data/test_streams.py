"""Stream batching: exact segments, contiguous rows, document boundaries, resume."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch

from rnnkit.data.streams import StreamBatcher
from rnnkit.errors import CheckpointError, ConfigError, DataError


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
