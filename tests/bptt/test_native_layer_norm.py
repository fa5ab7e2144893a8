"""The layer-normalised LSTM and GRU in the compiled time loop (``rnnkit/csrc/layer_norm.h``)
against the PyTorch loop, the oracle: outputs, final states and every gradient, in float64
to 1e-12 and float32 to rounding, in bidirectional stacks with holes, zero-length and
full-length rows (sorted and packed by the compiled loop), on one and two threads; that
the dispatch runs the compiled loop; that either loop's forward pairs with either loop's
backward (the same caches); and what stays on the PyTorch loop. With recurrent dropout
and zoneout: tests/bptt/test_native_layer_norm_regularized.py."""

from __future__ import annotations

import pytest
import torch

from rnnkit import GRU, LSTM, LSTMState
from rnnkit.bptt import native
from rnnkit.bptt.dispatch import compiled_library
from rnnkit.bptt.fused import fused_form
from rnnkit.bptt.recurrence import run_recurrence, takes_projected
from rnnkit.bptt.regularized import regularized
from rnnkit.cells.layer_norm import (
    LayerNormGRUCell,
    LayerNormGRUKernel,
    LayerNormLSTMCell,
    LayerNormLSTMKernel,
)

pytestmark = pytest.mark.skipif(not native.available(), reason="no compiled loop here")

KINDS = {
    "lstm": lambda *a, **kw: LSTM(*a, layer_norm=True, **kw),
    "gru-keep": lambda *a, **kw: GRU(*a, layer_norm=True, reset="after", update="keep", **kw),
    "gru-candidate": lambda *a, **kw: GRU(*a, layer_norm=True, reset="after", **kw),
}
I, H = 5, 8


def _mask(B: int, T: int) -> torch.Tensor:
    """``(B, T)``: full rows, a zero-length row, prefixes of every length, and holes."""
    lengths = torch.tensor([T, 0, 3, T, 5, 1, T, 2, T - 1, 4, T])[:B]
    mask = torch.arange(T)[None, :] < lengths[:, None]
    mask[3, 2] = mask[3, 4] = mask[6, 0] = mask[4, 1] = False  # holes inside rows
    return mask


def _layer(kind: str, dtype: torch.dtype, hidden: int = H):
    """The same parameters in either dtype (drawn in float32: float64 holds them exactly)."""
    torch.manual_seed(0)
    layer = KINDS[kind](I, hidden, num_layers=2, bidirectional=True)
    with torch.no_grad():  # gains and shifts away from 1 and 0, so that they matter
        for name, p in layer.named_parameters():
            if "gamma" in name or "beta" in name or "bias_hn" in name:
                p.add_(0.3 * torch.randn(p.shape))
    return layer.to(dtype)


def _run(layer, x, mask, s0, compiled: bool):
    """Outputs, final states, every gradient (x, parameters, initial states), and the
    outputs again under no_grad (the loop then saves nothing)."""
    with native.use_native(compiled):
        state = LSTMState(*s0) if len(s0) == 2 else s0[0]
        out = layer(x, mask=mask, state=state)
        finals = list(out.state) if len(s0) == 2 else [out.state]
        real = mask.T[..., None] if not layer.batch_first else mask[..., None]
        h = torch.where(real, out.outputs, 0.0)  # the padding's outputs are unspecified
        g = torch.linspace(-1, 1, h.numel(), dtype=h.dtype).view(h.shape)
        loss = (h * g).sum() + sum((f * f.cos()).sum() for f in finals)
        grads = torch.autograd.grad(loss, [x, *layer.parameters(), *s0])
        with torch.no_grad():
            h_ng = torch.where(real, layer(x, mask=mask, state=state).outputs, 0.0)
    return [h.detach(), *(f.detach() for f in finals), *grads, h_ng]


def _loop(
    kind: str,
    dtype: torch.dtype,
    threads: int,
    compiled: bool,
    B: int = 11,
    T: int = 7,
    hidden: int = H,
):
    """:func:`_run` of a bidirectional stack over :func:`_mask` on ``threads`` threads, the
    same data in either dtype."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        layer = _layer(kind, dtype, hidden)
        gen = torch.Generator().manual_seed(1)
        x = torch.randn(B, T, I, generator=gen).to(dtype).requires_grad_()
        n = 2 if kind == "lstm" else 1
        s0 = [
            torch.randn(2, 2, B, hidden, generator=gen).to(dtype).requires_grad_() for _ in range(n)
        ]
        return _run(layer, x, _mask(B, T), s0, compiled)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("kind", list(KINDS))
def test_float64_compiled_equals_the_pytorch_loop(kind, threads) -> None:
    got = _loop(kind, torch.float64, threads, compiled=True)
    want = _loop(kind, torch.float64, threads, compiled=False)
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", list(KINDS))
def test_float64_compiled_equals_the_pytorch_loop_on_wide_rows(kind) -> None:
    """Rows wide enough for the compiled loop's blocked row sums (32 entries a block) and a
    remainder after them: H = 40, so 4H = 160, 3H = 120 and H itself end in a part block."""
    got = _loop(kind, torch.float64, 1, compiled=True, hidden=40)
    want = _loop(kind, torch.float64, 1, compiled=False, hidden=40)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("kind", list(KINDS))
def test_float32_compiled_is_as_near_the_truth_as_the_pytorch_loop(kind, threads) -> None:
    """In float32 each loop rounds its own way: both are held to the float64 result (the
    truth, to 1e-12) and the compiled loop's error may be at most 4 times the PyTorch
    loop's, plus 1e-6 of the tensor's largest value (measured: the compiled loop's error
    less that is at most 2.5 times the PyTorch loop's, in the gradients of the gains and
    the bias, which the loop sums row by row)."""
    truth = _loop(kind, torch.float64, threads, compiled=False)
    got = _loop(kind, torch.float32, threads, compiled=True)
    want = _loop(kind, torch.float32, threads, compiled=False)
    for a, b, t in zip(got, want, truth, strict=True):
        err_c, err_p = ((v.double() - t).abs().max() for v in (a, b))
        assert err_c <= 4 * err_p + 1e-6 * t.abs().max()


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_dispatch_runs_the_compiled_loop(kind, monkeypatch) -> None:
    """On the CPU the compiled loop runs both directions' forward and backward; with it
    switched off, the PyTorch loop."""
    cls = LayerNormLSTMKernel if kind == "lstm" else LayerNormGRUKernel
    calls: list[str] = []
    for name in ("native_forward", "native_backward"):
        original = getattr(cls, name)

        def spy(self, *args, _original=original, _name=name, **kwargs):
            calls.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(cls, name, spy)
    layer = _layer(kind, torch.float32)
    x = torch.randn(3, 4, I, requires_grad=True)
    with native.use_native(True):
        layer(x).outputs.sum().backward()
    assert calls.count("native_forward") == 4 and calls.count("native_backward") == 4
    calls.clear()
    with native.use_native(False):
        layer(x).outputs.sum().backward()
    assert calls == []


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("forward_compiled", [True, False])
def test_either_loops_forward_pairs_with_either_loops_backward(kind, forward_compiled) -> None:
    """The compiled loop fills the PyTorch loop's caches: a forward on one loop and the
    backward on the other give the gradients of one loop (a mask with holes; every row
    runs to the end, so that nothing is packed away)."""
    torch.manual_seed(0)
    cell = LayerNormLSTMCell(I, H) if kind == "lstm" else LayerNormGRUCell(I, H, kind[4:])
    cell = cell.double()
    T, B = 6, 5
    x = torch.randn(T, B, cell.gates * H, dtype=torch.float64, requires_grad=True)
    s0 = tuple(torch.randn(B, H, dtype=torch.float64) for _ in range(cell.kernel.num_states))
    mask = torch.ones(T, B, dtype=torch.bool)
    mask[1, 2] = mask[3, 0] = mask[2, 4] = False
    # the loop's weights: the input part's own (weight_ih, gamma_ih) are the caller's
    params = [p for n, p in cell.named_parameters() if n not in ("weight_ih", "gamma_ih")]
    results = []
    for crossed in (False, True):
        with native.use_native(forward_compiled):
            out, finals = run_recurrence(cell.kernel, x, cell.weights(), s0, mask)
        loss = (out * out.sin()).sum() + sum(f.sum() for f in finals)
        with native.use_native(forward_compiled != crossed):
            results.append(torch.autograd.grad(loss, [x, *params]))
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


@pytest.mark.parametrize("cell", [LayerNormLSTMCell(3, 4), LayerNormGRUCell(3, 4)])
def test_what_stays_on_the_pytorch_loop(cell) -> None:
    """The compiled loop takes the plain cell on the CPU (with zoneout too:
    tests/bptt/test_native_layer_norm_regularized.py); not a projected input (the cell
    reads its normalised input part, not x W_ihᵀ), and no fused kernel computes this
    function."""
    cell = cell.double()
    x = torch.zeros(5, 2, cell.gates * 4, dtype=torch.float64)
    w = cell.weights()
    assert compiled_library(cell.kernel, x, *w) is native.library()
    assert compiled_library(cell.kernel, x.to("meta"), *w) is None  # another device
    assert not takes_projected(cell.kernel, x, w)
    keep = tuple(
        torch.full((5, 2, 4), 0.5, dtype=torch.float64) for _ in range(cell.kernel.num_states)
    )
    assert compiled_library(regularized(cell.kernel, None, keep), x, *w) is native.library()  # type: ignore[arg-type]
    assert fused_form(cell.kernel) is None  # type: ignore[arg-type]


def test_the_operators_refuse_wrong_gains_and_caches() -> None:
    lib = native.library()
    assert lib is not None
    T, B = 3, 2
    xp, w_hh, bias = torch.zeros(T, B, 4 * H), torch.zeros(4 * H, H), torch.zeros(4 * H)
    h0 = c0 = torch.zeros(B, H)
    with pytest.raises(RuntimeError, match=r"gains \(48\)"):
        lib.ln_lstm_forward(xp, w_hh, bias, torch.zeros(5 * H), h0, c0, None, True)
    out = lib.ln_lstm_forward(xp, w_hh, bias, torch.ones(6 * H), h0, c0, None, True)
    with pytest.raises(RuntimeError, match="cache must hold 6 tensors"):
        lib.ln_lstm_backward(out[2:7], out[1], w_hh, torch.ones(6 * H), None, None, h0, c0)
    with pytest.raises(RuntimeError, match="xp has"):
        lib.ln_gru_forward(
            xp, w_hh[: 3 * H], bias[: 3 * H], torch.ones(4 * H), h0, None, True, False
        )
