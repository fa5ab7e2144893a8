"""CUDA graphs over the Triton steps' loops (``rnnkit.bptt.gpu_graphs``), without a GPU.

A stand-in graph class (``FakeGraph``) takes the place of ``torch.cuda.CUDAGraph``: its
capture records the function and computes nothing (it fills the outputs with NaN, as a
real capture leaves them unwritten), its replay runs the recorded function again on the
static buffers and writes the results into the captured outputs, as a real replay does.
With it, the copy-in / replay / copy-out logic runs on the CPU, the kernels in Triton's
interpreter. Oracle: the same steps with graphs off (the eager loop), float64, 1e-12.
``tests/bptt/test_gpu_steps_cuda.py`` runs the real graphs where a GPU is present.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import warnings

import pytest
import torch

from rnnkit.bptt import gpu_graphs, gpu_steps
from rnnkit.bptt.gpu_graphs import use_cuda_graphs
from rnnkit.bptt.regularized import regularized
from rnnkit.cells.gru import GRUCell
from rnnkit.cells.kernel import Weights
from rnnkit.cells.lstm import LSTMCell
from rnnkit.cells.rnn import RNNCell
from rnnkit.errors import ConfigError

pytest.importorskip("triton")
pytestmark = pytest.mark.usefixtures("triton_interpreter")  # tests/conftest.py
T, B, I, H = 5, 3, 2, 4
F64 = torch.float64


class FakeGraph:
    """Stands in for a CUDA graph of one function (``gpu_graphs._GRAPH``)."""

    fail = False  # a capture that raises, as a real one may

    def __init__(self, device: torch.device) -> None:
        self.device, self.fn, self.outputs = device, None, ()
        self.warm_ups = self.replays = 0

    def warm_up(self, fn):
        self.warm_ups += 1
        fn()

    def capture(self, fn):
        if self.fail:
            raise RuntimeError("operation not permitted when stream is capturing")
        self.fn, self.outputs = fn, tuple(fn())
        for t in self.outputs:  # a capture runs nothing: what it returns is unwritten
            if t is not None:
                t.fill_(float("nan") if t.is_floating_point() else -1)
        return self.outputs

    def replay(self):
        self.replays += 1
        for dst, src in zip(self.outputs, self.fn(), strict=True):
            if dst is not None and dst is not src:
                dst.copy_(src)


@pytest.fixture
def graphs(monkeypatch):
    """Graphs for CPU tensors too, on ``FakeGraph``; the graphs made, in order."""
    made: list[FakeGraph] = []

    def make(device):
        made.append(FakeGraph(device))
        return made[-1]

    gpu_graphs.clear_cuda_graphs()
    monkeypatch.setattr(gpu_graphs, "_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(gpu_graphs, "_GRAPH", make)
    yield made
    gpu_graphs.clear_cuda_graphs()


def _cell(name: str):
    torch.manual_seed(1)
    return {
        "lstm": lambda: LSTMCell(I, H),
        "gru_candidate_before": lambda: GRUCell(I, H, update="candidate", reset="before"),
        "gru_keep_after": lambda: GRUCell(I, H, update="keep", reset="after"),
        "rnn_sigmoid": lambda: RNNCell(I, H, nonlinearity="sigmoid"),
    }[name]().double()


def _kernel(cell, regularizers: str):
    """The cell's kernel as such, or with recurrent dropout and zoneout (``real``: keep
    factors with values everywhere; ``eval``: a constant expanded, stride 0)."""
    if regularizers == "none":
        return cell.kernel
    g = torch.Generator().manual_seed(3)
    n = 2 if isinstance(cell, LSTMCell) else 1
    if regularizers == "eval":
        keep = tuple(torch.full((1, 1, 1), 0.3, dtype=F64).expand(T, B, H) for _ in range(n))
        return regularized(cell.kernel, None, keep)
    rec = (torch.rand(B, H, generator=g, dtype=F64) < 0.5).double() * 2.0
    keep = tuple(torch.rand(T, B, H, generator=g, dtype=F64) for _ in range(n))
    return regularized(cell.kernel, rec, keep)


def _inputs(n: int, seed: int):
    """Input, initial states, a mask with holes and an empty row, resets inside it."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, B, I, dtype=F64, generator=g)
    states0 = tuple(torch.randn(B, H, dtype=F64, generator=g) for _ in range(n))
    mask = torch.ones(T, B, dtype=torch.bool)
    mask[:, 1] = False
    mask[[1, 3], 2] = False
    reset = torch.zeros(T, B, dtype=torch.bool)
    reset[2, 0] = reset[0, 2] = reset[3, 2] = True
    return torch.where(mask[..., None], x, 0.0), states0, mask, reset


def _leaves(w: Weights) -> Weights:
    return Weights(*(None if p is None else p.detach().clone().requires_grad_(True) for p in w))


def _forward(kernel, w, x, states0, mask, reset):
    """One call: ``(leaves, outputs, finals)``, autograd's graph kept."""
    x = x.clone().requires_grad_(True)
    states0 = tuple(s.clone().requires_grad_(True) for s in states0)
    outputs, finals = gpu_steps.run_steps(kernel, x, w, states0, mask, reset)
    return [x, *(p for p in w if p is not None), *states0], outputs, finals


def _grads(leaves, outputs, finals, seed: int):
    g = torch.Generator().manual_seed(seed)
    loss = (outputs * torch.randn(outputs.shape, dtype=F64, generator=g)).sum()
    loss = loss + sum((f * torch.randn(f.shape, dtype=F64, generator=g)).sum() for f in finals)
    return list(torch.autograd.grad(loss, leaves))


def _train(kernel, w, inputs, seed: int):
    leaves, outputs, finals = _forward(kernel, w, *inputs)
    grads = _grads(leaves, outputs, finals, seed)
    return [outputs.detach(), *(f.detach() for f in finals), *grads]


def _close(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


CASES = [
    ("lstm", "none"),
    ("gru_candidate_before", "none"),
    ("gru_keep_after", "none"),
    ("rnn_sigmoid", "none"),
    ("lstm", "real"),
    ("rnn_sigmoid", "eval"),
]


@pytest.mark.parametrize("name, regularizers", CASES, ids=[f"{c}-{r}" for c, r in CASES])
def test_replays_equal_the_eager_loop_and_see_new_inputs_and_weights(graphs, name, regularizers):
    cell = _cell(name)
    kernel = _kernel(cell, regularizers)
    n = 2 if isinstance(cell, LSTMCell) else 1
    w1, first = _leaves(cell.weights()), _inputs(n, seed=5)
    w2 = Weights(*(None if p is None else p * 1.5 - 0.1 for p in w1))  # an update between
    w2, second = _leaves(w2), _inputs(n, seed=6)
    with use_cuda_graphs(False):
        want = [_train(kernel, w1, first, 7), _train(kernel, w2, second, 8)]
    assert graphs == []  # off: nothing captured
    with use_cuda_graphs(True):
        # call 1's backward runs after call 2's forward and backward: what autograd saved
        # of call 1 is its own, not the graphs' buffers that call 2 rewrote
        leaves1, outputs1, finals1 = _forward(kernel, w1, *first)
        kept = [outputs1.clone(), *(f.clone() for f in finals1)]
        got2 = _train(kernel, w2, second, 8)
        got1 = _grads(leaves1, outputs1, finals1, 7)
    _close([outputs1, *finals1], kept)  # call 2 did not overwrite what call 1 returned
    _close([*kept, *got1], want[0])
    _close(got2, want[1])
    # one forward and one backward graph, each captured once (warmed up first) and
    # replayed at each of the two calls
    assert [(g.warm_ups, g.replays) for g in graphs] == [(1, 2), (1, 2)]
    assert gpu_graphs.cuda_graph_stats() == {"captures": 2, "replays": 4, "failures": 0}


def test_inference_has_its_own_graph_and_equals_the_eager_loop(graphs):
    cell = _cell("gru_candidate_before")
    x, states0, mask, reset = _inputs(1, seed=5)
    w = cell.weights()
    with torch.no_grad():
        with use_cuda_graphs(False):
            want = gpu_steps.run_steps(cell.kernel, x, w, states0, mask, reset)
        with use_cuda_graphs(True):
            for _ in range(2):
                out, finals = gpu_steps.run_steps(cell.kernel, x, w, states0, mask, reset)
                _close([out, *finals], [want[0], *want[1]])
    (key,) = gpu_graphs.cached_keys("cpu")
    assert key[:3] == ("forward", "gru_candidate_before", False)  # nothing saved
    forms = [gpu_graphs.form(_cell(name).kernel) for name in ("lstm", "rnn_sigmoid")]
    assert forms == ["lstm", "rnn_sigmoid"]
    assert [(g.warm_ups, g.replays) for g in graphs] == [(1, 2)]


def test_inference_mode_and_no_grad_each_have_their_own_graph(graphs):
    """A graph captured under torch.inference_mode holds inference tensors as its static
    inputs, which no call outside inference mode may refill (torch refuses the copy): the
    same call under no_grad afterwards captures its own, and both equal the eager loop."""
    cell = _cell("lstm")
    x, states0, mask, reset = _inputs(2, seed=5)
    w = cell.weights()
    with torch.no_grad(), use_cuda_graphs(False):
        want = gpu_steps.run_steps(cell.kernel, x, w, states0, mask, reset)
    with use_cuda_graphs(True):
        for mode in (torch.inference_mode, torch.no_grad, torch.inference_mode):
            with mode():
                out, finals = gpu_steps.run_steps(cell.kernel, x, w, states0, mask, reset)
            _close([out, *finals], [want[0], *want[1]])
    modes = sorted(key[-2] for key in gpu_graphs.cached_keys("cpu"))
    assert modes == [False, True] and [g.replays for g in graphs] == [2, 1]


@pytest.mark.parametrize("name", ["lstm", "gru_keep_after"])
def test_the_record_of_a_window_equals_the_eager_one(graphs, name):
    # forward_record (the windowed BPTT's forward on the Triton steps) runs the same loop
    cell = _cell(name)
    n = 2 if isinstance(cell, LSTMCell) else 1
    x, states0, mask, reset = _inputs(n, seed=5)
    args = (cell.kernel, x, cell.weights(), states0, mask[..., None], reset[..., None], True)
    with use_cuda_graphs(False):
        want = gpu_steps.forward_record(*args)
    with use_cuda_graphs(True):
        for _ in range(2):
            got = gpu_steps.forward_record(*args)
            _close([got.x, *got.states, *got.cache], [want.x, *want.states, *want.cache])
    assert [(g.warm_ups, g.replays) for g in graphs] == [(1, 2)]


def test_a_different_length_captures_anew_and_the_same_reuses(graphs):
    cell = _cell("lstm")
    w = cell.weights()
    x, states0, mask, reset = _inputs(2, seed=5)
    with torch.no_grad(), use_cuda_graphs(True):
        for steps in (T, T - 2, T, T - 2):
            args = (x[:steps], w, states0, mask[:steps], reset[:steps])
            out, _ = gpu_steps.run_steps(cell.kernel, *args)
            with use_cuda_graphs(False):
                want, _ = gpu_steps.run_steps(cell.kernel, *args)
            _close([out], [want])
    assert [g.replays for g in graphs] == [2, 2]
    assert gpu_graphs.cuda_graph_stats()["captures"] == 2
    lengths = [k[-1][0][0][0] for k in gpu_graphs.cached_keys("cpu")]  # gates' T
    assert sorted(lengths) == [T - 2, T]


def test_the_key_holds_what_fixes_the_work_and_the_cache_is_bounded(graphs, monkeypatch):
    waits: list[str] = []  # a graph is dropped only once its device's last use has ended
    monkeypatch.setattr(gpu_graphs._Device, "idle", lambda self: waits.append("idle"))
    a = torch.zeros(2, 3, dtype=F64)
    key = gpu_graphs.signature([a, None, a.T, torch.zeros(1, 1).expand(4, 2)])
    assert key == (
        ((2, 3), (3, 1), F64, "cpu"),
        None,
        ((3, 2), (1, 3), F64, "cpu"),
        ((4, 2), (0, 0), torch.float32, "cpu"),
    )

    def double(t):
        return (t * 2.0,)

    for n in range(gpu_graphs.CACHE_SIZE):
        gpu_graphs.replayed(("test",), double, [torch.ones(n + 1)])
    # the least recently used goes first: size 1 was used again, so size 2 is dropped
    got = gpu_graphs.replayed(("test",), double, [torch.full((1,), 3.0)])
    assert got is not None and torch.equal(got[0], torch.tensor([6.0]))
    assert waits == []
    gpu_graphs.replayed(("test",), double, [torch.ones(gpu_graphs.CACHE_SIZE + 1)])
    assert waits == ["idle"]
    sizes = [k[-1][0][0][0] for k in gpu_graphs.cached_keys("cpu")]
    assert len(sizes) == gpu_graphs.CACHE_SIZE
    assert 2 not in sizes and sizes[-2:] == [1, gpu_graphs.CACHE_SIZE + 1]
    # another key with the same inputs is another graph
    gpu_graphs.replayed(("other",), double, [torch.ones(1)])
    assert gpu_graphs.cuda_graph_stats()["captures"] == gpu_graphs.CACHE_SIZE + 2


def test_an_expanded_input_keeps_its_strides_and_copies_only_its_values(graphs):
    def strides(t):
        return (t * 1.0, torch.tensor(t.stride()))

    for value in (1.0, 2.0):
        t = torch.full((1, 3), value).expand(4, 3)
        got = gpu_graphs.replayed(("test",), strides, [t])
        assert got is not None
        assert torch.equal(got[0], t) and got[1].tolist() == [0, 1]


def test_a_failing_capture_runs_the_eager_loop_with_one_warning(graphs, monkeypatch):
    monkeypatch.setattr(FakeGraph, "fail", True)
    cell = _cell("rnn_sigmoid")
    w = _leaves(cell.weights())
    inputs = _inputs(1, seed=5)
    with use_cuda_graphs(False):
        want = _train(cell.kernel, w, inputs, 7)
    with use_cuda_graphs(True), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            _close(_train(cell.kernel, w, inputs, 7), want)
    msgs = [str(c.message) for c in caught if issubclass(c.category, RuntimeWarning)]
    assert len(msgs) == 1 and "could not be captured" in msgs[0], msgs
    # forward and backward failed once each, then their keys run eagerly: no new capture
    assert gpu_graphs.cuda_graph_stats() == {"captures": 0, "replays": 0, "failures": 2}
    assert len(graphs) == 2


def test_off_by_default_and_nothing_captured_where_off(graphs, monkeypatch):
    cell = _cell("lstm")
    x, states0, mask, reset = _inputs(2, seed=5)
    monkeypatch.setitem(gpu_graphs._choice, "on", "0")
    with torch.no_grad():
        gpu_steps.run_steps(cell.kernel, x, cell.weights(), states0, mask, reset)
        monkeypatch.setattr(gpu_graphs, "_DEVICES", ("cuda",))  # the real rule: CUDA only
        with use_cuda_graphs(True):
            assert not gpu_graphs.wanted(x)
            gpu_steps.run_steps(cell.kernel, x, cell.weights(), states0, mask, reset)
    assert graphs == [] and gpu_graphs.cuda_graph_stats()["captures"] == 0


def test_the_switch_reads_the_environment_and_refuses_a_wrong_value(monkeypatch):
    for value, on in (("1", True), ("on", True), ("0", False), ("", False), ("off", False)):
        monkeypatch.setenv("RNNKIT_CUDA_GRAPHS", value)
        monkeypatch.setitem(gpu_graphs._choice, "on", gpu_graphs._from_environment())
        assert gpu_graphs.cuda_graphs_enabled() is on
        with use_cuda_graphs(not on):
            assert gpu_graphs.cuda_graphs_enabled() is not on
        assert gpu_graphs.cuda_graphs_enabled() is on
    monkeypatch.setitem(gpu_graphs._choice, "on", "maybe")
    with pytest.raises(ConfigError, match="RNNKIT_CUDA_GRAPHS='maybe'"):
        gpu_graphs.cuda_graphs_enabled()
    with pytest.raises(TypeError), use_cuda_graphs(1):  # type: ignore[arg-type]
        pass


def test_importing_rnnkit_with_the_switch_on_changes_nothing():
    code = (
        "import sys, torch, rnnkit; from rnnkit.bptt import gpu_graphs as g; "
        "print(g.cuda_graphs_enabled(), 'triton' in sys.modules, torch.cuda.is_initialized(), "
        "g.cuda_graph_stats()['captures'])"
    )
    env = {**os.environ, "RNNKIT_CUDA_GRAPHS": "1"}
    env.pop("TRITON_INTERPRET", None)
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["True", "False", "False", "0"]


# ---- threads ---------------------------------------------------------------------------


def _slow_double(t):
    """Reads its input after a pause: where another thread's copy-in could land."""
    time.sleep(0.002)
    return (t * 2.0,)


def _in_threads(n: int, work) -> list:
    """``work(i)`` in ``n`` threads started together; their results, or their errors."""
    barrier = threading.Barrier(n)
    results: list = [None] * n

    def run(i):
        barrier.wait()
        try:
            results[i] = work(i)
        except Exception as e:  # shown by the assertion, not lost in the thread
            results[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_threads_on_one_graph_each_get_their_own_outputs(graphs):
    # Without the lock a thread's copy-in overwrote another's static input between its
    # copy-in and its replay (that thread got the other's doubles), and two threads
    # capturing the same key at once made two graphs.
    def work(i):
        got = []
        for k in range(6):
            out = gpu_graphs.replayed(("test",), _slow_double, [torch.full((3,), 10.0 * i + k)])
            assert out is not None
            got.append(out[0].tolist())
        return got

    results = _in_threads(4, work)
    for i, got in enumerate(results):
        assert got == [[2.0 * (10.0 * i + k)] * 3 for k in range(6)], (i, got)
    assert len(graphs) == 1
    assert gpu_graphs.cuda_graph_stats() == {"captures": 1, "replays": 24, "failures": 0}


def test_threads_capturing_and_evicting_keep_the_cache_bounded_and_right(graphs):
    def work(i):
        for n in range(gpu_graphs.CACHE_SIZE + 4):  # each thread: more keys than fit
            size = 1 + (n * 7 + i) % (gpu_graphs.CACHE_SIZE + 8)
            out = gpu_graphs.replayed(("test",), _slow_double, [torch.full((size,), float(i))])
            assert out is not None and torch.equal(out[0], torch.full((size,), 2.0 * i))
        return True

    assert _in_threads(4, work) == [True] * 4
    keys = gpu_graphs.cached_keys("cpu")
    assert len(keys) == gpu_graphs.CACHE_SIZE and len(set(keys)) == len(keys)
    stats = gpu_graphs.cuda_graph_stats()
    assert stats["replays"] == 4 * (gpu_graphs.CACHE_SIZE + 4) and stats["failures"] == 0
    assert stats["captures"] == len(graphs)


def test_threads_running_one_layer_match_the_eager_loop(graphs):
    cell = _cell("gru_candidate_before")
    w = _leaves(cell.weights())
    inputs = [_inputs(1, seed=20 + i) for i in range(3)]
    with use_cuda_graphs(False):
        want = [_train(cell.kernel, w, inputs[i], 7 + i) for i in range(3)]

    def work(i):
        return _train(cell.kernel, w, inputs[i], 7 + i)

    with use_cuda_graphs(True):  # the switch is the process's: set once, for all threads
        results = _in_threads(3, work)
    for got, expected in zip(results, want, strict=True):
        assert not isinstance(got, Exception), got
        _close(got, expected)
    assert gpu_graphs.cuda_graph_stats()["captures"] == 2  # one forward, one backward
