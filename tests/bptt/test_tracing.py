"""torch.compile, torch.export and ONNX with the default (compiled) loop: the traced graph
equals eager within float32 rounding on inputs with masks, the mask stays an input of the
graph, and the TorchScript tracers are refused with one clear error. Tiny models: tracing
is slow."""

from __future__ import annotations

import importlib.util
import warnings

import pytest
import torch

import rnnkit
from rnnkit.bptt import native
from rnnkit.bptt.tracing import TracingError, exporting

ATOL = 1e-5  # float32: the traced PyTorch loop vs the compiled C++ loop


class Masked(torch.nn.Module):
    """A layer taking (x, mask) and returning its outputs and final h (graph-friendly)."""

    def __init__(self, layer: torch.nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.layer(x, mask=mask)
        h = out.state.h if isinstance(out.state, rnnkit.LSTMState) else out.state
        return out.outputs, h


def _inputs(seed: int, B: int = 3, T: int = 5, I: int = 3):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, I, generator=g)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0] = T
    mask = torch.arange(T)[None, :] < lengths[:, None]
    x = torch.where(mask[..., None], x, torch.full_like(x, float("nan")))  # NaN padding
    return x, mask


def _close(a, b):
    for p, q in zip(a, b, strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=ATOL)


def test_the_default_loop_is_the_compiled_one():
    """What the tests below compare against: eager runs the C++ loop where it builds."""
    if not native.available():
        pytest.skip("the compiled loop does not build here (no C++ compiler)")
    assert native.library() is not None


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_export_equals_eager_with_masks(cell):
    torch.manual_seed(0)
    layer = {"lstm": rnnkit.LSTM, "gru": rnnkit.GRU}[cell](3, 4, num_layers=2, bidirectional=True)
    model = Masked(layer.eval())
    program = torch.export.export(model, _inputs(0))
    for seed in (1, 2):  # other inputs AND other masks: the mask is an input, not a constant
        x, mask = _inputs(seed)
        _close(program.module()(x, mask), model(x, mask))


# torch.nn.LSTM's own forward reassigns its _flat_weights; export notes it (torch's warning,
# the same for torch's class).
@pytest.mark.filterwarnings("ignore:The tensor attributes self._flat_weights")
def test_torch_nn_dropin_exports():
    """The drop-in exports as torch's layer does: the same graph (torch's computation of
    the same function, one aten.lstm node), small, equal to eager."""
    torch.manual_seed(0)
    x = torch.randn(2, 5, 3)
    try:  # the oracle first: torch 2.9's export refuses its own LSTM (_flat_weights)
        torch.export.export(torch.nn.LSTM(3, 4, batch_first=True).eval(), (x,))
    except ValueError as exc:
        pytest.skip(f"this torch cannot export torch.nn.LSTM either: {str(exc)[:60]}")
    lstm = rnnkit.nn.LSTM(3, 4, batch_first=True).eval()
    program = torch.export.export(lstm, (x,))
    targets = _targets(program)
    assert targets.count("aten.lstm.input") == 1 and len(program.graph.nodes) < 40
    x2 = torch.randn(2, 5, 3)
    (out, (h, c)), (e_out, (e_h, e_c)) = program.module()(x2), lstm(x2)
    _close((out, h, c), (e_out, e_h, e_c))


def test_compile_fullgraph_forward_and_gradients():
    """fullgraph=True: no graph break anywhere in the layer; gradients of the compiled
    training step equal the eager explicit BPTT's."""
    torch.manual_seed(0)
    layer = rnnkit.LSTM(3, 4)
    model = Masked(layer)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    x, mask = _inputs(3, T=4)
    eager_out = model(x, mask)
    eager_grads = torch.autograd.grad(sum(t.square().sum() for t in eager_out), layer.parameters())
    out = compiled(x, mask)
    _close(out, eager_out)
    grads = torch.autograd.grad(sum(t.square().sum() for t in out), layer.parameters())
    _close(grads, eager_grads)


def test_compiled_masks_with_holes_train_like_eager():
    """Under torch.compile the time loop is one opaque operator (rnnkit::recurrence) whose
    gradients are the explicit BPTT's: a mask with holes compiles and gives eager's
    gradients."""
    torch.manual_seed(0)
    layer = rnnkit.LSTM(3, 4, num_layers=2, bidirectional=True)
    x, mask = _inputs(4, B=3, T=6)
    mask[1, 2] = False  # a hole

    def loss(x, mask):
        return layer(x, mask=mask).outputs.square().sum()

    eager = torch.autograd.grad(loss(x, mask), list(layer.parameters()))
    compiled = torch.compile(loss, backend="aot_eager", fullgraph=True)(x, mask)
    _close(torch.autograd.grad(compiled, list(layer.parameters())), eager)


def test_window_bptt_is_refused_while_tracing():
    layer = rnnkit.RNN(3, 4, num_layers=2)

    def train_step(x):
        return layer(x, window=2).outputs.sum()

    with pytest.raises(Exception, match=r"window=2 \(truncated BPTT\) cannot be traced"):
        torch.compile(train_step, backend="eager", fullgraph=True)(torch.randn(2, 4, 3))


def test_the_compiled_graph_holds_one_operator_per_layer_and_direction():
    from torch._dynamo.testing import CompileCounterWithBackend

    layer = rnnkit.GRU(3, 4, num_layers=2, update="candidate", reset="before")
    counter = CompileCounterWithBackend("aot_eager")
    x, mask = _inputs(6, T=5)
    torch.compile(lambda x, m: layer(x, mask=m).outputs.sum(), backend=counter, fullgraph=True)(
        x, mask
    )
    (graph,) = counter.graphs
    ops = [str(n.target) for n in graph.graph.nodes if n.op == "call_function"]
    assert ops.count("rnnkit.recurrence") == 2  # not 5 unrolled steps of each layer
    assert not any("sigmoid" in op for op in ops)


def test_jit_trace_is_refused():
    model = Masked(rnnkit.GRU(3, 4).eval())
    with pytest.raises(TracingError, match=r"dynamo=True"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's TracerWarnings on the way to the refusal
        torch.jit.trace(model, _inputs(0))


@pytest.mark.skipif(
    importlib.util.find_spec("onnx") is None, reason="onnx not installed (extra: rnnkit[onnx])"
)
def test_legacy_onnx_exporter_is_refused(tmp_path):
    model = Masked(rnnkit.LSTM(3, 4).eval())
    refused = pytest.raises(TracingError, match="TorchScript-based ONNX exporter")
    with refused, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, _inputs(0), str(tmp_path / "m.onnx"), dynamo=False)
    assert not (tmp_path / "m.onnx").exists()


def test_onnx_dynamo_export_runs_in_onnxruntime(tmp_path):
    for name in ("onnxscript", "onnxruntime"):
        if importlib.util.find_spec(name) is None:
            pytest.skip(f"{name} not installed (extras: rnnkit[onnx], test-onnx)")
    import onnxruntime

    torch.manual_seed(0)
    model = Masked(rnnkit.GRU(3, 4, bidirectional=True).eval())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(model, _inputs(0, T=4), dynamo=True, verbose=False)
    program.save(str(tmp_path / "m.onnx"))
    session = onnxruntime.InferenceSession(str(tmp_path / "m.onnx"))
    assert [i.name for i in session.get_inputs()] == ["x", "mask"]
    x, mask = _inputs(5, T=4)
    got = session.run(None, {"x": x.numpy(), "mask": mask.numpy()})
    _close([torch.from_numpy(a) for a in got], model(x, mask))


class Unmasked(torch.nn.Module):
    """A layer taking x alone (no mask: the graph can hold PyTorch's fused operator)."""

    def __init__(self, layer: torch.nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x).outputs


def _targets(program) -> list[str]:
    return [str(n.target) for n in program.graph.nodes if n.op == "call_function"]


@pytest.mark.parametrize(
    "make, op",
    [
        (lambda: rnnkit.LSTM(3, 4, num_layers=2), "aten.lstm.input"),
        (
            lambda: rnnkit.GRU(3, 4, num_layers=2, update="candidate", reset="after"),
            "aten.gru.input",
        ),
        (lambda: rnnkit.RNN(3, 4, num_layers=2, nonlinearity="relu"), "aten.rnn_relu.input"),
    ],
    ids=["lstm", "gru-after", "rnn-relu"],
)
def test_export_without_a_mask_holds_one_operator_per_layer(make, op):
    """The recurrence is one node of the graph (not T unrolled steps), the graph stays
    small, and it computes what eager does."""
    torch.manual_seed(0)
    model = Unmasked(make().eval())
    x = torch.randn(2, 6, 3)
    program = torch.export.export(model, (x,))
    assert _targets(program).count(op) == 2  # two layers
    x2 = torch.randn(2, 6, 3)
    _close([program.module()(x2)], [model(x2)])


def test_an_exported_two_layer_lstm_is_at_most_three_times_torchs_graph():
    torch.manual_seed(0)
    ours = Unmasked(rnnkit.LSTM(8, 16, num_layers=2).eval())
    theirs = torch.nn.LSTM(8, 16, num_layers=2, batch_first=True).eval()

    class First(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm = theirs

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lstm(x)[0]

    x = torch.randn(3, 20, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's own note on its _flat_weights
        n_torch = len(torch.export.export(First(), (x,)).graph.nodes)
    n_ours = len(torch.export.export(ours, (x,)).graph.nodes)
    assert n_ours <= 3 * n_torch, (n_ours, n_torch)


def test_forms_without_a_fused_operator_stay_unrolled_in_the_graph():
    model = Unmasked(rnnkit.GRU(3, 4, update="keep", reset="before").eval())
    program = torch.export.export(model, (torch.randn(2, 5, 3),))
    targets = _targets(program)
    assert not any("gru" in t for t in targets)
    assert targets.count("aten.sigmoid.default") >= 5  # the steps, one by one


@pytest.mark.parametrize(
    "make",
    [
        lambda: rnnkit.GRU(
            3, 4, num_layers=2, bidirectional=True, update="candidate", reset="after"
        ),
        lambda: rnnkit.LSTM(3, 4, num_layers=2),
    ],
    ids=["gru", "lstm"],
)
def test_compile_without_a_mask_trains_like_eager(make):
    """A compiled training step (the unrolled steps: AOTAutograd cannot differentiate the
    CPU's fused LSTM) gives eager's outputs and gradients."""
    torch.manual_seed(0)
    layer = make()
    model = Unmasked(layer)
    x = torch.randn(2, 5, 3)
    eager = model(x)
    eager_grads = torch.autograd.grad(eager.square().sum(), layer.parameters())
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    out = compiled(x)
    grads = torch.autograd.grad(out.square().sum(), layer.parameters())
    _close([out], [eager])
    _close(grads, eager_grads)


def test_onnx_export_without_a_mask_maps_to_onnx_recurrent_operators(tmp_path):
    for name in ("onnxscript", "onnxruntime"):
        if importlib.util.find_spec(name) is None:
            pytest.skip(f"{name} not installed (extras: rnnkit[onnx], test-onnx)")
    import onnxruntime

    torch.manual_seed(0)
    model = Unmasked(rnnkit.LSTM(3, 4, num_layers=2, bidirectional=True).eval())
    x = torch.randn(2, 5, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(model, (x,), dynamo=True, verbose=False)
    ops = [node.op_type for node in program.model_proto.graph.node]
    assert ops.count("LSTM") == 4  # two layers, two directions; no unrolled steps
    assert "Sigmoid" not in ops
    program.save(str(tmp_path / "m.onnx"))
    session = onnxruntime.InferenceSession(str(tmp_path / "m.onnx"))
    x2 = torch.randn(2, 5, 3)
    (got,) = session.run(None, {session.get_inputs()[0].name: x2.numpy()})
    _close([torch.from_numpy(got)], [model(x2)])


def test_a_compiled_program_runs_the_drop_in_as_torchs_layer():
    """Under torch.compile a drop-in behaves as torch.nn.LSTM does (torch's computation of
    the same function), so a program compiles as fast as with torch's layer; its results
    and gradients equal eager rnnkit's."""
    torch.manual_seed(0)
    model = torch.nn.Sequential()
    model.add_module("rnn", rnnkit.nn.LSTM(3, 4, num_layers=2))
    x = torch.randn(5, 2, 3)
    eager = model(x)[0]
    eager_grads = torch.autograd.grad(eager.square().sum(), list(model.parameters()))
    compiled = torch.compile(model, backend="aot_eager")(x)[0]
    grads = torch.autograd.grad(compiled.square().sum(), list(model.parameters()))
    _close([compiled], [eager])
    _close(grads, eager_grads)


def test_exporting_is_true_under_export_only():
    """``exporting()`` inside a graph torch.compile traces is False (torch before 2.13
    answers ``torch.compiler.is_exporting()`` there with True), inside torch.export True,
    in eager code False."""
    seen: list[bool] = []

    class Probe(torch.nn.Module):
        def forward(self, x):
            seen.append(exporting())
            return x + 1

    assert not exporting()
    torch.compile(Probe(), backend="eager", fullgraph=True)(torch.randn(2))
    torch.export.export(Probe(), (torch.randn(2),))
    assert seen[0] is False and len(seen) > 1 and all(seen[1:])  # (export may trace twice)


def test_a_saved_program_loads_and_runs_in_a_process_without_rnnkit(tmp_path):
    """A program exported with plain-tensor outputs (docs/export.md) is written by
    torch.export.save and runs without rnnkit: its graph holds torch's operators only
    (the loading process never imports rnnkit)."""
    import subprocess
    import sys

    class Served(torch.nn.Module):
        def __init__(self, layer: torch.nn.Module) -> None:
            super().__init__()
            self.layer = layer

        def forward(self, x: torch.Tensor, mask: torch.Tensor):
            out = self.layer(x, mask=mask)
            return out.outputs, out.state.h, out.state.c

    torch.manual_seed(0)
    served = Served(rnnkit.LSTM(3, 4, num_layers=2, bidirectional=True).eval())
    torch.export.save(torch.export.export(served, _inputs(0)), tmp_path / "p.pt2")
    x, mask = _inputs(1)
    torch.save({"x": x, "mask": mask}, tmp_path / "in.pt")
    script = (
        "import sys, torch\n"
        f"p = torch.export.load({str(tmp_path / 'p.pt2')!r}).module()\n"
        f"i = torch.load({str(tmp_path / 'in.pt')!r})\n"
        f"torch.save(p(i['x'], i['mask']), {str(tmp_path / 'out.pt')!r})\n"
        "assert 'rnnkit' not in sys.modules\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-2000:]
    got = torch.load(tmp_path / "out.pt")
    _close(got, served(x, mask))
