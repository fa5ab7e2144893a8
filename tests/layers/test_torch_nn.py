"""``rnnkit.nn.RNN/LSTM/GRU`` against ``torch.nn`` with the same state dict (float64):
outputs, final states and every gradient; packed and unbatched input, ``hx``, the
constructor's positional order, initial weights from the same seed, errors."""

from __future__ import annotations

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import rnnkit
from rnnkit import nn as knn

DTYPE = torch.float64
MODES = [("RNN", {}), ("RNN", {"nonlinearity": "relu"}), ("LSTM", {}), ("GRU", {})]
SHAPES = [  # (batch_first, bidirectional, num_layers)
    (False, False, 1),
    (True, True, 2),
    (False, True, 2),
]


def _pair(mode: str, seed: int = 0, **kw):
    torch.manual_seed(seed)
    reference = getattr(torch.nn, mode)(3, 5, dtype=DTYPE, **kw)
    mine = getattr(knn, mode)(3, 5, dtype=DTYPE, **kw)
    mine.load_state_dict(reference.state_dict())
    return reference, mine


def _hx(mode: str, L: int, D: int, B: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(L * D, B, 5, dtype=DTYPE, generator=g)
    if mode == "LSTM":
        return (h, torch.randn(L * D, B, 5, dtype=DTYPE, generator=g))
    return h


def _flat(state):
    return list(state) if isinstance(state, tuple) else [state]


def _grads(module, x, hx, out_state):
    out, state = out_state
    loss = out.pow(2).sum() + sum(s.sin().sum() for s in _flat(state))
    inputs = [x, *_flat(hx)]
    names = [n for n, _ in module.named_parameters()]
    grads = torch.autograd.grad(loss, [*inputs, *module.parameters()])
    return dict(zip(["x", "h0", "c0"][: len(inputs)] + names, grads, strict=False))


@pytest.mark.parametrize("mode,options", MODES, ids=lambda v: str(v))
@pytest.mark.parametrize("batch_first,bidirectional,num_layers", SHAPES)
def test_same_outputs_states_and_gradients(mode, options, batch_first, bidirectional, num_layers):
    kw = dict(batch_first=batch_first, bidirectional=bidirectional, num_layers=num_layers)
    reference, mine = _pair(mode, **options, **kw)
    B, T = 3, 6
    shape = (B, T, 3) if batch_first else (T, B, 3)
    x = torch.randn(*shape, dtype=DTYPE, requires_grad=True)
    hx = _hx(mode, num_layers, 2 if bidirectional else 1, B)
    for h in _flat(hx):
        h.requires_grad_(True)
    expected, got = reference(x, hx), mine(x, hx)
    torch.testing.assert_close(got[0], expected[0], rtol=0, atol=1e-10)
    for a, b in zip(_flat(got[1]), _flat(expected[1]), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
    g_ref, g_mine = _grads(reference, x, hx, expected), _grads(mine, x, hx, got)
    assert g_mine.keys() == g_ref.keys()
    for name in g_ref:
        torch.testing.assert_close(g_mine[name], g_ref[name], rtol=0, atol=1e-9, msg=name)
    # No hx: zeros, as in torch.
    torch.testing.assert_close(mine(x)[0], reference(x)[0], rtol=0, atol=1e-10)


@pytest.mark.parametrize("mode", ["RNN", "LSTM", "GRU"])
@pytest.mark.parametrize("batch_first", [False, True])
def test_packed_sequence_in_and_out(mode, batch_first):
    reference, mine = _pair(mode, batch_first=batch_first, bidirectional=True, num_layers=2)
    lengths = torch.tensor([4, 7, 2, 7])  # unsorted: enforce_sorted=False
    x = torch.randn(4, 7, 3, dtype=DTYPE)
    if not batch_first:
        x = x.transpose(0, 1)
    packed = pack_padded_sequence(x, lengths, batch_first=batch_first, enforce_sorted=False)
    hx = _hx(mode, 2, 2, 4)
    (p_ref, s_ref), (p_mine, s_mine) = reference(packed, hx), mine(packed, hx)
    assert isinstance(p_mine, torch.nn.utils.rnn.PackedSequence)
    assert torch.equal(p_mine.batch_sizes, p_ref.batch_sizes)
    assert torch.equal(p_mine.sorted_indices, p_ref.sorted_indices)
    assert torch.equal(p_mine.unsorted_indices, p_ref.unsorted_indices)
    torch.testing.assert_close(p_mine.data, p_ref.data, rtol=0, atol=1e-10)
    for a, b in zip(_flat(s_mine), _flat(s_ref), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
    _, out_lengths = pad_packed_sequence(p_mine, batch_first=batch_first)
    assert out_lengths.tolist() == lengths.tolist()


@pytest.mark.parametrize("mode", ["RNN", "LSTM", "GRU"])
def test_unbatched_input(mode):
    reference, mine = _pair(mode, bidirectional=True)
    x = torch.randn(6, 3, dtype=DTYPE)
    h = torch.randn(2, 5, dtype=DTYPE)
    hx = (h, h.cos()) if mode == "LSTM" else h
    (o_ref, s_ref), (o_mine, s_mine) = reference(x, hx), mine(x, hx)
    assert o_mine.shape == o_ref.shape == (6, 10)
    torch.testing.assert_close(o_mine, o_ref, rtol=0, atol=1e-10)
    for a, b in zip(_flat(s_mine), _flat(s_ref), strict=True):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


@pytest.mark.parametrize("mode", ["RNN", "LSTM", "GRU"])
def test_no_bias(mode):
    reference, mine = _pair(mode, bias=False, num_layers=2)
    assert list(mine.state_dict()) == list(reference.state_dict())
    assert not any("bias" in k for k in mine.state_dict())
    x = torch.randn(5, 2, 3, dtype=DTYPE)
    torch.testing.assert_close(mine(x)[0], reference(x)[0], rtol=0, atol=1e-10)


@pytest.mark.parametrize("mode", ["RNN", "LSTM", "GRU"])
def test_same_seed_same_initial_weights_and_state_dict_both_ways(mode):
    torch.manual_seed(3)
    reference = getattr(torch.nn, mode)(4, 6, num_layers=2, bidirectional=True)
    torch.manual_seed(3)
    mine = getattr(knn, mode)(4, 6, num_layers=2, bidirectional=True)
    assert list(mine.state_dict()) == list(reference.state_dict())
    for key, value in reference.state_dict().items():
        assert torch.equal(mine.state_dict()[key], value), key
    back = getattr(torch.nn, mode)(4, 6, num_layers=2, bidirectional=True)
    back.load_state_dict(mine.state_dict())  # and rnnkit's loads into torch
    assert [len(w) for w in mine.all_weights] == [len(w) for w in reference.all_weights]


def test_torch_positional_order_and_defaults():
    """``LSTM(8, 16, 2, True, True)`` is (num_layers, bias, batch_first), as in torch."""
    mine, reference = knn.LSTM(8, 16, 2, True, True), torch.nn.LSTM(8, 16, 2, True, True)
    for name in ("num_layers", "bias", "batch_first", "dropout", "bidirectional", "proj_size"):
        assert getattr(mine, name) == getattr(reference, name), name
    assert knn.GRU(2, 3).batch_first is False
    rnn = knn.RNN(3, 4, 1, "relu")
    assert rnn.nonlinearity == "relu" and repr(rnn) == "RNN(3, 4, nonlinearity='relu')"
    assert repr(knn.LSTM(3, 4, batch_first=True)) == repr(torch.nn.LSTM(3, 4, batch_first=True))
    mine.flatten_parameters()  # torch code calls it; a no-op here


def test_eval_mode_dropout_is_identity_as_in_torch():
    reference, mine = _pair("GRU", num_layers=3, dropout=0.5)
    reference.eval()
    mine.eval()
    x = torch.randn(5, 2, 3, dtype=DTYPE)
    torch.testing.assert_close(mine(x)[0], reference(x)[0], rtol=0, atol=1e-10)


def test_errors_are_clear():
    with pytest.raises(ValueError, match="proj_size=2 is not supported"):
        knn.LSTM(3, 4, proj_size=2)
    with pytest.raises(ValueError, match="Unknown nonlinearity"):
        knn.RNN(3, 4, nonlinearity="sigmoid")
    lstm = knn.LSTM(3, 4, num_layers=2)
    x = torch.randn(5, 2, 3)
    with pytest.raises(TypeError, match=r"hx must be the pair \(h_0, c_0\)"):
        lstm(x, torch.zeros(2, 2, 4))
    with pytest.raises(RuntimeError, match=r"Expected hx\[0\] size \(2, 2, 4\)"):
        lstm(x, (torch.zeros(1, 2, 4), torch.zeros(1, 2, 4)))
    with pytest.raises(TypeError, match="hx must be one tensor"):
        knn.GRU(3, 4)(x, (torch.zeros(1, 2, 4),))
    with pytest.raises(ValueError, match="Expected input to be 2D or 3D"):
        knn.GRU(3, 4)(torch.zeros(5, 2, 3, 1))


def test_namespace():
    assert rnnkit.nn.LSTM is knn.LSTM
    assert sum(p.numel() for p in knn.LSTM(3, 5).parameters()) == sum(
        p.numel() for p in torch.nn.LSTM(3, 5).parameters()
    )
