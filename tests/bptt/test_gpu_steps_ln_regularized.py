"""The layer-normalised LSTM and GRU with recurrent dropout (the LSTM's only) and zoneout
on the Triton steps (``rnnkit.bptt.gpu_steps_ln``) against the explicit BPTT of the
PyTorch loop with the same fixed masks.

No GPU here: the kernels run in Triton's interpreter (``triton_interpreter``,
tests/conftest.py). Oracle: ``RegularizedKernel`` around the cell's kernel in the
library's PyTorch time loop (``forward_pass``, ``backward_sweep``, ``weight_grads``), in
float64, to ~1e-12: outputs, final states and every gradient (the input part, ``W_h``,
the bias, the gains, the initial states), with holes and resets; the public layer forced
onto the Triton steps against the loop. Sizes stay tiny, ``H`` not a power of two so the
blocks' tails are masked.
"""

from __future__ import annotations

import pytest
import torch

import rnnkit
from rnnkit.bptt import gpu_steps, gpu_steps_ln, recurrence
from rnnkit.bptt.backward import backward_sweep, weight_grads
from rnnkit.bptt.forward import forward_pass
from rnnkit.bptt.fused import use_fused
from rnnkit.bptt.native import use_native
from rnnkit.bptt.regularized import RegularizedKernel
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
# the masks of _masks each cell takes (the layer-normalised GRU: no recurrent dropout)
LSTM_ONLY = ("dropout", "both", "zoneout_c")


def _cell(name: str):
    """A cell with gains and biases away from their initial 1 and 0."""
    torch.manual_seed(1)
    cell = CELLS[name]().double()
    with torch.no_grad():
        for p in cell.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return cell


def _case(cell, kind: str):
    """The input part, initial states, mask (row 1 of length 0, row 2 with holes) and,
    for ``resets``, resets inside the loop (one at step 0, one at a held step)."""
    g = torch.Generator().manual_seed(0)
    n = cell.kernel.num_states
    x = cell.input_part(torch.randn(T, B, I, dtype=torch.float64, generator=g)).detach()
    states0 = tuple(torch.randn(B, H, dtype=torch.float64, generator=g) for _ in range(n))
    mask = torch.ones(T, B, dtype=torch.bool)
    mask[:, 1] = False
    mask[[1, 3], 2] = False
    x = torch.where(mask[..., None], x, 0.0)
    reset = None
    if kind == "resets":
        reset = torch.zeros(T, B, dtype=torch.bool)
        reset[2, 0] = reset[0, 2] = reset[3, 2] = True  # (3, 2) is a held step
    return x, states0, mask, reset


def _masks(which: str, n: int):
    """Recurrent dropout's mask ``(B, H)`` (0 or 2: p = 1/2) and zoneout's keep factors
    ``(T, B, H)`` per state: a Bernoulli draw (training), a constant expanded
    (evaluation), real values in (0, 1), or on c only."""
    g = torch.Generator().manual_seed(3)
    rec = (torch.rand(B, H, generator=g, dtype=torch.float64) < 0.5).double() * 2.0
    bern = tuple((torch.rand(T, B, H, generator=g, dtype=torch.float64) < 0.4).double()
                 for _ in range(n))  # fmt: skip
    real = tuple(torch.rand(T, B, H, generator=g, dtype=torch.float64) for _ in range(n))
    const = tuple(torch.full((1, 1, 1), 0.3, dtype=torch.float64).expand(T, B, H)
                  for _ in range(n))  # fmt: skip
    return {
        "dropout": (rec, None),
        "zoneout": (None, bern),
        "zoneout_eval": (None, const),
        "zoneout_real": (None, real),
        "both": (rec, real),
        "zoneout_c": (rec, (None, real[-1])),
    }[which]


def _oracle(kernel, w, x, states0, mask, reset, d_out, d_finals):
    """The explicit BPTT of the PyTorch loop: outputs, finals, then the gradients of the
    input part, weight_hh, bias, the gains and the initial states."""
    mask3 = mask[..., None]
    reset3 = None if reset is None else reset[..., None]
    with use_native(False), torch.no_grad():
        record = forward_pass(kernel, x, w, states0, mask3, True, reset=reset3)
        sweep = backward_sweep(kernel, record, w, mask3, d_out, d_finals)
        grads = weight_grads(kernel, record, sweep, w, (True, False, True, True, True))
    finals = tuple(s[-1] for s in record.states)
    return [record.states[0][1:], *finals, *(g for g in grads if g is not None),
            *sweep.d_states0]  # fmt: skip


def _steps(kernel, w, x, states0, mask, reset, d_out, d_finals):
    """The same by the Triton steps, gradients by autograd through their node."""
    x = x.clone().requires_grad_(True)
    states0 = tuple(s.clone().requires_grad_(True) for s in states0)
    w = w._replace(bias_hn=w.bias_hn.detach().requires_grad_(True))
    outputs, finals = gpu_steps.run_steps(kernel, x, w, states0, mask, reset)
    loss = (outputs * d_out).sum() + sum(
        (f * d).sum() for f, d in zip(finals, d_finals, strict=True)
    )
    grads = torch.autograd.grad(loss, [x, w.weight_hh, w.bias, w.bias_hn, *states0])
    return [outputs.detach(), *(f.detach() for f in finals), *grads]


def _compare(name, which, kind):
    cell = _cell(name)
    x, states0, mask, reset = _case(cell, kind)
    rec, keep = _masks(which, cell.kernel.num_states)
    kernel = RegularizedKernel(cell.kernel, rec, keep)
    g = torch.Generator().manual_seed(5)
    d_out = torch.randn(T, B, H, dtype=torch.float64, generator=g)
    d_finals = tuple(torch.randn(B, H, dtype=torch.float64, generator=g) for _ in states0)
    w = cell.weights()
    got = _steps(kernel, w, x, states0, mask, reset, d_out, d_finals)
    want = _oracle(kernel, w, x, states0, mask, reset, d_out, d_finals)
    # outputs, finals, ∂x, ∂W_h, ∂b, ∂gains, ∂states0
    assert len(got) == len(want) == 2 * len(states0) + 5
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    return got


@pytest.mark.parametrize("kind", ["holes", "resets"])
@pytest.mark.parametrize("which", ["dropout", "zoneout", "both", "zoneout_c"])
def test_lstm_regularized_steps_equal_the_explicit_bptt_in_float64(which, kind):
    _compare("lstm", which, kind)


@pytest.mark.parametrize("kind", ["holes", "resets"])
@pytest.mark.parametrize("which", ["zoneout", "zoneout_real"])
@pytest.mark.parametrize("name", ["gru_candidate", "gru_keep"])
def test_gru_zoneout_steps_equal_the_explicit_bptt_in_float64(name, which, kind):
    _compare(name, which, kind)


@pytest.mark.parametrize("name", list(CELLS))
def test_zoneout_at_evaluation(name):
    """Zoneout's constant factor expanded over (T, B, H), as evaluation passes it."""
    _compare(name, "zoneout_eval", "holes")


def test_the_masks_change_the_function():
    """The oracle comparison is not empty: the regularizers change outputs and gradients
    (so a kernel that ignored them would fail the comparisons above)."""
    plain = _compare("lstm", "both", "holes")
    cell = _cell("lstm")
    x, states0, mask, _ = _case(cell, "holes")
    g = torch.Generator().manual_seed(5)
    d_out = torch.randn(T, B, H, dtype=torch.float64, generator=g)
    d_finals = tuple(torch.randn(B, H, dtype=torch.float64, generator=g) for _ in states0)
    bare = _steps(cell.kernel, cell.weights(), x, states0, mask, None, d_out, d_finals)
    assert all(not torch.allclose(a, b) for a, b in zip(plain[:4], bare[:4], strict=True))


def test_the_gru_refuses_a_recurrent_mask():
    cell = _cell("gru_keep")
    x, states0, _, _ = _case(cell, "holes")
    rec = torch.ones(B, H, dtype=torch.float64)
    with pytest.raises(ValueError, match="no layer-normalised GRU form"):
        gpu_steps_ln.run_ln_steps(cell.kernel, x, cell.weights(), states0, None, None,
                                  (rec, None, None))  # fmt: skip


@pytest.mark.parametrize(
    ("cls", "options"),
    [
        (
            rnnkit.LSTM,
            {"num_layers": 2, "bidirectional": True, "recurrent_dropout": 0.4, "zoneout": 0.3},
        ),
        (rnnkit.GRU, {"update": "keep", "reset": "after", "zoneout": 0.3}),
    ],
)
@pytest.mark.parametrize("training", [True, False])
def test_public_layer_with_fixed_masks_on_the_triton_steps_equals_the_loop(
    cls, options, training, count_calls
):
    """The public layer with the same drawn masks (training) or zoneout's expectation
    (evaluation), forced onto the Triton steps, equals the PyTorch loop, and the Triton
    steps ran every layer and direction."""
    calls = count_calls(recurrence, "run_steps")
    torch.manual_seed(2)
    layer = cls(I, H, layer_norm=True, **options).double()
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(0.2 * torch.randn_like(p))
    layer.train(training)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, 2:] = False
    mask[2, [0, 3]] = False
    x = torch.randn(B, T, I, dtype=torch.float64)
    masks = layer.draw_masks(B, T, x)
    results, counts = [], []
    for path in ("triton", "loop"):
        xx = x.clone().requires_grad_(True)
        with use_fused(path), use_native(False):
            out = layer(xx, mask=mask, masks=masks)
        finals = tuple(out.state) if isinstance(out.state, LSTMState) else (out.state,)
        loss = out.outputs.sin().sum() + sum((f * f).sum() for f in finals)
        grads = torch.autograd.grad(loss, [xx, *layer.parameters()])
        results.append([out.outputs, *finals, *grads])
        counts.append(calls["n"])
    directions = 2 if options.get("bidirectional") else 1
    assert counts == [options.get("num_layers", 1) * directions] * 2
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
