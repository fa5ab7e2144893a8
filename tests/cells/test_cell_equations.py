"""The textbook equations of docs/math.md, "Cells", transcribed independently into numpy, per column
vector, with the parameter blocks cut out of the documented layout (README: LSTM gate order
i, f, g, o; GRU r, z, n; one bias per gate; ``bias_hn`` inside ``r ⊙ (W_hn h + b_hn)``).

Plus one golden-value test per cell variant: fixed weights, fixed input, and the expected
numbers printed ONCE by the numpy reference below (not by rnnkit) and pasted in.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rnnkit import GRUCell, LSTMCell, LSTMState, RNNCell
from rnnkit.layers.cell_stacks import GRU, LSTM, RNN

pytestmark = pytest.mark.usefixtures("single_thread")

# ------------------------------------------------------------------ numpy reference (docs/math.md)


def sigma(a):
    return 1.0 / (1.0 + np.exp(-a))


def ref_rnn(x, h, P, nonlinearity):
    """Simple cell: a = W_x x + W_h h + b; h' = φ(a)."""
    a = P["weight_ih"] @ x + P["weight_hh"] @ h + P["bias"]
    if nonlinearity == "sigmoid":  # the logistic σ(a) = 1 / (1 + e^{−a})
        return 1.0 / (1.0 + np.exp(-a))
    return np.tanh(a) if nonlinearity == "tanh" else np.maximum(a, 0.0)


def ref_lstm(x, h, c, P):
    """LSTM with u = [x; h] and W_gate = [W_gate,x  W_gate,h] (d_h × (d + d_h))."""
    d_h = h.shape[0]
    W = np.concatenate([P["weight_ih"], P["weight_hh"]], axis=1)  # (4 d_h, d + d_h)
    blocks = {name: slice(k * d_h, (k + 1) * d_h) for k, name in enumerate("ifco")}
    u = np.concatenate([x, h])
    f = sigma(W[blocks["f"]] @ u + P["bias"][blocks["f"]])
    i = sigma(W[blocks["i"]] @ u + P["bias"][blocks["i"]])
    o = sigma(W[blocks["o"]] @ u + P["bias"][blocks["o"]])
    g = np.tanh(W[blocks["c"]] @ u + P["bias"][blocks["c"]])
    c_new = f * c + i * g
    return o * np.tanh(c_new), c_new


def ref_gru(x, h, P, update, reset):
    """GRU with its two switches, exactly as written in docs/math.md."""
    d_h, d = h.shape[0], x.shape[0]
    W = np.concatenate([P["weight_ih"], P["weight_hh"]], axis=1)  # (3 d_h, d + d_h)
    W_r, W_z, W_h = W[:d_h], W[d_h : 2 * d_h], W[2 * d_h :]
    b_r, b_z, b_h = P["bias"][:d_h], P["bias"][d_h : 2 * d_h], P["bias"][2 * d_h :]
    u = np.concatenate([x, h])
    z = sigma(W_z @ u + b_z)
    r = sigma(W_r @ u + b_r)
    if reset == "before":
        h_tilde = np.tanh(W_h @ np.concatenate([x, r * h]) + b_h)
    else:
        W_hx, W_hh = W_h[:, :d], W_h[:, d:]
        b_hx, b_hh = b_h, P["bias_hn"]
        h_tilde = np.tanh(W_hx @ x + b_hx + r * (W_hh @ h + b_hh))
    if update == "candidate":
        return (1 - z) * h + z * h_tilde
    return z * h + (1 - z) * h_tilde


def ref_sequence(kind, options, P, xs, h0, c0=None):
    """Run the reference over ``xs (T, d)`` for ONE sequence; returns the h's ``(T, d_h)``
    and the final (h, c)."""
    h, c = h0, c0
    hs = []
    for x in xs:
        if kind == "rnn":
            h = ref_rnn(x, h, P, options["nonlinearity"])
        elif kind == "lstm":
            h, c = ref_lstm(x, h, c, P)
        else:
            h = ref_gru(x, h, P, options["update"], options["reset"])
        hs.append(h)
    return np.stack(hs), h, c


# ------------------------------------------------------------------ fixed weights


def fixed_values(n: int, k: int) -> torch.Tensor:
    """Deterministic values in [−0.5, 0.5): a strided walk through a linspace."""
    grid = torch.linspace(-0.5, 0.5, 23, dtype=torch.float64)[:-1]  # 22 points
    return grid[(torch.arange(n) * 7 + 5 * k) % 22]


def set_fixed_weights(cell) -> None:
    with torch.no_grad():
        for k, (_, p) in enumerate(sorted(cell.named_parameters())):
            p.copy_(fixed_values(p.numel(), k).view_as(p))


def numpy_params(cell) -> dict[str, np.ndarray]:
    return {n: p.detach().double().numpy().copy() for n, p in cell.named_parameters()}


VARIANTS = {
    "rnn_tanh": ("rnn", {"nonlinearity": "tanh"}),
    "rnn_relu": ("rnn", {"nonlinearity": "relu"}),
    "rnn_sigmoid": ("rnn", {"nonlinearity": "sigmoid"}),
    "lstm": ("lstm", {}),
    "gru_candidate_before": ("gru", {"update": "candidate", "reset": "before"}),
    "gru_candidate_after": ("gru", {"update": "candidate", "reset": "after"}),
    "gru_keep_before": ("gru", {"update": "keep", "reset": "before"}),
    "gru_keep_after": ("gru", {"update": "keep", "reset": "after"}),
}


def build(name, I, H, layer=False):
    kind, options = VARIANTS[name]
    if layer:
        cls = {"rnn": RNN, "lstm": LSTM, "gru": GRU}[kind]
        return cls(I, H, **options).double()
    cls = {"rnn": RNNCell, "lstm": LSTMCell, "gru": GRUCell}[kind]
    return cls(I, H, **options).double()


def golden_input():
    """x ``(T=3, I=3)`` and h0, c0 ``(H=2,)`` for the golden tests."""
    xs = np.array([[0.5, -1.0, 0.25], [-1.5, 0.0, -0.75], [-0.5, 2.0, -1.0]])
    return xs, np.array([0.1, -0.2]), np.array([0.3, -0.4])


# ------------------------------------------------------------------ the tests


@pytest.mark.parametrize("name", list(VARIANTS))
def test_cell_step_matches_textbook_equations(name):
    kind, options = VARIANTS[name]
    I, H, B, T = 3, 4, 3, 5
    torch.manual_seed(3)
    cell = build(name, I, H)
    P = numpy_params(cell)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(T, B, I, generator=gen, dtype=torch.float64)
    h0 = torch.randn(B, H, generator=gen, dtype=torch.float64)
    c0 = torch.randn(B, H, generator=gen, dtype=torch.float64)
    state = LSTMState(h0, c0) if kind == "lstm" else h0
    got = []
    for t in range(T):
        state = cell(x[t], state)
        got.append((state.h if kind == "lstm" else state).detach().numpy())
    got = np.stack(got, axis=1)  # (B, T, H)
    for b in range(B):
        hs, _, _ = ref_sequence(kind, options, P, x[:, b].numpy(), h0[b].numpy(), c0[b].numpy())
        np.testing.assert_allclose(got[b], hs, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_layer_matches_textbook_equations(name):
    """The whole-sequence layer (explicit time loop) against the reference, with lengths."""
    kind, options = VARIANTS[name]
    I, H, B, T = 3, 4, 3, 5
    torch.manual_seed(4)
    layer = build(name, I, H, layer=True)
    P = numpy_params(layer.cells()[0])
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(B, T, I, generator=gen, dtype=torch.float64)
    lengths = torch.tensor([5, 2, 4])
    out = layer(x, lengths=lengths)
    h_final = out.state.h if kind == "lstm" else out.state
    zeros = np.zeros(H)
    for b in range(B):
        n = int(lengths[b])
        hs, h, c = ref_sequence(kind, options, P, x[b, :n].numpy(), zeros, zeros)
        np.testing.assert_allclose(out.outputs[b, :n].detach().numpy(), hs, rtol=0, atol=1e-12)
        np.testing.assert_allclose(h_final[0, 0, b].detach().numpy(), h, rtol=0, atol=1e-12)
        if kind == "lstm":
            np.testing.assert_allclose(out.state.c[0, 0, b].detach().numpy(), c, atol=1e-12)


def test_gru_switches_really_differ():
    """The four GRU forms are four different functions on the same weights."""
    xs, h0, _ = golden_input()
    results = {}
    for name in ("gru_candidate_before", "gru_candidate_after", "gru_keep_before"):
        cell = build(name, 3, 2)
        set_fixed_weights(cell)
        results[name] = cell(torch.from_numpy(xs[:1]), torch.from_numpy(h0[None]))
    vals = list(results.values())
    assert not torch.allclose(vals[0], vals[1])
    assert not torch.allclose(vals[0], vals[2])
    assert not torch.allclose(vals[1], vals[2])


# Printed once by ``ref_sequence`` (numpy, the formulas above) on the fixed weights
# of ``set_fixed_weights`` and the input of ``golden_input``: h_1, h_2, h_3 (each H = 2),
# then the final c for the LSTM.
GOLDEN = {
    "rnn_tanh": [
        -0.732495516950279,
        -0.436729088065867,
        0.0548650317403974,
        0.16648745754067,
        0.438100047770882,
        0.628966842765059,
    ],
    "rnn_relu": [0, 0, 0, 0.295454545454545, 0.490702479338843, 0.678719008264463],
    # h_1 by hand: a = (−0.934091, −0.468182), σ(a) = (0.282095, 0.385047)
    "rnn_sigmoid": [
        0.282095495274008,
        0.385046673041744,
        0.454022003297609,
        0.568447521126525,
        0.593701140961868,
        0.680692596331253,
    ],
    "lstm": [
        0.0382133677222701,
        -0.109751164012209,
        -0.0129050823250891,
        -0.0184633172584416,
        -0.119579543115721,
        -0.0209032838467925,
        -0.215191966454369,
        -0.0536609884647857,
    ],
    "gru_candidate_before": [
        -0.0625442182265531,
        -0.0960378694618308,
        -0.138487212122114,
        0.0906036809752851,
        -0.312620688179551,
        0.0218240113322085,
    ],
    "gru_candidate_after": [
        -0.241859619318207,
        -0.253307095681256,
        -0.0992241134250173,
        0.166645187684367,
        0.436273775120009,
        0.699643473835347,
    ],
    "gru_keep_before": [
        -0.119910974741661,
        -0.12402606357036,
        -0.139417893110035,
        0.0083585926366887,
        -0.193519511151081,
        -0.00938422827700408,
    ],
    "gru_keep_after": [
        -0.310025094853558,
        -0.254161945020411,
        -0.164803810613712,
        -0.0290652901587443,
        0.0245150703561977,
        0.12129243512453,
    ],
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_golden_values(name):
    kind, options = VARIANTS[name]
    xs, h0, c0 = golden_input()
    cell = build(name, 3, 2)
    set_fixed_weights(cell)
    expected = torch.tensor(GOLDEN[name], dtype=torch.float64)
    # one step at a time through the cell
    h0_t, c0_t = torch.from_numpy(h0[None]), torch.from_numpy(c0[None])
    state = LSTMState(h0_t, c0_t) if kind == "lstm" else h0_t
    hs = []
    for x in xs:
        state = cell(torch.from_numpy(x[None]), state)
        hs.append(state.h[0] if kind == "lstm" else state[0])
    if kind == "lstm":
        hs.append(state.c[0])
    torch.testing.assert_close(torch.cat(hs).detach(), expected, rtol=0, atol=1e-12)
    # the whole-sequence layer (explicit time loop) gives the same numbers
    layer = build(name, 3, 2, layer=True)
    layer.cells()[0].load_state_dict(cell.state_dict())
    init = h0_t[None, None]
    init = LSTMState(init, c0_t[None, None]) if kind == "lstm" else init
    out = layer(torch.from_numpy(xs[None]), state=init)
    got = out.outputs[0].reshape(-1)
    if kind == "lstm":
        got = torch.cat([got, out.state.c.reshape(-1)])
    torch.testing.assert_close(got.detach(), expected, rtol=0, atol=1e-12)
    # and the reference itself still prints them (guards the pasted numbers)
    ref, _, c = ref_sequence(kind, options, numpy_params(cell), xs, h0, c0)
    ref = ref.reshape(-1)
    if kind == "lstm":
        ref = np.concatenate([ref, c])
    np.testing.assert_allclose(ref, expected.numpy(), rtol=0, atol=1e-12)
