"""The layer-normalised LSTM and GRU: the time loop's hand-written backward against
autograd of the cell's plain step (float64, holes in the mask, both directions), finite
differences with the regularizers, recompute, and the refusals (the compiled loop against
the PyTorch loop: tests/bptt/test_native_layer_norm.py)."""

from __future__ import annotations

import pytest
import torch

from rnnkit import GRU, LSTM, LSTMState
from rnnkit.cells.layer_norm import LayerNormLSTMCell, normalize
from rnnkit.errors import ConfigError

DT = torch.float64
KINDS = {
    "lstm": lambda *a, **kw: LSTM(*a, layer_norm=True, **kw),
    "gru-keep": lambda *a, **kw: GRU(*a, layer_norm=True, reset="after", update="keep", **kw),
    "gru-candidate": lambda *a, **kw: GRU(*a, layer_norm=True, reset="after", **kw),
}


def _reference(cell, x, real, s0):
    """The cell's own step (plain ops) over time, the state held at masked steps."""
    state, outs = s0, []
    for t in range(x.shape[0]):
        new = cell(x[t], state)
        m = real[t][:, None]
        if isinstance(new, LSTMState):
            state = LSTMState(torch.where(m, new.h, state.h), torch.where(m, new.c, state.c))
        else:
            state = torch.where(m, new, state)
        outs.append(state.h if isinstance(state, LSTMState) else state)
    return torch.stack(outs), state


def _perturbed(layer, gen):
    with torch.no_grad():  # gains and shifts away from 1 and 0, so that they matter
        for name, p in layer.named_parameters():
            if "gamma" in name or "beta" in name or "bias_hn" in name:
                p.add_(0.3 * torch.randn(p.shape, generator=gen, dtype=p.dtype))


@pytest.mark.usefixtures("time_loop")  # on both loops
@pytest.mark.parametrize("kind", list(KINDS))
def test_layer_equals_autograd_of_the_plain_step(kind, holey_mask, gen):
    B, T = holey_mask.shape
    layer = KINDS[kind](3, 4, batch_first=False).double()
    _perturbed(layer, gen)
    cell = layer.cells()[0]
    lstm = kind == "lstm"
    x = torch.randn(T, B, 3, generator=gen, dtype=DT, requires_grad=True)
    parts = [torch.randn(B, 4, generator=gen, dtype=DT, requires_grad=True) for _ in "hc"]
    s0 = LSTMState(*parts) if lstm else parts[0]
    state = LSTMState(parts[0][None, None], parts[1][None, None]) if lstm else s0[None, None]
    out = layer(x, mask=holey_mask.T, state=state)
    ref_out, ref_fin = _reference(cell, x, holey_mask.T, s0)
    real = holey_mask.T[..., None]
    torch.testing.assert_close(torch.where(real, out.outputs, 0), torch.where(real, ref_out, 0))
    fin = [s[0, 0] for s in out.state] if lstm else [out.state[0, 0]]
    ref = list(ref_fin) if lstm else [ref_fin]
    for a, b in zip(fin, ref, strict=True):
        torch.testing.assert_close(a, b)
    inputs = [x, *(parts if lstm else parts[:1]), *layer.parameters()]
    g = torch.randn(out.outputs.shape, generator=gen, dtype=DT)
    gf = [torch.randn(B, 4, generator=gen, dtype=DT) for _ in fin]
    got = torch.autograd.grad([torch.where(real, out.outputs, 0), *fin], inputs, [g, *gf])
    want = torch.autograd.grad([torch.where(real, ref_out, 0), *ref], inputs, [g, *gf])
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize(
    ("kind", "options"),
    [
        ("lstm", {}),
        ("lstm", {"zoneout": 0.3, "recurrent_dropout": 0.3}),
        ("gru-keep", {"zoneout": 0.3, "weight_drop": 0.3}),
        ("gru-candidate", {}),
    ],
)
def test_gradcheck_bidirectional_stack(kind, options, holey_mask):
    from torch.func import functional_call

    torch.manual_seed(0)
    B, T = holey_mask.shape
    layer = KINDS[kind](2, 2, num_layers=2, bidirectional=True, **options).double()
    _perturbed(layer, torch.Generator().manual_seed(3))
    x = torch.randn(B, T, 2, dtype=DT, requires_grad=True)
    masks = layer.draw_masks(B, T, x)
    names = [n for n, _ in layer.named_parameters()]
    params = [p.detach().clone().requires_grad_() for p in layer.parameters()]

    def f(x, *p):
        kw = {"mask": holey_mask, "masks": masks}
        out = functional_call(layer, dict(zip(names, p, strict=True)), (x,), kw)
        return (out.outputs, *out.state) if kind == "lstm" else (out.outputs, out.state)

    assert torch.autograd.gradcheck(f, (x, *params), eps=1e-6, atol=1e-6)


def test_the_cell_is_normalised_and_starts_with_unit_gains():
    cell = LayerNormLSTMCell(3, 4)
    assert all(bool((g == 1).all()) for g in (cell.gamma_ih, cell.gamma_hh, cell.gamma_c))
    assert bool((cell.beta_c == 0).all())
    n, _ = normalize(torch.randn(7, 16))
    torch.testing.assert_close(n.mean(-1), torch.zeros(7), atol=1e-6, rtol=0)
    torch.testing.assert_close(n.var(-1, unbiased=False), torch.ones(7), atol=1e-4, rtol=0)
    # invariant to the scale of W_x: the normalisation removes it
    x = torch.randn(2, 3)
    before = cell(x)
    with torch.no_grad():
        cell.weight_ih.mul_(3.0)
    torch.testing.assert_close(cell(x).h, before.h, atol=1e-4, rtol=1e-4)


@pytest.mark.usefixtures("time_loop")
@pytest.mark.parametrize("kind", list(KINDS))
def test_recompute_and_a_whole_window_are_full_bptt(kind, gen):
    """``recompute=k`` re-runs the loop on the stored input part: the same gradients;
    a window that covers every path is full BPTT (the window itself: tests/layers/
    test_windowed.py)."""
    layer = KINDS[kind](3, 4, 2, bidirectional=True).double()
    _perturbed(layer, gen)
    x = torch.randn(3, 7, 3, generator=gen, dtype=DT, requires_grad=True)
    lengths = torch.tensor([7, 3, 0])

    def grads(**kw):
        out = layer(x, lengths=lengths, **kw)
        final = out.state.h if isinstance(out.state, LSTMState) else out.state
        loss = (out.outputs**2).sum() + final.sum()
        return [out.outputs, *torch.autograd.grad(loss, [x, *layer.parameters()])]

    want = grads()
    got_window = grads(window=2 * 6 + 1)
    layer.recompute = 3
    got_recompute = grads()
    for got in (got_window, got_recompute):
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_refusals():
    x = torch.randn(2, 5, 3, dtype=DT, requires_grad=True)
    with pytest.raises(ConfigError, match="no forget_bias"):
        LSTM(3, 4, layer_norm=True, forget_bias=1.0)
    from rnnkit.layers.interop import to_torch

    with pytest.raises(ValueError, match="layer-normalised"):
        to_torch(LSTM(3, 4, layer_norm=True))
    with pytest.raises(ConfigError, match="needs reset='after'"):
        GRU(3, 4, layer_norm=True)
    with pytest.raises(ConfigError, match="no layer-normalised GRU form"):
        GRU(3, 4, layer_norm=True, reset="after", recurrent_dropout=0.2).double()(x)
