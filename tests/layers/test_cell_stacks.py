"""RNN, LSTM and GRU: one nonlinearity per layer, each kind's cells and options, and their
names at their old place."""

from __future__ import annotations

import pytest
import torch

from rnnkit import GRU, LSTM, RNN, GRUCell, LSTMCell, RNNCell
from rnnkit.errors import ConfigError
from rnnkit.layers import cell_stacks, stacked

pytestmark = pytest.mark.usefixtures("single_thread", "time_loop")

DT = torch.float64
TOL = {"atol": 1e-10, "rtol": 0.0}


def test_rnn_with_one_nonlinearity_per_layer_equals_the_layers_composed(gen):
    """RNN(nonlinearity=("tanh", "sigmoid")) = a tanh layer feeding a sigmoid layer with
    the same weights (values and autograd gradients, bidirectional, with lengths)."""
    mixed = RNN(3, 4, 2, True, nonlinearity=("tanh", "sigmoid")).double()
    assert [c.nonlinearity for c in mixed.cells()] == ["tanh", "tanh", "sigmoid", "sigmoid"]
    one = RNN(3, 4, 1, True, nonlinearity="tanh").double()
    two = RNN(8, 4, 1, True, nonlinearity="sigmoid").double()
    one.layers[0].load_state_dict(mixed.layers[0].state_dict())
    two.layers[0].load_state_dict(mixed.layers[1].state_dict())
    x = torch.randn(3, 5, 3, generator=gen, dtype=DT)
    lengths = torch.tensor([5, 2, 4])
    got = mixed(x, lengths=lengths).outputs
    want = two(one(x, lengths=lengths).outputs, lengths=lengths).outputs
    torch.testing.assert_close(got, want, **TOL)
    g1 = torch.autograd.grad(got.sum(), list(mixed.parameters()))
    g2 = torch.autograd.grad(want.sum(), [*one.parameters(), *two.parameters()])
    for a, b in zip(g1, g2, strict=True):
        torch.testing.assert_close(a, b, **TOL)


def test_rnn_nonlinearity_per_layer_must_name_every_layer():
    with pytest.raises(ValueError, match="2 entries for 3 layers"):
        RNN(3, 4, 3, nonlinearity=("tanh", "sigmoid"))
    with pytest.raises(ValueError, match="nonlinearity must be one of"):
        RNN(3, 4, 2, nonlinearity=("tanh", "softsign"))


def test_each_kind_builds_its_cells_with_their_options():
    lstm = LSTM(3, 4, 2, bidirectional=True, forget_bias=2.0)
    assert all(c.forget_bias == 2.0 for c in lstm.cells())
    assert [type(c) for c in lstm.cells()] == [LSTMCell] * 4
    assert [c.input_size for c in lstm.cells()] == [3, 3, 8, 8]
    gru = GRU(3, 4, update="keep", reset="after")
    assert type(gru.cells()[0]) is GRUCell
    assert (gru.cells()[0].update, gru.cells()[0].reset) == ("keep", "after")
    assert [type(c) for c in RNN(3, 4, 3).cells()] == [RNNCell] * 3


def test_names_still_import_from_stacked():
    namespace: dict[str, object] = {}
    exec("from rnnkit.layers.stacked import GRU", namespace)  # the import statement users wrote
    assert namespace["GRU"] is cell_stacks.GRU is GRU
    assert stacked.LSTM is LSTM and stacked.RNN is RNN
    with pytest.raises(AttributeError, match="no attribute 'Transformer'"):
        stacked.Transformer  # noqa: B018


@pytest.mark.parametrize("kind", [LSTM, GRU])
@pytest.mark.parametrize("flag", ["no", 1, None])
def test_layer_norm_takes_a_bool_only(kind, flag):
    # "no" is truthy: it built layer-normalised cells without a word
    with pytest.raises(ConfigError, match=f"^layer_norm must be True or False, got {flag!r}$"):
        kind(3, 4, layer_norm=flag, reset="after") if kind is GRU else kind(3, 4, layer_norm=flag)
    plain = kind(3, 4, layer_norm=False)
    assert type(plain.cells()[0]) is (GRUCell if kind is GRU else LSTMCell)
