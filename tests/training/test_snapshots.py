"""A snapshot's carried state: to named tensors and back, for each kind of state."""

from __future__ import annotations

import torch

from rnnkit.training.snapshots import carry_from, carry_tensors
from rnnkit.types import LSTMState


def test_carried_states_round_trip():
    h, c = torch.randn(2, 1, 3, 4), torch.randn(2, 1, 3, 4)
    back = carry_from(carry_tensors(LSTMState(h, c)), torch.device("cpu"))
    assert isinstance(back, LSTMState) and torch.equal(back.h, h) and torch.equal(back.c, c)
    assert torch.equal(carry_from(carry_tensors(h), torch.device("cpu")), h)
    assert carry_tensors(None) == {} and carry_from({"rng/torch": h}, torch.device("cpu")) is None
