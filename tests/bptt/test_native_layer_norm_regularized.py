"""The layer-normalised LSTM and GRU with recurrent dropout (the LSTM's only) and zoneout in
the compiled time loop (``rnnkit/csrc/layer_norm.h`` with ``Regularizers``): against
autograd of the masked step in plain torch operations (both loops), and against the
PyTorch loop (``RegularizedKernel`` around the cell's kernel, the oracle) in float64 to
1e-12 and float32 held to float64, in bidirectional stacks with holes, zero-length and
full-length rows, on one and two threads; that the compiled loop is the one that ran;
that either loop's forward pairs with either loop's backward."""

from __future__ import annotations

import pytest
import torch

from rnnkit import GRU, LSTM, LSTMState
from rnnkit.bptt import native
from rnnkit.bptt.dispatch import compiled_library
from rnnkit.bptt.recurrence import run_recurrence
from rnnkit.bptt.regularized import CompiledRegularized, RegularizedKernel, regularized
from rnnkit.cells.layer_norm import (
    LayerNormGRUCell,
    LayerNormGRUKernel,
    LayerNormLSTMCell,
    LayerNormLSTMKernel,
    layer_norm_gru_step,
    layer_norm_lstm_step,
)
from rnnkit.layers.regularization import CellMasks, StackMasks

DT = torch.float64
KINDS = {
    "lstm": lambda *a, **kw: LSTM(*a, layer_norm=True, **kw),
    "gru-keep": lambda *a, **kw: GRU(*a, layer_norm=True, reset="after", update="keep", **kw),
    "gru-candidate": lambda *a, **kw: GRU(*a, layer_norm=True, reset="after", **kw),
}
# the combinations a layer-normalised cell takes (the GRU refuses recurrent dropout)
CASES = [
    ("lstm", {"recurrent_dropout": 0.4}),
    ("lstm", {"zoneout": 0.3}),
    ("lstm", {"recurrent_dropout": 0.4, "zoneout": 0.3}),
    ("gru-keep", {"zoneout": 0.3}),
    ("gru-candidate", {"zoneout": 0.3}),
]
I, H = 5, 8

needs_native = pytest.mark.skipif(not native.available(), reason="no compiled loop here")


def _perturbed(layer, gen):
    with torch.no_grad():  # gains and shifts away from 1 and 0, so that they matter
        for name, p in layer.named_parameters():
            if "gamma" in name or "beta" in name or "bias_hn" in name:
                p.add_(0.3 * torch.randn(p.shape, generator=gen, dtype=p.dtype))


# -- against autograd of the masked step in plain operations ---------------------------


def _reference(cell, x, masks: CellMasks, real, s0):
    """The cell's plain step over time: the recurrent product reads ``h ⊙ m``, zoneout
    mixes ``d ⊙ prev + (1 − d) ⊙ new``, masked steps hold the state."""
    w = cell.weights()
    states, outs = s0, []
    for t in range(x.shape[0]):
        xp = cell.input_part(x[t])
        h = states[0] if masks.recurrent is None else states[0] * masks.recurrent
        if cell.is_lstm:
            new = tuple(layer_norm_lstm_step(xp, LSTMState(h, states[1]), w))
        else:
            # the update mixes the unmasked state (no recurrent mask here: refused)
            new = (layer_norm_gru_step(xp, h, w, cell.update),)
        if masks.keep is not None:
            new = tuple(
                d[t] * p + (1 - d[t]) * n for d, p, n in zip(masks.keep, states, new, strict=True)
            )
        m = real[t][:, None]
        states = tuple(torch.where(m, n, p) for n, p in zip(new, states, strict=True))
        outs.append(states[0])
    return torch.stack(outs), states


@pytest.mark.usefixtures("time_loop")  # on both loops
@pytest.mark.parametrize(("kind", "options"), CASES)
@pytest.mark.parametrize("real_valued", [False, True])
def test_equals_autograd_of_the_masked_plain_step(kind, options, real_valued, holey_mask, gen):
    """Outputs, final states and every gradient (input, initial states, every parameter
    including the gains) of one layer with holes and a zero-length row; zoneout's factors
    0/1 draws or real values in (0, 1) (the form evaluation uses)."""
    B, T = holey_mask.shape
    layer = KINDS[kind](I, H, batch_first=False).double()
    _perturbed(layer, gen)
    cell = layer.cells()[0]
    n = 2 if cell.is_lstm else 1
    rec = None
    if "recurrent_dropout" in options:
        rec = (torch.rand(B, H, generator=gen, dtype=DT) > 0.4) / 0.6
    keep = None
    if "zoneout" in options:
        draw = [torch.rand(T, B, H, generator=gen, dtype=DT) for _ in range(n)]
        keep = tuple(d if real_valued else (d < 0.3).double() for d in draw)
    masks = CellMasks(None, rec, keep)
    x = torch.randn(T, B, I, generator=gen, dtype=DT, requires_grad=True)
    s0 = tuple(torch.randn(B, H, generator=gen, dtype=DT, requires_grad=True) for _ in range(n))
    state = LSTMState(s0[0][None, None], s0[1][None, None]) if n == 2 else s0[0][None, None]
    real = holey_mask.T
    out = layer(x, mask=real, state=state, masks=StackMasks(None, (None,), None, (masks,)))
    ref_out, ref_fin = _reference(cell, x, masks, real, s0)
    fin = [s[0, 0] for s in out.state] if n == 2 else [out.state[0, 0]]
    r3 = real[..., None]
    got_out, want_out = torch.where(r3, out.outputs, 0), torch.where(r3, ref_out, 0)
    torch.testing.assert_close(got_out, want_out, rtol=1e-12, atol=1e-12)
    for a, b in zip(fin, ref_fin, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    inputs = [x, *s0, *layer.parameters()]
    g = torch.randn(out.outputs.shape, generator=gen, dtype=DT)
    gf = [torch.randn(B, H, generator=gen, dtype=DT) for _ in fin]
    got = torch.autograd.grad([got_out, *fin], inputs, [g, *gf], allow_unused=True)
    want = torch.autograd.grad([want_out, *ref_fin], inputs, [g, *gf], allow_unused=True)
    for a, b in zip(got, want, strict=True):
        if b is None:  # gamma_ih of a layer reached only through the input part
            assert a is None or not a.any()
        else:
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


# -- the compiled loop against the PyTorch loop -----------------------------------------


def _mask(B: int, T: int) -> torch.Tensor:
    """``(B, T)``: full rows, a zero-length row, prefixes of every length, and holes."""
    lengths = torch.tensor([T, 0, 3, T, 5, 1, T, 2, T - 1, 4, T])[:B]
    mask = torch.arange(T)[None, :] < lengths[:, None]
    mask[3, 2] = mask[3, 4] = mask[6, 0] = mask[4, 1] = False  # holes inside rows
    return mask


def _stack(kind, options, dtype):
    """A bidirectional stack of two layers, the same parameters in either dtype (drawn in
    float32: float64 holds them exactly)."""
    torch.manual_seed(0)
    layer = KINDS[kind](I, H, num_layers=2, bidirectional=True, **options)
    _perturbed(layer, torch.Generator().manual_seed(2))
    return layer.to(dtype)


def _run(kind, options, dtype, threads, compiled, B=11, T=7):
    """Outputs, final states, every gradient (x, parameters, initial states) and the
    evaluation's outputs (zoneout's expectation, nothing saved) of :func:`_stack` over
    :func:`_mask`, the same masks and data in either dtype."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        layer = _stack(kind, options, dtype)
        gen = torch.Generator().manual_seed(1)
        x = torch.randn(B, T, I, generator=gen).to(dtype).requires_grad_()
        n = 2 if kind == "lstm" else 1
        s0 = [torch.randn(2, 2, B, H, generator=gen).to(dtype).requires_grad_() for _ in range(n)]
        torch.manual_seed(3)
        masks = _cast(layer.draw_masks(B, T, x.double()), dtype)  # drawn once, in float64
        mask = _mask(B, T)
        with native.use_native(compiled):
            state = LSTMState(*s0) if n == 2 else s0[0]
            out = layer(x, mask=mask, state=state, masks=masks)
            finals = list(out.state) if n == 2 else [out.state]
            h = torch.where(mask[..., None], out.outputs, 0.0)  # the padding is unspecified
            g = torch.linspace(-1, 1, h.numel(), dtype=h.dtype).view(h.shape)
            loss = (h * g).sum() + sum((f * f.cos()).sum() for f in finals)
            grads = torch.autograd.grad(loss, [x, *layer.parameters(), *s0])
            layer.eval()
            with torch.no_grad():
                h_eval = torch.where(mask[..., None], layer(x, mask=mask, state=state).outputs, 0)
        return [h.detach(), *(f.detach() for f in finals), *grads, h_eval]
    finally:
        torch.set_num_threads(before)


def _cast(masks: StackMasks | None, dtype: torch.dtype) -> StackMasks:
    """Every mask of ``masks`` in ``dtype``."""
    assert masks is not None

    def to(v):
        return None if v is None else v.to(dtype)

    cells = tuple(
        CellMasks(
            to(c.weight_hh), to(c.recurrent), None if c.keep is None else tuple(map(to, c.keep))
        )
        for c in masks.cells
    )
    return StackMasks(to(masks.input), tuple(map(to, masks.between)), to(masks.output), cells)


def _spy(monkeypatch) -> dict[str, int]:
    """Counts of the layer-normalised kernels' compiled calls that took regularizers."""
    calls = {"native_forward": 0, "native_backward": 0}
    for cls in (LayerNormLSTMKernel, LayerNormGRUKernel):
        for name in calls:
            original = getattr(cls, name)

            def spy(self, *args, _original=original, _name=name, **kwargs):
                reg = kwargs.get("reg")
                calls[_name] += reg is not None and any(r is not None for r in reg)
                return _original(self, *args, **kwargs)

            monkeypatch.setattr(cls, name, spy)
    return calls


@needs_native
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("kind", "options"), CASES)
def test_float64_compiled_equals_the_pytorch_loop(kind, options, threads, monkeypatch) -> None:
    calls = _spy(monkeypatch)
    got = _run(kind, options, DT, threads, compiled=True)
    # 4 directions of layers: forward and backward in training, forward at evaluation
    # (zoneout's expectation; recurrent dropout is then the identity)
    ran = {"native_forward": 8 if "zoneout" in options else 4, "native_backward": 4}
    assert calls == ran
    want = _run(kind, options, DT, threads, compiled=False)
    assert calls == ran  # the PyTorch loop: no more
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@needs_native
@pytest.mark.parametrize(("kind", "options"), CASES)
def test_float32_compiled_is_as_near_the_truth_as_the_pytorch_loop(kind, options) -> None:
    """Each loop rounds its own way in float32: both are held to the float64 result (the
    truth). Each tensor's error in the compiled loop, relative to the tensor's largest
    value, may be at most 4 times the PyTorch loop's largest such error over the tensors
    of the same run, plus 1e-6. (Per tensor the two loops' errors scatter: over six draws
    of the data the compiled loop's largest relative error was 0.6–2 times the PyTorch
    loop's, single tensors up to 7 times where the PyTorch loop happened to be exact.)"""
    truth = _run(kind, options, DT, 1, compiled=False)
    got = _run(kind, options, torch.float32, 1, compiled=True)
    want = _run(kind, options, torch.float32, 1, compiled=False)

    def rel(v, t):
        return float((v.double() - t).abs().max() / t.abs().max().clamp_min(1e-30))

    level = max(rel(b, t) for b, t in zip(want, truth, strict=True))
    for a, t in zip(got, truth, strict=True):
        assert rel(a, t) <= 4 * level + 1e-6


@needs_native
@pytest.mark.parametrize(("kind", "options"), CASES)
@pytest.mark.parametrize("forward_compiled", [True, False])
def test_either_loops_forward_pairs_with_either_loops_backward(kind, options, forward_compiled):
    """The compiled loop fills the PyTorch loop's record (the cell's caches, then the
    states standing in for zoneout's h̃): a forward on one loop and the backward on the
    other give the gradients of one loop (a mask with holes and a zero-length row)."""
    torch.manual_seed(0)
    cell = LayerNormLSTMCell(I, H) if kind == "lstm" else LayerNormGRUCell(I, H, kind[4:])
    cell = cell.double()
    _perturbed(cell, torch.Generator().manual_seed(2))
    T, B, n = 6, 5, cell.kernel.num_states
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(T, B, cell.gates * H, generator=gen, dtype=DT, requires_grad=True)
    s0 = tuple(torch.randn(B, H, generator=gen, dtype=DT) for _ in range(n))
    mask = torch.ones(T, B, dtype=torch.bool)
    mask[1, 2] = mask[3, 0] = mask[2, 4] = False
    mask[:, 3] = False
    rec = (torch.rand(B, H, generator=gen, dtype=DT) > 0.4) / 0.6
    keep = tuple((torch.rand(T, B, H, generator=gen, dtype=DT) < 0.3).double() for _ in range(n))
    kernel = regularized(
        cell.kernel,
        rec if "recurrent_dropout" in options else None,
        keep if "zoneout" in options else None,
    )
    params = [p for n, p in cell.named_parameters() if n not in ("weight_ih", "gamma_ih")]
    results = []
    for crossed in (False, True):
        with native.use_native(forward_compiled):
            out, finals = run_recurrence(kernel, x, cell.weights(), s0, mask)  # type: ignore[arg-type]
        loss = (out * out.sin()).sum() + sum(f.sum() for f in finals)
        with native.use_native(forward_compiled != crossed):
            results.append(torch.autograd.grad(loss, [x, *params]))
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


@needs_native
@pytest.mark.parametrize("cell", [LayerNormLSTMCell(3, 4), LayerNormGRUCell(3, 4)])
def test_the_compiled_loop_takes_the_regularizers(cell) -> None:
    """A layer-normalised cell with zoneout (and the LSTM with recurrent dropout) runs the
    compiled loop on the CPU: the kernel around it has the compiled forward."""
    cell = cell.double()
    x = torch.zeros(5, 2, cell.gates * 4, dtype=DT)
    n = cell.kernel.num_states
    keep = tuple(torch.full((5, 2, 4), 0.5, dtype=DT) for _ in range(n))
    rec = torch.ones(2, 4, dtype=DT) if n == 2 else None
    kernel = regularized(cell.kernel, rec, keep)
    assert isinstance(kernel, CompiledRegularized)
    assert compiled_library(kernel, x, *cell.weights()) is native.library()  # type: ignore[arg-type]
    plain = RegularizedKernel(cell.kernel, rec, keep)  # the PyTorch loop's, the oracle
    assert compiled_library(plain, x, *cell.weights()) is None  # type: ignore[arg-type]


@needs_native
def test_the_operators_refuse_wrong_keep_factors_and_packed_rows() -> None:
    lib = native.library()
    assert lib is not None
    T, B = 3, 2
    xp, w_hh, bias = torch.zeros(T, B, 4 * H), torch.zeros(4 * H, H), torch.zeros(4 * H)
    gains, h0 = torch.ones(6 * H), torch.zeros(B, H)
    with pytest.raises(RuntimeError, match=r"keep_c must be contiguous \[3, 2, 8\]"):
        lib.ln_lstm_forward(
            xp, w_hh, bias, gains, h0, h0, None, True, None, None, None, torch.zeros(T, B, 1)
        )
    with pytest.raises(RuntimeError, match=r"rec_mask must be contiguous \[2, 8\]"):
        lib.ln_lstm_forward(xp, w_hh, bias, gains, h0, h0, None, True, None, torch.ones(H))
    offsets = torch.tensor([0, 2, 4, 6])
    with pytest.raises(RuntimeError, match="need unpacked rows"):
        lib.ln_gru_forward(
            torch.zeros(T * B, 3 * H), w_hh[: 3 * H], bias[: 3 * H], torch.ones(4 * H), h0,
            None, True, False, offsets, torch.zeros(T, B, H),
        )  # fmt: skip
