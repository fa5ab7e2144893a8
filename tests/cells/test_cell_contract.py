"""The contract every cell keeps (CONTRIBUTING.md, "Tests"), run on every variant.

* one step equals ``torch.nn``'s cell with copied weights, values and all gradients,
  both through ``from_torch`` and ``to_torch`` (the forms torch has);
* the whole sequence equals step by step (``cell.forward`` in a Python loop);
* initialisation: uniform bounds, orthogonal recurrent blocks, ``forget_bias``;
* argument checks with messages naming the argument, the expected and the received shape.
"""

from __future__ import annotations

import math

import pytest
import torch

from rnnkit import GRUCell, LSTMCell, LSTMState, RNNCell, from_torch, to_torch
from rnnkit.bptt.recurrence import run_recurrence

pytestmark = pytest.mark.usefixtures("single_thread", "time_loop")

DT = torch.float64
TOL = {"atol": 1e-10, "rtol": 0.0}


def torch_step(spec, tcell, x, states):
    if spec.is_lstm:
        return tuple(tcell(x, states))
    return (tcell(x, states[0]),)


@pytest.mark.parametrize("direction", ["from_torch", "to_torch"])
def test_cell_step_equals_torch(torch_spec, gen, direction):
    I, H, B = 3, 4, 5
    if direction == "from_torch":
        tcell = torch_spec.torch_cell(I, H)
        cell = from_torch(tcell)
        assert type(cell) is {"rnn": RNNCell, "lstm": LSTMCell, "gru": GRUCell}[torch_spec.kind]
    else:
        cell = torch_spec.cell(I, H)
        tcell = to_torch(cell)
        assert isinstance(tcell, torch.nn.RNNCellBase)
    if torch_spec.kind == "gru":
        assert (cell.update, cell.reset) == ("keep", "after")
    if torch_spec.kind == "rnn":
        assert cell.nonlinearity == tcell.nonlinearity == torch_spec.options["nonlinearity"]
    x = torch.randn(B, I, generator=gen, dtype=DT)
    s0 = [torch.randn(B, H, generator=gen, dtype=DT) for _ in range(torch_spec.num_states)]
    xs = [x.clone().requires_grad_() for _ in range(2)]
    s0s = [[s.clone().requires_grad_() for s in s0] for _ in range(2)]
    ours = torch_spec.unpack(cell(xs[0], torch_spec.pack(tuple(s0s[0]))))
    theirs = torch_step(torch_spec, tcell, xs[1], s0s[1])
    g = [torch.randn(B, H, generator=gen, dtype=DT) for _ in ours]
    sum((a * w).sum() for a, w in zip(ours, g, strict=True)).backward()
    sum((a * w).sum() for a, w in zip(theirs, g, strict=True)).backward()
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, **TOL)
    torch.testing.assert_close(xs[0].grad, xs[1].grad, **TOL)
    for a, b in zip(s0s[0], s0s[1], strict=True):
        torch.testing.assert_close(a.grad, b.grad, **TOL)
    for name, a, b in torch_spec.grad_pairs(cell, tcell):
        torch.testing.assert_close(a, b, **TOL, msg=lambda m, n=name: f"{n}: {m}")


def test_cell_float32_equals_torch(torch_spec, gen):
    tcell = torch_spec.torch_cell(3, 4, dtype=torch.float32)
    cell = from_torch(tcell)
    assert cell.weight_ih.dtype == torch.float32
    x = torch.randn(6, 3, generator=gen)
    s = [torch.randn(6, 4, generator=gen) for _ in range(torch_spec.num_states)]
    for _ in range(3):  # a few steps
        ours = torch_spec.unpack(cell(x, torch_spec.pack(tuple(s))))
        theirs = torch_step(torch_spec, tcell, x, s)
        for a, b in zip(ours, theirs, strict=True):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
        s = list(theirs)


def test_zero_state_default(cell_spec, gen):
    cell = cell_spec.cell(3, 4)
    x = torch.randn(2, 3, generator=gen, dtype=DT)
    zeros = tuple(torch.zeros(2, 4, dtype=DT) for _ in range(cell_spec.num_states))
    a = cell_spec.unpack(cell(x))
    b = cell_spec.unpack(cell(x, cell_spec.pack(zeros)))
    for u, v in zip(a, b, strict=True):
        assert torch.equal(u, v)


# ------------------------------------------------------- whole sequence = step by step


def test_whole_sequence_equals_step_by_step(cell_spec, gen):
    T, B, I, H = 7, 3, 3, 4
    cell = cell_spec.cell(I, H)
    x = torch.randn(T, B, I, generator=gen, dtype=DT)
    s0 = tuple(torch.randn(B, H, generator=gen, dtype=DT) for _ in range(cell_spec.num_states))
    with torch.no_grad():
        out, finals = run_recurrence(cell.kernel, x, cell.weights(), s0)
        state = cell_spec.pack(s0)
        steps = []
        for t in range(T):
            state = cell(x[t], state)
            steps.append(cell_spec.unpack(state)[0])
    torch.testing.assert_close(out, torch.stack(steps), **TOL)
    for a, b in zip(finals, cell_spec.unpack(state), strict=True):
        torch.testing.assert_close(a, b, **TOL)

    # the same through the batch-first layer holding this cell
    layer = cell_spec.layer(I, H)
    layer.cells()[0].load_state_dict(cell.state_dict())
    init = cell_spec.pack(tuple(s[None, None] for s in s0))
    with torch.no_grad():
        res = layer(x.transpose(0, 1), state=init)
    torch.testing.assert_close(res.outputs, torch.stack(steps, dim=1), **TOL)
    for a, b in zip(cell_spec.unpack(res.state), cell_spec.unpack(state), strict=True):
        torch.testing.assert_close(a[0, 0], b, **TOL)


def test_split_sequence_carries_state(cell_spec, gen):
    """Two halves run one after the other, the state carried, equal one unbroken run."""
    layer = cell_spec.layer(3, 4, num_layers=2)
    x = torch.randn(2, 7, 3, generator=gen, dtype=DT)
    with torch.no_grad():
        whole = layer(x)
        first = layer(x[:, :3])
        second = layer(x[:, 3:], state=first.state)
    torch.testing.assert_close(torch.cat([first.outputs, second.outputs], 1), whole.outputs, **TOL)
    for a, b in zip(cell_spec.unpack(second.state), cell_spec.unpack(whole.state), strict=True):
        torch.testing.assert_close(a, b, **TOL)


# --------------------------------------------------------------------- initialisation


def test_uniform_init_bounds_and_shapes(cell_spec):
    I, H = 3, 16
    cell = cell_spec.cell(I, H, dtype=torch.float32)
    G = {"rnn": 1, "lstm": 4, "gru": 3}[cell_spec.kind]
    assert cell.weight_ih.shape == (G * H, I)
    assert cell.weight_hh.shape == (G * H, H)
    assert cell.bias.shape == (G * H,)
    if cell_spec.options.get("reset") == "after":
        assert cell.bias_hn.shape == (H,)
    else:
        assert getattr(cell, "bias_hn", None) is None
    bound = 1 / math.sqrt(H)
    for name, p in cell.named_parameters():
        p = p.detach()
        assert float(p.abs().max()) <= bound, name
        assert float(p.std()) > bound / 4, f"{name} looks constant"


def test_orthogonal_init_gives_orthogonal_recurrent_blocks(cell_spec):
    H = 5
    cell = cell_spec.cell(3, H, init="orthogonal")
    G = cell.weight_hh.shape[0] // H
    eye = torch.eye(H, dtype=DT)
    blocks = []
    for k in range(G):
        W = cell.weight_hh[k * H : (k + 1) * H].detach()
        torch.testing.assert_close(W @ W.T, eye, atol=1e-6, rtol=0)
        torch.testing.assert_close(
            torch.linalg.matrix_norm(W, ord=2), torch.tensor(1.0, dtype=DT), atol=1e-6, rtol=0
        )
        blocks.append(W)
    for a in range(G):  # each block its own draw
        for b in range(a + 1, G):
            assert not torch.allclose(blocks[a], blocks[b])
    # the uniform default is not orthogonal
    plain = cell_spec.cell(3, H)
    W = plain.weight_hh[:H].detach()
    assert not torch.allclose(W @ W.T, eye, atol=1e-2)


def test_orthogonal_init_through_the_layer(cell_spec):
    layer = cell_spec.layer(3, 4, num_layers=2, bidirectional=True, init="orthogonal")
    for cell in layer.cells():
        W = cell.weight_hh[:4].detach()
        torch.testing.assert_close(W @ W.T, torch.eye(4, dtype=DT), atol=1e-6, rtol=0)


def test_forget_bias_adds_to_the_f_block():
    H = 6
    torch.manual_seed(11)
    base = LSTMCell(3, H)
    torch.manual_seed(11)
    shifted = LSTMCell(3, H, forget_bias=1.0)
    delta = (shifted.bias - base.bias).detach()
    expect = torch.zeros(4 * H)
    expect[H : 2 * H] = 1.0  # gate order i, f, g, o
    torch.testing.assert_close(delta, expect, atol=1e-6, rtol=0)
    assert torch.equal(shifted.weight_ih, base.weight_ih)
    assert torch.equal(shifted.weight_hh, base.weight_hh)
    assert len(list(shifted.parameters())) == 3  # still ONE trainable bias vector
    # it is a real change of the function: the f gate opens
    f_base = torch.sigmoid(base.bias[H : 2 * H])
    f_shift = torch.sigmoid(shifted.bias[H : 2 * H])
    assert bool((f_shift > f_base).all())


def test_forget_bias_through_the_layer():
    from rnnkit import LSTM

    layer = LSTM(3, 4, num_layers=2, forget_bias=2.0)
    for cell in layer.cells():
        b = cell.bias.detach()
        assert float(b[4:8].min()) > 2.0 - 0.5 - 1e-6
        assert float(b[:4].abs().max()) <= 0.5


# --------------------------------------------------------------------- argument checks


@pytest.mark.parametrize(
    ("cls", "kwargs", "word"),
    [
        (RNNCell, {"nonlinearity": "softsign"}, "nonlinearity"),
        (GRUCell, {"update": "old"}, "update"),
        (GRUCell, {"reset": "middle"}, "reset"),
        (LSTMCell, {"init": "zeros"}, "init"),
        (RNNCell, {"hidden_size": 0}, "hidden_size"),
        (RNNCell, {"input_size": 2.5}, "input_size"),
    ],
)
def test_bad_cell_options(cls, kwargs, word):
    args = {"input_size": 3, "hidden_size": 4, **kwargs}
    with pytest.raises(ValueError, match=word):
        cls(**args)


def test_cell_input_errors(cell_spec):
    cell = cell_spec.cell(3, 4)
    good = cell_spec.pack(tuple(torch.zeros(2, 4, dtype=DT) for _ in range(cell_spec.num_states)))
    with pytest.raises(ValueError, match=r"x must have shape \(B, 3\).*got \(2, 3, 1\)"):
        cell(torch.zeros(2, 3, 1, dtype=DT), good)
    with pytest.raises(ValueError, match=r"x must have shape \(B, 3\).*got \(2, 5\)"):
        cell(torch.zeros(2, 5, dtype=DT), good)
    with pytest.raises(TypeError, match=r"float32.*float64"):
        cell(torch.zeros(2, 3, dtype=torch.float32), good)
    with pytest.raises(TypeError, match=r"x must be a torch\.Tensor"):
        cell([[0.0, 0.0, 0.0]], good)
    bad = cell_spec.pack(tuple(torch.zeros(2, 5, dtype=DT) for _ in range(cell_spec.num_states)))
    with pytest.raises(ValueError, match=r"state.*\(B, H\) = \(2, 4\), got \(2, 5\)"):
        cell(torch.zeros(2, 3, dtype=DT), bad)
    bad = cell_spec.pack(tuple(torch.zeros(3, 4, dtype=DT) for _ in range(cell_spec.num_states)))
    with pytest.raises(ValueError, match=r"state.*\(2, 4\), got \(3, 4\)"):
        cell(torch.zeros(2, 3, dtype=DT), bad)


def test_lstm_cell_state_in_lstm_state_with_matching_c():
    cell = LSTMCell(3, 4).double()
    x = torch.zeros(2, 3, dtype=DT)
    with pytest.raises(ValueError, match=r"state\.c.*\(2, 4\), got \(2, 5\)"):
        cell(x, LSTMState(torch.zeros(2, 4, dtype=DT), torch.zeros(2, 5, dtype=DT)))


@pytest.mark.parametrize("as_tuple", [False, True], ids=["tensor", "tuple"])
def test_lstm_cell_rejects_non_lstm_state(as_tuple):
    cell = LSTMCell(3, 4).double()
    x = torch.zeros(2, 3, dtype=DT)
    h = torch.zeros(2, 4, dtype=DT)
    state = (h, h.clone()) if as_tuple else h
    with pytest.raises(TypeError, match="LSTMState"):
        cell(x, state)


def test_lstm_cell_fused_step_equals_the_oracle_step_and_its_gradients():
    """``LSTMCell.forward`` runs torch's fused ``lstm_cell``: the same values and
    gradients (float64) as ``lstm_step``, the plain-op oracle."""
    from rnnkit.cells.lstm import lstm_step

    torch.manual_seed(0)
    cell = LSTMCell(3, 4, forget_bias=1.0).double()
    x = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    c0 = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    inputs = [x, h0, c0, *cell.parameters()]
    fused = cell(x, LSTMState(h0, c0))
    oracle = lstm_step(x, LSTMState(h0, c0), cell.weights())
    torch.testing.assert_close(fused.h, oracle.h, rtol=0, atol=1e-14)
    torch.testing.assert_close(fused.c, oracle.c, rtol=0, atol=1e-14)
    w = torch.randn(2, 5, 4, dtype=torch.float64)
    g_fused = torch.autograd.grad((fused.h * w[0]).sum() + (fused.c * w[1]).sum(), inputs)
    g_oracle = torch.autograd.grad((oracle.h * w[0]).sum() + (oracle.c * w[1]).sum(), inputs)
    for a, b in zip(g_fused, g_oracle, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-13)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), "a", True])
def test_a_forget_bias_that_is_not_a_finite_number_is_named(bad):
    # NaN made every output NaN; "a" failed in float() without naming the argument.
    with pytest.raises(ValueError, match=f"^forget_bias must be a finite number, got {bad!r}$"):
        LSTMCell(3, 4, forget_bias=bad)
    from rnnkit import LSTM

    with pytest.raises(ValueError, match=r"^forget_bias must be a finite number"):
        LSTM(3, 4, forget_bias=bad)
