"""‖∂h_t/∂h_k‖₂ against autograd and under the bound; the gradient-flow bundle."""

from __future__ import annotations

import json

import pytest
import torch
from jacobian_cases import CELLS, DT, MASK, flat_run, make, zero_state

import rnnkit.diagnostics.contributions as contributions_module
import rnnkit.diagnostics.jacobian as jacobian_module
from rnnkit import RNNCell
from rnnkit.diagnostics import (
    gradient_flow,
    jacobian_norms,
    real_steps,
    rnn_jacobian_bound,
    spectral_norm,
    state_gradient_norms,
    step_jacobians,
)
from rnnkit.layers.recurrent import Recurrent


@pytest.mark.parametrize(
    ("nonlinearity", "scale", "method"),
    [
        ("tanh", 0.5, "exact"),
        ("tanh", 1.0, "exact"),
        ("tanh", 3.0, "exact"),
        ("relu", 0.5, "exact"),
        ("relu", 3.0, "exact"),
        ("tanh", 0.5, "power"),
        ("tanh", 3.0, "power"),
    ],
)
def test_measured_norms_never_exceed_the_bound(nonlinearity, scale, method) -> None:
    torch.manual_seed(1)
    cell = RNNCell(3, 6, nonlinearity=nonlinearity).to(DT)
    with torch.no_grad():
        cell.weight_hh.mul_(scale * 2.0)
    x = torch.randn(3, 7, 3, dtype=DT)
    for start in (0, 3):
        norms = jacobian_norms(cell, x, start=start, mask=MASK, method=method)
        # Masked steps hold the state (Jacobian I): the exponent counts real steps only.
        counts = real_steps(cell, x, start=start, mask=MASK)
        if start == 0:
            assert counts[1].tolist() == [0, 1, 1, 2, 3, 3, 4, 4]  # row 1: 1010110 → cumsum
        bound = rnn_jacobian_bound(cell, counts)
        assert bool((norms <= bound * (1 + 1e-12)).all()), (norms, bound)
        full = jacobian_norms(cell, x, start=start, method=method)  # no mask: t − k
        assert bool((full <= rnn_jacobian_bound(cell, range(8 - start)) * (1 + 1e-12)).all())
        assert torch.equal(norms[:, 0], torch.ones(3, dtype=DT))


# ---- Jacobian norms against autograd of the whole chain ---------------------------------
@pytest.mark.parametrize("name", list(CELLS))
def test_exact_norms_equal_the_autograd_jacobian(name: str) -> None:
    cell, x = make(name)
    B, T = MASK.shape
    H = cell.hidden_size
    start = 2
    with torch.no_grad():
        s_start = flat_run(cell, x, zero_state(cell, B), MASK)[start]
    for full_state in (False, True) if cell.is_lstm else (False,):
        width = s_start.shape[1] if full_state else H
        got = jacobian_norms(cell, x, start=start, mask=MASK, full_state=full_state)
        power = jacobian_norms(
            cell, x, start=start, mask=MASK, full_state=full_state, method="power"
        )
        for j, t in enumerate(range(start, T + 1)):
            J = torch.autograd.functional.jacobian(
                lambda s, t=t: flat_run(cell, x, s, MASK, start)[t - start], s_start
            )  # (B, S, B, S)
            for b in range(B):
                want = torch.linalg.matrix_norm(J[b, :width, b, :width], ord=2)
                assert float(got[b, j]) == pytest.approx(float(want), rel=1e-10, abs=1e-14)
                assert float(power[b, j]) <= float(want) * (1 + 1e-10)  # ‖Pv‖ never exceeds
                assert float(power[b, j]) == pytest.approx(float(want), rel=1e-6, abs=1e-12)


@pytest.mark.parametrize("name", list(CELLS))
@pytest.mark.parametrize("rows_at_once", ["all", "three", "one pass a row"])
def test_step_jacobians_equal_autograds_of_each_step(name, rows_at_once, monkeypatch) -> None:
    # the rows of J_t come from one backward pass of the batch repeated (all rows at once,
    # or three at a time: a bound that does not divide S), or, where the step's input is
    # wide, from one pass per row; oracle: autograd's Jacobian of the plain step at the
    # recorded states
    cell, x = make(name)
    B, T = MASK.shape
    S = zero_state(cell, B).shape[1]
    if rows_at_once == "three":
        monkeypatch.setattr(jacobian_module, "_ROWS_AT_ONCE", 3 * B * (S + x.shape[2]))
    elif rows_at_once == "one pass a row":
        monkeypatch.setattr(jacobian_module, "_REPEAT_WORK", 0)
    got = step_jacobians(cell, x, mask=MASK)
    with torch.no_grad():
        states = flat_run(cell, x, zero_state(cell, B), MASK)
    eye = torch.eye(S, dtype=DT)
    for t in range(T):
        J = torch.autograd.functional.jacobian(
            lambda s, t=t: flat_run(cell, x[:, t : t + 1], s, torch.ones(B, 1, dtype=torch.bool))[
                1
            ],
            states[t],
        )  # (B, S, B, S)
        for b in range(B):
            want = J[b, :, b, :] if MASK[b, t] else eye
            torch.testing.assert_close(got[t, b], want, rtol=1e-12, atol=1e-14)


def test_step_jacobians_hold_at_masked_steps() -> None:
    cell, x = make("gru_candidate_before")
    J = step_jacobians(cell, x, mask=MASK)
    assert J.shape == (7, 3, 4, 4)
    eye = torch.eye(4, dtype=DT)
    for t, b in torch.nonzero(~MASK.T).tolist():
        assert torch.equal(J[t, b], eye)
    norms = jacobian_norms(cell, x, mask=MASK)
    assert float(norms[2, 4]) == float(norms[2, 7])  # row 2 ends at position 2: held


@pytest.mark.parametrize("method", ["exact", "power"])
def test_jacobian_norms_run_the_direction_once(method, monkeypatch) -> None:
    """One forward run per call, whichever method (the exact one reads the step Jacobians
    of that same run), with the norms of ``step_jacobians``' own run."""
    cell, x = make("lstm")
    calls = []
    real = jacobian_module.run_direction

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(jacobian_module, "run_direction", counted)
    norms = jacobian_norms(cell, x, start=1, mask=MASK, method=method)
    assert len(calls) == 1
    J = step_jacobians(cell, x, mask=MASK)  # its own run
    assert len(calls) == 2
    P = torch.eye(J.shape[-1], dtype=DT).expand(J.shape[1], -1, -1)
    H = cell.hidden_size
    for j, t in enumerate(range(1, J.shape[0]), start=1):
        P = J[t] @ P
        want = torch.linalg.matrix_norm(P[:, :H, :H], ord=2)
        torch.testing.assert_close(
            norms[:, j], want, rtol=1e-6 if method == "power" else 0, atol=1e-12
        )


def test_power_iteration_large_hidden() -> None:
    torch.manual_seed(0)
    cell = RNNCell(3, 24).to(DT)
    x = torch.randn(2, 4, 3, dtype=DT)
    exact = jacobian_norms(cell, x)
    power = jacobian_norms(cell, x, method="power")
    torch.testing.assert_close(power, exact, rtol=1e-6, atol=1e-12)
    with pytest.raises(ValueError, match="method"):
        jacobian_norms(cell, x, method="svd")
    with pytest.raises(ValueError, match="start"):
        jacobian_norms(cell, x, start=5)


# ---- ∂L/∂h_k --------------------------------------------------------------------------
def test_gradient_flow_bundle_is_json_ready() -> None:
    cell, x = make("rnn_tanh")
    flow = gradient_flow(cell, x, loss_fn=lambda h: h.sum(), mask=MASK, start=1)
    assert flow.state_grad_norms.shape == (8,)
    assert flow.jacobian_norms.shape == flow.bound.shape == flow.real_steps.shape == (3, 7)
    assert flow.weight_norm == pytest.approx(spectral_norm(cell.weight_hh))
    assert bool((flow.jacobian_norms <= flow.bound * (1 + 1e-12)).all())
    assert flow.real_steps[2].tolist() == [0, 1, 2, 2, 2, 2, 2]
    data = json.loads(json.dumps(flow.to_dict()))
    assert data["start"] == 1 and len(data["bound"][0]) == 7
    lstm, x = make("lstm")
    flow = gradient_flow(lstm, x, loss_fn=lambda h: h.sum(), method="power")
    assert flow.bound is None and json.dumps(flow.to_dict())


def test_a_whole_layer_is_a_type_error_naming_the_part_to_give() -> None:
    """``gradient_flow`` of a bidirectional layer's layer raised AttributeError
    ('Bidirectional' object has no attribute 'hidden_size'); every diagnostic now says
    which part of a layer is a source."""
    from rnnkit import LSTM

    x = torch.randn(2, 5, 3)
    loss = lambda h: h[:, -1].sum()  # noqa: E731
    bi, one = LSTM(3, 4, bidirectional=True), LSTM(3, 4)
    for function in (gradient_flow, state_gradient_norms, jacobian_norms):
        kw = {} if function is jacobian_norms else {"loss_fn": loss}
        with pytest.raises(
            TypeError, match=r"got Bidirectional: give one of its directions, \.directions\[0\]"
        ):
            function(bi.layers[0], x, **kw)
        with pytest.raises(
            TypeError, match=r"got LSTM: give one direction of one of its layers, \.layers\[i\]"
        ):
            function(one, x, **kw)
    flow = gradient_flow(bi.layers[0].directions[1], x, loss_fn=loss)  # what it says works
    assert flow.state_grad_norms.shape == (6,)


@pytest.mark.parametrize(("option", "value"), [("iterations", 0), ("iterations", -5), ("block", 0)])
def test_power_iteration_counts_below_one_are_refused(option, value) -> None:
    # iterations=0 returned the random start's estimate (0.94 where the norm is 1.07);
    # block=0 was taken as 1.
    cell, x = RNNCell(2, 40), torch.randn(2, 6, 2)
    with pytest.raises(ValueError, match=f"^{option} must be a positive integer, got {value}$"):
        jacobian_norms(cell, x, method="power", **{option: value})


@pytest.mark.parametrize(
    ("name", "method", "reverse", "zoneout"),
    [
        ("rnn_tanh", "exact", False, 0.0),
        ("lstm", "exact", True, 0.0),
        ("lstm", "power", False, 0.3),
        ("gru_candidate_before", "power", True, 0.0),
        ("gru_keep_after", None, False, 0.2),
    ],
)
def test_gradient_flow_runs_the_direction_once(name, method, reverse, zoneout, count_calls):
    """It ran the recurrence twice (once for the state gradients, once for the Jacobians'
    norms); one run now, and the numbers of the two separate calls it made, exactly."""
    cell, x = make(name)
    source = Recurrent(cell, reverse=reverse)
    kw = {"mask": MASK, "zoneout": zoneout}
    runs = count_calls(contributions_module, "forward_pass")  # run_direction's recurrence
    flow = gradient_flow(source, x, loss_fn=lambda h: (h**2).sum(), start=1, method=method, **kw)
    assert runs["n"] == 1
    grads = state_gradient_norms(source, x, loss_fn=lambda h: (h**2).sum(), **kw)
    norms = jacobian_norms(source, x, start=1, method=method or "exact", **kw)
    assert runs["n"] == 3  # the old way: a run for each
    assert torch.equal(flow.state_grad_norms, grads)
    assert torch.equal(flow.jacobian_norms, norms)
