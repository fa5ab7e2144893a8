"""The layer-normalised LSTM: the time loop's hand-written backward against autograd of
the cell's plain step (float64, holes in the mask, both directions), finite differences
with the regularizers, the compiled loop never taken, and the refusals."""

from __future__ import annotations

import pytest
import torch

from rnnkit import LSTM, LSTMState
from rnnkit.bptt.forward import _compiled
from rnnkit.bptt.fused import fused_form
from rnnkit.cells.layer_norm import LayerNormLSTMCell, normalize
from rnnkit.errors import ConfigError

pytestmark = pytest.mark.usefixtures("time_loop")

DT = torch.float64


def _reference(cell, x, real, s0):
    """The cell's own step (plain ops) over time, the state held at masked steps."""
    state, outs = s0, []
    for t in range(x.shape[0]):
        new = cell(x[t], state)
        m = real[t][:, None]
        state = LSTMState(torch.where(m, new.h, state.h), torch.where(m, new.c, state.c))
        outs.append(state.h)
    return torch.stack(outs), state


def _perturbed(layer, gen):
    with torch.no_grad():  # gains and shifts away from 1 and 0, so that they matter
        for name, p in layer.named_parameters():
            if "gamma" in name or "beta" in name:
                p.add_(0.3 * torch.randn(p.shape, generator=gen, dtype=p.dtype))


def test_layer_equals_autograd_of_the_plain_step(holey_mask, gen):
    B, T = holey_mask.shape
    layer = LSTM(3, 4, batch_first=False, layer_norm=True).double()
    _perturbed(layer, gen)
    cell = layer.cells()[0]
    x = torch.randn(T, B, 3, generator=gen, dtype=DT, requires_grad=True)
    s0 = LSTMState(*(torch.randn(B, 4, generator=gen, dtype=DT, requires_grad=True) for _ in "hc"))
    out = layer(x, mask=holey_mask.T, state=LSTMState(s0.h[None, None], s0.c[None, None]))
    ref_out, ref_fin = _reference(cell, x, holey_mask.T, s0)
    real = holey_mask.T[..., None]
    torch.testing.assert_close(torch.where(real, out.outputs, 0), torch.where(real, ref_out, 0))
    torch.testing.assert_close(out.state.h[0, 0], ref_fin.h)
    torch.testing.assert_close(out.state.c[0, 0], ref_fin.c)
    inputs = [x, *s0, *layer.parameters()]
    g = torch.randn(out.outputs.shape, generator=gen, dtype=DT)
    gc = torch.randn(B, 4, generator=gen, dtype=DT)
    got = torch.autograd.grad(
        [torch.where(real, out.outputs, 0), out.state.c[0, 0]], inputs, [g, gc]
    )
    want = torch.autograd.grad([torch.where(real, ref_out, 0), ref_fin.c], inputs, [g, gc])
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("options", [{}, {"zoneout": 0.3, "recurrent_dropout": 0.3}])
def test_gradcheck_bidirectional_stack(options, holey_mask):
    from torch.func import functional_call

    torch.manual_seed(0)
    B, T = holey_mask.shape
    layer = LSTM(2, 2, num_layers=2, bidirectional=True, layer_norm=True, **options).double()
    _perturbed(layer, torch.Generator().manual_seed(3))
    x = torch.randn(B, T, 2, dtype=DT, requires_grad=True)
    masks = layer.draw_masks(B, T, x)
    names = [n for n, _ in layer.named_parameters()]
    params = [p.detach().clone().requires_grad_() for p in layer.parameters()]

    def f(x, *p):
        kw = {"mask": holey_mask, "masks": masks}
        out = functional_call(layer, dict(zip(names, p, strict=True)), (x,), kw)
        return out.outputs, *out.state

    assert torch.autograd.gradcheck(f, (x, *params), eps=1e-6, atol=1e-6)


def test_no_compiled_loop_and_no_fused_form():
    cell = LayerNormLSTMCell(3, 4).double()
    x = torch.zeros(5, 2, 16, dtype=DT)
    assert _compiled(cell.kernel, x, *cell.weights()) is None
    assert fused_form(cell.kernel) is None  # type: ignore[arg-type]


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


def test_refusals():
    layer = LSTM(3, 4, layer_norm=True).double()
    x = torch.randn(2, 5, 3, dtype=DT, requires_grad=True)
    with pytest.raises(ConfigError, match="full BPTT only"):
        layer(x, window=2)
    layer.recompute = 2
    with pytest.raises(ConfigError, match="full BPTT only"):
        layer(x)
    with pytest.raises(ConfigError, match="no forget_bias"):
        LSTM(3, 4, layer_norm=True, forget_bias=1.0)
    from rnnkit.layers.interop import to_torch

    with pytest.raises(ValueError, match="layer-normalised"):
        to_torch(LSTM(3, 4, layer_norm=True))
