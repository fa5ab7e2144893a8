"""The state and output containers of ``rnnkit.types``."""

from __future__ import annotations

import pytest
import torch

from rnnkit import LSTM, RNN, LSTMState, RecurrentOutput
from rnnkit.types import State

pytestmark = pytest.mark.usefixtures("single_thread")


def test_lstm_state_is_a_named_pair():
    h, c = torch.zeros(2, 3), torch.ones(2, 3)
    s = LSTMState(h, c)
    assert s.h is h and s.c is c
    assert s._fields == ("h", "c")
    a, b = s
    assert a is h and b is c
    assert isinstance(s, tuple) and len(s) == 2
    assert LSTMState(c=c, h=h) == s


def test_recurrent_output_fields_and_unpacking():
    out = RecurrentOutput(torch.zeros(2, 5, 4), torch.zeros(1, 1, 2, 4))
    assert out._fields == ("outputs", "state")
    outputs, state = out
    assert outputs is out.outputs and state is out.state
    assert out[0] is out.outputs


def test_layers_return_the_containers():
    res = RNN(3, 4)(torch.zeros(2, 5, 3))
    assert type(res) is RecurrentOutput
    assert isinstance(res.state, torch.Tensor)
    res = LSTM(3, 4)(torch.zeros(2, 5, 3))
    assert type(res) is RecurrentOutput
    assert type(res.state) is LSTMState
    assert res.state.h.shape == res.state.c.shape == (1, 1, 2, 4)


def test_state_alias_covers_both_forms():
    assert torch.Tensor in State.__args__
    assert LSTMState in State.__args__
