"""``gradcheck``: the explicit BPTT passes against finite differences; a broken one fails."""

from __future__ import annotations

import json

import pytest
import torch

from rnnkit import LSTM
from rnnkit.cells.lstm import LSTMKernel
from rnnkit.cells.rnn import RNNKernel
from rnnkit.diagnostics import GradcheckResult, gradcheck
from rnnkit.diagnostics.gradcheck import random_mask

VARIANTS = [
    ("rnn", {"nonlinearity": "tanh"}),
    ("rnn", {"nonlinearity": "relu"}),
    ("rnn", {"nonlinearity": "sigmoid"}),
    ("lstm", {}),
    ("gru", {"update": "candidate", "reset": "before"}),
    ("gru", {"update": "candidate", "reset": "after"}),
    ("gru", {"update": "keep", "reset": "before"}),
    ("gru", {"update": "keep", "reset": "after"}),
]


@pytest.mark.parametrize(
    ("cell", "options"), VARIANTS, ids=["_".join([c, *o.values()]) for c, o in VARIANTS]
)
def test_every_cell_variant_passes(cell: str, options: dict) -> None:
    result = gradcheck(cell, **options)
    assert result.passed, result.to_dict()
    assert result.max_rel_error < 1e-7
    names = [e.name for e in result.errors]
    assert names[-2:] in (["input", "state"], ["state.h", "state.c"])
    expected = {"layers.0.cell.weight_ih", "layers.0.cell.weight_hh", "layers.0.cell.bias"}
    assert expected <= set(names)
    assert ("layers.0.cell.bias_hn" in names) == (options.get("reset") == "after")


@pytest.mark.parametrize(
    ("cell", "options"), [("lstm", {}), ("gru", {"reset": "after", "update": "keep"})]
)
@pytest.mark.parametrize("window", [None, 2])
def test_the_layer_normalised_cells_pass_with_every_gain(cell: str, options: dict, window) -> None:
    """Two bidirectional layers: the upper layer's input part reads both directions; with
    a window, the finite differences of the budget graph (the input part recomputed)."""
    result = gradcheck(
        cell,
        layer_norm=True,
        num_layers=2,
        bidirectional=True,
        steps=3,
        hidden_size=3,
        window=window,
        **options,
    )
    assert result.passed, result.to_dict()
    names = {e.name for e in result.errors}
    gains = ("gamma_ih", "gamma_hh", *(("gamma_c", "beta_c") if cell == "lstm" else ("bias_hn",)))
    for layer in (0, 1):
        for gain in gains:
            assert f"layers.{layer}.directions.1.cell.{gain}" in names


def test_a_corrupted_layer_norm_gain_gradient_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check sees a 1 % error in one gain's gradient (γ_c of the PyTorch loop)."""
    from rnnkit.bptt import native
    from rnnkit.cells.layer_norm import LayerNormLSTMKernel

    real = LayerNormLSTMKernel.recurrent_grads

    def off(self, d_xp, d_hp, h_prev, cache, mm=torch.mm):
        g_hh, gains = real(self, d_xp, d_hp, h_prev, cache, mm)
        H = h_prev.shape[1]
        return g_hh, torch.cat([gains[: 4 * H], 1.01 * gains[4 * H : 5 * H], gains[5 * H :]])

    monkeypatch.setattr(LayerNormLSTMKernel, "recurrent_grads", off)
    with native.use_native(False):
        result = gradcheck("lstm", layer_norm=True)
    assert not result.passed and result.worst.name == "layers.0.cell.gamma_c"


def test_stacked_bidirectional_and_windowed() -> None:
    full = gradcheck("rnn", num_layers=2, bidirectional=True, steps=3, hidden_size=3)
    assert full.passed and len(full.errors) == 4 * 3 + 2
    windowed = gradcheck("lstm", num_layers=2, bidirectional=True, steps=3, window=2, hidden_size=3)
    assert windowed.passed, windowed.to_dict()
    assert windowed.config["window"] == 2


def test_window_reference_is_the_truncated_graph() -> None:
    """BPTT(2) differs from full BPTT here, yet passes: the reference is truncated too."""
    torch.manual_seed(0)
    layer = LSTM(3, 4).double()
    x = torch.randn(2, 5, 3, dtype=torch.float64)
    grads = []
    for window in (None, 2):
        layer.zero_grad()
        layer(x, window=window).outputs.sum().backward()
        grads.append(layer.layers[0].cell.weight_hh.grad.clone())
    assert float((grads[0] - grads[1]).abs().max()) > 1e-3
    assert gradcheck("lstm", window=2, steps=5).passed
    assert gradcheck("gru", reset="after", window=1, steps=4).passed


def corrupt(monkeypatch: pytest.MonkeyPatch, kernel: type, change) -> None:
    """Wrap the kernel's hand-written step backward — and, where the time loop has a
    compiled twin of it (``native_backward``), that one too — with ``change``."""
    for name in ("step_backward", "native_backward"):
        original = getattr(kernel, name, None)
        if original is None:
            continue

        def wrapped(self, *args, _original=original, _name=name):
            return change(_name, _original(self, *args))

        monkeypatch.setattr(kernel, name, wrapped)


@pytest.mark.parametrize("window", [None, 2])
def test_a_corrupted_backward_fails(monkeypatch: pytest.MonkeyPatch, window) -> None:
    def scaled(name, out):
        if name == "step_backward":  # ∂L/∂h_{t−1}, scaled at every step
            return tuple(1.01 * d for d in out)
        d_xp, d_hp, d0, d_x, d_b = out
        d_hp = d_hp if d_hp is d_xp else 1.01 * d_hp
        d_x = None if d_x is None else 1.01 * d_x
        d_b = None if d_b is None else 1.01 * d_b
        return 1.01 * d_xp, d_hp, tuple(1.01 * d for d in d0), d_x, d_b

    corrupt(monkeypatch, RNNKernel, scaled)
    result = gradcheck("rnn", window=window)
    assert not result.passed
    assert 1e-4 < result.max_rel_error < 1.0


def test_a_corrupted_lstm_cell_gradient_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    def dropped_c(name, out):
        if name == "step_backward":
            d_h, d_c = out
            return d_h, 0.99 * d_c  # the memory path loses 1 % at every step
        d_xp, d_hp, (d_h0, d_c0), d_x, d_b = out
        return d_xp, d_hp, (d_h0, 0.99 * d_c0), d_x, d_b  # the initial memory's gradient is off

    corrupt(monkeypatch, LSTMKernel, dropped_c)
    result = gradcheck("lstm")
    assert not result.passed and result.max_rel_error > 1e-5


ALL_REGULARIZERS = {"recurrent_dropout": 0.3, "zoneout": 0.2, "weight_drop": 0.2}


@pytest.mark.parametrize(
    ("cell", "options"),
    [
        ("lstm", {}),
        ("gru", {"reset": "before"}),
        ("gru", {"update": "keep", "reset": "after"}),
        ("rnn", {"nonlinearity": "sigmoid"}),
        ("lstm", {"layer_norm": True}),
        ("gru", {"reset": "after", "layer_norm": True, "recurrent_dropout": 0.0}),
    ],
)
@pytest.mark.parametrize(
    "backward",
    [
        {},
        {"window": 3, "bidirectional": True, "input_size": 2, "hidden_size": 3},
        {"window": 2},
        {"recompute": 2},
    ],
    ids=["full", "window-bidirectional", "window", "recompute"],
)
def test_the_regularizers_pass_on_every_backward(cell, options, backward) -> None:
    """Recurrent dropout, zoneout and weight drop, their masks held: full BPTT, BPTT(τ)
    (whose reference runs the regularized steps in the budget graph) and recompute. The
    bidirectional window, whose reference is the dearest (every level of the budget
    graph, every direction, for each of its finite differences), on narrower layers:
    inputs 2, hidden 3 (no two of the weight blocks square)."""
    given = {**ALL_REGULARIZERS, **options}
    result = gradcheck(cell, num_layers=2, steps=5, **given, **backward)
    assert result.passed and result.max_rel_error < 1e-7, result.worst
    drawn = {k: v for k, v in given.items() if k in ALL_REGULARIZERS and v}
    assert {k: result.config[k] for k in drawn} == drawn


@pytest.mark.parametrize(
    "backward",
    [{}, {"window": 2}, {"window": 1, "num_layers": 3}, {"recompute": 2}],
    ids=["full", "window", "window-3-layers", "recompute"],
)
@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn"])
def test_document_starts_pass_on_every_backward(cell, backward) -> None:
    """``resets=True``: the state entering a start is zero on both sides (the budget
    graph's levels too), with zoneout and weight drop held."""
    result = gradcheck(
        cell, resets=True, steps=6, batch_size=4, zoneout=0.2, weight_drop=0.2, **backward
    )
    assert result.passed and result.max_rel_error < 1e-7, result.worst
    assert result.config["resets"] is True


def test_a_budget_graph_without_the_starts_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """The window's reference must reset too: a sweep that let the gradient cross the
    starts (resets ignored in the backward's record) fails against it."""
    from rnnkit.bptt import windowed

    real = windowed._Steps.__init__

    def crossing(self, unit):
        real(self, unit)
        self.reset = None  # the backward no longer stops at a start

    monkeypatch.setattr(windowed._Steps, "__init__", crossing)
    result = gradcheck("gru", resets=True, steps=6, batch_size=4, window=3, num_layers=2)
    assert not result.passed and result.max_rel_error > 1e-3


def test_the_masks_are_part_of_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """A regularized step's backward that loses 2 % of ``∂L/∂s_{t−1}`` under a window is
    found: the reference runs the regularized steps, with the same masks."""
    from rnnkit.bptt.regularized import RegularizedKernel

    real = RegularizedKernel.step_backward

    def unzoned(self, d_new, prev, new, cache, d_xp, d_hp, w):
        d_prev = real(self, d_new, prev, new, cache, d_xp, d_hp, w)
        return tuple(0.98 * d for d in d_prev)

    monkeypatch.setattr(RegularizedKernel, "step_backward", unzoned)
    result = gradcheck("gru", zoneout=0.3, window=2, steps=5)
    assert not result.passed and result.max_rel_error > 1e-4


def test_regularizer_refusals_are_named() -> None:
    with pytest.raises(ValueError, match=r"^recurrent_dropout has no layer-normalised GRU form$"):
        gradcheck("gru", reset="after", layer_norm=True, recurrent_dropout=0.2)
    with pytest.raises(ValueError, match=r"^window and recompute cannot be combined"):
        gradcheck("lstm", window=2, recompute=2)
    with pytest.raises(ValueError, match=r"^resets need a unidirectional stack"):
        gradcheck("lstm", resets=True, bidirectional=True)


def test_result_is_json_ready_and_tolerance_applies() -> None:
    result = gradcheck("gru", steps=3, tol=1e-300)
    assert isinstance(result, GradcheckResult) and not result.passed  # nothing is that exact
    data = json.loads(json.dumps(result.to_dict(), allow_nan=False))
    assert data["passed"] is False and data["worst"] == result.worst.name
    assert data["config"]["cell"] == "gru" and data["tol"] == 1e-300
    assert {"name", "numel", "max_abs_error", "max_abs_grad", "rel_error"} == set(data["errors"][0])
    with pytest.raises(ValueError, match="cell"):
        gradcheck("transformer")


def test_random_mask_has_holes_and_padding_and_leaves_the_global_rng() -> None:
    mask = random_mask(64, 8, torch.Generator().manual_seed(3))
    assert bool(mask[:, 0].all()) and bool(mask[0].all())
    steps = torch.arange(1, 9)
    lengths = torch.where(mask, steps, 0).amax(1)  # last real step + 1
    assert bool((lengths < 8).any())  # trailing padding
    inside = torch.arange(8)[None, :] < lengths[:, None]
    assert bool((inside & ~mask).any())  # holes
    state = torch.random.get_rng_state()
    gradcheck("rnn", steps=2)
    assert torch.equal(state, torch.random.get_rng_state())


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("steps", 0, "steps must be a positive integer, got 0"),  # was torch's random_ error
        ("batch_size", 0, "batch_size must be a positive integer, got 0"),  # an IndexError
        ("eps", 0.0, "eps must be a finite number > 0, got 0.0"),  # ZeroDivisionError
        ("tol", -1.0, "tol must be a finite number > 0, got -1.0"),  # could never pass
    ],
)
def test_a_bad_option_is_named(option, value, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        gradcheck("rnn", **{option: value})


def test_layer_norm_takes_the_lstm_or_gru():
    with pytest.raises(ValueError, match=r"^layer_norm takes cell 'lstm' or 'gru', got 'rnn'$"):
        gradcheck("rnn", layer_norm=True)
