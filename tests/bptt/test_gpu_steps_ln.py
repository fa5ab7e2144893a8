"""The layer-normalised LSTM and GRU on the Triton steps (``rnnkit.bptt.gpu_steps_ln``)
against the library's PyTorch loop with its explicit BPTT, in float64, to ~1e-12: outputs,
final states and every gradient (the input part, ``W_h``, the bias, the gains, the
initial states), with holes and resets. Under Triton's interpreter (tests/conftest.py);
sizes stay tiny, ``H`` not a power of two so the blocks' tails are masked.
"""

from __future__ import annotations

import pytest
import torch

import rnnkit
from rnnkit.bptt import gpu_steps, recurrence
from rnnkit.bptt.backward import backward_sweep, weight_grads
from rnnkit.bptt.forward import forward_pass
from rnnkit.bptt.fused import use_fused
from rnnkit.bptt.native import use_native
from rnnkit.cells.layer_norm import LayerNormGRUCell, LayerNormLSTMCell
from rnnkit.types import LSTMState

pytest.importorskip("triton")
pytestmark = pytest.mark.usefixtures("triton_interpreter")

T, B, I, H = 5, 3, 4, 3

CELLS = {
    "lstm": lambda: LayerNormLSTMCell(I, H),
    "gru_candidate": lambda: LayerNormGRUCell(I, H, update="candidate"),
    "gru_keep": lambda: LayerNormGRUCell(I, H, update="keep"),
}


def _cell(name: str):
    """A cell with gains and biases away from their initial 1 and 0."""
    torch.manual_seed(1)
    cell = CELLS[name]().double()
    with torch.no_grad():
        for p in cell.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return cell


def _case(cell, kind: str):
    """The input part, initial states, mask and resets (as tests/bptt/test_gpu_steps.py)."""
    g = torch.Generator().manual_seed(0)
    n = 2 if isinstance(cell, LayerNormLSTMCell) else 1
    x = cell.input_part(torch.randn(T, B, I, dtype=torch.float64, generator=g)).detach()
    states0 = tuple(torch.randn(B, H, dtype=torch.float64, generator=g) for _ in range(n))
    mask = reset = None
    if kind != "plain":
        mask = torch.ones(T, B, dtype=torch.bool)
        mask[:, 1] = False
        mask[[1, 3], 2] = False
        x = torch.where(mask[..., None], x, 0.0)
    if kind == "resets":
        reset = torch.zeros(T, B, dtype=torch.bool)
        reset[2, 0] = reset[0, 2] = reset[3, 2] = True  # (3, 2) is a held step
    return x, states0, mask, reset


def _oracle(cell, x, states0, mask, reset, d_out, d_finals):
    kernel, w = cell.kernel, cell.weights()
    mask3 = None if mask is None else mask[..., None]
    reset3 = None if reset is None else reset[..., None]
    with use_native(False), torch.no_grad():
        record = forward_pass(kernel, x, w, states0, mask3, True, reset=reset3)
        sweep = backward_sweep(kernel, record, w, mask3, d_out, d_finals)
        grads = weight_grads(kernel, record, sweep, w, (True, False, True, True, True))
    finals = tuple(s[-1] for s in record.states)
    return [record.states[0][1:], *finals, *(g for g in grads if g is not None),
            *sweep.d_states0]  # fmt: skip


def _steps(cell, x, states0, mask, reset, d_out, d_finals):
    x = x.clone().requires_grad_(True)
    states0 = tuple(s.clone().requires_grad_(True) for s in states0)
    w = cell.weights()
    params = [w.weight_hh, w.bias, w.bias_hn]
    w = w._replace(bias_hn=w.bias_hn.detach().requires_grad_(True))
    params[2] = w.bias_hn
    outputs, finals = gpu_steps.run_steps(cell.kernel, x, w, states0, mask, reset)
    loss = (outputs * d_out).sum() + sum(
        (f * d).sum() for f, d in zip(finals, d_finals, strict=True)
    )
    grads = torch.autograd.grad(loss, [x, *params, *states0])
    return [outputs.detach(), *(f.detach() for f in finals), *grads]


@pytest.mark.parametrize("kind", ["plain", "holes", "resets"])
@pytest.mark.parametrize("name", list(CELLS))
def test_ln_steps_equal_the_explicit_bptt_in_float64(name, kind):
    cell = _cell(name)
    x, states0, mask, reset = _case(cell, kind)
    g = torch.Generator().manual_seed(5)
    d_out = torch.randn(T, B, H, dtype=torch.float64, generator=g)
    d_finals = tuple(torch.randn(B, H, dtype=torch.float64, generator=g) for _ in states0)
    got = _steps(cell, x, states0, mask, reset, d_out, d_finals)
    want = _oracle(cell, x, states0, mask, reset, d_out, d_finals)
    # outputs, finals, ∂x, ∂W_h, ∂b, ∂gains, ∂states0
    assert len(got) == len(want) == 2 * len(states0) + 5
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


@pytest.mark.parametrize(("steps", "rows"), [(0, 2), (3, 0)])
@pytest.mark.parametrize("name", ["lstm", "gru_keep"])
def test_ln_steps_without_steps_or_rows(name, steps, rows):
    """No step: the initial states come back, their gradient passes through; no row:
    empty outputs and gradients, no launch reads anything."""
    cell = _cell(name)
    n = 2 if isinstance(cell, LayerNormLSTMCell) else 1
    x = torch.randn(steps, rows, cell.gates * H, dtype=torch.float64, requires_grad=True)
    states0 = tuple(torch.randn(rows, H, dtype=torch.float64, requires_grad=True) for _ in range(n))
    outputs, finals = gpu_steps.run_steps(cell.kernel, x, cell.weights(), states0)
    assert outputs.shape == (steps, rows, H)
    d_finals = [torch.randn_like(f) for f in finals]
    grads = torch.autograd.grad(
        sum((f * d).sum() for f, d in zip(finals, d_finals, strict=True)), [x, *states0]
    )
    assert grads[0].shape == x.shape
    for f, s0, g, d in zip(finals, states0, grads[1:], d_finals, strict=True):
        assert torch.equal(f, s0) if steps == 0 else f.shape == s0.shape
        assert torch.equal(g, d)


@pytest.mark.parametrize(
    ("cls", "options"),
    [
        (rnnkit.LSTM, {"num_layers": 2, "bidirectional": True}),
        (rnnkit.GRU, {"update": "keep", "reset": "after"}),
    ],
)
def test_public_layer_norm_layer_on_the_triton_steps_equals_the_loop(cls, options, count_calls):
    calls = count_calls(recurrence, "run_steps")
    torch.manual_seed(2)
    layer = cls(I, H, layer_norm=True, **options).double()
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(0.2 * torch.randn_like(p))
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, 2:] = False
    mask[2, [0, 3]] = False
    resets = torch.zeros(B, T, dtype=torch.bool)
    resets[0, 2] = resets[2, 4] = True
    if options.get("bidirectional"):  # resets: a unidirectional stack's
        resets = None
    x = torch.randn(B, T, I, dtype=torch.float64)
    results, counts = [], []
    for path in ("triton", "loop"):
        xx = x.clone().requires_grad_(True)
        with use_fused(path), use_native(False):
            out = layer(xx, mask=mask, resets=resets)
        finals = tuple(out.state) if isinstance(out.state, LSTMState) else (out.state,)
        loss = out.outputs.sin().sum() + sum((f * f).sum() for f in finals)
        grads = torch.autograd.grad(loss, [xx, *layer.parameters()])
        results.append([out.outputs, *finals, *grads])
        counts.append(calls["n"])
    # the triton path ran every layer and direction there, once each (the unidirectional
    # GRU's resets inside its one call, not the pieces between them); the loop none
    directions = 2 if options.get("bidirectional") else 1
    assert counts == [options.get("num_layers", 1) * directions] * 2
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


@pytest.mark.slow
def test_ln_kernels_compile_for_a_gpu(compile_for_sm90):
    cases = """[
        (K.ln_lstm_forward, {"HAS_MASK": True, "HAS_RESET": True}),
        (K.ln_lstm_backward, {"HAS_MASK": True, "HAS_RESET": True, "HAS_DOUT": True}),
        (K.ln_gru_forward, {"HAS_MASK": True, "HAS_RESET": True, "KEEP": True}),
        (K.ln_gru_backward, {"HAS_MASK": True, "HAS_RESET": True, "HAS_DOUT": False,
                             "KEEP": False}),
    ]"""
    # tc: the LSTM's tanh c buffer here, not a step index
    done = compile_for_sm90("rnnkit.bptt.triton_ln_kernels", cases, 256, "t,B,H,kt,kb")
    assert len(done) == 2 * 4
    assert all(cubin for _, _, cubin in done), done
