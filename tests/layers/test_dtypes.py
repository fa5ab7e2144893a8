"""Layers and drop-ins whose weights are bfloat16, float16 or float64, on the CPU.

Oracles: ``torch.nn`` with copied weights in the same dtype (values and gradients to the
dtype's rounding), and, for float16/bfloat16, the same layer in float32 from the rounded
weights (rnnkit computes a float16/bfloat16 recurrence in float32 on the CPU and rounds
its results once: equal to the bit).
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from rnnkit import nn as knn
from rnnkit.cells.amp import computes_in_float32
from rnnkit.layers import GRU, LSTM, RNN
from rnnkit.types import LSTMState

pytestmark = pytest.mark.usefixtures("single_thread")

LOW = [torch.bfloat16, torch.float16]
# the dtype's rounding: its machine epsilon (float64: the loop's sums over a few terms)
EPS = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10, torch.float64: 1e-13}
T, B, I, H = 6, 3, 5, 4


def _pair(mode: str, dtype: torch.dtype, **kw) -> tuple[torch.nn.Module, torch.nn.Module]:
    """torch.nn's layer and the drop-in with the same weights, in ``dtype``."""
    torch.manual_seed(0)
    reference = getattr(torch.nn, mode)(I, H, **kw).to(dtype)
    mine = getattr(knn, mode)(I, H, **kw).to(dtype)
    mine.load_state_dict(reference.state_dict())
    return reference, mine


def _run(module: torch.nn.Module, x: Tensor) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """Output, final h and every gradient of ``sum(output · weights)`` (float64)."""
    for p in module.parameters():
        p.grad = None
    x = x.detach().clone().requires_grad_()
    out, final = module(x)
    h = final[0] if isinstance(final, tuple) else final
    g = torch.linspace(-1, 1, out.numel(), dtype=torch.float64).view(out.shape)
    (out * g.to(out.dtype)).sum().backward()
    grads = {n: p.grad.double() for n, p in module.named_parameters()}
    grads["x"] = x.grad.double()
    return out.detach().double(), h.detach().double(), grads


@pytest.mark.parametrize("dtype", [*LOW, torch.float64], ids=str)
@pytest.mark.parametrize("mode", ["RNN", "LSTM", "GRU"])
def test_drop_ins_agree_with_torch_in_each_dtype(mode: str, dtype: torch.dtype) -> None:
    reference, mine = _pair(mode, dtype, num_layers=2, bidirectional=True)
    x = torch.randn(T, B, I, generator=torch.Generator().manual_seed(1)).to(dtype)
    out_t, h_t, grads_t = _run(reference, x)
    out_m, h_m, grads_m = _run(mine, x)
    mine.zero_grad()
    assert mine(x)[0].dtype == dtype
    assert all(p.grad is None or p.grad.dtype == dtype for p in mine.parameters())
    # each side carries the dtype's rounding (torch's compounded over the steps): a few eps
    tol = 8 * EPS[dtype]
    torch.testing.assert_close(out_m, out_t, atol=tol, rtol=0)
    torch.testing.assert_close(h_m, h_t, atol=tol, rtol=0)
    for name, g in grads_t.items():
        scale = max(float(g.abs().max()), 1.0)
        torch.testing.assert_close(grads_m[name], g, atol=tol * scale, rtol=0, msg=name)


def _own(kind: type, dtype: torch.dtype, **kw) -> torch.nn.Module:
    torch.manual_seed(0)
    return kind(I, H, **kw).to(dtype)


@pytest.mark.parametrize("dtype", LOW, ids=str)
@pytest.mark.parametrize("kind", [RNN, LSTM, GRU], ids=lambda k: k.__name__)
def test_low_precision_layer_is_its_float32_computation_rounded_once(
    kind: type, dtype: torch.dtype
) -> None:
    """float16/bfloat16 weights on the CPU: the loop runs in float32 (the compiled loop
    where it is built) and the outputs, the final state and every gradient are rounded
    once to the weights' dtype. The loop in bfloat16 itself rounds at every step."""
    low = _own(kind, dtype, num_layers=1)  # one cell: each gradient is one rounding
    high = _own(kind, torch.float32, num_layers=1)
    high.load_state_dict({k: v.float() for k, v in low.state_dict().items()})
    x = torch.randn(B, T, I, generator=torch.Generator().manual_seed(2)).to(dtype)
    lengths = torch.tensor([T, 2, T - 1])
    results = []
    for layer, xx in ((low, x), (high, x.float())):
        xx = xx.clone().requires_grad_()
        out = layer(xx, lengths=lengths)
        state = out.state
        h = state.h if isinstance(state, LSTMState) else state
        out.outputs.sum().backward()
        grads = [p.grad for p in layer.parameters()]
        results.append((out.outputs, h, xx.grad, grads))
    (out_l, h_l, dx_l, g_l), (out_h, h_h, dx_h, g_h) = results
    assert out_l.dtype == h_l.dtype == dx_l.dtype == dtype
    assert torch.equal(out_l, out_h.to(dtype))
    assert torch.equal(h_l, h_h.to(dtype))
    assert torch.equal(dx_l, dx_h.to(dtype))
    for gl, gh in zip(g_l, g_h, strict=True):
        assert gl.dtype == dtype and torch.equal(gl, gh.to(dtype))


@pytest.mark.parametrize(
    "options",
    [{"layer_norm": True}, {"recurrent_dropout": 0.3, "zoneout": 0.2}, {"weight_drop": 0.3}],
    ids=["layer_norm", "recurrent_dropout_zoneout", "weight_drop"],
)
def test_low_precision_layer_with_options_runs_in_float32(options: dict) -> None:
    """The cell kinds and regularizers whose masks enter the loop: cast with it."""
    layer = _own(LSTM, torch.bfloat16, **options).train()
    x = torch.randn(B, T, I, dtype=torch.bfloat16, requires_grad=True)
    out = layer(x)
    out.outputs.float().square().sum().backward()
    assert out.outputs.dtype == out.state.h.dtype == torch.bfloat16
    assert x.grad is not None and bool(x.grad.isfinite().all())
    assert all(p.grad is not None and p.grad.dtype == torch.bfloat16 for p in layer.parameters())


def test_computes_in_float32_names_the_low_precision_dtypes_and_where() -> None:
    bf16, f16 = torch.ones(1, dtype=torch.bfloat16), torch.ones(1, dtype=torch.float16)
    assert computes_in_float32(bf16) and computes_in_float32(f16)
    assert computes_in_float32(f16, fused=True)  # the CPU: always
    assert not computes_in_float32(torch.ones(1, dtype=torch.float32))
    assert not computes_in_float32(torch.ones(1, dtype=torch.float64))
    # another device ("meta" stands for a GPU): cuDNN keeps float16, not bfloat16
    assert not computes_in_float32(f16.to("meta"), fused=True)
    assert computes_in_float32(f16.to("meta")) and computes_in_float32(bf16.to("meta"), True)


@pytest.mark.parametrize("dtype", LOW, ids=str)
def test_low_precision_windowed_stack_is_its_float32_computation_rounded_once(
    dtype: torch.dtype,
) -> None:
    """``window=τ`` runs the whole stack in one node: in float32 too, rounded once."""
    low = _own(LSTM, dtype, num_layers=2)
    high = _own(LSTM, torch.float32, num_layers=2)
    high.load_state_dict({k: v.float() for k, v in low.state_dict().items()})
    x = torch.randn(B, T, I, generator=torch.Generator().manual_seed(3)).to(dtype)
    results = []
    for layer, xx in ((low, x), (high, x.float())):
        xx = xx.clone().requires_grad_()
        out = layer(xx, window=2)
        out.outputs.sum().backward()
        results.append((out.outputs, out.state.c, xx.grad, [p.grad for p in layer.parameters()]))
    (out_l, c_l, dx_l, g_l), (out_h, c_h, dx_h, g_h) = results
    assert out_l.dtype == c_l.dtype == dx_l.dtype == dtype
    assert torch.equal(out_l, out_h.to(dtype))
    assert torch.equal(c_l, c_h.to(dtype))
    assert torch.equal(dx_l, dx_h.to(dtype))
    for gl, gh in zip(g_l, g_h, strict=True):
        assert gl.dtype == dtype and torch.equal(gl, gh.to(dtype))


def _error_of(fn) -> BaseException:
    with pytest.raises(Exception) as caught:  # the type is what is compared
        fn()
    return caught.value


MISMATCHES = [
    (torch.float64, torch.float32),
    (torch.bfloat16, torch.float32),
    (torch.float32, torch.float16),
]


@pytest.mark.parametrize(("weights", "inputs"), MISMATCHES, ids=str)
@pytest.mark.parametrize("mode", ["RNN", "LSTM", "GRU"])
def test_drop_ins_refuse_another_input_dtype_as_torch_does(
    mode: str, weights: torch.dtype, inputs: torch.dtype
) -> None:
    """The input, or the initial state, in another dtype than the weights: torch's
    exception type, one line naming the drop-in."""
    reference, mine = _pair(mode, weights)
    x = torch.randn(T, B, I, dtype=inputs)
    theirs, ours = _error_of(lambda: reference(x)), _error_of(lambda: mine(x))
    assert type(ours) is type(theirs)
    assert str(ours).startswith(f"rnnkit.nn.{mode}: input dtype ({inputs})")
    assert "\n" not in str(ours)
    h = torch.zeros(1, B, H, dtype=inputs)
    hx = (h, h) if mode == "LSTM" else h
    xw = x.to(weights)
    theirs, ours = _error_of(lambda: reference(xw, hx)), _error_of(lambda: mine(xw, hx))
    assert type(ours) is type(theirs)
    assert str(ours).startswith(f"rnnkit.nn.{mode}: hx")
    assert "\n" not in str(ours)


@pytest.mark.parametrize(("weights", "inputs"), MISMATCHES, ids=str)
@pytest.mark.parametrize("kind", [RNN, LSTM, GRU], ids=lambda k: k.__name__)
def test_layers_name_themselves_when_the_input_dtype_differs(
    kind: type, weights: torch.dtype, inputs: torch.dtype
) -> None:
    layer = _own(kind, weights)
    x = torch.randn(B, T, I, dtype=inputs)
    name = kind.__name__
    with pytest.raises(TypeError, match=rf"^{name}: x is {inputs} on cpu but the parameters"):
        layer(x)
    z = torch.zeros(1, 1, B, H, dtype=inputs)
    state = LSTMState(z, z) if kind is LSTM else z
    part = "state.h" if kind is LSTM else "state"
    with pytest.raises(TypeError, match=rf"^{name}: {part} is {inputs} on cpu, x is {weights}"):
        layer(x.to(weights), state=state)
    cell = layer.cells()[0]
    with pytest.raises(TypeError, match=rf"^{type(cell).__name__}: x is {inputs} on cpu"):
        cell(torch.randn(B, I, dtype=inputs))


@pytest.mark.parametrize("mode", ["RNN", "LSTM", "GRU"])
def test_built_under_a_float64_default_they_compute_in_float64(mode: str) -> None:
    """``torch.set_default_dtype(torch.float64)`` before building: the drop-ins, rnnkit's
    own layers and cells are float64 and agree with torch's layer built the same way."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        torch.manual_seed(0)
        reference = getattr(torch.nn, mode)(I, H)
        mine = getattr(knn, mode)(I, H)
        own = {"RNN": RNN, "LSTM": LSTM, "GRU": GRU}[mode](I, H)
        cell = getattr(knn, mode + "Cell")(I, H)
        x = torch.randn(T, B, I)
    finally:
        torch.set_default_dtype(before)
    for module in (mine, own, cell):
        assert {p.dtype for p in module.parameters()} == {torch.float64}
    mine.load_state_dict(reference.state_dict())
    out_t, h_t, grads_t = _run(reference, x)
    out_m, h_m, grads_m = _run(mine, x)
    assert out_m.dtype == torch.float64
    torch.testing.assert_close(out_m, out_t, atol=1e-12, rtol=0)
    torch.testing.assert_close(h_m, h_t, atol=1e-12, rtol=0)
    for name, g in grads_t.items():
        torch.testing.assert_close(grads_m[name], g, atol=1e-12, rtol=0, msg=name)
    assert own(x.transpose(0, 1)).outputs.dtype == torch.float64


@pytest.mark.parametrize("mode", ["RNN", "LSTM", "GRU"])
def test_under_autocast_a_float32_input_meets_bfloat16_weights(mode: str) -> None:
    """Under autocast a float32 input is cast to float16/bfloat16 weights (autocast
    casts it so for torch's layers): the result is the layer's on the rounded input, in
    the weights' dtype, for the drop-in, rnnkit's own layer and its cell; outside
    autocast the same call is the dtype error."""
    _, mine = _pair(mode, torch.bfloat16)
    own = _own({"RNN": RNN, "LSTM": LSTM, "GRU": GRU}[mode], torch.bfloat16)
    x = torch.randn(T, B, I)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got_mine = mine(x)[0]
        got_own = own(x.transpose(0, 1)).outputs
        got_cell = own.cells()[0](x[0])
    assert torch.equal(got_mine, mine(x.bfloat16())[0])
    assert torch.equal(got_own, own(x.transpose(0, 1).bfloat16()).outputs)
    cell_out = own.cells()[0](x[0].bfloat16())
    first = got_cell[0] if isinstance(got_cell, tuple) else got_cell
    assert torch.equal(first, cell_out[0] if isinstance(cell_out, tuple) else cell_out)
    with pytest.raises(ValueError, match=rf"^rnnkit\.nn\.{mode}: input dtype"):
        mine(x)


@pytest.mark.parametrize("mode", ["RNN", "LSTM", "GRU"])
def test_under_autocast_float64_beside_float32_fails_as_torch_does(mode: str) -> None:
    """autocast casts float32 only: a float64 input or state beside float32 weights
    fails in torch's product (a ``RuntimeError``); the drop-in says so in one line."""
    reference, mine = _pair(mode, torch.float32)
    x = torch.randn(T, B, I, dtype=torch.float64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        theirs, ours = _error_of(lambda: reference(x)), _error_of(lambda: mine(x))
    assert type(ours) is type(theirs) is RuntimeError
    assert str(ours).startswith(f"rnnkit.nn.{mode}: input dtype (torch.float64)")
    h = torch.zeros(1, B, H, dtype=torch.float64)
    hx = (h, h) if mode == "LSTM" else h
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours = _error_of(lambda: mine(x.float(), hx))
    assert type(ours) is RuntimeError and str(ours).startswith(f"rnnkit.nn.{mode}: hx")
    cell = getattr(knn, mode + "Cell")(I, H)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours = _error_of(lambda: cell(x[0]))
    assert type(ours) is RuntimeError and str(ours).startswith(f"rnnkit.nn.{mode}Cell: input")


@pytest.mark.parametrize(
    "dtype, path, computed",
    [
        (torch.float16, "auto", torch.float32),  # the Triton steps' dtypes, not the loop's
        (torch.float16, "fused", torch.float16),  # cuDNN keeps float16
        (torch.bfloat16, "fused", torch.float32),  # cuDNN takes no bfloat16
    ],
)
def test_off_the_cpu_low_precision_weights_compute_where_a_kernel_takes_them(
    dtype, path, computed, monkeypatch
) -> None:
    # "meta" stands for a GPU (a device other than the CPU): what dtype the time loop gets
    from rnnkit.bptt import fused
    from rnnkit.layers import recurrent

    seen = []

    def spy(owner, name, at):
        real = getattr(owner, name)

        def run(*args, **kwargs):
            seen.append(args[at].dtype)
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, name, run)

    spy(recurrent, "run_recurrence", 1)  # (kernel, x, ...): the time loop's input
    spy(fused, "_call", 1)  # (form, x, ...): the fused kernel's (cuDNN's on a GPU)
    layer = LSTM(3, 4).to("meta", dtype)
    with fused.use_fused(path):
        out = layer(torch.zeros(2, 5, 3, device="meta", dtype=dtype))
    assert seen and set(seen) == {computed} and out.outputs.dtype == dtype
