"""Recurrent dropout and zoneout in the time loop: outputs and every gradient equal
autograd of the same masked computation written in plain torch ops (fixed masks, float64),
on both time loops (the LSTM's compiled loop takes the masks; the other cells run the
PyTorch loop even where the compiled one is asked for)."""

from __future__ import annotations

import pytest
import torch

from rnnkit import GRU, LSTM, RNN
from rnnkit.bptt import native
from rnnkit.bptt.dispatch import compiled_library
from rnnkit.bptt.fused import use_fused, wants_fused
from rnnkit.bptt.regularized import CompiledRegularized, regularized
from rnnkit.cells.gru import GRUKernel
from rnnkit.cells.lstm import LSTMKernel
from rnnkit.cells.rnn import RNNKernel
from rnnkit.layers.regularization import CellMasks, StackMasks

pytestmark = pytest.mark.usefixtures("time_loop")

T, B, I, H = 5, 3, 2, 4
KINDS = {
    "lstm": lambda **kw: LSTM(I, H, batch_first=False, **kw),
    "gru-keep-after": lambda **kw: GRU(I, H, batch_first=False, update="keep", reset="after", **kw),
    "gru-cand-before": lambda **kw: GRU(I, H, batch_first=False, **kw),
    "rnn": lambda **kw: RNN(I, H, batch_first=False, **kw),
}


def reference_step(cell, x, prev, w_hh, rec, lstm):
    """One step in plain ops; the recurrent products read ``prev[0] ⊙ rec``."""
    h = prev[0]
    hm = h if rec is None else h * rec
    if lstm:
        a = x @ cell.weight_ih.T + hm @ w_hh.T + cell.bias
        i, f, g, o = a.chunk(4, dim=1)
        c = torch.sigmoid(f) * prev[1] + torch.sigmoid(i) * torch.tanh(g)
        return (torch.sigmoid(o) * torch.tanh(c), c)
    if cell.gates == 1:
        return (torch.tanh(x @ cell.weight_ih.T + hm @ w_hh.T + cell.bias),)
    xp = x @ cell.weight_ih.T + cell.bias
    r, z = torch.sigmoid(xp[:, : 2 * H] + hm @ w_hh[: 2 * H].T).chunk(2, dim=1)
    if cell.reset == "after":
        n = torch.tanh(xp[:, 2 * H :] + r * (hm @ w_hh[2 * H :].T + cell.bias_hn))
    else:
        n = torch.tanh(xp[:, 2 * H :] + (r * hm) @ w_hh[2 * H :].T)
    if cell.update == "keep":
        return (z * h + (1 - z) * n,)
    return ((1 - z) * h + z * n,)


def reference(layer, x, masks: CellMasks, real, states0):
    cell = layer.cells()[0]
    w_hh = cell.weight_hh if masks.weight_hh is None else cell.weight_hh * masks.weight_hh
    states, outs = states0, []
    for t in range(x.shape[0]):
        new = reference_step(cell, x[t], states, w_hh, masks.recurrent, cell.is_lstm)
        if masks.keep is not None:
            new = tuple(
                d[t] * p + (1 - d[t]) * n for d, p, n in zip(masks.keep, states, new, strict=True)
            )
        m = real[t][:, None]
        new = tuple(torch.where(m, n, p) for n, p in zip(new, states, strict=True))
        outs.append(new[0])
        states = new
    return torch.stack(outs), states


def draw(layer, p_rec, p_zone, weight_drop, gen, real_valued=False):
    cell = layer.cells()[0]
    rec = None
    if p_rec:
        rec = (torch.rand(B, H, generator=gen, dtype=torch.float64) > p_rec) / (1 - p_rec)
    keep = None
    if p_zone:
        n = 2 if cell.is_lstm else 1
        keep = tuple(
            torch.rand(T, B, H, generator=gen, dtype=torch.float64)
            if real_valued
            else (torch.rand(T, B, H, generator=gen, dtype=torch.float64) < p_zone).double()
            for _ in range(n)
        )
    drop_w = None
    if weight_drop:
        shape = cell.weight_hh.shape
        drop_w = (torch.rand(*shape, generator=gen, dtype=torch.float64) > 0.5) * 2.0
    return CellMasks(drop_w, rec, keep)


def compare(kind, masks_of, gen, lengths=(5, 3, 0)):
    layer = KINDS[kind]().double()
    masks = masks_of(layer)
    x = torch.randn(T, B, I, generator=gen, dtype=torch.float64, requires_grad=True)
    s0 = tuple(
        torch.randn(B, H, generator=gen, dtype=torch.float64, requires_grad=True)
        for _ in range(2 if layer.is_lstm else 1)
    )
    lengths_t = torch.tensor(lengths)
    real = torch.arange(T)[:, None] < lengths_t[None, :]
    state = None
    if layer.is_lstm:
        from rnnkit import LSTMState

        state = LSTMState(s0[0][None, None], s0[1][None, None])
    else:
        state = s0[0][None, None]
    stack = StackMasks(None, (None,), None, (masks,))
    out = layer(x, lengths=lengths_t, state=state, masks=stack)
    ref_out, ref_fin = reference(layer, x, masks, real, s0)
    # the padding of the outputs holds the state (the reference's too)
    torch.testing.assert_close(out.outputs, ref_out)
    fin = (out.state.h, out.state.c) if layer.is_lstm else (out.state,)
    for a, b in zip(fin, ref_fin, strict=True):
        torch.testing.assert_close(a[0, 0], b)
    g_out = torch.randn(out.outputs.shape, generator=gen, dtype=torch.float64)
    g_fin = [torch.randn(B, H, generator=gen, dtype=torch.float64) for _ in fin]
    inputs = [x, *s0, *layer.parameters()]
    got = torch.autograd.grad(
        [out.outputs, *(f[0, 0] for f in fin)], inputs, [g_out, *g_fin], allow_unused=True
    )
    want = torch.autograd.grad([ref_out, *ref_fin], inputs, [g_out, *g_fin], allow_unused=True)
    for a, b in zip(got, want, strict=True):
        if b is None:
            assert a is None or not a.any()
        else:
            torch.testing.assert_close(a, b)


@pytest.mark.parametrize("kind", list(KINDS))
def test_recurrent_dropout_equals_autograd_of_the_masked_step(kind, gen):
    compare(kind, lambda layer: draw(layer, 0.4, 0.0, False, gen), gen)


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("real_valued", [False, True])
def test_zoneout_equals_autograd_of_the_mixed_step(kind, real_valued, gen):
    compare(kind, lambda layer: draw(layer, 0.0, 0.3, False, gen, real_valued), gen)


@pytest.mark.parametrize("kind", list(KINDS))
def test_all_in_loop_options_together(kind, gen):
    compare(kind, lambda layer: draw(layer, 0.3, 0.3, True, gen), gen)


@pytest.mark.parametrize("kind", list(KINDS))
def test_weight_drop_alone_equals_autograd_in_either_loop(kind, gen):
    compare(kind, lambda layer: draw(layer, 0.0, 0.0, True, gen), gen, lengths=(5, 5, 5))


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_cell_has_a_compiled_loop_and_none_a_fused_form(kind):
    layer = KINDS[kind]().double()
    cell = layer.cells()[0]
    kernel = regularized(cell.kernel, torch.ones(B, H, dtype=torch.float64), None)
    x = torch.zeros(T, B, I, dtype=torch.float64)
    compiled = compiled_library(kernel, x, *cell.weights()) is not None
    assert compiled == (native.available() and native._enabled)
    assert isinstance(kernel, CompiledRegularized)
    with use_fused("fused"):
        assert wants_fused(kernel, x, None, None, False) is None  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("batch", [3, 9])
def test_compiled_loop_equals_the_pytorch_loop(monkeypatch, kind, dtype, batch, holey_mask):
    """The compiled loop with recurrent dropout and zoneout (holes in the mask,
    batch-first input; an LSTM of 9 rows on one thread takes its input product in the
    loop) gives the PyTorch loop's outputs and gradients, and is the loop that ran."""
    if not native.available():
        pytest.skip("the compiled time loop is unavailable on this machine")
    calls = {"forward": 0, "backward": 0}
    kernel_class = {"lstm": LSTMKernel, "rnn": RNNKernel}.get(kind, GRUKernel)
    for name in calls:
        real = getattr(kernel_class, "native_" + name)

        def counted(*args, _real=real, _name=name, **kwargs):
            calls[_name] += kwargs.get("reg") is not None
            return _real(*args, **kwargs)

        monkeypatch.setattr(kernel_class, "native_" + name, counted)
    gen = torch.Generator().manual_seed(0)
    mask = holey_mask.repeat(3, 1)[:batch]
    Tn = mask.shape[1]
    torch.manual_seed(1)
    layer = KINDS[kind](recurrent_dropout=0.4, zoneout=0.3).to(dtype)
    layer.batch_first = True
    x = torch.randn(batch, Tn, I, generator=gen, dtype=dtype)
    masks = layer.draw_masks(batch, Tn, x)
    g = torch.randn(batch, Tn, H, generator=gen, dtype=dtype)
    results = []
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for compiled in (True, False):
            xi = x.clone().requires_grad_()
            with native.use_native(compiled):
                out = layer(xi, mask=mask, masks=masks)
                finals = list(out.state) if kind == "lstm" else [out.state]
                grads = torch.autograd.grad(
                    [out.outputs, *finals], [xi, *layer.parameters()],
                    [g, *(torch.ones_like(f) for f in finals)],
                )  # fmt: skip
            results.append([out.outputs, *finals, *grads])
    finally:
        torch.set_num_threads(before)
    assert calls == {"forward": 1, "backward": 1}
    tol = {} if dtype == torch.float64 else {"rtol": 1e-5, "atol": 1e-5}
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, **tol)
    # evaluation (nothing kept for a backward): zoneout's expectation in both loops
    layer.eval()
    with torch.no_grad():
        outs = []
        for compiled in (True, False):
            with native.use_native(compiled):
                outs.append(layer(x, mask=mask).outputs)
    assert calls["forward"] == 2
    torch.testing.assert_close(outs[0], outs[1], **tol)


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("forward_compiled", [True, False])
def test_either_loops_forward_pairs_with_either_backward(kind, forward_compiled, gen):
    """The forward of one loop and the backward of the other give the gradients of the
    masked computation (the record holds the same buffers in both)."""
    if not native.available():
        pytest.skip("the compiled time loop is unavailable on this machine")
    layer = KINDS[kind]().double()
    masks = draw(layer, 0.4, 0.3, True, gen)
    x = torch.randn(T, B, I, generator=gen, dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor([5, 3, 1])
    real = torch.arange(T)[:, None] < lengths[None, :]
    stack = StackMasks(None, (None,), None, (masks,))
    with native.use_native(forward_compiled):
        out = layer(x, lengths=lengths, masks=stack)
    g = torch.randn(out.outputs.shape, generator=gen, dtype=torch.float64)
    with native.use_native(not forward_compiled):
        got = torch.autograd.grad(out.outputs, [x, *layer.parameters()], g)
    s0 = tuple(torch.zeros(B, H, dtype=torch.float64) for _ in range(2 if layer.is_lstm else 1))
    ref, _ = reference(layer, x, masks, real, s0)
    want = torch.autograd.grad(ref, [x, *layer.parameters()], g)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)
