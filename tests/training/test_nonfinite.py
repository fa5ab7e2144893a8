"""Non-finite values: skip up to MAX_SKIPPED_STEPS in a row, stop otherwise; float16
overflows left to the GradScaler up to MAX_SCALER_SKIPS in a row."""

from __future__ import annotations

import math

import pytest
import torch

from rnnkit.training.nonfinite import (
    MAX_SCALER_SKIPS,
    MAX_SKIPPED_STEPS,
    NonFiniteGuard,
    TrainingDiverged,
)


def test_finite_values_pass_and_stop_mode_raises_naming_the_step():
    events: list[dict] = []
    guard = NonFiniteGuard("stop", events.append)
    assert guard.check(1.5, "the training loss", (1, 1, 0))
    with pytest.raises(TrainingDiverged, match=r"the gradient norm is inf at step 4 \(batch 2 of "):
        guard.check(math.inf, "the gradient norm", (4, 2, 1))
    assert events == []


def test_skip_mode_counts_bad_steps_in_a_row_and_a_good_step_resets_them():
    events: list[dict] = []
    guard = NonFiniteGuard("skip", events.append)
    for step in range(1, MAX_SKIPPED_STEPS):
        assert not guard.check(math.nan, "the training loss", (step, step, 0))
    guard.good_step()
    for step in range(1, MAX_SKIPPED_STEPS):
        assert not guard.check(math.nan, "the training loss", (step, step, 0))
    with pytest.raises(TrainingDiverged, match=f"{MAX_SKIPPED_STEPS} steps in a row were skipped"):
        guard.check(math.nan, "the training loss", (99, 1, 0))
    assert [e["event"] for e in events] == ["skipped"] * (2 * MAX_SKIPPED_STEPS - 1)


def test_an_overflow_is_the_scalers_skip_until_too_many_in_a_row():
    param = torch.nn.Parameter(torch.ones(2))
    optimizer = torch.optim.SGD([param], lr=1.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    events: list[dict] = []
    guard = NonFiniteGuard("stop", events.append)
    param.grad = torch.tensor([1.0, 2.0])
    assert not guard.scaler_skipped(scaler, optimizer, [param], (1, 1, 0))
    for step in range(1, MAX_SCALER_SKIPS):
        scaler.scale((param * math.inf).sum()).backward()
        scaler.unscale_(optimizer)
        assert guard.scaler_skipped(scaler, optimizer, [param], (step, step, 0))
        param.grad = None
    assert torch.equal(param.detach(), torch.ones(2))  # no step was taken
    assert guard.scaler_skips == guard.scaler_streak == MAX_SCALER_SKIPS - 1
    assert events[-1]["scale"] == 2.0 ** (16 - (MAX_SCALER_SKIPS - 1))  # halved each time
    scaler.scale((param * math.inf).sum()).backward()
    scaler.unscale_(optimizer)
    with pytest.raises(TrainingDiverged, match=f"overflowed float16 {MAX_SCALER_SKIPS} steps"):
        guard.scaler_skipped(scaler, optimizer, [param], (99, 1, 0))


def test_before_any_update_the_learning_rate_is_not_blamed():
    """A non-finite loss at the first step comes from the data or the starting weights:
    no update has happened (a regress value of 1e30 said "lower --lr")."""
    guard = NonFiniteGuard("stop", lambda event: None, lambda name: "--" + name)
    with pytest.raises(TrainingDiverged, match=r"step 1 .*\(before any update, so not the lea"):
        guard.check(math.inf, "the training loss", (1, 1, 0))
    guard.good_step()
    with pytest.raises(TrainingDiverged, match=r"step 2 .*\(lower --lr or set --clip_norm\)$"):
        guard.check(math.inf, "the training loss", (2, 2, 0))


def test_the_advice_lowers_a_clip_norm_that_is_set():
    """With clipping on, "set --clip-norm" was advised all the same (the command line's
    default is 5.0): the advice is to lower it, naming its value as the user gave it."""
    for argument, clip_norm, expected in [
        (
            lambda name: "--" + name.replace("_", "-"),
            5.0,
            "lower --lr or lower --clip-norm (now 5)",
        ),
        (lambda name: name, 0.5, "lower the optimizer's lr or lower clip_norm (now 0.5)"),
        (lambda name: "--" + name.replace("_", "-"), None, "lower --lr or set --clip-norm"),
    ]:
        guard = NonFiniteGuard("stop", lambda event: None, argument, clip_norm)
        guard.good_step()
        with pytest.raises(TrainingDiverged) as caught:
            guard.check(math.nan, "the gradient norm", (2, 2, 0))
        assert str(caught.value).endswith(f"({expected})")
