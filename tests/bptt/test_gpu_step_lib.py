"""The one-step LSTM operators in Triton (``rnnkit.bptt.gpu_step_lib``) and the loops that
stay in Python on them.

No GPU here: the kernels run in Triton's interpreter (``TRITON_INTERPRET=1``, set for this
module only). Oracles: the compiled library's ``lstm_step`` / ``lstm_step_backward`` (their
semantics are the contract, in-place writes included), :class:`LSTMKernel`'s own step in
PyTorch through the same step interface, and the teacher-forced attention decoder on the
default CPU path (the compiled library), every gradient in float64. One test compiles
every kernel for a GPU (Triton's compiler, no GPU needed), in a process without the
interpreter.
"""

from __future__ import annotations

import pytest
import torch

from rnnkit.bptt import gpu_route, native
from rnnkit.bptt.dispatch import python_step_kernel
from rnnkit.bptt.fused import use_fused
from rnnkit.bptt.gpu_step_lib import TritonGRUStep, TritonStepLib
from rnnkit.cells.gru import GRUKernel
from rnnkit.cells.kernel import Weights
from rnnkit.cells.lstm import LSTMKernel, NativeLSTMStep
from rnnkit.cells.rnn import RNNKernel
from rnnkit.errors import ConfigError
from rnnkit.models.seq2seq import build_seq2seq
from rnnkit.models.seq2seq_torch_step import TorchInferenceStep
from rnnkit.models.spec import ModelSpec

pytest.importorskip("triton")
pytestmark = pytest.mark.usefixtures("triton_interpreter")  # tests/conftest.py

TOL = {
    torch.float64: {"atol": 1e-12, "rtol": 1e-12},
    torch.float32: {"atol": 2e-6, "rtol": 1e-5},
}
# (B, H): one program with a masked tail, and several programs (B·H over one block of 1024)
SIZES = [(3, 5), (37, 29)]


def _buffers(B: int, H: int, dtype: torch.dtype, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, dtype=dtype)

    return {
        "xp": r(B, 4 * H), "rec": r(B, 4 * H), "bias": r(4 * H), "c_prev": r(B, H),
        "d_h": r(B, H), "d_c": r(B, H), "d_out": r(B, H),
    }  # fmt: skip


def _run_ops(lib, b: dict[str, torch.Tensor], with_d_out: bool) -> dict[str, torch.Tensor]:
    """Every buffer the two operators read or write, after a forward and a backward."""
    gates = b["xp"].clone()
    h, c, tanh_c = (torch.full_like(b["c_prev"], float("nan")) for _ in range(3))
    lib.lstm_step(gates, b["rec"], b["bias"], b["c_prev"], h, c, tanh_c)
    d_h, d_c = b["d_h"].clone(), b["d_c"].clone()
    d_gates = torch.full_like(gates, float("nan"))
    extra = (b["d_out"],) if with_d_out else ()
    lib.lstm_step_backward(gates, tanh_c, b["c_prev"], d_h, d_c, d_gates, *extra)
    return {"gates": gates, "h": h, "c": c, "tanh_c": tanh_c, "d_h": d_h, "d_c": d_c,
            "d_gates": d_gates}  # fmt: skip


@pytest.mark.skipif(not native.available(), reason="no compiled loop here")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize(("B", "H"), SIZES)
@pytest.mark.parametrize("with_d_out", [False, True])
def test_the_triton_ops_equal_the_compiled_librarys(dtype, B, H, with_d_out):
    b = _buffers(B, H, dtype)
    want = _run_ops(native.library(), b, with_d_out)
    got = _run_ops(TritonStepLib(), b, with_d_out)
    for name, w in want.items():
        torch.testing.assert_close(got[name], w, **TOL[dtype], msg=name)
    assert torch.equal(got["d_h"], torch.zeros_like(got["d_h"]))  # zeroed, as the library's


def _kernel_step(kernel, w: Weights, x, h0, c0, d_h, d_c):
    """One step forward and backward through the step interface the Python loops call:
    the new states, the activated gates, ``tanh c``, ∂L/∂ of the pre-activations,
    ∂L/∂h_{t−1} and ∂L/∂c_{t−1}."""
    B, H = h0.shape
    xps = kernel.project_inputs(x, w, 1, B)
    cache = kernel.alloc_cache(1, B, H, xps, True)
    h, c = torch.empty_like(h0), torch.empty_like(c0)
    cache_t = tuple(t[0] for t in cache)
    kernel.step_into(tuple(t[0] for t in xps), (h0, c0), (h, c), cache_t, kernel.prepare(w))
    states = (torch.stack([h0, h]), torch.stack([c0, c]))
    bcache = tuple(t[0] for t in kernel.backward_cache(cache, states))
    d_xp = torch.empty(B, 4 * H, dtype=x.dtype)
    d_hp, d_cp = kernel.step_backward(
        (d_h.clone(), d_c.clone()), (h0, c0), (h, c), bcache, d_xp, d_xp,
        kernel.prepare_backward(w),
    )  # fmt: skip
    return {"h": h, "c": c, "gates": cache_t[0], "tanh_c": cache_t[1], "d_xp": d_xp,
            "d_hp": d_hp, "d_cp": d_cp}  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize(("B", "H"), SIZES)
def test_native_step_on_triton_equals_the_lstm_kernels_own_step(dtype, B, H):
    # NativeLSTMStep(TritonStepLib()) through the same interface as LSTMKernel (PyTorch):
    # LSTMKernel's g rows are scaled (g = 2σ(2a) − 1), NativeLSTMStep's are not; the
    # buffers after the step hold the same values
    g = torch.Generator().manual_seed(3)
    I = 6

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, dtype=dtype)

    w = Weights(r(4 * H, I), r(4 * H, H), r(4 * H), None)
    args = (w, r(B, I), r(B, H), r(B, H), r(B, H), r(B, H))
    want = _kernel_step(LSTMKernel(), *args)
    got = _kernel_step(NativeLSTMStep(TritonStepLib()), *args)
    for name, v in want.items():
        torch.testing.assert_close(got[name], v, **TOL[dtype], msg=name)


def _gru_step(kernel, w: Weights, x, h0, d_h):
    """A GRU step forward and backward through the step interface, and the recurrent
    weight gradients of that step."""
    B, H = h0.shape
    xps = kernel.project_inputs(x, w, 1, B)
    cache = kernel.alloc_cache(1, B, H, xps, True)
    h = torch.empty_like(h0)
    cache_t = tuple(t[0] for t in cache)
    kernel.step_into(tuple(t[0] for t in xps), (h0,), (h,), cache_t, kernel.prepare(w))
    bcache = tuple(t[0] for t in kernel.backward_cache(cache, (torch.stack([h0, h]),)))
    d_xp = torch.full((B, 3 * H), float("nan"), dtype=x.dtype)  # every entry written
    d_hp = torch.full_like(h0, float("nan")) if kernel.reset == "after" else d_xp
    (d_prev,) = kernel.step_backward(
        (d_h.clone(),), (h0,), (h,), bcache, d_xp, d_hp, kernel.prepare_backward(w)
    )
    d_w, d_bias_hn = kernel.recurrent_grads(d_xp, d_hp, h0, cache_t)
    out = {"h": h, "rz": cache_t[0], "n": cache_t[1], "rec": cache_t[2], "d_xp": d_xp,
           "d_hp": d_hp, "d_prev": d_prev, "d_w": d_w}  # fmt: skip
    return out if d_bias_hn is None else {**out, "d_bias_hn": d_bias_hn}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize(("B", "H"), SIZES)
@pytest.mark.parametrize("update", ["keep", "candidate"])
@pytest.mark.parametrize("reset", ["after", "before"])
def test_triton_gru_step_equals_the_gru_kernels_own_step(dtype, B, H, update, reset):
    g = torch.Generator().manual_seed(4)
    I = 6

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, dtype=dtype)

    w = Weights(r(3 * H, I), r(3 * H, H), r(3 * H), r(H) if reset == "after" else None)
    args = (w, r(B, I), r(B, H), r(B, H))
    want = _gru_step(GRUKernel(update, reset), *args)
    got = _gru_step(TritonGRUStep(update, reset), *args)
    assert got.keys() == want.keys()
    for name, v in want.items():
        torch.testing.assert_close(got[name], v, **TOL[dtype], msg=name)


def test_bad_buffers_are_one_clear_error():
    b = _buffers(2, 3, torch.float64)
    h, c, tc = (torch.empty(2, 3, dtype=torch.float64) for _ in range(3))
    lib = TritonStepLib()
    with pytest.raises(ValueError, match=r"rec must be \(2, 12\)"):
        lib.lstm_step(b["xp"], b["rec"][:1], b["bias"], b["c_prev"], h, c, tc)
    with pytest.raises(ValueError, match="c_prev must be float32 or float64"):
        lib.lstm_step(b["xp"], b["rec"], b["bias"], b["c_prev"].float(), h, c, tc)
    with pytest.raises(ValueError, match="d_gates must be contiguous"):
        lib.lstm_step_backward(b["xp"], tc, b["c_prev"], h, c, torch.empty(12, 2).T)


class _CudaLike:
    """What the choice reads of a CUDA tensor: its device and dtype (a device object needs
    no GPU; nothing is allocated on it)."""

    device = torch.device("cuda", 0)
    dtype = torch.float32


def test_python_step_kernel_chooses_the_triton_step(monkeypatch):
    monkeypatch.setitem(gpu_route._why, "cuda:0", None)  # the first-use test: they run
    lstm, gru = LSTMKernel(), GRUKernel("keep", "before")
    cpu = torch.zeros(2, 3)
    with use_fused("auto"):  # CUDA tensors with triton: the Triton step, no library
        step, lib = python_step_kernel(lstm, _CudaLike())
        assert isinstance(step, NativeLSTMStep) and isinstance(step.lib, TritonStepLib)
        assert lib is None
        assert python_step_kernel(gru, _CudaLike()) == (TritonGRUStep("keep", "before"), None)
        rnn = RNNKernel("tanh")  # one product and one activation: nothing to fuse
        assert python_step_kernel(rnn, _CudaLike()) == (rnn, None)
        step, lib = python_step_kernel(lstm, cpu)  # the CPU's default is unchanged
        assert not isinstance(getattr(step, "lib", None), TritonStepLib)
        assert (lib is None) == (step is lstm)
        monkeypatch.setitem(gpu_route._found, "triton", False)  # triton not installed
        assert python_step_kernel(lstm, _CudaLike()) == (lstm, None)
    monkeypatch.setitem(gpu_route._found, "triton", True)
    with use_fused("loop"):
        assert python_step_kernel(lstm, _CudaLike()) == (lstm, None)
    with use_fused("triton"):  # forced: on the CPU too (in the interpreter)
        step, lib = python_step_kernel(lstm, cpu)
        assert isinstance(step.lib, TritonStepLib) and lib is None  # type: ignore[attr-defined]
        assert python_step_kernel(lstm, cpu.half())[0] is not step  # float16: not its
        monkeypatch.delenv("TRITON_INTERPRET")
        with pytest.raises(ConfigError, match="TRITON_INTERPRET=1"):
            python_step_kernel(lstm, cpu)
        monkeypatch.setitem(gpu_route._found, "triton", False)
        with pytest.raises(ConfigError, match=r"pip install 'rnnkit\[gpu\]'"):
            python_step_kernel(lstm, cpu)


def _grads(kind: str, cell: dict[str, str], path: str):
    """Loss and every parameter's gradient of a Seq2Seq with ``cell`` as its decoder,
    attention before the step, float64, on ``path``."""
    torch.manual_seed(0)
    shape = ModelSpec(
        hidden=5, embedding=3, attention=kind, context="both", bidirectional=False, **cell
    )
    m = build_seq2seq(shape, 9, 9).double()
    g = torch.Generator().manual_seed(1)
    B, S, T = 3, 4, 4
    source = torch.randint(4, 9, (B, S), generator=g)
    source_mask = torch.ones(B, S, dtype=torch.bool)
    source_mask[1, 2:] = False
    target_in = torch.randint(4, 9, (B, T), generator=g)
    target_mask = torch.ones(B, T, dtype=torch.bool)
    target_mask[2, 3:] = False
    with use_fused(path):
        out = m(source, source_mask, target_in, target_mask)
        d = torch.randn(out.logits.shape, generator=g, dtype=torch.float64)
        loss = (out.logits * d).sum() + out.attention.square().sum()
        grads = torch.autograd.grad(loss, list(m.parameters()), allow_unused=True)
    return loss, dict(zip([n for n, _ in m.named_parameters()], grads, strict=True))


CASES = [  # each attention kind with the LSTM; each GRU form once
    ("dot", {"cell": "lstm"}),
    ("bilinear", {"cell": "lstm"}),
    ("additive", {"cell": "lstm"}),
    ("additive", {"cell": "gru", "update": "keep", "reset": "after"}),
    ("dot", {"cell": "gru", "update": "candidate", "reset": "after"}),
    ("bilinear", {"cell": "gru", "update": "keep", "reset": "before"}),
    ("additive", {"cell": "gru", "update": "candidate", "reset": "before"}),
]


@pytest.mark.parametrize(
    ("kind", "cell"), CASES, ids=[f"{k}-{'-'.join(c.values())}" for k, c in CASES]
)
def test_attention_decoder_on_the_triton_step_equals_the_cpu_path(kind, cell, monkeypatch):
    calls = {"forward": 0, "backward": 0}
    spied = (
        (TritonStepLib, "lstm_step", "forward"),
        (TritonStepLib, "lstm_step_backward", "backward"),
        (TritonGRUStep, "step_into", "forward"),
        (TritonGRUStep, "step_backward", "backward"),
    )
    for cls, name, what in spied:
        real = getattr(cls, name)

        def spy(self, *args, _real=real, _what=what):
            calls[_what] += 1
            return _real(self, *args)

        monkeypatch.setattr(cls, name, spy)
    want_loss, want = _grads(kind, cell, "auto")  # the CPU's default
    assert calls == {"forward": 0, "backward": 0}
    got_loss, got = _grads(kind, cell, "triton")
    assert calls == {"forward": 4, "backward": 4}  # one of each per step
    torch.testing.assert_close(got_loss, want_loss, atol=1e-10, rtol=1e-10)
    for name, w in want.items():
        assert (got[name] is None) == (w is None), name
        if w is not None:
            assert float(w.abs().sum()) > 0, name
            torch.testing.assert_close(got[name], w, atol=1e-10, rtol=1e-10, msg=name)


@pytest.mark.parametrize(
    ("reset", "wiring"), [("after", "before"), ("before", "after"), ("before", "before")]
)
def test_decoding_a_gru_decoder_on_the_triton_step_equals_the_cpu_path(
    reset, wiring, count_calls, monkeypatch
):
    # without gradients, each decoder cell's step (two layers) runs on TritonGRUStep where
    # the Triton steps would run; the same log-probabilities as the cells' own steps. The
    # decoding takes the model's general step here (decoding's own step of torch
    # operations, which a GPU takes instead, is held to it in test_seq2seq_torch_step)
    monkeypatch.setattr(TorchInferenceStep, "build", classmethod(lambda cls, m: None))
    calls = count_calls(TritonGRUStep, "step_into")
    torch.manual_seed(0)
    shape = ModelSpec(cell="gru", update="keep", reset=reset, hidden=5, embedding=3, layers=2,
                      attention="additive", attention_wiring=wiring, context="input")  # fmt: skip
    m = build_seq2seq(shape, 9, 9).double().eval()
    g = torch.Generator().manual_seed(1)
    source = torch.randint(4, 9, (3, 4), generator=g)
    source_mask = torch.ones(3, 4, dtype=torch.bool)
    source_mask[1, 2:] = False
    tokens = torch.randint(4, 9, (3, 3), generator=g)

    def steps(path):
        with use_fused(path), torch.no_grad():
            state = m.encode(source, source_mask)
            out = []
            for t in range(tokens.shape[1]):
                log_probs, state = m.step(tokens[:, t], state)
                out.append(log_probs)
            decoded = m.decode(source, source_mask, max_length=4)
        return torch.stack(out), [[r.ids for r in rows] for rows in decoded]

    want, want_decoded = steps("auto")  # the CPU: the cells' own steps
    assert calls["n"] == 0
    got, got_decoded = steps("triton")
    assert calls["n"] > 2 * 3  # two layers, three steps, then the decoding's
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)
    assert got_decoded == want_decoded
    with use_fused("triton"):  # with gradients: the cell's own step (autograd)
        calls["n"] = 0
        m.step(tokens[:, 0], m.encode(source, source_mask))[0].sum().backward()
        assert calls["n"] == 0


@pytest.mark.slow
def test_kernels_compile_for_a_gpu(compile_for_sm90):
    cases = """[
        (K.lstm_step, {}),
        (K.lstm_step_backward, {"HAS_DOUT": True}),
        (K.gru_after_step, {"KEEP": True}),
        (K.gru_before_gates, {}),
        (K.gru_before_state, {"KEEP": False}),
        (K.gru_step_backward, {"KEEP": True, "AFTER": True}),
        (K.gru_step_backward, {"KEEP": False, "AFTER": False}),
        (K.gru_before_backward, {}),
    ]"""
    done = compile_for_sm90("rnnkit.bptt.triton_step_kernels", cases)
    assert len(done) == 2 * 8
    assert all(cubin for _, _, cubin in done), done
