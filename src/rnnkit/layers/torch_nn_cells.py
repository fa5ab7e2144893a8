"""``torch.nn.RNNCell`` / ``LSTMCell`` / ``GRUCell`` with torch's interface, one step of
rnnkit's cells.

Like the layers of :mod:`rnnkit.layers.torch_nn`, each class *is* torch's (a subclass):
the same constructor, parameters (``weight_ih``, ``weight_hh``, ``bias_ih``,
``bias_hh``), ``state_dict`` and initial weights from the same seed; ``forward(input,
hx=None)`` takes ``(B, I)`` or unbatched ``(I,)`` input and returns ``h'`` (the LSTM:
``(h', c')``). The step is rnnkit's readable cell step (``rnn_step``, ``lstm_step``,
``gru_step`` with ``update="keep", reset="after"``) with one bias per gate,
``b = b_ih + b_hh`` (the GRU's ``b_hn`` kept inside ``r ⊙ (W_hn h + b_hn)``).
TorchScript compiles torch's class with the same parameters.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from rnnkit.bptt.tracing import transforming
from rnnkit.cells.amp import autocast_reconciles
from rnnkit.cells.gru import gru_step
from rnnkit.cells.kernel import Weights
from rnnkit.cells.lstm import lstm_step
from rnnkit.cells.rnn import rnn_step
from rnnkit.layers.torch_nn import (
    _DEVICE_FAILURES,
    _fused_computes,
    _one_step,
    _plain_cpu_step,
    fx_leaf_call,
    scriptable_copy,
)
from rnnkit.types import LSTMState

__all__ = ["GRUCell", "LSTMCell", "RNNCell"]


class _CellDropIn:
    """What the three cells add to torch's: rnnkit computes ``forward``."""

    _torch_class: type[nn.Module]
    input_size: int
    hidden_size: int
    bias: bool
    weight_ih: Tensor
    weight_hh: Tensor

    def __prepare_scriptable__(self) -> nn.Module:
        """``torch.jit.script`` compiles torch's class with these parameters."""
        return scriptable_copy(self, self._torch_class)  # type: ignore[arg-type]

    def _weights(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``(w_ih, w_hh, b_ih, b_hh)``, each read once, in the order torch's step reads
        them: a parametrization (``weight_norm``, a weight-dropping one) runs once per
        step as with torch's cell, drawing the same random numbers. Zero biases for
        ``bias=False`` (torch registers them as None)."""
        w_ih, w_hh = self.weight_ih, self.weight_hh
        b_ih, b_hh = getattr(self, "bias_ih", None), getattr(self, "bias_hh", None)
        if b_ih is None or b_hh is None:
            b_ih = b_hh = w_ih.new_zeros(w_ih.shape[0])
        return w_ih, w_hh, b_ih, b_hh

    def _batched(
        self, input: Tensor, hx: Tensor | None, what: str, weight: Tensor
    ) -> tuple[Tensor, Tensor, bool]:
        """``(x (B, I), h (B, H), batched)``, with torch's checks and messages."""
        name = f"rnnkit.nn.{type(self).__name__}"
        if input.dim() not in (1, 2):
            raise ValueError(f"{name}: Expected input to be 1D or 2D, got {input.dim()}D instead")
        if hx is not None and hx.dim() not in (1, 2):  # torch's ValueError ("hidden": GRU, RNN)
            word = "hidden" if what == "hx" else what
            raise ValueError(f"{name}: Expected {word} to be 1D or 2D, got {hx.dim()}D instead")
        batched = input.dim() == 2
        x = input if batched else input.unsqueeze(0)
        if x.shape[1] != self.input_size:
            raise RuntimeError(
                f"{name}: input has inconsistent input_size: got {x.shape[1]} expected "
                f"{self.input_size}"
            )
        if x.device != weight.device:
            raise RuntimeError(  # torch's type and words (its kernels' device check)
                f"{name}: Input and parameter tensors are not at the same device, found input "
                f"tensor at {x.device} and parameter tensor at {weight.device}; move the input "
                f"(input.to({str(weight.device)!r})) or the cell (cell.to({str(x.device)!r}))"
            )
        self._check_dtype(x, "input", weight)
        if hx is None:
            return x, x.new_zeros(x.shape[0], self.hidden_size), batched
        if hx.device != x.device:
            raise RuntimeError(
                f"{name}: Input and hidden tensors are not at the same device, found input "
                f"tensor at {x.device} and hidden tensor at {hx.device}; move {what} "
                f"({what}.to({str(x.device)!r}))"
            )
        self._check_dtype(hx, what, weight)
        if hx.dim() != input.dim():
            raise RuntimeError(
                f"{name}: {what} should be {input.dim()}D for {input.dim()}D input, got {hx.dim()}D"
            )
        h = hx if batched else hx.unsqueeze(0)
        if h.shape[0] != x.shape[0]:
            raise RuntimeError(
                f"{name}: Input batch size {x.shape[0]} doesn't match {what} batch size "
                f"{h.shape[0]}"
            )
        if h.shape[1] != self.hidden_size:
            raise RuntimeError(
                f"{name}: {what} has inconsistent hidden_size: got {h.shape[1]}, expected "
                f"{self.hidden_size}"
            )
        return x, h, batched

    def _check_dtype(self, t: Tensor, what: str, weight: Tensor) -> None:
        """torch's error (a ``RuntimeError`` from its product) for a dtype other than the
        weights' (under autocast: one that autocast does not cast,
        ``rnnkit.cells.amp.autocast_reconciles``), in one line naming the cell."""
        if t.dtype == weight.dtype:  # (autocast is asked only then: it has no meta device)
            return
        if not (
            torch.is_autocast_enabled(t.device.type) and autocast_reconciles(t.dtype, weight.dtype)
        ):
            raise RuntimeError(
                f"rnnkit.nn.{type(self).__name__}: {what} is {t.dtype} but the weights are "
                f"{weight.dtype}; convert {what} ({what}.to({weight.dtype}))"
            )

    def _call(self, input: Tensor, hx: Any) -> Any:
        """The drop-in's ``forward``. The common case first, in as few looks as possible
        (a decoder calls its cell at every step): a plain float32/float64 CPU input and
        state, the default path, no autocast, no transform (``_plain_cpu_step``), where
        torch's fused operator computes the step on torch's own weights
        (:meth:`_fused_step`, else torch's ``forward``); should torch refuse the input,
        rnnkit's checks say what, naming the cell. Otherwise: FX tracing records one
        node (:func:`fx_leaf_call`), scripting, tracing and an empty input are torch's
        ``forward`` (:meth:`_use_torch`), then :meth:`_torchs`, else rnnkit's step."""
        if _plain_cpu_step(input) and _plain_state(hx):
            try:
                fused = self._fused_step(input, hx)
                return self._torch_class.forward(self, input, hx) if fused is None else fused
            except _DEVICE_FAILURES:
                raise
            except (RuntimeError, ValueError, TypeError):
                if self._use_torch(input):  # there torch's forward is the whole answer
                    raise
                return self._own_step(input, hx)
        traced = fx_leaf_call(self, input, hx)  # type: ignore[arg-type]
        if traced is not None:
            return traced
        if self._use_torch(input):
            return self._torch_class.forward(self, input, hx)
        if (handed := self._torchs(input, hx)) is not None:
            return handed
        return self._own_step(input, hx)

    def _fused_step(self, input: Tensor, hx: Any) -> Any:
        """torch's fused operator of the step on batched input ``(B, I)`` and state (or
        None: zeros), called as torch's ``forward`` calls it, with the weights taken
        from ``_parameters`` (:func:`_parameters_of`); None where the call is not that
        (unbatched, a parametrized or wrapped weight): torch's ``forward`` then."""
        raise NotImplementedError

    def _own_step(self, input: Tensor, hx: Any) -> Any:
        """rnnkit's step, after its checks (each class's)."""
        raise NotImplementedError

    def _use_torch(self, input: Tensor) -> bool:
        """Whether torch's own ``forward`` must compute this step: while scripting or
        tracing, and for an empty input."""
        return torch.jit.is_scripting() or torch.jit.is_tracing() or input.numel() == 0

    def _handed_over(self, input: Tensor) -> bool:
        """Whether torch's own ``forward`` computes this step for speed: where rnnkit's
        layers would run PyTorch's fused kernels (a GPU by default:
        ``torch_nn._fused_computes``), and on the CPU as a drop-in layer's single step
        does (``torch_nn._one_step``: float32 or float64, the default path, no
        autocast): torch's fused step computes the same function, and rnnkit's step of
        separate operations took 1.0–2.8× its time (``benchmarks/README.md``).
        ``use_fused("loop")`` runs rnnkit's step. Not under a ``torch.func`` transform:
        under ``vmap`` torch's fused steps have no batching rule (``aten::gru_cell``:
        torch's slow fallback and its warning; ``aten::lstm_cell``: an error)."""
        if transforming():
            return False
        return isinstance(input, Tensor) and (_fused_computes(input) or _one_step(input))

    def _torchs(self, input: Tensor, hx: Any) -> Any:
        """torch's ``forward`` of the step where :meth:`_handed_over`, else None (also
        where torch refuses the input: rnnkit's checks then say what, naming the cell)."""
        if not self._handed_over(input):
            return None
        try:
            return self._torch_class.forward(self, input, hx)
        except _DEVICE_FAILURES:
            raise  # out of memory or a CUDA error: not the input's fault, not to be rerun
        except (RuntimeError, ValueError, TypeError):
            return None


class RNNCell(_CellDropIn, nn.RNNCell):
    """``torch.nn.RNNCell(input_size, hidden_size, bias=True, nonlinearity="tanh",
    device=None, dtype=None)``: ``h' = φ(W_ih x + W_hh h + b)``.

    >>> cell = RNNCell(3, 4)
    >>> cell(torch.zeros(2, 3)).shape, isinstance(cell, torch.nn.RNNCell)
    (torch.Size([2, 4]), True)
    """

    _torch_class = nn.RNNCell
    nonlinearity: str

    def forward(self, input: Tensor, hx: Tensor | None = None) -> Tensor:
        return self._call(input, hx)

    def _fused_step(self, input: Tensor, hx: Tensor | None) -> Tensor | None:
        weights = _parameters_of(self, RNNCell)
        op = _RNN_CELL_OPS.get(self.nonlinearity)
        if weights is None or op is None or input.dim() != 2:
            return None
        if hx is None:
            hx = input.new_zeros(input.shape[0], self.hidden_size)
        elif hx.dim() != 2:
            return None
        return op(input, hx, *weights)

    def _own_step(self, input: Tensor, hx: Tensor | None) -> Tensor:
        if self.nonlinearity not in _RNN_CELL_OPS:  # torch's cell checks it at each call
            raise RuntimeError(
                f"rnnkit.nn.RNNCell: Unknown nonlinearity: {self.nonlinearity} "
                "(nonlinearity must be 'tanh' or 'relu')"
            )
        w_ih, w_hh, b_ih, b_hh = self._weights()
        x, h, batched = self._batched(input, hx, "hx", w_ih)
        out = rnn_step(x, h, Weights(w_ih, w_hh, b_ih + b_hh, None), self.nonlinearity)
        return out if batched else out.squeeze(0)


class LSTMCell(_CellDropIn, nn.LSTMCell):
    """``torch.nn.LSTMCell(input_size, hidden_size, bias=True, device=None, dtype=None)``:
    ``(h', c') = cell(x, (h, c))``, gates i, f, g, o.

    >>> h, c = LSTMCell(3, 4)(torch.zeros(3))  # unbatched
    >>> h.shape, c.shape
    (torch.Size([4]), torch.Size([4]))
    """

    _torch_class = nn.LSTMCell

    def forward(
        self, input: Tensor, hx: tuple[Tensor, Tensor] | None = None
    ) -> tuple[Tensor, Tensor]:
        return self._call(input, hx)

    def _fused_step(
        self, input: Tensor, hx: tuple[Tensor, Tensor] | None
    ) -> tuple[Tensor, Tensor] | None:
        weights = _parameters_of(self, LSTMCell)
        if weights is None or input.dim() != 2:
            return None
        if hx is None:
            zeros = input.new_zeros(input.shape[0], self.hidden_size)
            hx = (zeros, zeros)
        elif len(hx) != 2 or hx[0].dim() != 2 or hx[1].dim() != 2:
            return None
        return torch.lstm_cell(input, hx, *weights)

    def _own_step(self, input: Tensor, hx: tuple[Tensor, Tensor] | None) -> tuple[Tensor, Tensor]:
        if hx is not None and (not isinstance(hx, tuple | list) or len(hx) != 2):
            raise TypeError("rnnkit.nn.LSTMCell: hx must be the pair (h_0, c_0), as for torch")
        w_ih, w_hh, b_ih, b_hh = self._weights()
        x, h, batched = self._batched(input, None if hx is None else hx[0], "hx[0]", w_ih)
        c = torch.zeros_like(h) if hx is None else self._batched(input, hx[1], "hx[1]", w_ih)[1]
        w = Weights(w_ih, w_hh, b_ih + b_hh, None)
        new = lstm_step(x, LSTMState(h, c), w)
        if batched:
            return new.h, new.c
        return new.h.squeeze(0), new.c.squeeze(0)


class GRUCell(_CellDropIn, nn.GRUCell):
    """``torch.nn.GRUCell(input_size, hidden_size, bias=True, device=None, dtype=None)``:
    rnnkit's GRU step with ``update="keep", reset="after"``, torch's function.

    >>> GRUCell(3, 4)(torch.zeros(2, 3), torch.zeros(2, 4)).shape
    torch.Size([2, 4])
    """

    _torch_class = nn.GRUCell

    def forward(self, input: Tensor, hx: Tensor | None = None) -> Tensor:
        return self._call(input, hx)

    def _fused_step(self, input: Tensor, hx: Tensor | None) -> Tensor | None:
        weights = _parameters_of(self, GRUCell)
        if weights is None or input.dim() != 2:
            return None
        if hx is None:
            hx = input.new_zeros(input.shape[0], self.hidden_size)
        elif hx.dim() != 2:
            return None
        return torch.gru_cell(input, hx, *weights)

    def _own_step(self, input: Tensor, hx: Tensor | None) -> Tensor:
        w_ih, w_hh, b_ih, b_hh = self._weights()
        x, h, batched = self._batched(input, hx, "hx", w_ih)
        H = self.hidden_size
        bias = torch.cat([b_ih[: 2 * H] + b_hh[: 2 * H], b_ih[2 * H :]])
        w = Weights(w_ih, w_hh, bias, b_hh[2 * H :])
        out = gru_step(x, h, w, "keep", "after")
        return out if batched else out.squeeze(0)


def _plain_state(hx: Any) -> bool:
    """Whether a cell's ``hx`` is None, a plain tensor or a tuple of them (no FX proxy,
    which :func:`fx_leaf_call` must see): with a plain input, the common case."""
    if hx is None or type(hx) is Tensor:
        return True
    return type(hx) is tuple and all(type(t) is Tensor for t in hx)


def _parameters_of(cell: nn.Module, cls: type) -> tuple[Any, Any, Any, Any] | None:
    """``(weight_ih, weight_hh, bias_ih, bias_hh)`` (biases None without ``bias``) as
    torch's ``forward`` reads them, straight from ``_parameters`` (reading them as
    attributes goes through ``nn.Module.__getattr__``, ~0.9 µs each); None where
    attributes would find something else: a subclass of ``cls`` (a parametrization
    makes one, whose properties compute the weights) or a weight missing there (moved
    out by ``torch.nn.utils.weight_norm``'s hook or a weight-dropping wrapper, which
    set it as a plain attribute)."""
    if type(cell) is not cls:
        return None
    p = cell._parameters
    try:
        return p["weight_ih"], p["weight_hh"], p["bias_ih"], p["bias_hh"]
    except KeyError:
        return None


#: torch's fused step of a simple cell, by its nonlinearity
_RNN_CELL_OPS = {"tanh": torch.rnn_tanh_cell, "relu": torch.rnn_relu_cell}


# Pickles name the public classes (rnnkit.nn.LSTMCell, ...).
_cls: Any
for _cls in (RNNCell, LSTMCell, GRUCell):
    _cls.__module__ = "rnnkit.nn"
