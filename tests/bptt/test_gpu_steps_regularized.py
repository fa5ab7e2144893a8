"""Recurrent dropout and zoneout on the Triton steps (``rnnkit.bptt.gpu_steps``) against
the explicit BPTT of the PyTorch loop with the same fixed masks.

No GPU here: the kernels run in Triton's interpreter (``triton_interpreter``,
tests/bptt/conftest.py). Oracle: ``RegularizedKernel`` in the library's PyTorch time loop
(``forward_pass``, ``backward_sweep``, ``weight_grads``), in float64, to ~1e-12; the
public layer against itself on the loop. Sizes stay tiny: the interpreter runs every
launch in numpy.
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
from rnnkit.bptt.regularized import RegularizedKernel, regularized
from rnnkit.cells.gru import GRUCell
from rnnkit.cells.lstm import LSTMCell
from rnnkit.cells.rnn import RNNCell
from rnnkit.types import LSTMState

pytest.importorskip("triton")
pytestmark = pytest.mark.usefixtures("triton_interpreter")

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


def _case(kind: str, n: int, seed: int = 0):
    """Input, initial states, mask (row 0 of length T, row 1 of length 0, row 2 with
    holes) and, for ``resets``, resets inside the loop (one at step 0, one at a held
    step)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, B, I, dtype=torch.float64, generator=g)
    states0 = tuple(torch.randn(B, H, dtype=torch.float64, generator=g) for _ in range(n))
    mask = torch.ones(T, B, dtype=torch.bool)
    mask[:, 1] = False
    mask[[1, 3], 2] = False
    x = torch.where(mask[..., None], x, 0.0)  # as clean_padding leaves it
    reset = None
    if kind == "resets":
        reset = torch.zeros(T, B, dtype=torch.bool)
        reset[2, 0] = reset[0, 2] = reset[3, 2] = True  # (3, 2) is a held step
    return x, states0, mask, reset


def _masks(which: str, n: int, seed: int = 3):
    """Recurrent dropout's mask ``(B, H)`` (0 or 2: p = 1/2) and zoneout's keep factors
    ``(T, B, H)`` per state: a Bernoulli draw (training), a constant expanded
    (evaluation), real values in (0, 1) (the formula in general), or on one state only."""
    g = torch.Generator().manual_seed(seed)
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
        "both": (rec, real),
        "zoneout_h": (rec, (bern[0], *((None,) * (n - 1)))),
        "zoneout_c": (None, (None, real[-1])),
    }[which]


def _oracle(kernel, w, x, states0, mask, reset, d_out, d_finals):
    """The explicit BPTT of the PyTorch loop: outputs, finals, then the gradients of x,
    weight_ih, weight_hh, bias, (bias_hn,) and the initial states."""
    mask3 = mask[..., None]
    reset3 = None if reset is None else reset[..., None]
    need = (True, True, True, True, w.bias_hn is not None)
    with use_native(False), torch.no_grad():
        record = forward_pass(kernel, x, w, states0, mask3, True, reset=reset3)
        sweep = backward_sweep(kernel, record, w, mask3, d_out, d_finals)
        grads = weight_grads(kernel, record, sweep, w, need)
    finals = tuple(s[-1] for s in record.states)
    got = [g for g in grads if g is not None]
    return [record.states[0][1:], *finals, *got, *sweep.d_states0]


def _steps(kernel, w, x, states0, mask, reset, d_out, d_finals):
    """The same by the Triton steps, gradients by autograd through their node."""
    x = x.clone().requires_grad_(True)
    states0 = tuple(s.clone().requires_grad_(True) for s in states0)
    outputs, finals = gpu_steps.run_steps(kernel, x, w, states0, mask, reset)
    loss = (outputs * d_out).sum() + sum(
        (f * d).sum() for f, d in zip(finals, d_finals, strict=True)
    )
    params = [p for p in w if p is not None]
    grads = torch.autograd.grad(loss, [x, *params, *states0])
    return [outputs.detach(), *(f.detach() for f in finals), *grads]


def _compare(name, which, kind):
    torch.manual_seed(1)
    cell = CELLS[name]().double()
    n = 2 if isinstance(cell, LSTMCell) else 1
    x, states0, mask, reset = _case(kind, n)
    rec, keep = _masks(which, n)
    kernel = RegularizedKernel(cell.kernel, rec, keep)
    g = torch.Generator().manual_seed(5)
    d_out = torch.randn(T, B, H, dtype=torch.float64, generator=g)
    d_finals = tuple(torch.randn(B, H, dtype=torch.float64, generator=g) for _ in range(n))
    want = _oracle(kernel, cell.weights(), x, states0, mask, reset, d_out, d_finals)
    got = _steps(kernel, cell.weights(), x, states0, mask, reset, d_out, d_finals)
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    return got, want


@pytest.mark.parametrize("kind", ["holes", "resets"])
@pytest.mark.parametrize("which", ["dropout", "zoneout", "both"])
@pytest.mark.parametrize("name", list(CELLS))
def test_regularized_steps_equal_the_explicit_bptt_in_float64(name, which, kind):
    _compare(name, which, kind)


@pytest.mark.parametrize("which", ["zoneout_eval", "zoneout_h", "zoneout_c"])
def test_lstm_zoneout_of_one_state_and_at_evaluation(which):
    _compare("lstm", which, "resets")


@pytest.mark.parametrize("name", ["gru_keep_after", "rnn_tanh"])
def test_zoneout_at_evaluation_on_the_other_cells(name):
    _compare(name, "zoneout_eval", "holes")


@pytest.mark.parametrize("name", ["lstm", "gru_candidate_before", "rnn_relu"])
def test_float32_agrees_with_float64_and_inference_keeps_nothing(name):
    torch.manual_seed(1)
    cell = CELLS[name]().double()
    n = 2 if isinstance(cell, LSTMCell) else 1
    x, states0, mask, reset = _case("resets", n)
    rec, keep = _masks("both", n)
    d_out = torch.ones(T, B, H, dtype=torch.float64)
    d_finals = tuple(torch.ones(B, H, dtype=torch.float64) for _ in range(n))
    kernel = RegularizedKernel(cell.kernel, rec, keep)
    want = _oracle(kernel, cell.weights(), x, states0, mask, reset, d_out, d_finals)
    with torch.no_grad():  # nothing saved: one step's scratch
        out, _ = gpu_steps.run_steps(kernel, x, cell.weights(), states0, mask, reset)
    assert not out.requires_grad
    torch.testing.assert_close(out, want[0], rtol=0, atol=1e-12)
    cell = cell.float()
    got = _steps(  # the masks stay float64: the steps take them in the weights' dtype
        kernel,
        cell.weights(),
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


def test_the_masks_change_the_function():
    """The comparisons above would not see masks ignored by both sides: the regularized
    steps differ from the plain ones."""
    cell = CELLS["gru_keep_before"]().double()
    x, states0, mask, _ = _case("holes", 1)
    rec, keep = _masks("both", 1)
    with torch.no_grad():
        plain, _ = gpu_steps.run_steps(cell.kernel, x, cell.weights(), states0, mask)
        for kernel in (regularized(cell.kernel, rec, None), regularized(cell.kernel, None, keep)):
            out, _ = gpu_steps.run_steps(kernel, x, cell.weights(), states0, mask)
            assert float((out - plain)[:, 0].abs().max()) > 1e-3


@pytest.fixture
def steps_calls(count_calls):
    """How many layers the Triton steps ran."""
    count = count_calls(recurrence, "run_steps")
    return count


def _layer_results(layer, x, mask, masks, path, resets=None):
    x = x.clone().requires_grad_(True)
    with use_fused(path), use_native(False):
        out = layer(x, mask=mask, masks=masks, resets=resets)
    finals = tuple(out.state) if isinstance(out.state, LSTMState) else (out.state,)
    loss = out.outputs.sin().sum() + sum((f * f).sum() for f in finals)
    grads = torch.autograd.grad(loss, [x, *layer.parameters()])
    return [out.outputs, *finals, *grads]


@pytest.mark.parametrize(
    ("cls", "options"),
    [
        (rnnkit.LSTM, {"bidirectional": True}),
        (rnnkit.GRU, {"reset": "before"}),
        (rnnkit.RNN, {"nonlinearity": "sigmoid"}),
    ],
)
@pytest.mark.parametrize("training", [True, False])
def test_public_layer_with_fixed_masks_equals_the_loop(cls, options, training, steps_calls):
    torch.manual_seed(2)
    layer = cls(I, H, num_layers=2, recurrent_dropout=0.4, zoneout=0.3, **options).double()
    layer.train(training)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, 3:] = False
    mask[2, [0, 3]] = False  # holes
    x = torch.randn(B, T, I, dtype=torch.float64)
    masks = layer.draw_masks(B, T, x)
    assert masks is not None
    cells = masks.cells
    assert all(c.keep is not None for c in cells)
    assert all((c.recurrent is not None) == training for c in cells)
    got = _layer_results(layer, x, mask, masks, "triton")
    D = 2 if options.get("bidirectional") else 1
    assert steps_calls["n"] == 2 * D  # every layer and direction on the Triton steps
    want = _layer_results(layer, x, mask, masks, "loop")
    assert steps_calls["n"] == 2 * D
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


@pytest.mark.parametrize(("cls", "options"), [(rnnkit.LSTM, {}), (rnnkit.GRU, {"reset": "before"})])
def test_stack_resets_with_regularizers_in_one_triton_call_per_layer(cls, options, steps_calls):
    """Resets, holes and every regularizer at once: one call per layer on the Triton
    steps; the loop runs the pieces between the resets."""
    torch.manual_seed(4)
    layer = cls(
        I, H, num_layers=2, recurrent_dropout=0.4, zoneout=0.3, weight_drop=0.2,
        locked_dropout=0.2, **options,
    ).double()  # fmt: skip
    x = torch.randn(B, T, I, dtype=torch.float64)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, 3:] = False
    mask[2, 1] = False
    resets = torch.zeros(B, T, dtype=torch.bool)
    resets[0, 2] = resets[2, 4] = resets[2, 1] = True  # (2, 1) is a held step
    masks = layer.draw_masks(B, T, x)
    got = _layer_results(layer, x, mask, masks, "triton", resets)
    assert steps_calls["n"] == layer.num_layers
    want = _layer_results(layer, x, mask, masks, "loop", resets)
    assert steps_calls["n"] == layer.num_layers
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


@pytest.fixture
def steps_regs(monkeypatch):
    """The regularizers' tensors (``_Reg``) each call of ``_Steps`` received."""
    seen = []
    real = gpu_steps._Steps

    class Spy:
        @staticmethod
        def apply(kernel, mask, reset, reg, *rest):
            seen.append(reg)
            return real.apply(kernel, mask, reset, reg, *rest)

    monkeypatch.setattr(gpu_steps, "_Steps", Spy)
    return seen


def _stored(t):
    """How many values a tensor's storage holds."""
    return t.untyped_storage().nbytes() // t.element_size()


def _kept(reg):
    """The keep factors a call of the steps received."""
    return [k for k in (reg.kh, reg.kc) if k is not None]


def _keep_forms(n):
    """Zoneout keep factors that broadcast to ``(T, B, H)``, and how many values the steps
    should store of them: the constant of evaluation, one per row, one per step and unit,
    and (LSTM) a constant h factor beside a full c factor (stored on the c's axes)."""
    g = torch.Generator().manual_seed(7)
    const = torch.full((1, 1, 1), 0.3, dtype=torch.float64).expand(T, B, H)
    row = torch.rand(1, B, 1, generator=g, dtype=torch.float64).expand(T, B, H)
    step = torch.rand(T, 1, H, generator=g, dtype=torch.float64).expand(T, B, H)
    full = torch.rand(T, B, H, generator=g, dtype=torch.float64)
    forms = {
        "constant": ((const,) * n, H),
        "row": ((row,) * n, B * H),
        "step": ((step,) * n, T * H),
    }
    if n == 2:
        forms["mixed"] = ((const, full), T * B * H)
    return forms


@pytest.mark.parametrize(
    ("name", "form"),
    [
        *((name, form) for name in ("gru_keep_after", "gru_candidate_before", "rnn_tanh")
          for form in ("constant", "row", "step")),
        *(("lstm", form) for form in ("constant", "row", "step", "mixed")),
    ],
)  # fmt: skip
def test_broadcast_keep_factors_are_read_in_place(name, form, steps_regs):
    """A keep factor constant along an axis reaches the kernels as a strided view that
    stores only the axes it varies on (the constant p of evaluation: H values, not a
    (T, B, H) tensor), with the results of the same values written out in full."""
    torch.manual_seed(1)
    cell = CELLS[name]().double()
    n = 2 if isinstance(cell, LSTMCell) else 1
    keep, stored = _keep_forms(n)[form]
    x, states0, mask, reset = _case("resets", n)
    g = torch.Generator().manual_seed(5)
    d_out = torch.randn(T, B, H, dtype=torch.float64, generator=g)
    d_finals = tuple(torch.randn(B, H, dtype=torch.float64, generator=g) for _ in range(n))
    w = cell.weights()
    strided = RegularizedKernel(cell.kernel, None, keep)
    got = _steps(strided, w, x, states0, mask, reset, d_out, d_finals)
    kept = _kept(steps_regs[0])
    assert [tuple(k.shape) for k in kept] == [(T, B, H)] * n
    assert max(_stored(k) for k in kept) == stored
    explicit = RegularizedKernel(cell.kernel, None, tuple(k.contiguous() for k in keep))
    want = _steps(explicit, w, x, states0, mask, reset, d_out, d_finals)
    assert [_stored(k) for k in _kept(steps_regs[1])] == [T * B * H] * n
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


@pytest.mark.parametrize("cls", [rnnkit.LSTM, rnnkit.GRU, rnnkit.RNN])
def test_zoneout_at_evaluation_writes_no_keep_tensor(cls, steps_regs):
    """The public layer in eval mode with zoneout: the steps receive the constant p as H
    stored values per state, and give the outputs of training's path fed the same
    constant as an explicit (T, B, H) keep tensor."""
    torch.manual_seed(3)
    layer = cls(I, H, zoneout=0.3).double().eval()
    x = torch.randn(B, T, I, dtype=torch.float64)
    with use_fused("triton"), use_native(False), torch.no_grad():
        out = layer(x)
    kept = _kept(steps_regs[0])
    assert len(kept) == (2 if cls is rnnkit.LSTM else 1)
    assert all(_stored(k) == H and k.shape == (T, B, H) for k in kept)
    masks = layer.draw_masks(B, T, x)
    assert masks is not None
    full = [torch.full((T, B, H), 0.3, dtype=torch.float64) for _ in kept]
    explicit = masks._replace(cells=tuple(c._replace(keep=tuple(full)) for c in masks.cells))
    with use_fused("triton"), use_native(False), torch.no_grad():
        want = layer.train()(x, masks=explicit)
    assert [_stored(k) for k in _kept(steps_regs[1])] == [T * B * H] * len(kept)
    torch.testing.assert_close(out.outputs, want.outputs, rtol=0, atol=1e-12)


@pytest.mark.parametrize("cls", [rnnkit.LSTM, rnnkit.RNN])
def test_zoneout_keeps_the_cells_own_states_only_for_a_backward(cls, monkeypatch):
    """``cn`` (the LSTM's c̃, the simple cell's h̃) is what the backward reads: without a
    gradient no (T, B, H) buffer is written, and the outputs are the PyTorch loop's."""
    launched = []
    real = gpu_steps.launch

    def spy(x, B, H_, mask, reset, reg):
        launched.append(reg.cn)
        return real(x, B, H_, mask, reset, reg)

    monkeypatch.setattr(gpu_steps, "launch", spy)
    torch.manual_seed(4)
    layer = cls(I, H, zoneout=0.3).double()
    x = torch.randn(B, T, I, dtype=torch.float64)
    for mode in (layer.eval, layer.train):
        mode()
        torch.manual_seed(5)
        with use_fused("loop"), use_native(False), torch.no_grad():
            want = layer(x).outputs
        launched.clear()
        torch.manual_seed(5)
        with use_fused("triton"), use_native(False), torch.no_grad():
            got = layer(x).outputs
        assert launched == [None]
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    with use_fused("triton"), use_native(False):
        layer(x.requires_grad_(True)).outputs.sum().backward()
    assert [tuple(c.shape) for c in launched[1:]] == [(T, B, H)] * 2  # forward, backward
