"""What every cell shares: its parameters, their initialisation, and argument checks.

A cell stores ``weight_ih (G·H, I)``, ``weight_hh (G·H, H)`` and ONE ``bias (G·H,)`` — the
textbook form (PyTorch's two biases per gate are added on import). ``G`` is the
number of gate blocks: 1 (RNN), 4 (LSTM, order i,f,g,o), 3 (GRU, order r,z,n).

Each concrete cell module also provides, side by side:

* ``rnn_step`` / ``lstm_step`` / ``gru_step``: one step in plain differentiable torch ops,
  the oracle of the autograd tests (and the loop a traced graph holds);
* ``rnn_step_backward`` / ``lstm_step_backward`` / ``gru_step_backward``: the readable
  hand-written backward of that step (tested against autograd);
* the kernel's ``step_into`` and ``step_backward``: the same step and backward writing
  into the preallocated buffers of the time loop, the form the explicit BPTT runs. They,
  and the compiled loop (``rnnkit.bptt.native``), are tested against the readable pair.
"""

from __future__ import annotations

import math
from typing import ClassVar, TypeVar, cast

import torch
from torch import Tensor, nn

from rnnkit.cells.kernel import Kernel, Weights
from rnnkit.types import LSTMState, State

#: A step's state kind: a cell's check returns the kind it was given.
S = TypeVar("S", Tensor, LSTMState)

__all__ = ["CellBase", "check_cell_input"]

INITS = ("uniform", "orthogonal")


class CellBase(nn.Module):
    """Parameters and initialisation common to all cells.

    Args:
        input_size: ``I``, the width of ``x_t``.
        hidden_size: ``H``, the width of ``h_t``.
        init: ``"uniform"`` draws every parameter from U(−1/√H, 1/√H) like PyTorch;
            ``"orthogonal"`` does the same but makes each gate block of ``weight_hh`` an
            orthogonal ``H × H`` matrix (keeps ‖W_h‖₂ = 1 at the start: the gradient
            bound (γλ)^(t−k) then neither vanishes nor explodes from the weights alone).
    """

    gates: ClassVar[int] = 1
    is_lstm: ClassVar[bool] = False

    def __init__(self, input_size: int, hidden_size: int, init: str = "uniform") -> None:
        super().__init__()
        for name, value in (("input_size", input_size), ("hidden_size", hidden_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if init not in INITS:
            raise ValueError(f"init must be one of {INITS}, got {init!r}")
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.init = init
        G, H = self.gates, hidden_size
        self.weight_ih = nn.Parameter(torch.empty(G * H, input_size))
        self.weight_hh = nn.Parameter(torch.empty(G * H, H))
        self.bias = nn.Parameter(torch.empty(G * H))

    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.hidden_size)
        with torch.no_grad():
            for p in self.parameters():
                p.uniform_(-bound, bound)
            if self.init == "orthogonal":
                H = self.hidden_size
                for k in range(self.gates):
                    nn.init.orthogonal_(self.weight_hh[k * H : (k + 1) * H])

    def extra_repr(self) -> str:
        return f"{self.input_size}, {self.hidden_size}"

    @property
    def kernel(self) -> Kernel:
        """The cell kind's step, forward and backward, as the time loop runs it."""
        raise NotImplementedError(f"{type(self).__name__} has no kernel")

    def weights(self) -> Weights:
        """The parameters as the time loop reads them."""
        raise NotImplementedError(f"{type(self).__name__} has no weights")

    def zero_state(self, batch_size: int, like: Tensor) -> State:
        """The all-zero state for ``batch_size`` rows, on ``like``'s device and dtype."""
        h = like.new_zeros(batch_size, self.hidden_size)
        return LSTMState(h, torch.zeros_like(h)) if self.is_lstm else h


def check_cell_input(cell: CellBase, x: Tensor, state: S | None) -> S:
    """Validate one step's input ``x (B, I)`` and state; return the state (zeros if None)."""
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 2 or x.shape[1] != cell.input_size:
        raise ValueError(
            f"x must have shape (B, {cell.input_size}) = (batch, input_size), got {tuple(x.shape)}"
        )
    w = cell.weight_ih
    if x.dtype != w.dtype or x.device != w.device:
        raise TypeError(
            f"{type(cell).__name__}: x is {x.dtype} on {x.device} but the cell's parameters "
            f"are {w.dtype} on {w.device}; convert one of them (e.g. cell.to(x))"
        )
    B, H = x.shape[0], cell.hidden_size
    if state is None:
        return cast(S, cell.zero_state(B, x))
    parts: tuple[tuple[str, object], ...] = (("state", state),)
    if cell.is_lstm:
        if not isinstance(state, LSTMState):
            raise TypeError(
                f"the state of an LSTM cell must be LSTMState(h, c), got {type(state).__name__}"
            )
        parts = (("state.h", state.h), ("state.c", state.c))
    for name, t in parts:
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if tuple(t.shape) != (B, H):
            raise ValueError(f"{name} must have shape (B, H) = {(B, H)}, got {tuple(t.shape)}")
        if t.dtype != x.dtype or t.device != x.device:
            raise TypeError(
                f"{type(cell).__name__}: {name} is {t.dtype} on {t.device}, x is {x.dtype} "
                f"on {x.device}; convert {name} ({name}.to(x))"
            )
    return state
