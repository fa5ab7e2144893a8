"""The pictures: PNG bytes of the promised size, the data each picture draws, no warnings.

Checks read what was drawn (bar heights, image arrays, tick labels, axis scales) from the
figure's artists, never pixels. ``filterwarnings = error`` makes any matplotlib warning
(a missing glyph, a log axis with nothing positive, a layout that does not fit) a failure.
"""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch
from matplotlib.figure import Figure
from PIL import Image

from rnnkit import RNNCell
from rnnkit.diagnostics import gradient_flow, step_contributions
from rnnkit.diagnostics.plots import (
    display_token,
    plot_attention,
    plot_contributions,
    plot_grad_norms,
    plot_gradient_flow,
    plot_hidden_states,
    plot_losses,
    plot_next_symbol,
    projected_contributions,
    to_png,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(png: bytes) -> tuple[int, int]:
    assert png[:8] == PNG_SIGNATURE
    with Image.open(io.BytesIO(png)) as im:
        im.load()  # decodes every row: a truncated or corrupt PNG raises here
        assert im.format == "PNG"
        return im.size


def bars(fig: Figure) -> dict[str, list[float]]:
    return {c.get_label(): [p.get_height() for p in c] for c in fig.axes[0].containers}


def tick_texts(labels) -> list[str]:
    return [t.get_text() for t in labels]


RNG = np.random.default_rng(0)
EXAMPLES = {
    "losses": lambda: plot_losses(
        [50, 100, 150], [3.0, 2.0, 1.5], [100, 150], [2.1, 1.7], bits_per_char=True, baseline=1.8
    ),
    "grad_norms": lambda: plot_grad_norms([50, 100, 150], [0.3, 9.0, 2.0], clip_norm=5.0),
    "gradient_flow": lambda: plot_gradient_flow(
        np.geomspace(1e-5, 1, 21), np.geomspace(1, 1e-3, 11)[None], 0.9 ** np.arange(11)
    ),
    "contributions": lambda: plot_contributions(RNG.normal(size=30)),
    "attention": lambda: plot_attention(RNG.dirichlet(np.ones(5), 4), list("abcde"), list("wxyz")),
    "next_symbol": lambda: plot_next_symbol(
        RNG.dirichlet(np.ones(8), 12), list("abcdefgh"), list("hello world!"), top=5
    ),
    "hidden_states": lambda: plot_hidden_states(np.tanh(RNG.normal(size=(12, 10))), list("x" * 12)),
}


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_every_picture_is_a_png_of_its_figure_size(name):
    fig = EXAMPLES[name]()
    assert isinstance(fig, Figure)
    w, h = fig.get_size_inches()
    assert png_size(to_png(fig, dpi=50)) == (round(w * 50), round(h * 50))
    for ax in fig.axes:  # every panel has a title or belongs to a titled figure
        if ax.get_label() == "<colorbar>":
            continue
        assert ax.get_title() or ax.get_title(loc="left") or fig.get_suptitle()
        assert ax.get_xlabel() and ax.get_ylabel()


def test_to_png_size_follows_dpi_and_bytes_are_reproducible():
    fig = plot_losses([1, 2], [1.0, 0.5], width=4, height=3)
    png = to_png(fig, dpi=80)
    assert png_size(png) == (320, 240)
    assert to_png(fig, dpi=80) == png  # no timestamp in the file


def test_contribution_bars_add_up_to_the_drawn_total():
    values = np.array([0.5, -0.25, 1.0, 0.125, -2.0])
    fig = plot_contributions(values)
    drawn = bars(fig)
    assert drawn["contributions"] == pytest.approx(values.tolist(), abs=0)
    assert len(drawn["total"]) == 1
    assert math.fsum(drawn["contributions"]) == pytest.approx(drawn["total"][0], rel=1e-12)
    assert any("Σ" in t.get_text() for t in fig.axes[0].texts)
    assert "total" in tick_texts(fig.axes[0].get_xticklabels())


def test_contribution_total_must_match_the_bars():
    plot_contributions([1.0, 2.0], total=3.0 + 1e-12)
    with pytest.raises(ValueError, match="add up to 3"):
        plot_contributions([1.0, 2.0], total=4.0)
    with pytest.raises(ValueError, match="axis"):
        plot_contributions([1.0], axis="time")


def test_projected_contributions_of_a_real_gradient_sum_to_its_norm():
    """Step contributions of ∂L/∂W_hh from the explicit BPTT, projected: Σ c_k = ‖G‖, and
    ‖G‖ is the autograd gradient's norm; the bars drawn add up to the same total."""
    torch.manual_seed(0)
    cell = RNNCell(3, 4).double()
    x = torch.randn(2, 7, 3, dtype=torch.float64)
    parts = step_contributions(cell, x, loss_fn=lambda h: h.pow(2).sum())
    values, total = projected_contributions(parts.weight_hh)
    assert values.shape == (7,)
    assert math.fsum(values) == pytest.approx(total, rel=1e-12)
    h = torch.zeros(2, 4, dtype=torch.float64)
    loss = 0.0
    for t in range(7):
        h = cell(x[:, t], h)
        loss = loss + h.pow(2).sum()
    (g,) = torch.autograd.grad(loss, cell.weight_hh)
    assert total == pytest.approx(float(g.norm()), rel=1e-10)
    drawn = bars(plot_contributions(values, total=total))
    assert math.fsum(drawn["contributions"]) == pytest.approx(drawn["total"][0], rel=1e-12)


def test_projected_contributions_of_a_zero_gradient():
    values, total = projected_contributions(np.zeros((3, 2, 2)))
    assert total == 0.0 and values.tolist() == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError):
        projected_contributions(np.zeros((0, 2)))


def test_losses_axes_units_and_baseline():
    fig = plot_losses([1, 2], [2.0, 1.0], [2], [1.2], bits_per_char=True, baseline=1.5)
    ax = fig.axes[0]
    assert ax.get_ylabel() == "loss (nats per token)"
    assert ax.get_xlabel() == "optimizer step"
    labels = [line.get_label() for line in ax.lines]
    assert {"training", "validation", "n-gram baseline"} <= set(labels)
    assert any(
        getattr(child, "get_ylabel", lambda: "")() == "bits per character"
        for child in ax.child_axes
    )
    word = plot_losses([1], [2.0])
    assert not word.axes[0].child_axes  # no bits axis for word models
    empty = plot_losses([], [])
    assert "no losses" in empty.axes[0].texts[0].get_text()
    with pytest.raises(ValueError):
        plot_losses([1, 2], [1.0])


def test_gradient_flow_takes_a_gradient_flow_and_is_log_scaled():
    torch.manual_seed(0)
    flow = gradient_flow(RNNCell(2, 3), torch.randn(2, 6, 2), loss_fn=lambda h: h[:, -1].sum())
    fig = plot_gradient_flow(**flow.to_dict())  # the keys are the arguments
    left, right = fig.axes
    assert left.get_yscale() == right.get_yscale() == "log"
    np.testing.assert_allclose(left.lines[0].get_ydata(), flow.state_grad_norms.numpy())
    bound_lines = [line for line in right.lines if "bound" in line.get_label()]
    assert len(bound_lines) == 1
    loosest = flow.bound.numpy().reshape(-1, flow.jacobian_norms.shape[1]).max(0)
    np.testing.assert_allclose(bound_lines[0].get_ydata(), loosest)
    assert "k = 0" in right.get_xlabel()


def test_gradient_flow_with_zeros_several_losses_and_no_bound():
    lines = {"all steps": np.array([0.0, 1e-3, 1e-2, 1.0]), "last": np.array([0.0, 0.0, 0, 1.0])}
    fig = plot_gradient_flow(lines, np.ones(4), None, weight_norm=2.0)
    left, right = fig.axes
    assert [line.get_label() for line in left.lines] == ["all steps", "last"]
    assert np.isnan(left.lines[0].get_ydata()[0])  # zero: not drawn on the log axis
    assert not any("bound (" in line.get_label() for line in right.lines)
    bounded = plot_gradient_flow(
        np.geomspace(1e-3, 1, 4), state_grad_bound=10.0 ** np.arange(12, 0, -3)
    )
    left = bounded.axes[0]
    assert [line.get_label() for line in left.lines] == ["_child0", "bound"]
    assert left.get_ylim()[1] <= 1e4 * 3  # the range follows the measurements, not the bound
    only_zeros = plot_gradient_flow(np.zeros(5))  # nothing positive: linear, no warning
    assert only_zeros.axes[0].get_yscale() == "linear"
    with pytest.raises(ValueError, match="bound"):
        plot_gradient_flow(np.ones(3), np.ones((2, 3)), np.ones(4))


def test_grad_norms_marks_clipped_steps():
    fig = plot_grad_norms([1, 2, 3, 4], [1.0, 6.0, 0.0, 7.0], clip_norm=5.0)
    ax = fig.axes[0]
    clipped = next(line for line in ax.lines if line.get_label() == "clipped")
    assert clipped.get_xdata().tolist() == [2.0, 4.0]
    assert ax.get_yscale() == "log"
    assert "no gradient" in plot_grad_norms([], []).axes[0].texts[0].get_text()


def test_next_symbol_shows_the_top_symbols_and_marks_what_came_next():
    probs = np.full((4, 5), 0.05)
    probs[:, 3] = 0.6  # "d" most likely everywhere
    probs[[0, 1], 1] = 0.25  # then "b"
    probs /= probs.sum(1, keepdims=True)
    fig = plot_next_symbol(probs, list("abcde"), list("wxyz"), targets=[3, 1, 0, 3], top=2)
    ax = fig.axes[0]
    assert tick_texts(ax.get_yticklabels()) == ["d", "b"]  # most likely first
    np.testing.assert_allclose(ax.images[0].get_array(), probs[:, [3, 1]].T)
    offsets = ax.collections[0].get_offsets().tolist()
    assert offsets == [[0, 0], [1, 1], [3, 0]]  # "a" at t = 2 is not among the rows shown
    assert tick_texts(ax.get_xticklabels()) == list("wxyz")
    with pytest.raises(ValueError, match="labels"):
        plot_next_symbol(probs, list("abc"))


def test_hidden_states_picks_the_most_varying_units():
    states = np.zeros((6, 5))
    states[:, 1] = np.linspace(-1, 1, 6)
    states[:, 4] = np.linspace(1, -1, 6) * 0.5
    fig = plot_hidden_states(states, max_units=2)
    ax = fig.axes[0]
    np.testing.assert_allclose(ax.images[0].get_array(), states[:, [1, 4]].T)
    assert tick_texts(ax.get_yticklabels()) == ["1", "4"]
    assert "2 of 5 units" in ax.get_ylabel()
    assert ax.get_xlabel() == "time step t"


def test_attention_rows_are_targets_and_columns_sources():
    weights = np.array([[0.9, 0.1, 0.0], [0.2, 0.3, 0.5]])
    fig = plot_attention(weights, ["le", "chat", "$"], ["the", "cat"])
    ax = fig.axes[0]
    np.testing.assert_allclose(ax.images[0].get_array(), weights)
    assert tick_texts(ax.get_xticklabels()) == ["le", "chat", "$"]  # "$" stays a dollar
    assert tick_texts(ax.get_yticklabels()) == ["the", "cat"]
    with pytest.raises(ValueError, match="labels"):
        plot_attention(weights, ["a"], ["b", "c"])


def test_token_labels_are_visible_and_drawable():
    assert display_token(" ") == "␣"
    assert display_token("\n") == "↵"
    assert display_token("\t") == "⇥"
    assert display_token("\x00") == "\\x00"
    assert display_token("") == "∅"
    assert display_token("é") == "é"
    assert display_token("中") == "U+4E2D"  # no glyph in the default font
    # Drawing all of them (and mathtext-like text) raises no warning.
    tokens = [" ", "\n", "\x01", "$x$", "\U0010ffff", "中", "<s>", "a_b^c"]
    to_png(plot_attention(np.eye(len(tokens)), tokens, tokens), dpi=30)


def test_many_positions_thin_the_tick_labels():
    fig = plot_hidden_states(np.zeros((200, 3)), [str(i % 10) for i in range(200)])
    assert len(fig.axes[0].get_xticks()) <= 64


def test_score_histograms_over_decades_are_log_scaled_and_read_the_bulk():
    """Truncated sessions scoring ~20,000 beside normal sessions of 0.3–4.4 and a threshold
    of 3.74: on a linear axis every normal session and the threshold were in the first of
    40 bins. On a log axis the normal sessions spread over bins of their own."""
    from rnnkit.diagnostics.plots import plot_score_histograms

    rng = np.random.default_rng(0)
    normal = rng.lognormal(0.3, 0.6, 300).clip(0.32, 4.38)
    anomalous = np.r_[rng.uniform(94, 300, 30), rng.uniform(13_743, 21_401, 10)]
    fig = plot_score_histograms([("rnn", normal, anomalous, 3.742)], score="combined")
    ax = fig.axes[0]
    assert ax.get_xscale() == "log"
    assert ax.get_xlabel() == "session score (combined), log scale"
    normal_bars = [p for p in ax.containers[0] if p.get_height() > 0]
    assert len(normal_bars) >= 8  # the normal sessions are readable, not one bar
    assert sum(p.get_height() for p in ax.containers[0]) == 300  # every session drawn
    assert sum(p.get_height() for p in ax.containers[1]) == 40
    # the threshold is inside the normal sessions' bins, not at the edge of the first
    lefts = [p.get_x() for p in normal_bars]
    assert min(lefts) < 3.742 < max(p.get_x() + p.get_width() for p in normal_bars)
    assert ax.get_xlim()[0] < 0.32 and ax.get_xlim()[1] >= 21_401


def test_score_histograms_stay_linear_for_scores_of_one_scale_and_count_scores():
    from rnnkit.diagnostics.plots import plot_score_histograms

    # normal sessions 0–1, anomalous up to 30: one scale
    fig = plot_score_histograms([("m", np.linspace(0.05, 1, 50), [5.0, 30.0], 0.9)])
    assert fig.axes[0].get_xscale() == "linear"
    # a count score: normal sessions all at 0, a threshold of 1e-4, anomalous 1–12
    fig = plot_score_histograms([("m", np.zeros(50), [1.0, 3.0, 12.0], 1e-4)], score="count")
    assert fig.axes[0].get_xscale() == "linear"


def test_score_histograms_of_signed_scores_over_decades_are_symlog_and_name_their_lines():
    from rnnkit.diagnostics.plots import plot_score_histograms

    z = np.r_[np.random.default_rng(1).normal(size=500), 300.0, 2000.0]
    fig = plot_score_histograms(
        [("validation vectors", z, [], 2.576)],
        threshold_label="per-vector bound z = 2.576",
        lines=[(6.413, "session threshold 6.413")],
        counted="vectors",
    )
    ax = fig.axes[0]
    assert ax.get_xscale() == "symlog"
    assert sum(p.get_height() for p in ax.containers[0]) == 502  # the largest in a bin too
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["normal (502)", "per-vector bound z = 2.576", "session threshold 6.413"]
    assert [line.get_xdata()[0] for line in ax.lines] == [2.576, 6.413]
