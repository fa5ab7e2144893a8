"""The Triton steps compiled and run on a CUDA device, against the CPU oracle (the
library's PyTorch loop in float64; for the attention decoder's one-step operators, the
CPU's path). Skipped where there is no CUDA device or no triton;
``tests/bptt/test_gpu_steps.py`` holds the same kernels to the oracle everywhere, in
Triton's interpreter."""

from __future__ import annotations

import pytest
import torch

import rnnkit
from rnnkit.bptt import recurrence
from rnnkit.bptt.fused import use_fused
from rnnkit.bptt.gpu_step_lib import TritonGRUStep, TritonStepLib
from rnnkit.bptt.native import use_native
from rnnkit.models.seq2seq import build_seq2seq
from rnnkit.models.spec import ModelSpec
from rnnkit.types import LSTMState

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

B, T, I, H = 5, 9, 3, 8
FORMS = [
    ("lstm_holes", rnnkit.LSTM, {}),
    ("gru_keep_before", rnnkit.GRU, {"update": "keep", "reset": "before"}),
    ("gru_candidate_after_holes", rnnkit.GRU, {"update": "candidate", "reset": "after"}),
    ("rnn_sigmoid", rnnkit.RNN, {"nonlinearity": "sigmoid"}),
    ("layer_norm_lstm_holes", rnnkit.LSTM, {"layer_norm": True}),
    (
        "layer_norm_gru_keep_holes",
        rnnkit.GRU,
        {"update": "keep", "reset": "after", "layer_norm": True},
    ),
]


def _run(layer, x, mask, device, dtype):
    layer = layer.to(device=device, dtype=dtype)
    x = x.to(device=device, dtype=dtype).requires_grad_(True)
    out = layer(x, mask=mask.to(device))
    finals = tuple(out.state) if isinstance(out.state, LSTMState) else (out.state,)
    loss = out.outputs.sin().sum() + sum((f * f).sum() for f in finals)
    grads = torch.autograd.grad(loss, [x, *layer.parameters()])
    return [t.detach().double().cpu() for t in (out.outputs, *finals, *grads)]


@pytest.mark.parametrize("name, cls, kw", FORMS, ids=[f[0] for f in FORMS])
def test_on_cuda_the_default_path_runs_the_triton_steps(name, cls, kw, count_calls):
    pytest.importorskip("triton")
    count = count_calls(recurrence, "run_steps")
    torch.manual_seed(0)
    layer = cls(I, H, num_layers=2, bidirectional=True, **kw)
    mask = torch.rand(B, T) < 0.8  # holes
    mask[0], mask[1] = True, False  # lengths T and 0
    x = torch.randn(B, T, I, dtype=torch.float64)
    with use_fused("loop"), use_native(False):
        want = _run(layer, x, mask, "cpu", torch.float64)
    for dtype, tol in ((torch.float64, 1e-10), (torch.float32, 2e-5)):
        count["n"] = 0
        with use_fused("auto"):
            got = _run(layer, x, mask, "cuda", dtype)
        assert count["n"] == 4  # two layers, two directions
        for g, w in zip(got, want, strict=True):
            scale = float(w.abs().max()) or 1.0
            assert float((g - w).abs().max()) / scale <= tol


def _moved(masks, device, dtype):
    """The regularizers' masks (``StackMasks``) on ``device`` in ``dtype``."""

    def to(t):
        return None if t is None else t.to(device=device, dtype=dtype)

    cells = tuple(
        c._replace(
            weight_hh=to(c.weight_hh),
            recurrent=to(c.recurrent),
            keep=None if c.keep is None else tuple(to(k) for k in c.keep),
        )
        for c in masks.cells
    )
    return masks._replace(
        input=to(masks.input),
        between=tuple(to(b) for b in masks.between),
        output=to(masks.output),
        cells=cells,
    )


@pytest.mark.parametrize("cls, kw", [(rnnkit.LSTM, {}), (rnnkit.GRU, {"reset": "before"})])
def test_on_cuda_recurrent_dropout_and_zoneout_run_the_triton_steps(cls, kw, count_calls):
    pytest.importorskip("triton")
    count = count_calls(recurrence, "run_steps")
    torch.manual_seed(0)
    layer = cls(I, H, num_layers=2, bidirectional=True, recurrent_dropout=0.3, zoneout=0.2, **kw)
    mask = torch.rand(B, T) < 0.8  # holes
    mask[0], mask[1] = True, False
    x = torch.randn(B, T, I, dtype=torch.float64)
    masks = layer.double().draw_masks(B, T, x)

    def run(device, dtype):
        layer.to(device=device, dtype=dtype)
        xx = x.to(device=device, dtype=dtype).requires_grad_(True)
        out = layer(xx, mask=mask.to(device), masks=_moved(masks, device, dtype))
        finals = tuple(out.state) if isinstance(out.state, LSTMState) else (out.state,)
        loss = out.outputs.sin().sum() + sum((f * f).sum() for f in finals)
        grads = torch.autograd.grad(loss, [xx, *layer.parameters()])
        return [t.detach().double().cpu() for t in (out.outputs, *finals, *grads)]

    with use_fused("loop"), use_native(False):
        want = run("cpu", torch.float64)
    for dtype, tol in ((torch.float64, 1e-10), (torch.float32, 2e-5)):
        count["n"] = 0
        with use_fused("auto"):
            got = run("cuda", dtype)
        assert count["n"] == 4  # two layers, two directions
        for g, w in zip(got, want, strict=True):
            scale = float(w.abs().max()) or 1.0
            assert float((g - w).abs().max()) / scale <= tol


def _windowed_results(layer, x, mask, starts, device, dtype):
    """Outputs, final states and every gradient of ``layer(x, window=3)`` on ``device``
    in ``dtype``, as float64 on the CPU."""
    layer.to(device=device, dtype=dtype)
    xx = x.to(device=device, dtype=dtype).requires_grad_(True)
    r = None if starts is None else starts.to(device)
    out = layer(xx, mask=mask.to(device), window=3, resets=r)
    finals = tuple(out.state) if isinstance(out.state, LSTMState) else (out.state,)
    loss = out.outputs.sin().sum() + sum((f * f).sum() for f in finals)
    grads = torch.autograd.grad(loss, [xx, *layer.parameters()])
    return [t.detach().double().cpu() for t in (out.outputs, *finals, *grads)]


WINDOWED = [
    ("lstm_bidirectional_holes", rnnkit.LSTM, {"bidirectional": True}, False),
    ("gru_keep_before_resets", rnnkit.GRU, {"update": "keep", "reset": "before"}, True),
    ("gru_candidate_after_holes", rnnkit.GRU, {"bidirectional": True, "reset": "after"}, False),
    ("rnn_sigmoid_resets", rnnkit.RNN, {"nonlinearity": "sigmoid"}, True),
]


@pytest.mark.parametrize("name, cls, kw, resets", WINDOWED, ids=[w[0] for w in WINDOWED])
def test_on_cuda_a_window_runs_the_triton_forward(name, cls, kw, resets, count_calls):
    pytest.importorskip("triton")
    from rnnkit.bptt import gpu_steps

    count = count_calls(gpu_steps, "_forward")
    torch.manual_seed(0)
    layer = cls(I, H, num_layers=2, **kw)
    mask = torch.rand(B, T) < 0.8  # holes
    mask[0], mask[1] = True, False  # lengths T and 0
    starts = (torch.rand(B, T) < 0.2) if resets else None
    x = torch.randn(B, T, I, dtype=torch.float64)
    with use_fused("loop"), use_native(False):
        want = _windowed_results(layer, x, mask, starts, "cpu", torch.float64)
    for dtype, tol in ((torch.float64, 1e-10), (torch.float32, 2e-5)):
        count["n"] = 0
        with use_fused("auto"):
            got = _windowed_results(layer, x, mask, starts, "cuda", dtype)
        assert count["n"] == 2 * (2 if kw.get("bidirectional") else 1)  # one per direction
        for g, w in zip(got, want, strict=True):
            scale = float(w.abs().max()) or 1.0
            assert float((g - w).abs().max()) / scale <= tol


@pytest.mark.parametrize(
    "cls, kw, resets",
    [
        (rnnkit.LSTM, {"bidirectional": True}, False),
        (rnnkit.GRU, {"update": "keep", "reset": "after"}, True),
    ],
)
def test_on_cuda_a_layer_normalised_window_equals_the_cpu(cls, kw, resets):
    """The windowed stack's node computes the input parts itself; its forward runs the
    loop where the Triton steps' record has no layer-normalised form."""
    torch.manual_seed(0)
    layer = cls(I, H, num_layers=2, layer_norm=True, **kw)
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if "gamma" in name or "beta" in name:
                p.add_(0.3 * torch.randn_like(p))
    mask = torch.rand(B, T) < 0.8
    mask[0], mask[1] = True, False
    starts = (torch.rand(B, T) < 0.2) if resets else None
    x = torch.randn(B, T, I, dtype=torch.float64)
    with use_fused("loop"), use_native(False):
        want = _windowed_results(layer, x, mask, starts, "cpu", torch.float64)
    for dtype, tol in ((torch.float64, 1e-10), (torch.float32, 1e-4)):
        got = _windowed_results(layer, x, mask, starts, "cuda", dtype)
        for g, w in zip(got, want, strict=True):
            scale = float(w.abs().max()) or 1.0
            assert float((g - w).abs().max()) / scale <= tol


def _moved(masks, device, dtype):
    """The regularizers' masks (nested named tuples of tensors) on ``device`` in ``dtype``."""
    if isinstance(masks, torch.Tensor):
        return masks.to(device=device, dtype=dtype)
    if isinstance(masks, tuple):
        parts = [_moved(m, device, dtype) for m in masks]
        return type(masks)(*parts) if hasattr(masks, "_fields") else tuple(parts)
    return masks


@pytest.mark.parametrize(("window", "recompute"), [(3, None), (None, 4)])
@pytest.mark.parametrize("cls, kw", [(rnnkit.LSTM, {}), (rnnkit.GRU, {"reset": "before"})])
def test_on_cuda_the_regularizers_under_a_window_or_recompute_equal_the_cpu(
    cls, kw, window, recompute
):
    """Recurrent dropout, zoneout and weight drop under a window or recompute, the masks
    drawn once on the CPU and moved: the CPU's float64 results."""
    torch.manual_seed(0)
    layer = cls(I, H, num_layers=2, recurrent_dropout=0.3, zoneout=0.2, weight_drop=0.2, **kw)
    layer = layer.double()
    layer.recompute = recompute
    mask = torch.rand(B, T) < 0.8
    mask[0], mask[1] = True, False
    x = torch.randn(B, T, I, dtype=torch.float64)
    masks = layer.draw_masks(B, T, x)

    def results(device, dtype):
        layer.to(device=device, dtype=dtype)
        xx = x.to(device=device, dtype=dtype).requires_grad_(True)
        out = layer(xx, mask=mask.to(device), window=window, masks=_moved(masks, device, dtype))
        finals = tuple(out.state) if isinstance(out.state, LSTMState) else (out.state,)
        loss = out.outputs.sin().sum() + sum((f * f).sum() for f in finals)
        grads = torch.autograd.grad(loss, [xx, *layer.parameters()])
        return [t.detach().double().cpu() for t in (out.outputs, *finals, *grads)]

    want = results("cpu", torch.float64)
    for dtype, tol in ((torch.float64, 1e-10), (torch.float32, 2e-5)):
        got = results("cuda", dtype)
        for g, w in zip(got, want, strict=True):
            scale = float(w.abs().max()) or 1.0
            assert float((g - w).abs().max()) / scale <= tol


DECODERS = [  # each attention kind with the LSTM; the GRU's two reset forms
    ("dot", {"cell": "lstm"}),
    ("bilinear", {"cell": "lstm"}),
    ("additive", {"cell": "lstm"}),
    ("additive", {"cell": "gru", "update": "keep", "reset": "after"}),
    ("dot", {"cell": "gru", "update": "candidate", "reset": "before"}),
]


@pytest.mark.parametrize(
    ("kind", "cell"), DECODERS, ids=[f"{k}-{'-'.join(c.values())}" for k, c in DECODERS]
)
def test_on_cuda_the_attention_decoder_runs_the_triton_step(kind, cell, monkeypatch):
    # the teacher-forced decoder with attention before the step: an LSTM's or a GRU's gate
    # math in Triton launches (rnnkit.bptt.gpu_step_lib), against the CPU path in float64
    pytest.importorskip("triton")
    calls = {"n": 0}
    for cls, name in ((TritonStepLib, "lstm_step"), (TritonGRUStep, "step_into")):
        real = getattr(cls, name)

        def counted(self, *args, _real=real):
            calls["n"] += 1
            return _real(self, *args)

        monkeypatch.setattr(cls, name, counted)
    torch.manual_seed(0)
    shape = ModelSpec(hidden=8, embedding=4, attention=kind, context="both", **cell)
    model = build_seq2seq(shape, 13, 13)
    g = torch.Generator().manual_seed(1)
    source = torch.randint(4, 13, (B, T), generator=g)
    source_mask = torch.ones(B, T, dtype=torch.bool)
    source_mask[1, 4:] = False
    target_in = torch.randint(4, 13, (B, T), generator=g)
    target_mask = torch.ones(B, T, dtype=torch.bool)
    target_mask[2, 5:] = False
    d_logits = torch.randn(B, T, 13, generator=g, dtype=torch.float64)

    def run(device, dtype):
        m = model.to(device=device, dtype=dtype)
        batch = (t.to(device) for t in (source, source_mask, target_in, target_mask))
        out = m(*batch)
        loss = (out.logits * d_logits.to(device, dtype)).sum() + out.attention.square().sum()
        grads = torch.autograd.grad(loss, list(m.parameters()))
        return [t.detach().double().cpu() for t in (out.logits, out.attention, *grads)]

    want = run("cpu", torch.float64)
    assert calls["n"] == 0
    # cuDNN runs the encoder: TF32 off, so that float32 is float32
    with use_fused("auto"), torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        # (float32: a whole model's gradient sums, relative to their largest entry)
        for dtype, tol in ((torch.float64, 1e-10), (torch.float32, 1e-4)):
            calls["n"] = 0
            got = run("cuda", dtype)
            assert calls["n"] == T  # the Triton step at every decoder step
            for a, w in zip(got, want, strict=True):
                scale = float(w.abs().max()) or 1.0
                assert float((a - w).abs().max()) / scale <= tol


@pytest.mark.parametrize("reset", ["after", "before"])
def test_on_cuda_decoding_a_gru_decoder_runs_the_triton_step(reset, count_calls):
    # without gradients a GRU decoder's cell steps run on TritonGRUStep: the CPU's
    # log-probabilities (the cells' own steps) in float64
    pytest.importorskip("triton")
    calls = count_calls(TritonGRUStep, "step_into")
    torch.manual_seed(0)
    shape = ModelSpec(cell="gru", reset=reset, hidden=8, embedding=4, layers=2,
                      attention="additive", context="input")  # fmt: skip
    model = build_seq2seq(shape, 13, 13).double().eval()
    g = torch.Generator().manual_seed(1)
    source = torch.randint(4, 13, (B, T), generator=g)
    source_mask = torch.ones(B, T, dtype=torch.bool)
    source_mask[1, 4:] = False
    tokens = torch.randint(4, 13, (B, 4), generator=g)

    def run(device):
        m = model.to(device)
        with torch.no_grad():
            state = m.encode(source.to(device), source_mask.to(device))
            out = []
            for t in range(tokens.shape[1]):
                log_probs, state = m.step(tokens[:, t].to(device), state)
                out.append(log_probs.cpu())
        return torch.stack(out)

    want = run("cpu")
    assert calls["n"] == 0
    with use_fused("auto"):
        got = run("cuda")
    assert calls["n"] == 2 * tokens.shape[1]  # two layers, every step
    torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)


GRAPHED = [
    ("lstm_holes", rnnkit.LSTM, {}),
    ("gru_keep_before", rnnkit.GRU, {"update": "keep", "reset": "before"}),
    ("rnn_sigmoid", rnnkit.RNN, {"nonlinearity": "sigmoid"}),
    ("gru_after_regularized", rnnkit.GRU, {"recurrent_dropout": 0.3, "zoneout": 0.2}),
    ("lstm_regularized", rnnkit.LSTM, {"recurrent_dropout": 0.3, "zoneout": 0.2}),
]


@pytest.mark.parametrize("name, cls, kw", GRAPHED, ids=[g[0] for g in GRAPHED])
def test_on_cuda_graphs_of_the_triton_steps_equal_the_eager_steps(name, cls, kw):
    """``RNNKIT_CUDA_GRAPHS=1`` (``use_cuda_graphs``): two training steps with an update
    of the weights between, the graphs captured at the first and replayed at both, equal
    the eager Triton steps (outputs, final states, every gradient). Every call (two
    layers, forward and backward) replays a graph; the second step
    captures none (the input size is not part of the key, and the weights are copied in)."""
    pytest.importorskip("triton")
    import copy

    from rnnkit.bptt import gpu_graphs

    torch.manual_seed(0)
    base = cls(I, H, num_layers=2, **kw)  # resets: a unidirectional stack
    mask = torch.rand(B, T) < 0.8  # holes
    mask[0], mask[1] = True, False  # lengths T and 0
    resets = torch.rand(B, T) < 0.2
    x = torch.randn(B, T, I, dtype=torch.float64)

    def two_steps(dtype, on):
        layer = copy.deepcopy(base).to(device="cuda", dtype=dtype).train()
        params = list(layer.parameters())
        got, captures = [], []
        for step in range(2):
            torch.manual_seed(step)  # the same regularizer masks with graphs and without
            xx = x.to(device="cuda", dtype=dtype).requires_grad_(True)
            with use_fused("triton"), gpu_graphs.use_cuda_graphs(on):
                out = layer(xx, mask=mask.cuda(), resets=resets.cuda())
                finals = tuple(out.state) if isinstance(out.state, LSTMState) else (out.state,)
                loss = out.outputs.sin().sum() + sum((f * f).sum() for f in finals)
                grads = torch.autograd.grad(loss, [xx, *params])
            got += [t.detach().double().cpu() for t in (out.outputs, *finals, *grads)]
            with torch.no_grad():  # an optimiser's step: the graphs must see new weights
                for p, g in zip(params, grads[1:], strict=True):
                    p.sub_(0.5 * g)
            captures.append(gpu_graphs.cuda_graph_stats()["captures"])
        return got, captures

    for dtype, tol in ((torch.float64, 1e-10), (torch.float32, 2e-5)):
        gpu_graphs.clear_cuda_graphs()
        want, none = two_steps(dtype, False)
        assert none == [0, 0]
        got, captures = two_steps(dtype, True)
        counts = gpu_graphs.cuda_graph_stats()
        assert counts["failures"] == 0, counts
        assert counts["replays"] == 2 * 2 * 2, counts  # 2 steps x (fwd, bwd) x 2 layers
        assert 2 <= captures[0] == captures[1] <= 4, captures
        for g, w in zip(got, want, strict=True):
            scale = float(w.abs().max()) or 1.0
            assert float((g - w).abs().max()) / scale <= tol
    gpu_graphs.clear_cuda_graphs()
