"""A stack's call of one time step as PyTorch's fused cell operators, one per layer and
direction (``rnnkit.layers.fused_stack.one_step``), against the library's time loop with its
explicit BPTT (``use_fused("loop")``, the definition) in float64: outputs, final states and
every gradient; which calls take it and which keep the loop."""

from __future__ import annotations

import pytest
import torch

import rnnkit
from path_runs import FORMS
from path_runs import outputs_and_grads as _run
from rnnkit.bptt.fused import cell_step, step_in_one_call, use_fused
from rnnkit.layers import fused_stack
from rnnkit.types import LSTMState

pytestmark = pytest.mark.usefixtures("single_thread")

B, I, H = 5, 3, 4


@pytest.fixture
def steps(count_calls):
    """How many cells stepped through the fused cell operators."""
    return count_calls(fused_stack, "cell_step")


def _layer(cls, kw, dtype=torch.float64, **more):
    torch.manual_seed(3)
    return cls(input_size=I, hidden_size=H, **kw, **more).to(dtype)


def _state(layer, gen, dtype=torch.float64):
    L, D = layer.num_layers, layer.num_directions
    h = torch.randn(L, D, B, H, dtype=dtype, generator=gen)
    return LSTMState(h, torch.randn(L, D, B, H, dtype=dtype, generator=gen)) if layer.is_lstm else h


def _same(expected, got, tol=1e-12):
    assert len(expected) == len(got)
    for e, g in zip(expected, got, strict=True):
        torch.testing.assert_close(g, e, atol=tol, rtol=0.0)


@pytest.mark.parametrize("name, cls, kw", FORMS, ids=[f[0] for f in FORMS])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["one-way", "bidirectional"])
def test_one_step_equals_the_explicit_bptt_in_float64(name, cls, kw, bidirectional, steps):
    gen = torch.Generator().manual_seed(0)
    layer = _layer(cls, kw, num_layers=2, bidirectional=bidirectional)
    x = torch.randn(B, 1, I, dtype=torch.float64, generator=gen)
    state = _state(layer, gen)
    expected = _run(layer, x, state, "loop")
    assert steps["n"] == 0
    got = _run(layer, x, state, "auto")
    assert steps["n"] == 2 * layer.num_directions  # every cell of the stack, once
    _same(expected, got)


@pytest.mark.parametrize("name, cls, kw", FORMS, ids=[f[0] for f in FORMS])
def test_a_padded_row_keeps_its_state_and_its_nan_reaches_nothing(name, cls, kw, steps):
    # lengths 1 and 0 at T = 1: a row of length 0 holds its initial state, and the NaN in
    # its input (padding) must not reach an output, a state or a gradient
    gen = torch.Generator().manual_seed(1)
    layer = _layer(cls, kw, num_layers=2, bidirectional=True)
    x = torch.randn(B, 1, I, dtype=torch.float64, generator=gen)
    x[1] = float("nan")
    x[3] = float("nan")
    lengths = torch.tensor([1, 0, 1, 0, 1])
    state = _state(layer, gen)
    expected = _run(layer, x, state, "loop", lengths=lengths)
    got = _run(layer, x, state, "auto", lengths=lengths)
    assert steps["n"] == 4
    for t in got:
        assert torch.isfinite(t).all()
    _same(expected, got)


def test_no_initial_state_time_major_and_the_dropout_between_layers(steps):
    # Dropout between the layers in training: the same module draws the same B·H values
    # in the same order as in the loop's path, so a seeded call gives the same result and
    # leaves the generator where the loop leaves it.
    gen = torch.Generator().manual_seed(2)
    layer = _layer(rnnkit.LSTM, {}, num_layers=3, dropout=0.5, batch_first=False)
    x = torch.randn(1, B, I, dtype=torch.float64, generator=gen)
    expected = _run(layer, x, None, "loop", seed=7)
    after_loop = torch.get_rng_state()
    got = _run(layer, x, None, "auto", seed=7)
    assert torch.equal(torch.get_rng_state(), after_loop)
    assert steps["n"] == 3
    _same(expected, got)
    assert not torch.equal(got[0], _run(layer, x, None, "auto", seed=8)[0])  # it drops out


def test_float32_against_the_loop(steps):
    gen = torch.Generator().manual_seed(4)
    layer = _layer(rnnkit.GRU, {"update": "keep", "reset": "after"}, torch.float32, num_layers=2)
    x = torch.randn(B, 1, I, generator=gen)
    state = _state(layer, gen, torch.float32)
    expected = _run(layer, x, state, "loop")
    got = _run(layer, x, state, "auto")
    assert steps["n"] == 2
    _same(expected, got, tol=1e-6)


@pytest.mark.parametrize(
    "make, T, call",
    [
        (lambda: _layer(rnnkit.LSTM, {}), 2, {}),  # two steps: the loop
        (lambda: _layer(rnnkit.GRU, {}), 1, {}),  # reset="before": no fused operator
        (lambda: _layer(rnnkit.RNN, {"nonlinearity": "sigmoid"}), 1, {}),
        (lambda: _layer(rnnkit.LSTM, {}, zoneout=0.2), 1, {}),  # a regularizer inside
        (lambda: _layer(rnnkit.LSTM, {}, recompute=1), 1, {}),
        (lambda: _layer(rnnkit.GRU, {"reset": "after"}, layer_norm=True), 1, {}),
        (lambda: _layer(rnnkit.LSTM, {}), 1, {"window": 1}),
    ],
    ids=["T=2", "gru-before", "sigmoid", "zoneout", "recompute", "layer-norm", "window"],
)
def test_calls_the_cell_operators_do_not_compute_keep_the_loop(make, T, call, steps):
    layer = make()
    x = torch.randn(B, T, I, dtype=torch.float64, requires_grad=True)
    layer(x, **call).outputs.sum().backward()
    assert steps["n"] == 0


def test_the_path_decides():
    x = torch.zeros(1, 2, 3)
    assert step_in_one_call(x)
    assert step_in_one_call(x.double())
    assert not step_in_one_call(x.half())  # the CPU computes float16 in float32: the loop's
    for path in ("loop", "fused", "triton"):
        with use_fused(path):
            assert not step_in_one_call(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not step_in_one_call(x)


def test_under_vmap_the_loop_runs(steps):
    layer = _layer(rnnkit.LSTM, {})
    xs = torch.randn(3, B, 1, I, dtype=torch.float64)
    got = torch.func.vmap(lambda x: layer(x).outputs)(xs)
    with use_fused("loop"):
        expected = torch.stack([layer(x).outputs for x in xs])
    assert steps["n"] == 0
    torch.testing.assert_close(got, expected, atol=1e-12, rtol=0.0)


@pytest.mark.parametrize("name, cls, kw", FORMS, ids=[f[0] for f in FORMS])
def test_cell_step_is_the_cells_step(name, cls, kw):
    gen = torch.Generator().manual_seed(5)
    cell = _layer(cls, kw).cells()[0]
    x = torch.randn(B, I, dtype=torch.float64, generator=gen)
    h = torch.randn(B, H, dtype=torch.float64, generator=gen)
    c = torch.randn(B, H, dtype=torch.float64, generator=gen)
    state = LSTMState(h, c) if cell.is_lstm else h
    states0 = tuple(state) if cell.is_lstm else (state,)
    form = name.split("_")[0] if name.startswith("gru") or name == "lstm" else name
    got = cell_step(cell.kernel, form, x, cell.weights(), states0)
    with use_fused("loop"):
        expected = cell(x, state)
    expected = tuple(expected) if cell.is_lstm else (expected,)
    _same(list(expected), list(got))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name, cls, kw", FORMS, ids=[f[0] for f in FORMS])
def test_on_cuda_one_step_is_the_cell_operators_and_equals_the_cpu_oracle(name, cls, kw, steps):
    gen = torch.Generator().manual_seed(6)
    layer = _layer(cls, kw, num_layers=2, bidirectional=True)
    x = torch.randn(B, 1, I, dtype=torch.float64, generator=gen)
    state = _state(layer, gen)
    lengths = torch.tensor([1, 0, 1, 1, 0])
    expected = _run(layer, x, state, "loop", lengths=lengths)
    on_gpu = LSTMState(*(s.cuda() for s in state)) if layer.is_lstm else state.cuda()
    got = _run(layer.cuda(), x.cuda(), on_gpu, "auto", lengths=lengths.cuda())
    assert steps["n"] == 4
    _same(expected, [g.cpu() for g in got], tol=1e-10)
