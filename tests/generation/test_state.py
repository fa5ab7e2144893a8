"""Rows of nested states: mixed batch dimensions, a reorder callable, select_state."""

from __future__ import annotations

from typing import NamedTuple

import pytest
import torch
from step_models import (
    EOS,
)
from torch import Tensor

from rnnkit.generation.search import generate, generate_batch
from rnnkit.generation.state import select_state
from rnnkit.types import LSTMState


class DecoderState(NamedTuple):
    hidden: Tensor  # (1, 1, B, 1): the last token
    memory: Tensor  # (B, V): a per-source bias, batch first (an encoder's summary)


class Decoder:
    """A seq2seq-like decoder whose state mixes batch dims 2 and 0."""

    def __init__(self, V: int) -> None:
        self.log_table = torch.log_softmax(
            torch.randn(V, V, generator=torch.Generator().manual_seed(6)), -1
        )

    def step(self, token: Tensor, state: DecoderState) -> tuple[Tensor, DecoderState]:
        B = token.shape[0]
        assert state.hidden.shape[2] == B and state.memory.shape[0] == B
        log_probs = torch.log_softmax(self.log_table[token] + state.memory, dim=-1)
        return log_probs, DecoderState(token.view(1, 1, B, 1).float(), state.memory)


def test_decoder_states_with_mixed_batch_dims() -> None:
    V, S = 6, 3
    memory = 3.0 * torch.randn(S, V, generator=torch.Generator().manual_seed(7))
    state = DecoderState(torch.zeros(1, 1, S, 1), memory)
    dec = Decoder(V)

    def reorder(s: DecoderState, index: Tensor) -> DecoderState:
        return DecoderState(s.hidden[:, :, index], s.memory[index])

    by_dim = generate_batch(
        dec,
        None,
        bos_id=1,
        eos_id=EOS,
        max_length=5,
        strategy="beam",
        beam_size=3,
        num=2,
        state=state,
        state_batch_dim=(2, 0),
    )
    by_fn = generate_batch(
        dec,
        [[1]] * S,
        bos_id=1,
        eos_id=EOS,
        max_length=5,
        strategy="beam",
        beam_size=3,
        num=2,
        state=state,
        reorder=reorder,
    )
    assert by_dim == by_fn and len(by_dim) == S
    for i in range(S):
        one = select_state(state, torch.tensor([i]), dim=(2, 0))
        alone = generate(
            dec,
            None,
            bos_id=1,
            eos_id=EOS,
            max_length=5,
            strategy="beam",
            beam_size=3,
            num=2,
            state=one,
            state_batch_dim=(2, 0),
        )
        assert [r.ids for r in alone] == [r.ids for r in by_dim[i]]
    greedy = generate_batch(
        dec, None, bos_id=1, eos_id=EOS, max_length=5, state=state, state_batch_dim=(2, 0)
    )
    assert len(greedy) == S and all(len(g) == 1 for g in greedy)


def test_select_state_walks_nested_structures() -> None:
    x = torch.arange(4.0).view(1, 1, 4, 1)
    state = {"lstm": LSTMState(x, -x), "memory": [torch.arange(4), None]}
    out = select_state(state, torch.tensor([3, 3]), dim={"lstm": 2, "memory": 0})
    assert isinstance(out["lstm"], LSTMState)
    assert out["lstm"].c.view(-1).tolist() == [-3.0, -3.0]
    assert out["memory"][0].tolist() == [3, 3] and out["memory"][1] is None
    assert select_state(None, torch.tensor([0])) is None
    with pytest.raises(TypeError, match="state_batch_dim"):
        select_state((x, x), torch.tensor([0]), dim=(2,))
