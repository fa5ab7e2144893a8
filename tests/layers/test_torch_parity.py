"""Whole layers equal ``torch.nn.RNN/LSTM/GRU`` with copied weights (the layer contract).

Outputs, final states and ALL gradients (inputs, initial state, every parameter of every
layer and direction), float64 to 1e-10, single and multi-layer, bidirectional, with
``lengths`` (against ``pack_padded_sequence(..., enforce_sorted=False)``), through both
``from_torch`` and ``to_torch``. float32 to 1e-5; dropout only in training mode.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from rnnkit import GRU, LSTM, RNN, LSTMState, from_torch, to_torch

pytestmark = pytest.mark.usefixtures("single_thread", "time_loop")

DT = torch.float64
TOL = {"atol": 1e-10, "rtol": 0.0}
B, T, I, H = 4, 7, 3, 4
LENGTHS = torch.tensor([7, 3, 1, 5])  # unsorted: enforce_sorted=False must cope

CONFIGS = [(1, False), (2, False), (1, True), (2, True)]


def run_torch(tmod, x, h0, lengths):
    if lengths is None:
        out, hn = tmod(x, h0)
    else:
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, hn = tmod(packed, h0)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])
    return out, (hn if isinstance(hn, tuple) else (hn,))


def check_layer_against_torch(spec, layer, tmod, gen, lengths, dtype=DT, tol=None):
    tol = tol or TOL
    L, D = tmod.num_layers, 2 if tmod.bidirectional else 1
    x = torch.randn(B, T, I, generator=gen, dtype=dtype)
    s0 = [torch.randn(L * D, B, H, generator=gen, dtype=dtype) for _ in range(spec.num_states)]
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    s1 = [s.view(L, D, B, H).clone().requires_grad_() for s in s0]
    s2 = [s.clone().requires_grad_() for s in s0]

    res = layer(x1, lengths=lengths, state=spec.pack(tuple(s1)))
    t_out, t_fin = run_torch(tmod, x2, tuple(s2) if spec.is_lstm else s2[0], lengths)

    mask = (
        torch.ones(B, T, dtype=torch.bool)
        if lengths is None
        else lengths[:, None] > torch.arange(T)
    )
    m = mask[..., None].to(dtype)
    ours_fin = spec.unpack(res.state)
    assert res.outputs.shape == (B, T, D * H)
    for a in ours_fin:
        assert a.shape == (L, D, B, H)
    torch.testing.assert_close(res.outputs * m, t_out * m, **tol)
    for a, b in zip(ours_fin, t_fin, strict=True):
        torch.testing.assert_close(a, b.view(L, D, B, H), **tol)

    g_out = torch.randn(B, T, D * H, generator=gen, dtype=dtype) * m
    g_fin = [torch.randn(L, D, B, H, generator=gen, dtype=dtype) for _ in t_fin]
    loss1 = (res.outputs * g_out).sum() + sum(
        (a * g).sum() for a, g in zip(ours_fin, g_fin, strict=True)
    )
    loss2 = (t_out * g_out).sum() + sum(
        (a.view(L, D, B, H) * g).sum() for a, g in zip(t_fin, g_fin, strict=True)
    )
    loss1.backward()
    loss2.backward()
    torch.testing.assert_close(x1.grad, x2.grad, **tol)
    for a, b in zip(s1, s2, strict=True):
        torch.testing.assert_close(a.grad, b.grad.view(L, D, B, H), **tol)
    cells = layer.cells()
    assert len(cells) == L * D
    for index, cell in enumerate(cells):
        l, d = divmod(index, D)
        sfx = f"_l{l}" + ("_reverse" if d else "")
        for name, a, b in spec.grad_pairs(cell, tmod, sfx):
            torch.testing.assert_close(a, b, **tol, msg=lambda msg, n=name + sfx: f"{n}: {msg}")


@pytest.mark.parametrize(("num_layers", "bidirectional"), CONFIGS, ids=lambda v: str(v))
@pytest.mark.parametrize("with_lengths", [False, True], ids=["full", "lengths"])
def test_from_torch_layer_equals_torch(torch_spec, gen, num_layers, bidirectional, with_lengths):
    tmod = torch_spec.torch_layer(I, H, num_layers, bidirectional)
    layer = from_torch(tmod)
    assert type(layer) is {"rnn": RNN, "lstm": LSTM, "gru": GRU}[torch_spec.kind]
    assert (layer.num_layers, layer.bidirectional, layer.batch_first) == (
        num_layers,
        bidirectional,
        True,
    )
    lengths = LENGTHS if with_lengths else None
    check_layer_against_torch(torch_spec, layer, tmod, gen, lengths)


@pytest.mark.parametrize(("num_layers", "bidirectional"), CONFIGS, ids=lambda v: str(v))
@pytest.mark.parametrize("with_lengths", [False, True], ids=["full", "lengths"])
def test_to_torch_layer_equals_rnnkit(torch_spec, gen, num_layers, bidirectional, with_lengths):
    layer = torch_spec.layer(I, H, num_layers, bidirectional, seed=7)
    tmod = to_torch(layer)
    assert isinstance(tmod, nn.RNNBase) and tmod.batch_first
    assert (tmod.num_layers, tmod.bidirectional) == (num_layers, bidirectional)
    if torch_spec.kind == "rnn":
        assert tmod.nonlinearity == torch_spec.options["nonlinearity"]
    lengths = LENGTHS if with_lengths else None
    check_layer_against_torch(torch_spec, layer, tmod, gen, lengths)


def test_round_trip_keeps_parameters(torch_spec):
    layer = torch_spec.layer(I, H, 2, True, seed=3)
    back = from_torch(to_torch(layer))
    for (n1, p1), (n2, p2) in zip(layer.named_parameters(), back.named_parameters(), strict=True):
        assert n1 == n2
        torch.testing.assert_close(p1, p2, atol=1e-15, rtol=0)


def test_from_torch_keeps_batch_first_false(torch_spec, gen):
    tmod = torch_spec.torch_layer(I, H, 1, True)
    tmod.batch_first = False
    layer = from_torch(tmod)
    assert layer.batch_first is False
    x = torch.randn(T, B, I, generator=gen, dtype=DT)
    with torch.no_grad():
        ours = layer(x).outputs
        theirs = tmod(x)[0]
    torch.testing.assert_close(ours, theirs, **TOL)


@pytest.mark.parametrize(("num_layers", "bidirectional"), [(1, False), (2, True)], ids=str)
def test_float32_matches_torch(torch_spec, gen, num_layers, bidirectional):
    tmod = torch_spec.torch_layer(I, H, num_layers, bidirectional, dtype=torch.float32)
    layer = from_torch(tmod)
    assert layer.cells()[0].weight_ih.dtype == torch.float32
    check_layer_against_torch(
        torch_spec, layer, tmod, gen, LENGTHS, dtype=torch.float32, tol={"atol": 1e-5, "rtol": 1e-5}
    )


# --------------------------------------------------------------------------- dropout


def test_dropout_only_in_training_mode(torch_spec, gen):
    torch.manual_seed(0)
    kw = {"batch_first": True, "dropout": 0.5, "bidirectional": True}
    if torch_spec.kind == "rnn":
        kw["nonlinearity"] = torch_spec.options["nonlinearity"]
    tmod = {"rnn": nn.RNN, "lstm": nn.LSTM, "gru": nn.GRU}[torch_spec.kind](I, H, 2, **kw)
    tmod = tmod.double().eval()
    layer = from_torch(tmod)
    assert layer.dropout == 0.5
    x = torch.randn(B, T, I, generator=gen, dtype=DT)

    layer.eval()
    with torch.no_grad():
        a, b = layer(x), layer(x)
        want = tmod(x)[0]
    assert torch.equal(a.outputs, b.outputs)  # eval is deterministic
    torch.testing.assert_close(a.outputs, want, **TOL)  # and drops nothing

    layer.train()
    with torch.no_grad():
        c, d = layer(x), layer(x)
    assert not torch.allclose(c.outputs, a.outputs)  # training drops
    assert not torch.allclose(c.outputs, d.outputs)  # with fresh masks each call
    # between layers only: the first layer never sees dropout, so its final state is the
    # eval one, while the second layer's is not
    h_train, h_eval = torch_spec.unpack(c.state)[0], torch_spec.unpack(a.state)[0]
    torch.testing.assert_close(h_train[0], h_eval[0], **TOL)
    assert not torch.allclose(h_train[1], h_eval[1])


def test_dropout_not_applied_to_single_layer_output(cell_spec, gen):
    with pytest.warns(UserWarning, match="does nothing with num_layers=1"):  # as torch warns
        layer = cell_spec.layer(I, H, 1, True, dropout=0.9).train()
    x = torch.randn(B, T, I, generator=gen, dtype=DT)
    with torch.no_grad():
        train = layer(x)
        layer.eval()
        ev = layer(x)
    assert torch.equal(train.outputs, ev.outputs)


def test_dropout_out_of_range():
    with pytest.raises(ValueError, match="dropout"):
        RNN(3, 4, 2, dropout=1.0)
    with pytest.raises(ValueError, match="dropout"):
        RNN(3, 4, 2, dropout=-0.1)


def test_lstm_state_type(gen):
    out = LSTM(I, H, 2, True).double()(torch.randn(B, T, I, generator=gen, dtype=DT))
    assert isinstance(out.state, LSTMState)
    assert out.state.h.shape == out.state.c.shape == (2, 2, B, H)
