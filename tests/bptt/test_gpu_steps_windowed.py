"""The Triton steps' forward under the windowed BPTT(τ) and every other ``forward_pass``
reader (``rnnkit.bptt.gpu_steps.forward_record``), against the CPU's default path.

No GPU here: the kernels run in Triton's interpreter (``TRITON_INTERPRET=1`` for this
module only), the path forced with ``use_fused("triton")``. Oracle: the same call on the
CPU's default path (the compiled or the PyTorch loop, no Triton), in float64, to 1e-12:
outputs, final states and every gradient. A spy on the launches' driver makes sure the
Triton forward ran (a fallback to the loop would pass the comparisons). Sizes stay tiny:
the interpreter runs every launch in numpy.
"""

from __future__ import annotations

import pytest
import torch

import rnnkit
from rnnkit.bptt import gpu_route, gpu_steps
from rnnkit.bptt.backward import backward_sweep, weight_grads
from rnnkit.bptt.forward import forward_pass
from rnnkit.bptt.fused import use_fused
from rnnkit.bptt.native import use_native
from rnnkit.bptt.recompute import run_recomputed
from rnnkit.bptt.recurrence import run_recurrence
from rnnkit.bptt.regularized import regularized
from rnnkit.cells.gru import GRUCell
from rnnkit.cells.layer_norm import LayerNormLSTMCell
from rnnkit.cells.lstm import LSTMCell
from rnnkit.cells.rnn import RNNCell
from rnnkit.types import LSTMState

pytest.importorskip("triton")
pytestmark = pytest.mark.usefixtures("triton_interpreter", "single_thread")
T, B, I, H = 5, 3, 2, 3
DT = torch.float64

CELLS = {
    "lstm": lambda: LSTMCell(I, H),
    "gru_keep_before": lambda: GRUCell(I, H, update="keep", reset="before"),
    "gru_keep_after": lambda: GRUCell(I, H, update="keep", reset="after"),
    "gru_candidate_before": lambda: GRUCell(I, H, update="candidate", reset="before"),
    "gru_candidate_after": lambda: GRUCell(I, H, update="candidate", reset="after"),
    "rnn_tanh": lambda: RNNCell(I, H, nonlinearity="tanh"),
    "rnn_relu": lambda: RNNCell(I, H, nonlinearity="relu"),
    "rnn_sigmoid": lambda: RNNCell(I, H, nonlinearity="sigmoid"),
}


@pytest.fixture
def launches(count_calls):
    """How many forwards the Triton steps ran (their driver, ``gpu_steps._forward``)."""
    count = count_calls(gpu_steps, "_forward")
    return count


def _holes() -> torch.Tensor:
    """``(T, B)``: row 0 full, row 1 empty, row 2 with holes (one at the start)."""
    mask = torch.ones(T, B, dtype=torch.bool)
    mask[:, 1] = False
    mask[[0, 2], 2] = False
    return mask


def _close(got, want) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        if a is None or b is None:
            assert a is None and b is None
            continue
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def _recurrence(cell, x, states0, mask, window, path):
    """Outputs, finals and the gradients of x, the weights and the initial states of
    ``run_recurrence(window=τ)`` on ``path``."""
    x = x.clone().requires_grad_(True)
    states0 = tuple(s.clone().requires_grad_(True) for s in states0)
    with use_fused(path):
        outputs, finals = run_recurrence(cell.kernel, x, cell.weights(), states0, mask, window)
    g = torch.Generator().manual_seed(3)
    loss = (outputs * torch.randn(outputs.shape, dtype=DT, generator=g)).sum()
    loss = loss + sum((f * torch.randn(f.shape, dtype=DT, generator=g)).sum() for f in finals)
    params = [p for p in cell.weights() if p is not None]
    grads = torch.autograd.grad(loss, [x, *params, *states0])
    return [outputs.detach(), *(f.detach() for f in finals), *grads]


@pytest.mark.parametrize("window", [1, 3, T + 2])
@pytest.mark.parametrize("name", list(CELLS))
def test_windowed_recurrence_on_the_triton_forward_equals_the_cpu_path(name, window, launches):
    torch.manual_seed(1)
    cell = CELLS[name]().double()
    n = 2 if isinstance(cell, LSTMCell) else 1
    g = torch.Generator().manual_seed(0)
    x = torch.randn(T, B, I, dtype=DT, generator=g)
    states0 = tuple(torch.randn(B, H, dtype=DT, generator=g) for _ in range(n))
    mask = _holes()
    x[~mask] = float("nan")  # padding may hold anything
    want = _recurrence(cell, x, states0, mask, window, "auto")
    assert launches["n"] == 0  # the CPU's default never runs the Triton steps
    got = _recurrence(cell, x, states0, mask, window, "triton")
    assert launches["n"] == 1
    _close(got, want)
    assert torch.equal(got[1][1], states0[0][1])  # the empty row holds its initial state


@pytest.mark.parametrize("name", ["lstm", "gru_keep_before", "gru_candidate_after", "rnn_relu"])
def test_record_has_the_loops_layout_with_resets(name):
    """``forward_record`` keeps what the PyTorch loop keeps (states, cache, reset) at
    every real step, and the explicit BPTT on it gives the loop's gradients."""
    torch.manual_seed(2)
    cell = CELLS[name]().double()
    kernel, w = cell.kernel, cell.weights()
    n = 2 if isinstance(cell, LSTMCell) else 1
    g = torch.Generator().manual_seed(4)
    x = torch.randn(T, B, I, dtype=DT, generator=g)
    states0 = tuple(torch.randn(B, H, dtype=DT, generator=g) for _ in range(n))
    mask3 = _holes()[..., None]
    x = torch.where(mask3, x, 0.0)
    reset3 = torch.zeros(T, B, 1, dtype=torch.bool)
    reset3[0, 0] = reset3[3, 0] = reset3[2, 2] = True  # (2, 2) a held step
    d_out = torch.randn(T, B, H, dtype=DT, generator=g)
    d_fin = tuple(torch.randn(B, H, dtype=DT, generator=g) for _ in range(n))
    need = (True, True, True, True, w.bias_hn is not None)
    results = []
    for path in ("triton", "loop"):
        with use_fused(path), use_native(False), torch.no_grad():
            rec = forward_pass(kernel, x, w, states0, mask3, True, reset=reset3)
            sweep = backward_sweep(kernel, rec, w, mask3, d_out, d_fin, window=2)
            grads = weight_grads(kernel, rec, sweep, w, need)
        results.append((rec, [*grads, *sweep.d_states0]))
    (got, g_got), (want, g_want) = results
    assert got.reset is reset3 and got.x.shape == want.x.shape == (T * B, I)
    _close(got.states, want.states)
    assert len(got.cache) == len(want.cache)
    real = mask3.expand(T, B, 1)
    for a, b in zip(got.cache, want.cache, strict=True):
        assert a.shape == b.shape
        _close([torch.where(real, a, 0.0)], [torch.where(real, b, 0.0)])
    _close(g_got, g_want)


def _stack_results(layer, x, mask, state, resets, window, path):
    x = x.clone().requires_grad_(True)
    with use_fused(path):
        out = layer(x, mask=mask, state=state, window=window, resets=resets)
    finals = tuple(out.state) if isinstance(out.state, LSTMState) else (out.state,)
    loss = out.outputs.sin().sum() + sum((f * f).sum() for f in finals)
    grads = torch.autograd.grad(loss, [x, *layer.parameters()])
    return [out.outputs, *finals, *grads]


@pytest.mark.parametrize(
    ("cls", "options", "window"),
    [
        (rnnkit.LSTM, {}, 2),
        (rnnkit.GRU, {"reset": "before"}, 1),
        (rnnkit.RNN, {"nonlinearity": "sigmoid"}, 3),
    ],
)
def test_two_layer_stack_with_resets_through_the_public_layer(cls, options, window, launches):
    torch.manual_seed(3)
    layer = cls(I, H, num_layers=2, **options).double()
    mask = _holes().T.contiguous()  # (B, T)
    x = torch.randn(B, T, I, dtype=DT)
    resets = torch.zeros(B, T, dtype=torch.bool)
    resets[0, 2] = resets[2, 3] = resets[2, 2] = True  # (2, 2) a held step
    n = 2 if cls is rnnkit.LSTM else 1
    parts = [torch.randn(2, 1, B, H, dtype=DT) for _ in range(n)]
    state = LSTMState(*parts) if n == 2 else parts[0]
    want = _stack_results(layer, x, mask, state, resets, window, "auto")
    got = _stack_results(layer, x, mask, state, resets, window, "triton")
    assert launches["n"] == 2  # one Triton forward per layer
    _close(got, want)


@pytest.mark.parametrize(("cls", "options"), [(rnnkit.LSTM, {}), (rnnkit.GRU, {"reset": "after"})])
def test_bidirectional_stack_with_holes_through_the_public_layer(cls, options, launches):
    torch.manual_seed(5)
    layer = cls(I, H, num_layers=2, bidirectional=True, **options).double()
    mask = _holes().T.contiguous()
    x = torch.randn(B, T, I, dtype=DT)
    x[~mask] = float("nan")
    want = _stack_results(layer, x, mask, None, None, 2, "auto")
    got = _stack_results(layer, x, mask, None, None, 2, "triton")
    assert launches["n"] == 4  # two layers, two directions
    _close(got, want)


def test_segment_recompute_runs_the_triton_forward(launches):
    torch.manual_seed(6)
    cell = CELLS["gru_candidate_before"]().double()
    g = torch.Generator().manual_seed(7)
    x = torch.randn(T, B, I, dtype=DT, generator=g)
    s0 = torch.randn(B, H, dtype=DT, generator=g)
    mask = _holes()
    results = []
    for path in ("auto", "triton"):
        xx, h0 = x.clone().requires_grad_(True), s0.clone().requires_grad_(True)
        with use_fused(path):  # the backward recomputes on the path of its own call
            outputs, (h,) = run_recomputed(cell.kernel, xx, cell.weights(), (h0,), mask, 2)
            loss = outputs.sin().sum() + (h * h).sum()
            grads = torch.autograd.grad(loss, [xx, *cell.parameters(), h0])
        results.append([outputs, h, *grads])
    # three segments forward, each again in the backward
    assert launches["n"] == 6
    _close(*results)


def test_steps_record_takes_the_plain_cells_only():
    x = torch.zeros(T, B, I, dtype=DT)
    lstm = LSTMCell(I, H).kernel
    with use_fused("auto"):
        assert not gpu_route.steps_record(lstm, x)  # the CPU's default: the loop
    with use_fused("loop"):
        assert not gpu_route.steps_record(lstm, x)
    with use_fused("triton"):
        for make in CELLS.values():
            assert gpu_route.steps_record(make().kernel, x)
        assert not gpu_route.steps_record(lstm, x.half())
        assert not gpu_route.steps_record(LayerNormLSTMCell(I, H).kernel, x)
        assert not gpu_route.steps_record(regularized(lstm, torch.ones(B, H), None), x)


@pytest.mark.parametrize(("window", "recompute"), [(2, None), (None, 2)])
@pytest.mark.parametrize(("cls", "options"), [(rnnkit.LSTM, {}), (rnnkit.GRU, {"reset": "before"})])
def test_a_regularized_stack_under_a_window_or_recompute_on_the_gpu_route(
    cls, options, window, recompute
):
    """Recurrent dropout, zoneout and weight drop under a window or recompute where a GPU
    would run: the masks drawn from the same seed, the same results as the CPU's path."""
    torch.manual_seed(8)
    layer = cls(
        I, H, num_layers=2, recurrent_dropout=0.3, zoneout=0.2, weight_drop=0.2, **options
    ).double()
    layer.recompute = recompute
    mask = _holes().T.contiguous()
    x = torch.randn(B, T, I, dtype=DT)
    results = []
    for path in ("auto", "triton"):
        torch.manual_seed(9)
        results.append(_stack_results(layer, x, mask, None, None, window, path))
    _close(*results)


@pytest.mark.parametrize("cls", [rnnkit.LSTM, rnnkit.GRU])
def test_resets_in_one_call_draw_the_pieces_dropout(cls, launches):
    """Dropout between layers with rows reset inside the batch: the Triton steps run each
    layer in one call, the CPU's path the pieces between the reset columns; the one call
    draws its masks as the pieces do (piece by piece, layer by layer), so both give the
    same outputs and gradients for the same seed."""
    torch.manual_seed(4)
    layer = cls(I, H, num_layers=3, dropout=0.4).double()
    mask = _holes().T.contiguous()
    x = torch.randn(B, T, I, dtype=DT)
    resets = torch.zeros(B, T, dtype=torch.bool)
    resets[0, 2] = resets[2, 3] = True  # pieces 0–1, 2, 3–4
    results = []
    for path in ("auto", "triton"):
        torch.manual_seed(9)
        results.append(_stack_results(layer, x, mask, None, resets, None, path))
    assert launches["n"] == 3  # the one call of each layer
    _close(*results)
    torch.manual_seed(10)  # another draw: other masks, so the check above is not vacuous
    other = _stack_results(layer, x, mask, None, resets, None, "auto")
    assert not torch.allclose(other[0], results[0][0])
