"""``rnnkit.layers.interop``: GRU update-convention conversion, parameter counts
(docs/math.md, "Parameter counts"), and the clear errors of ``from_torch`` / ``to_torch``.

(Equality with ``torch.nn`` through ``from_torch``/``to_torch`` is the cell and layer
contract: ``tests/cells/test_cell_contract.py``, ``tests/layers/test_torch_parity.py``.)
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from rnnkit import (
    GRU,
    LSTM,
    RNN,
    GRUCell,
    LSTMCell,
    RNNCell,
    StackedRecurrent,
    convert_gru_update,
    count_parameters,
    from_torch,
    to_torch,
)

pytestmark = pytest.mark.usefixtures("single_thread", "time_loop")

DT = torch.float64
TOL = {"atol": 1e-12, "rtol": 0.0}
OTHER = {"candidate": "keep", "keep": "candidate"}


# ------------------------------------------------------------ convert_gru_update


def test_convert_gru_cell(gru_spec, gen):
    a = gru_spec.cell(3, 4)
    b = convert_gru_update(a)
    assert isinstance(b, GRUCell)
    assert b.update == OTHER[a.update]
    assert b.reset == a.reset
    assert b.weight_ih.dtype == DT
    # the z rows (order r, z, n) are negated, everything else is copied
    H = 4
    z = slice(H, 2 * H)
    for name in ("weight_ih", "weight_hh", "bias"):
        pa, pb = getattr(a, name).detach(), getattr(b, name).detach()
        assert torch.equal(pb[z], -pa[z]), name
        assert torch.equal(pb[:H], pa[:H]) and torch.equal(pb[2 * H :], pa[2 * H :]), name
    if a.reset == "after":
        assert torch.equal(b.bias_hn, a.bias_hn)
    # the same function, step after step
    x = torch.randn(6, 5, 3, generator=gen, dtype=DT)
    ha = hb = torch.randn(5, 4, generator=gen, dtype=DT)
    for t in range(6):
        ha, hb = a(x[t], ha), b(x[t], hb)
        torch.testing.assert_close(ha, hb, **TOL)
    # converting back gives the original parameters, and the source was not touched
    c = convert_gru_update(b)
    assert c.update == a.update
    for (n1, p1), (n2, p2) in zip(a.named_parameters(), c.named_parameters(), strict=True):
        assert n1 == n2 and torch.equal(p1, p2)
    assert b.weight_ih.data_ptr() != a.weight_ih.data_ptr()


@pytest.mark.parametrize(("num_layers", "bidirectional"), [(1, False), (2, True)], ids=str)
def test_convert_gru_layer(gru_spec, gen, num_layers, bidirectional):
    dropout = 0.25 if num_layers > 1 else 0.0  # one layer has no "between layers"
    a = gru_spec.layer(3, 4, num_layers, bidirectional, dropout=dropout)
    b = convert_gru_update(a)
    assert isinstance(b, GRU)
    assert (b.num_layers, b.bidirectional, b.dropout, b.batch_first) == (
        num_layers,
        bidirectional,
        dropout,
        True,
    )
    for ca, cb in zip(a.cells(), b.cells(), strict=True):
        assert cb.update == OTHER[ca.update] and cb.reset == ca.reset
    a.eval()
    b.eval()
    D = 2 if bidirectional else 1
    x = torch.randn(3, 5, 3, generator=gen, dtype=DT)
    h0 = torch.randn(num_layers, D, 3, 4, generator=gen, dtype=DT)
    lengths = torch.tensor([5, 2, 4])
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ra = a(xa, lengths=lengths, state=h0)
    rb = b(xb, lengths=lengths, state=h0)
    torch.testing.assert_close(ra.outputs, rb.outputs, **TOL)
    torch.testing.assert_close(ra.state, rb.state, **TOL)
    ra.outputs.sum().backward()
    rb.outputs.sum().backward()
    torch.testing.assert_close(xa.grad, xb.grad, **TOL)


def test_convert_then_to_torch(gen):
    """A textbook-update GRU with reset after becomes a torch.nn.GRU through conversion."""
    torch.manual_seed(2)
    layer = GRU(3, 4, 2, True, update="candidate", reset="after").double()
    with pytest.raises(ValueError, match="convert_gru_update"):
        to_torch(layer)
    t = to_torch(convert_gru_update(layer))
    x = torch.randn(2, 5, 3, generator=gen, dtype=DT)
    with torch.no_grad():
        torch.testing.assert_close(layer(x).outputs, t(x)[0], atol=1e-10, rtol=0)


def _mixed_stack(kinds):
    """A two-layer StackedRecurrent whose layers are the given cell kinds, bottom first."""
    made = iter(kinds)

    def factory(width):
        kind = next(made)
        return GRUCell(width, 4, "keep", "after") if kind is GRUCell else kind(width, 4)

    return StackedRecurrent(factory, 3, 4, num_layers=len(kinds))


@pytest.mark.parametrize(
    "m",
    [RNNCell(2, 3), LSTM(2, 3), nn.GRU(2, 3), _mixed_stack([GRUCell, RNNCell])],
    ids=["RNNCell", "LSTM", "nn.GRU", "GRU-then-RNN"],
)
def test_convert_rejects_non_gru(m):
    # A stack whose first layer is a GRU but not the others is no GRU either (it used to
    # fail on the second layer with an AttributeError).
    with pytest.raises(TypeError, match=r"convert_gru_update expects a GRUCell or GRU"):
        convert_gru_update(m)


# ------------------------------------------------------------ parameter counts


def test_spec_1_4_count_is_725():
    """Input 10, state 20, 5 classes: 200 + 400 + 100 + 20 + 5."""
    cell = RNNCell(10, 20)
    head = nn.Linear(20, 5)
    assert cell.weight_ih.numel() == 200
    assert cell.weight_hh.numel() == 400
    assert head.weight.numel() == 100
    assert cell.bias.numel() == 20
    assert head.bias.numel() == 5
    assert count_parameters(cell) + count_parameters(head) == 725
    assert count_parameters(nn.ModuleList([cell, head])) == 725
    assert count_parameters(RNN(10, 20)) == 620  # independent of the sequence length


@pytest.mark.parametrize(("I", "H"), [(1, 1), (3, 5), (10, 20)])
def test_cell_counts(I, H):
    assert count_parameters(RNNCell(I, H)) == H * (I + H + 1)
    assert count_parameters(RNNCell(I, H, nonlinearity="relu")) == H * (I + H + 1)
    assert count_parameters(LSTMCell(I, H)) == 4 * H * (I + H + 1)
    assert count_parameters(LSTMCell(I, H, forget_bias=1.0)) == 4 * H * (I + H + 1)
    for update in ("candidate", "keep"):
        assert count_parameters(GRUCell(I, H, update=update)) == 3 * H * (I + H + 1)
        assert count_parameters(GRUCell(I, H, update=update, reset="after")) == (
            3 * H * (I + H + 1) + H
        )


def test_layer_counts():
    I, H = 3, 5
    per = {
        "rnn": lambda i: H * (i + H + 1),
        "lstm": lambda i: 4 * H * (i + H + 1),
        "gru": lambda i: 3 * H * (i + H + 1),
    }
    for kind, cls in (("rnn", RNN), ("lstm", LSTM), ("gru", GRU)):
        assert count_parameters(cls(I, H, 3, True)) == 2 * (per[kind](I) + 2 * per[kind](2 * H))
    assert count_parameters(GRU(I, H, 2, reset="after")) == per["gru"](I) + per["gru"](H) + 2 * H


def test_one_bias_per_gate_versus_torch():
    """rnnkit's count is torch's minus the second bias (the GRU keeps b_hn)."""
    L, D, H = 2, 2, 4
    for tcls, gates in ((nn.RNN, 1), (nn.LSTM, 4)):
        t = tcls(3, H, L, bidirectional=True)
        assert count_parameters(from_torch(t)) == count_parameters(t) - L * D * gates * H
    t = nn.GRU(3, H, L, bidirectional=True)
    assert count_parameters(from_torch(t)) == count_parameters(t) - L * D * 2 * H


def test_count_skips_frozen_parameters():
    cell = LSTMCell(3, 4)
    cell.weight_hh.requires_grad_(False)
    assert count_parameters(cell) == 4 * 4 * (3 + 4 + 1) - 4 * 4 * 4


# ------------------------------------------------------------ from_torch / to_torch


@pytest.mark.parametrize("tcls", [nn.RNN, nn.LSTM, nn.GRU])
def test_from_torch_without_biases(tcls, gen):
    torch.manual_seed(0)
    t = tcls(3, 4, 2, bias=False, batch_first=True, bidirectional=True).double()
    k = from_torch(t)
    x = torch.randn(2, 5, 3, generator=gen, dtype=DT)
    with torch.no_grad():
        torch.testing.assert_close(k(x).outputs, t(x)[0], atol=1e-10, rtol=0)
    for cell in k.cells():
        assert torch.count_nonzero(cell.bias) == 0


@pytest.mark.parametrize("tcls", [nn.RNNCell, nn.LSTMCell, nn.GRUCell])
def test_from_torch_cell_without_biases(tcls, gen):
    torch.manual_seed(0)
    t = tcls(3, 4, bias=False).double()
    k = from_torch(t)
    x = torch.randn(2, 3, generator=gen, dtype=DT)
    with torch.no_grad():
        got = k(x)
        want = t(x)
    got = got.h if isinstance(t, nn.LSTMCell) else got
    want = want[0] if isinstance(t, nn.LSTMCell) else want
    torch.testing.assert_close(got, want, atol=1e-10, rtol=0)


def test_from_torch_keeps_eval_mode(gen):
    torch.manual_seed(0)
    t = nn.GRU(3, 4, 2, dropout=0.5, batch_first=True).double().eval()
    k = from_torch(t)
    x = torch.randn(2, 5, 3, generator=gen, dtype=DT)
    with torch.no_grad():
        torch.testing.assert_close(k(x).outputs, t(x)[0], atol=1e-10, rtol=0)
    assert k.training is False


@pytest.mark.parametrize("m", [nn.Linear(2, 3), nn.Sequential(nn.GRU(2, 3)), nn.Embedding], ids=str)
def test_from_torch_rejects_other_modules(m):
    m = m(3, 2) if isinstance(m, type) else m
    with pytest.raises(TypeError, match=r"from_torch expects torch\.nn\.RNN/LSTM/GRU.*got"):
        from_torch(m)


@pytest.mark.parametrize("name", ["RNN", "LSTM", "GRU", "RNNCell", "LSTMCell", "GRUCell"])
def test_from_torch_takes_rnnkits_own_drop_ins(name, gen):
    """``rnnkit.nn``'s drop-ins are torch's classes (isinstance holds) and compute torch's
    function: from_torch refused them ("expects ... LSTM, got LSTM")."""
    import rnnkit.nn as rnn

    torch.manual_seed(0)
    cell = name.endswith("Cell")
    options = {} if cell else {"num_layers": 2, "bidirectional": True, "batch_first": True}
    if name.startswith("RNN"):
        options["nonlinearity"] = "relu"
    drop_in = getattr(rnn, name)(3, 4, **options).double()
    torch.manual_seed(0)
    plain = getattr(nn, name)(3, 4, **options).double()  # the same draws: the same weights
    k = from_torch(drop_in)
    assert type(k) is type(from_torch(plain))
    x = torch.randn(*((2,) if cell else (2, 5)), 3, generator=gen, dtype=DT)
    with torch.no_grad():
        got, want = k(x), plain(x)
    got = (got.h if name == "LSTMCell" else got) if cell else got.outputs
    want = (want[0] if name == "LSTMCell" else want) if cell else want[0]
    torch.testing.assert_close(got, want, atol=1e-10, rtol=0)

    class Mine(getattr(rnn, name)):
        def forward(self, *args):  # a subclass of the drop-in may compute anything
            return super().forward(*args)

    with pytest.raises(TypeError, match="Mine"):
        from_torch(Mine(3, 4))


def test_from_torch_rejects_subclass_it_cannot_vouch_for():
    class MyGRU(nn.GRU):
        def forward(self, x, h=None):  # a subclass may compute anything
            return super().forward(2 * x, h)

    with pytest.raises(TypeError, match="MyGRU"):
        from_torch(MyGRU(2, 3))


def test_from_torch_rejects_projected_lstm():
    with pytest.raises(ValueError, match="proj_size"):
        from_torch(nn.LSTM(3, 4, proj_size=2))


@pytest.mark.parametrize(
    ("update", "reset"), [("candidate", "before"), ("candidate", "after"), ("keep", "before")]
)
@pytest.mark.parametrize("as_layer", [False, True], ids=["cell", "layer"])
def test_to_torch_rejects_gru_forms_torch_lacks(update, reset, as_layer):
    m = (
        GRU(3, 4, 2, update=update, reset=reset)
        if as_layer
        else GRUCell(3, 4, update=update, reset=reset)
    )
    with pytest.raises(ValueError, match=rf"update='{update}', reset='{reset}'") as info:
        to_torch(m)
    assert "keep" in str(info.value) and "after" in str(info.value)  # says what torch has


@pytest.mark.parametrize("m", [nn.Linear(2, 3), nn.GRU(2, 3)], ids=str)
def test_to_torch_rejects_non_rnnkit(m):
    with pytest.raises(TypeError, match="to_torch expects an rnnkit cell or layer"):
        to_torch(m)


def test_to_torch_keeps_dtype_and_options():
    layer = RNN(3, 4, 2, True, dropout=0.3, nonlinearity="relu").double()
    t = to_torch(layer)
    assert isinstance(t, nn.RNN)
    assert t.weight_ih_l0.dtype == DT
    assert (t.nonlinearity, t.dropout, t.num_layers, t.bidirectional, t.batch_first) == (
        "relu",
        0.3,
        2,
        True,
        True,
    )
    assert t.hidden_size == 4 and t.input_size == 3


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("tcls", [nn.RNN, nn.LSTM, nn.GRU])
def test_round_trip_keeps_batch_first(tcls, batch_first):
    """to_torch(from_torch(t)) reads its input as t does: the same outputs."""
    t = tcls(3, 4, 2, batch_first=batch_first).double()
    back = to_torch(from_torch(t))
    assert back.batch_first is batch_first
    x = torch.randn(5, 2, 3, dtype=DT)
    torch.testing.assert_close(back(x)[0], t(x)[0], rtol=0, atol=1e-12)


def test_to_torch_refuses_what_torch_has_no_form_for():
    with pytest.raises(ValueError, match="tanh and relu only"):
        to_torch(RNNCell(3, 4, nonlinearity="sigmoid"))
    with pytest.raises(ValueError, match="one nonlinearity for all layers"):
        to_torch(RNN(3, 4, 2, nonlinearity=("tanh", "relu")))


@pytest.mark.parametrize(
    "kinds", [[RNNCell, GRUCell], [GRUCell, RNNCell]], ids=["RNN-GRU", "GRU-RNN"]
)
def test_to_torch_refuses_a_stack_of_mixed_cell_kinds(kinds):
    # torch.nn has one cell kind per layer module; a mixed stack used to fail on the
    # second layer (no nonlinearity, or weights of the wrong shape for the first's kind).
    with pytest.raises(ValueError, match=r"one cell kind for all layers; this stack mixes"):
        to_torch(_mixed_stack(kinds))
