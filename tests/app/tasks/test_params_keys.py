"""A key's model in the params task: which values it reads and how they are normalised."""

from __future__ import annotations

import numpy as np
import pytest

from rnnkit.app.tasks.params.keys import collect, fit_key
from rnnkit.data.events import Session


def test_dims_are_the_numbers_of_every_training_vector() -> None:
    rows = [[float(i), None if i == 3 else 5.0, 7.0] for i in range(12)]
    occ = collect([(Session("a", ["k"] * 12, None, rows), "f", 1)])
    key, why = fit_key("k", 3, occ["k"], "keys/000")
    assert why == "" and key is not None
    assert key.dims == [0, 2]  # the middle value was missing once: not modelled
    assert key.mean.tolist() == [5.5, 7.0]
    assert key.scale[0] == pytest.approx(np.std(np.arange(12.0)))
    assert key.scale[1] == 7.0  # constant: max(|mean|, 1), so any change counts
    x, missing = key.normalise(np.array([[5.5, np.nan, 14.0], [np.nan, 1.0, 7.0]]))
    assert x.tolist() == [[0.0, 1.0], [0.0, 0.0]] and missing == 1
    assert fit_key("k", 3, collect([(Session("b", ["k"], None, [rows[0]]), "f", 1)])["k"],
                    "d")[1] == "1 training vector(s), fewer than 10"  # fmt: skip


def test_statistics_of_values_whose_squares_overflow_are_finite() -> None:
    """One duration of 1e300 among ordinary ones: its square overflows float64, so the
    standard deviation was inf, the key's scale was written as null and the run's
    ``keys.json`` refused by every later command ("key 'k' is not valid")."""
    import json
    import statistics

    from rnnkit.app.tasks.params.keys import KeyModel
    from rnnkit.training.checkpoint import dumps_strict

    column = [1e300] + [float(v) for v in range(11)] + [-3e299]
    rows = [[v, 2.0] for v in column]
    key, why = fit_key("k", 2, collect([(Session("a", ["k"] * 13, None, rows), "f", 1)])["k"], "d")
    assert why == "" and key is not None
    # statistics computes with exact fractions: no overflow in its squares
    assert key.mean[0] == pytest.approx(statistics.fmean(column), rel=1e-12)
    assert key.scale[0] == pytest.approx(statistics.pstdev(column), rel=1e-12)
    assert key.mean[1] == 2.0 and key.scale[1] == 2.0
    back = KeyModel.from_json(json.loads(dumps_strict(key.to_json())))
    assert np.array_equal(back.scale, key.scale)
    x, _ = key.normalise(np.array([[1e300, 2.0]]))
    assert np.isfinite(x).all()


def test_vector_errors_read_the_device_once_a_batch(monkeypatch) -> None:
    """On a GPU (reads counted on the CPU, as the device would see them) each batch's
    predictions come back in one read: the mask is made on the host and moved with its
    host copy, so the recurrence's questions of it (lengths, prefix form) read nothing
    (made on the device, it was read back by them every batch)."""
    import sys
    from pathlib import Path

    import torch

    from rnnkit.app.config import TrainConfig
    from rnnkit.app.tasks.params.keys import vector_errors
    from rnnkit.app.tasks.regress import build_regressor
    from rnnkit.bptt.fused import use_fused
    from rnnkit.data.vectors import VectorSequence

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "training"))
    from host_reads import HostReads

    rng = np.random.default_rng(0)
    seqs = [
        VectorSequence(
            rng.normal(size=(int(rng.integers(2, 8)), 2)).astype(np.float32), None, "f", i
        )
        for i in range(9)
    ]
    torch.manual_seed(0)
    model = build_regressor(TrainConfig(train="x", hidden=8), 2, 2).eval()
    alone = [vector_errors(model, [s], batch_size=1)[0][0] for s in seqs]
    with use_fused("fused"), HostReads(model) as counted:
        errors, preds = vector_errors(model, seqs, batch_size=4)
    assert counted.count == 3, dict(counted.sites)  # 9 sequences, batches of 4
    assert [len(p) for p in preds] == [len(s.values) - 1 for s in seqs]
    for got, want in zip(errors, alone, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
