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
from rnnkit.bptt.tracing import TracingError

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


def test_torch_nn_dropin_exports():
    torch.manual_seed(0)
    lstm = rnnkit.nn.LSTM(3, 4, batch_first=True).eval()
    x = torch.randn(2, 5, 3)
    program = torch.export.export(lstm, (x,))
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


def test_window_bptt_is_refused_while_tracing():
    layer = rnnkit.RNN(3, 4)

    def train_step(x):
        return layer(x, window=2).outputs.sum()

    with pytest.raises(Exception, match=r"window=2 \(truncated BPTT\) cannot be traced"):
        torch.compile(train_step, backend="eager", fullgraph=True)(torch.randn(2, 4, 3))


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
