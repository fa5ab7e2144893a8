"""The report's gradient section: what it draws is what the diagnostics give, from as few
runs of the first layer as it needs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import rnnkit.diagnostics.contributions as contributions_module
from rnnkit.app.config import TrainConfig
from rnnkit.app.report.flow import EXACT_WIDTH
from rnnkit.app.report.lm import lm_gradient_section
from rnnkit.app.report.run import Run
from rnnkit.diagnostics import (
    jacobian_norms,
    lag_contributions,
    plots,
    state_gradient_norms,
    step_contributions,
)
from rnnkit.metrics.losses import sequence_cross_entropy
from rnnkit.models import ModelSpec, build_language_model


@pytest.mark.parametrize(
    ("cell", "hidden", "steps"), [("rnn", 6, 40), ("lstm", 40, 12), ("gru", EXACT_WIDTH + 1, 5)]
)
def test_gradient_section_runs_the_first_layer_twice_with_the_same_figures(
    cell, hidden, steps, count_calls, monkeypatch
):
    """The section ran the first layer 5 times (both state gradients, the Jacobians, the
    step and the lag contributions each ran it); the full windows and their first 4 × 32
    steps are each run once now, and every figure is that of the separate calls, exactly
    (a GRU wider than ``EXACT_WIDTH`` takes the power iteration)."""
    torch.manual_seed(0)
    model = build_language_model(ModelSpec(cell=cell, hidden=hidden, embedding=5), 11).eval()
    batch = torch.randint(0, 11, (6, steps + 1))
    drawn: dict[str, list] = {"flow": [], "bars": []}
    real_flow, real_bars = plots.plot_gradient_flow, plots.projected_contributions

    def flow(lines, J, *args, **kwargs):
        drawn["flow"].append((dict(lines), J))
        return real_flow(lines, J, *args, **kwargs)

    def bars(weights, *args, **kwargs):
        drawn["bars"].append(weights)
        return real_bars(weights, *args, **kwargs)

    monkeypatch.setattr(plots, "plot_gradient_flow", flow)
    monkeypatch.setattr(plots, "projected_contributions", bars)
    runs = count_calls(contributions_module, "forward_pass")
    run = Run(Path("."), TrainConfig(train="x"), {}, {}, [])
    lm_gradient_section(run, model, batch, "the test's windows")
    # the gradients' two runs, and the gate-saturation table's run of the stack (one layer)
    assert runs["n"] == 2 + 1

    first = model.encoder.layers[0]
    inputs, targets = batch[:, :-1], batch[:, 1:]
    with torch.no_grad():
        x = model.embedding(inputs)
    T = inputs.shape[1]
    Bs, Ts = 4, min(T, 32)

    def loss(tgt):  # one layer: its outputs go straight to the head
        return lambda h: sequence_cross_entropy(model.head(h), tgt)

    def loss_last(h):
        return sequence_cross_entropy(model.head(h)[:, -1:], targets[:, -1:])

    ((lines, J),) = drawn["flow"]
    g_all, g_last = lines.values()
    assert torch.equal(
        torch.from_numpy(g_all), state_gradient_norms(first, x, loss_fn=loss(targets))
    )
    assert torch.equal(torch.from_numpy(g_last), state_gradient_norms(first, x, loss_fn=loss_last))
    method = "power" if hidden > EXACT_WIDTH else "exact"
    old_J = jacobian_norms(first, x[:Bs, :Ts], method=method, iterations=10)
    assert torch.equal(torch.from_numpy(J), old_J)
    steps_hh, lags_hh = drawn["bars"]
    assert torch.equal(steps_hh, step_contributions(first, x, loss_fn=loss(targets)).weight_hh)
    old_lags = lag_contributions(first, x[:Bs, :Ts], loss_fn=loss(targets[:Bs, :Ts]))
    assert torch.equal(lags_hh, old_lags.weight_hh)
    assert runs["n"] == 3 + 5  # the separate calls, as the section made them: a run each


RUNS = {
    # the class's initial state (init, both) and the class beside every token (input, both)
    **{
        f"condition-{c}": lambda d, c=c: ["--condition", c, "--train", str(d / "labels.tsv")]
        for c in ("init", "input", "both")
    },
    # the steps left beside every token; the loss reads each whole line's </s>
    "length-predict": lambda d: ["--length", "predict", "--train", str(d / "text.txt")],
}


@pytest.mark.parametrize("case", list(RUNS))
def test_a_conditional_or_length_models_bars_are_its_backward_pass(
    case, task_data, run_cli, tmp_path
):
    """Models whose stack reads more than the tokens: the section gives it what the model
    does, and the bars add up to the model's own backward pass (without the initial state
    the `init` and `both` cases are 3.5 % off; without the steps left, `length-predict`)."""
    import html
    import re

    from rnnkit.app.report.page import render_report

    out = tmp_path / "run"
    code, _, err = run_cli(
        "train", "--task", "lm", *RUNS[case](task_data), "--bptt", "full", "--layers", "2",
        "--cell", "lstm", "--steps", "3", "--hidden", "8", "--no-report", "-q", "--out", str(out),
    )  # fmt: skip
    assert code == 0, err
    body = html.unescape(render_report(out)).split('<section id="gradients">')[1]
    body = body.split("</section>")[0]
    assert body.count("<img") == 3
    assert re.search(r"On \d+ lines of (labels\.tsv, each with its class|text\.txt, whole)", body)

    def figure(label: str) -> float:
        found = re.search(re.escape(label) + r"</t[hd]>\s*<td[^>]*>([^<]*)</td>", body)
        assert found is not None, label
        return float(found.group(1))

    total = figure("‖∂L/∂W_hh‖: sum of the bars")
    assert total > 0
    assert total == pytest.approx(figure("‖∂L/∂W_hh‖: backward pass of the model"), rel=2e-3)
