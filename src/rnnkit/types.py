"""State and output containers, and the shape legend used in every docstring.

Shape legend: ``B`` batch, ``T`` time, ``I`` input width, ``H`` hidden width, ``D`` directions
(1 or 2), ``L`` layers, ``V`` vocabulary size, ``G`` gate blocks of a cell (RNN 1, GRU 3,
LSTM 4). Everything is batch-first.
"""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor

__all__ = ["LSTMState", "RecurrentOutput", "State"]


class LSTMState(NamedTuple):
    """The LSTM state pair: hidden ``h`` and memory cell ``c``, always of equal shape."""

    h: Tensor
    c: Tensor


# A recurrent state: one tensor for RNN/GRU, the pair for LSTM.
State = Tensor | LSTMState


class RecurrentOutput(NamedTuple):
    """What every recurrent layer returns.

    Attributes:
        outputs: ``(B, T, D·H)`` hidden states of the top layer at every step (the held
            state at masked steps).
        state: the final state of each sequence at its last real step, ``(L, D, B, H)``
            (an ``LSTMState`` of two such tensors for LSTM layers).
    """

    outputs: Tensor
    state: State
