"""Cells, inputs and a masked batch shared by the gradient-flow tests, and the oracle: a
plain step-by-step run of the cell over the flat state."""

from __future__ import annotations

import torch
from torch import Tensor

from rnnkit import GRUCell, LSTMCell, RNNCell
from rnnkit.cells.layer_norm import LayerNormGRUCell, LayerNormLSTMCell
from rnnkit.types import LSTMState

DT = torch.float64
MASK = torch.tensor([[1, 1, 1, 1, 1, 1, 1], [1, 0, 1, 1, 0, 1, 0], [0, 1, 1, 0, 0, 0, 0]]).bool()
CELLS = {
    "rnn_tanh": lambda: RNNCell(3, 4),
    "rnn_relu": lambda: RNNCell(3, 4, nonlinearity="relu"),
    "lstm": lambda: LSTMCell(3, 4),
    "gru_candidate_before": lambda: GRUCell(3, 4),
    "gru_keep_after": lambda: GRUCell(3, 4, update="keep", reset="after"),
    "ln_lstm": lambda: LayerNormLSTMCell(3, 4),
    "ln_gru": lambda: LayerNormGRUCell(3, 4),
}


def make(name: str, seed: int = 0):
    torch.manual_seed(seed)
    cell = CELLS[name]().to(DT)
    gen = torch.Generator().manual_seed(seed + 7)
    x = torch.randn(*MASK.shape, 3, generator=gen, dtype=DT)
    return cell, x


def flat_run(cell, x: Tensor, s0: Tensor, mask: Tensor, start: int = 0) -> list[Tensor]:
    """Oracle: states ``s_start … s_T`` (flat, ``[h; c]`` for LSTM) from ``s_start = s0``."""
    H = cell.hidden_size
    s, out = s0, [s0]
    for t in range(start, x.shape[1]):
        if cell.is_lstm:
            new = cell(x[:, t], LSTMState(s[:, :H], s[:, H:]))
            new = torch.cat([new.h, new.c], dim=1)
        else:
            new = cell(x[:, t], s)
        s = torch.where(mask[:, t : t + 1], new, s)
        out.append(s)
    return out


def zero_state(cell, B: int) -> Tensor:
    return torch.zeros(B, cell.hidden_size * (2 if cell.is_lstm else 1), dtype=DT)
