"""The Triton steps (``rnnkit.bptt.gpu_steps``) against the explicit BPTT, and their route.

No GPU here: the kernels run in Triton's interpreter (``TRITON_INTERPRET=1``, set for this
module only, before the kernels' module is imported, and removed after it). Oracle: the
library's PyTorch time loop with its explicit BPTT (``forward_pass``, ``backward_sweep``,
``weight_grads``; resets as the loop applies them), in float64, to ~1e-12. Sizes stay
tiny: the interpreter runs every launch in numpy. One test compiles every kernel for a
GPU (Triton's compiler, no GPU needed), in a process without the interpreter.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from types import SimpleNamespace

import pytest
import torch

import rnnkit
from rnnkit.bptt import dispatch, fused, gpu_route, gpu_steps, recurrence
from rnnkit.bptt.backward import backward_sweep, weight_grads
from rnnkit.bptt.dispatch import LOOP, STEPS, route
from rnnkit.bptt.forward import forward_pass
from rnnkit.bptt.fused import use_fused
from rnnkit.bptt.native import use_native
from rnnkit.bptt.regularized import regularized
from rnnkit.cells.gru import GRUCell
from rnnkit.cells.layer_norm import LayerNormLSTMCell
from rnnkit.cells.lstm import LSTMCell
from rnnkit.cells.rnn import RNNCell
from rnnkit.errors import ConfigError
from rnnkit.types import LSTMState

pytest.importorskip("triton")
pytestmark = pytest.mark.usefixtures("triton_interpreter")  # tests/conftest.py
T, B, I, H = 5, 3, 2, 4

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


def _case(kind: str, n: int, dtype: torch.dtype, seed: int = 0):
    """Input, initial states, mask and resets of a case: ``plain`` (every step real),
    ``holes`` (row 0 of length T, row 1 of length 0, row 2 with holes) or ``resets``
    (the same mask, and resets inside the loop, one at step 0 and one at a held step)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, B, I, dtype=dtype, generator=g)
    states0 = tuple(torch.randn(B, H, dtype=dtype, generator=g) for _ in range(n))
    mask = reset = None
    if kind != "plain":
        mask = torch.ones(T, B, dtype=torch.bool)
        mask[:, 1] = False
        mask[[1, 3], 2] = False
        x = torch.where(mask[..., None], x, 0.0)  # as clean_padding leaves it
    if kind == "resets":
        reset = torch.zeros(T, B, dtype=torch.bool)
        reset[2, 0] = reset[0, 2] = reset[3, 2] = True  # (3, 2) is a held step
    return x, states0, mask, reset


def _oracle(cell, x, states0, mask, reset, d_out, d_finals):
    """The explicit BPTT of the PyTorch loop: outputs, finals, then the gradients of x,
    weight_ih, weight_hh, bias, (bias_hn,) and the initial states."""
    kernel, w = cell.kernel, cell.weights()
    mask3 = None if mask is None else mask[..., None]
    reset3 = None if reset is None else reset[..., None]
    need = (True, True, True, True, w.bias_hn is not None)
    with use_native(False), torch.no_grad():
        record = forward_pass(kernel, x, w, states0, mask3, True, reset=reset3)
        sweep = backward_sweep(kernel, record, w, mask3, d_out, d_finals)
        grads = weight_grads(kernel, record, sweep, w, need)
    finals = tuple(s[-1] for s in record.states)
    got = [g for g in grads if g is not None]
    return [record.states[0][1:], *finals, *got, *sweep.d_states0]


def _steps(cell, x, states0, mask, reset, d_out, d_finals):
    """The same by the Triton steps, gradients by autograd through their node."""
    x = x.clone().requires_grad_(True)
    states0 = tuple(s.clone().requires_grad_(True) for s in states0)
    outputs, finals = gpu_steps.run_steps(cell.kernel, x, cell.weights(), states0, mask, reset)
    loss = (outputs * d_out).sum() + sum(
        (f * d).sum() for f, d in zip(finals, d_finals, strict=True)
    )
    params = [p for p in cell.weights() if p is not None]
    grads = torch.autograd.grad(loss, [x, *params, *states0])
    return [outputs.detach(), *(f.detach() for f in finals), *grads]


@pytest.mark.parametrize("kind", ["plain", "holes", "resets"])
@pytest.mark.parametrize("name", list(CELLS))
def test_steps_equal_the_explicit_bptt_in_float64(name, kind):
    torch.manual_seed(1)
    cell = CELLS[name]().double()
    n = 2 if isinstance(cell, LSTMCell) else 1
    x, states0, mask, reset = _case(kind, n, torch.float64)
    g = torch.Generator().manual_seed(5)
    d_out = torch.randn(T, B, H, dtype=torch.float64, generator=g)
    d_finals = tuple(torch.randn(B, H, dtype=torch.float64, generator=g) for _ in range(n))
    want = _oracle(cell, x, states0, mask, reset, d_out, d_finals)
    got = _steps(cell, x, states0, mask, reset, d_out, d_finals)
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    if kind != "plain":  # the empty row holds its initial state, and its gradient
        assert torch.equal(got[1][1], states0[0][1])
        passed = d_finals[0][1] + d_out[:, 1].sum(0)
        torch.testing.assert_close(got[-n][1], passed, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["lstm", "gru_keep_before", "gru_candidate_after", "rnn_sigmoid"])
def test_steps_in_float32_agree_with_float64(name):
    torch.manual_seed(1)
    cell = CELLS[name]().double()
    n = 2 if isinstance(cell, LSTMCell) else 1
    x, states0, mask, reset = _case("resets", n, torch.float64)
    d_out = torch.ones(T, B, H, dtype=torch.float64)
    d_finals = tuple(torch.ones(B, H, dtype=torch.float64) for _ in range(n))
    want = _oracle(cell, x, states0, mask, reset, d_out, d_finals)
    cell = cell.float()
    got = _steps(
        cell,
        x.float(),
        tuple(s.float() for s in states0),
        mask,
        reset,
        d_out.float(),
        tuple(d.float() for d in d_finals),
    )
    for a, b in zip(got, want, strict=True):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=1e-5)


def test_no_steps_no_work_and_inference_keeps_nothing():
    cell = CELLS["gru_keep_before"]().double()
    x, states0, _, _ = _case("plain", 1, torch.float64)
    outputs, (h,) = gpu_steps.run_steps(cell.kernel, x[:0], cell.weights(), states0)
    assert outputs.shape == (0, B, H) and torch.equal(h, states0[0])
    empty = (states0[0][:0],)  # a batch of no rows
    outputs, (h,) = gpu_steps.run_steps(cell.kernel, x[:, :0], cell.weights(), empty)
    assert outputs.shape == (T, 0, H) and h.shape == (0, H)
    with torch.no_grad():
        outputs, (h,) = gpu_steps.run_steps(cell.kernel, x, cell.weights(), states0)
    want = _oracle(cell, x, states0, None, None, torch.zeros(T, B, H), (torch.zeros(B, H),))
    torch.testing.assert_close(outputs, want[0], rtol=0, atol=1e-12)
    assert not outputs.requires_grad


@pytest.fixture
def steps_calls(count_calls):
    """How many layers the Triton steps ran."""
    count = count_calls(recurrence, "run_steps")
    return count


def _layer_results(layer, x, mask, state, path):
    x = x.clone().requires_grad_(True)
    with use_fused(path), use_native(False):
        out = layer(x, mask=mask, state=state)
    finals = tuple(out.state) if isinstance(out.state, LSTMState) else (out.state,)
    loss = out.outputs.sin().sum() + sum((f * f).sum() for f in finals)
    grads = torch.autograd.grad(loss, [x, *layer.parameters()])
    return [out.outputs, *finals, *grads]


@pytest.mark.parametrize(
    ("cls", "options"),
    [
        (rnnkit.LSTM, {}),
        (rnnkit.GRU, {"reset": "before"}),
        (rnnkit.RNN, {"nonlinearity": "sigmoid"}),
    ],
)
def test_bidirectional_stack_with_holes_through_the_public_layer(cls, options, steps_calls):
    torch.manual_seed(2)
    layer = cls(I, H, num_layers=2, bidirectional=True, **options).double()
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1] = False  # length 0
    mask[2, [0, 3]] = False  # holes; row 0 has length T
    x = torch.randn(B, T, I, dtype=torch.float64)
    x[~mask] = float("nan")  # padding may hold anything
    n = 2 if cls is rnnkit.LSTM else 1
    parts = [torch.randn(2, 2, B, H, dtype=torch.float64) for _ in range(n)]
    state = LSTMState(*parts) if n == 2 else parts[0]
    got = _layer_results(layer, x, mask, state, "triton")
    assert steps_calls["n"] == 4  # two layers, two directions
    want = _layer_results(layer, x, mask, state, "loop")
    assert steps_calls["n"] == 4
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    ("cls", "options"),
    [
        (rnnkit.GRU, {"reset": "before"}),
        (rnnkit.LSTM, {"num_layers": 2}),
        (rnnkit.LSTM, {"num_layers": 2, "layer_norm": True}),
        (rnnkit.GRU, {"num_layers": 2, "layer_norm": True, "reset": "after"}),
    ],
)
def test_stack_resets_run_inside_one_triton_call_per_layer(cls, options, steps_calls):
    torch.manual_seed(4)
    layer = cls(I, H, **options).double()
    x = torch.randn(B, T, I, dtype=torch.float64)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, 3:] = False
    mask[2, 1] = False
    resets = torch.zeros(B, T, dtype=torch.bool)
    resets[0, 2] = resets[2, 4] = resets[2, 1] = True  # (2, 1) is a held step
    results = []
    for path in ("triton", "loop"):
        xx = x.clone().requires_grad_(True)
        with use_fused(path), use_native(False):
            out = layer(xx, mask=mask, resets=resets)
        finals = tuple(out.state) if isinstance(out.state, LSTMState) else (out.state,)
        loss = out.outputs.sin().sum() + sum((f * f).sum() for f in finals)
        grads = torch.autograd.grad(loss, [xx, *layer.parameters()])
        results.append([out.outputs, *finals, *grads])
    # one call per layer on the Triton steps; the loop ran the pieces between the resets
    assert steps_calls["n"] == layer.num_layers
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_a_window_without_a_gradient_takes_the_resets_in_one_call(steps_calls):
    # the window shapes the gradient only: evaluation with one runs the plain Triton path
    torch.manual_seed(6)
    layer = rnnkit.LSTM(I, H, num_layers=2).double()
    x = torch.randn(B, T, I, dtype=torch.float64)
    resets = torch.zeros(B, T, dtype=torch.bool)
    resets[0, 2] = resets[2, 1] = True
    with torch.no_grad():
        with use_fused("triton"), use_native(False):
            got = layer(x, resets=resets, window=2)
        assert steps_calls["n"] == 2  # one call per layer, not the pieces between resets
        with use_fused("loop"), use_native(False):
            want = layer(x, resets=resets)
    torch.testing.assert_close(got.outputs, want.outputs, rtol=0, atol=1e-12)
    torch.testing.assert_close(got.state.c, want.state.c, rtol=0, atol=1e-12)


def test_resets_inside_one_call_only_on_the_triton_steps():
    cell = CELLS["lstm"]().double()
    x, states0, mask, reset = _case("resets", 2, torch.float64)
    args = (cell.kernel, x, cell.weights())
    with use_fused("loop"):
        assert not recurrence.takes_resets(*args, mask, None)
        with pytest.raises(ValueError, match="takes_resets"):
            recurrence.run_recurrence(*args, states0, mask, reset=reset)
    with use_fused("triton"):
        assert recurrence.takes_resets(*args, mask, None)
        assert not recurrence.takes_resets(*args, mask, 2)  # a window: the pieces


def _route(kernel, x, mask3=None, window=None, projected=False):
    return route(kernel, x, None, (), None, mask3, window, projected).path  # type: ignore[arg-type]


def test_route_forced_triton_takes_every_cell_it_handles():
    x = torch.zeros(T, B, I, dtype=torch.float64)
    holes = torch.ones(T, B, 1, dtype=torch.bool)
    holes[1, 0] = False
    with use_fused("triton"):
        for make in CELLS.values():
            assert _route(make().kernel, x) == STEPS
            assert _route(make().kernel, x, holes) == STEPS
        lstm = LSTMCell(I, H).kernel
        assert _route(lstm, x, window=3) == LOOP  # windowed BPTT(τ): the loop's
        assert _route(lstm, x, projected=True) == LOOP
        assert _route(lstm, x.half()) == LOOP
        assert _route(LayerNormLSTMCell(I, H).kernel, x) == STEPS
        assert _route(LayerNormLSTMCell(I, H).kernel, x, window=3) == LOOP
        # recurrent dropout and zoneout around a cell it handles (layer-normalised too)
        assert _route(regularized(lstm, torch.ones(B, H), None), x) == STEPS
        keep = (torch.ones(T, B, H),)
        assert _route(regularized(CELLS["rnn_sigmoid"]().kernel, None, keep), x) == STEPS
        norm = LayerNormLSTMCell(I, H).kernel
        assert _route(regularized(norm, torch.ones(B, H), None), x) == STEPS
        assert _route(regularized(norm, torch.ones(B, H), None), x, window=3) == LOOP


class _CudaLike:
    """What the route reads of a CUDA tensor: its device and dtype (a device object needs
    no GPU; nothing is allocated on it)."""

    device = torch.device("cuda", 0)
    dtype = torch.float32


@pytest.fixture
def kernels_run_on_cuda(monkeypatch):
    """The Triton kernels' first-use test on cuda:0 answered: they run."""
    monkeypatch.setitem(gpu_route._why, "cuda:0", None)


class _BrokenLaunch:
    """A kernel whose launch fails as a GPU without the toolchain's support fails."""

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            raise RuntimeError("PTXASError: ptxas fatal   : Value 'sm_120a' is not defined")

        return launch


@pytest.fixture
def kernels_cannot_run(monkeypatch):
    """triton imports, but no kernel builds: the first-use test fails (not looked up yet)."""
    monkeypatch.setitem(sys.modules, "broken_kernels", SimpleNamespace(probe=_BrokenLaunch()))
    monkeypatch.setattr(gpu_route, "_PROBE", "broken_kernels")
    monkeypatch.setattr(gpu_route, "_why", {})
    monkeypatch.setattr(gpu_route, "_warned", set())
    monkeypatch.setitem(gpu_route._found, "triton", True)


@pytest.mark.usefixtures("kernels_run_on_cuda")
def test_route_auto_takes_the_steps_on_cuda_where_cudnn_cannot(monkeypatch):
    x = _CudaLike()
    with use_fused("auto"):
        for name in ("gru_keep_before", "gru_candidate_before", "rnn_sigmoid"):
            assert _route(CELLS[name]().kernel, x) == STEPS
        assert _route(CELLS["gru_keep_before"]().kernel, x, window=2) == LOOP
        assert _route(LayerNormLSTMCell(I, H).kernel, x) == STEPS
        # on the CPU the loop runs (the compiled one), whatever the cell
        cpu = torch.zeros(T, B, I)
        assert _route(CELLS["gru_keep_before"]().kernel, cpu) == LOOP
        monkeypatch.setitem(gpu_route._found, "triton", False)  # triton not installed
        assert _route(CELLS["gru_keep_before"]().kernel, x) == LOOP
    with use_fused("loop"):
        monkeypatch.setitem(gpu_route._found, "triton", True)
        assert _route(CELLS["gru_keep_before"]().kernel, x) == LOOP


@pytest.mark.usefixtures("kernels_run_on_cuda")
def test_auto_on_cuda_keeps_cudnn_where_it_computes_the_function():
    x = _CudaLike()
    with use_fused("auto"):
        assert _route(CELLS["lstm"]().kernel, x) == dispatch.FUSED


@pytest.mark.usefixtures("kernels_cannot_run")
def test_auto_falls_back_to_the_loop_with_one_warning_where_triton_cannot_run(monkeypatch):
    x = _CudaLike()
    kernel = CELLS["gru_keep_before"]().kernel
    with use_fused("auto"):
        # without a GPU the test's allocation fails first (a CPU build of torch: not
        # compiled with CUDA; a CUDA build: no driver); on one, the broken launch
        why = (
            r"\((AssertionError: Torch not compiled with CUDA"
            r"|RuntimeError: Found no NVIDIA driver|RuntimeError: PTXAS)"
        )
        with pytest.warns(RuntimeWarning, match="cannot run on cuda:0 " + why):
            assert _route(kernel, x) == LOOP
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # said once per device
            assert _route(kernel, x) == LOOP
    assert gpu_route._why["cuda:0"] is not None


@pytest.mark.usefixtures("kernels_cannot_run")
def test_inside_the_callers_own_graph_capture_the_first_use_test_waits(monkeypatch):
    """The first-use test reads a value back, which would break a capture of the caller's
    own CUDA graph: inside one, that call runs the loop, with no warning, and nothing is
    kept; the test runs at the first call outside it."""
    x = _CudaLike()
    kernel = CELLS["gru_keep_before"]().kernel
    monkeypatch.setattr(gpu_route, "_capturing", lambda device: True)
    with use_fused("auto"), warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _route(kernel, x) == LOOP
    assert "cuda:0" not in gpu_route._why
    monkeypatch.setattr(gpu_route, "_capturing", lambda device: False)
    with use_fused("auto"), pytest.warns(RuntimeWarning, match="cannot run on cuda:0"):
        assert _route(kernel, x) == LOOP
    assert gpu_route._why["cuda:0"] is not None


@pytest.mark.usefixtures("kernels_cannot_run")
def test_forced_path_where_triton_cannot_run_is_one_clear_error(monkeypatch):
    x = torch.zeros(T, B, I)  # the CPU, in the interpreter as far as the check goes
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with use_fused("triton"), pytest.raises(ConfigError, match="triton cannot run on cpu: "):
        _route(CELLS["lstm"]().kernel, x)


def test_the_first_use_test_passes_where_the_kernels_run():
    # the interpreter (this module's fixture) runs them on the CPU
    assert gpu_route._runs_on(torch.device("cpu")) is None


def test_forced_path_without_interpreter_or_triton_is_one_clear_error(monkeypatch):
    x = torch.zeros(T, B, I)
    kernel = CELLS["lstm"]().kernel
    with use_fused("triton"):
        monkeypatch.delenv("TRITON_INTERPRET")
        with pytest.raises(ConfigError, match="TRITON_INTERPRET=1"):
            _route(kernel, x)
        monkeypatch.setitem(gpu_route._found, "triton", False)
        with pytest.raises(ConfigError, match=r"pip install 'rnnkit\[gpu\]'"):
            _route(kernel, x)


def test_the_environment_variable_names_the_path(monkeypatch):
    monkeypatch.setenv("RNNKIT_GPU_PATH", " Triton ")
    assert fused._from_environment() == "triton"
    assert "triton" in fused.PATHS


def test_importing_rnnkit_does_not_import_triton():
    code = (
        "import sys, rnnkit; "
        "print('triton' in sys.modules, 'rnnkit.bptt.triton_kernels' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=os.environ
    )
    assert out.stdout.split() == ["False", "False"]


@pytest.mark.slow
def test_kernels_compile_for_a_gpu(compile_for_sm90):
    cases = """[
        (K.lstm_forward, {"HAS_MASK": True, "HAS_RESET": True}),
        (K.lstm_backward, {"HAS_MASK": True, "HAS_RESET": True, "HAS_DOUT": True}),
        (K.gru_after_forward, {"KEEP": True, "HAS_MASK": True, "HAS_RESET": True}),
        (K.gru_before_gates, {"HAS_RESET": True}),
        (K.gru_before_state, {"KEEP": False, "HAS_MASK": True, "HAS_RESET": True}),
        (K.gru_update_backward, {"KEEP": True, "AFTER": True, "HAS_MASK": True,
                                 "HAS_RESET": True, "HAS_DOUT": True}),
        (K.gru_update_backward, {"KEEP": False, "AFTER": False, "HAS_MASK": True,
                                 "HAS_RESET": True, "HAS_DOUT": False}),
        (K.gru_before_backward, {"HAS_RESET": True}),
        (K.probe, {}),
    ] + [
        (fn, {"ACT": act, "HAS_MASK": True, "HAS_RESET": True, "HAS_DOUT": False})
        for act in (0, 1, 2) for fn in (K.rnn_forward, K.rnn_backward)
    ]"""
    done = compile_for_sm90("rnnkit.bptt.triton_kernels", cases)
    assert len(done) == 2 * 15
    assert all(cubin for _, _, cubin in done), done
