"""RecordedRun: one run of a direction, the numbers of the separate functions."""

from __future__ import annotations

import pytest
import torch
from jacobian_cases import MASK, make

import rnnkit.diagnostics.contributions as contributions_module
from rnnkit.diagnostics import (
    RecordedRun,
    jacobian_norms,
    lag_contributions,
    state_gradient_norms,
    step_contributions,
)
from rnnkit.layers.recurrent import Recurrent


@pytest.mark.parametrize(
    ("name", "reverse", "zoneout", "window", "batch_first"),
    [
        ("rnn_tanh", False, 0.0, None, True),
        ("lstm", True, 0.3, 2, True),
        ("gru_candidate_before", False, 0.0, 3, False),
        ("gru_keep_after", True, 0.2, None, True),
        ("ln_lstm", True, 0.3, 2, True),
        ("ln_gru", False, 0.0, None, False),
    ],
)
def test_one_run_answers_as_the_separate_calls(
    name, reverse, zoneout, window, batch_first, count_calls
):
    cell, x = make(name)
    mask = MASK if batch_first else MASK.T
    x = x if batch_first else x.transpose(0, 1)
    source = Recurrent(cell, reverse=reverse)
    kw = {"mask": mask, "zoneout": zoneout, "batch_first": batch_first}
    every, last = (lambda h: (h**2).sum()), (lambda h: h.sum() * 0.5)
    runs = count_calls(contributions_module, "forward_pass")
    recorded = RecordedRun(source, x, **kw)
    got = (
        recorded.state_gradient_norms(loss_fn=every),
        recorded.state_gradient_norms(loss_fn=last),
        recorded.step_contributions(loss_fn=every, window=window),
        recorded.lag_contributions(loss_fn=last, window=window),
        recorded.jacobian_norms(start=1, method="exact"),
        recorded.jacobian_norms(method="power", iterations=5, seed=3),
    )
    assert runs["n"] == 1
    want = (
        state_gradient_norms(source, x, loss_fn=every, **kw),
        state_gradient_norms(source, x, loss_fn=last, **kw),
        step_contributions(source, x, loss_fn=every, window=window, **kw),
        lag_contributions(source, x, loss_fn=last, window=window, **kw),
        jacobian_norms(source, x, start=1, method="exact", **kw),
        jacobian_norms(source, x, method="power", iterations=5, seed=3, **kw),
    )
    assert runs["n"] == 7
    B, T = MASK.shape
    assert recorded.shape == (B, T)
    for a, b in zip(got[:2] + got[4:], want[:2] + want[4:], strict=True):
        assert torch.equal(a, b)
    for a, b in zip(got[2:4], want[2:4], strict=True):
        assert a.parameters().keys() == b.parameters().keys()
        for field, left in a.parameters().items():
            assert torch.equal(left, b.parameters()[field])


def test_out_of_range_arguments_are_named_as_by_the_functions():
    cell, x = make("rnn_tanh")
    recorded = RecordedRun(cell, x)
    with pytest.raises(ValueError, match=r"^window must be a positive integer or None, got 0$"):
        recorded.step_contributions(loss_fn=lambda h: h.sum(), window=0)
    with pytest.raises(ValueError, match=r"^method must be one of"):
        recorded.jacobian_norms(method="svd")
    with pytest.raises(ValueError, match=r"^give exactly one of d_outputs and loss_fn$"):
        recorded.lag_contributions()
