"""``torch.nn.RNN`` / ``LSTM`` / ``GRU`` with torch's exact interface, run by rnnkit.

Replacing ``from torch import nn`` by ``from rnnkit import nn`` for these three classes
keeps a program's behaviour: the same constructor (positional order, defaults,
``batch_first=False``), the same parameters under the same names (``weight_ih_l0``,
``weight_hh_l0``, ``bias_ih_l0``, ``bias_hh_l0``, ``..._reverse``; a torch ``state_dict``
loads as it is, and the same seed gives the same initial weights), the same ``hx``
handling and state layout ``(L·D, B, H)``, ``PackedSequence`` in and out, unbatched
``(T, I)`` input. The computation is rnnkit's: the stacked layers of
:mod:`rnnkit.layers.stacked` with the explicit BPTT, fed these parameters.

PyTorch keeps two biases per gate; rnnkit's cells one. The cells are given
``b = b_ih + b_hh`` (for the GRU: ``b_ih + b_hh`` for r and z, and ``b_in`` with
``b_hn`` kept apart inside ``r ⊙ (W_hn h + b_hn)``), so the gradients reach both biases as
in torch. torch's GRU is rnnkit's ``update="keep", reset="after"``.

Not supported: ``proj_size`` (no projected LSTM in rnnkit: an error says so) and
``dropout=1``. Dropout between layers draws other random masks than torch's (same
probability). ``docs/torch-nn.md`` lists the differences.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from rnnkit.layers import cell_stacks
from rnnkit.layers.stacked import StackedRecurrent
from rnnkit.types import LSTMState

__all__ = ["GRU", "LSTM", "RNN"]

_GATES = {"RNN": 1, "LSTM": 4, "GRU": 3}


class _TorchRNNBase(nn.Module):
    """The part the three classes share (torch's ``RNNBase``)."""

    mode = "RNN"

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        proj_size: int = 0,
        device: Any = None,
        dtype: torch.dtype | None = None,
        *,
        nonlinearity: str = "tanh",
    ) -> None:
        super().__init__()
        name = type(self).__name__
        if proj_size:
            raise ValueError(
                f"rnnkit.nn.{name}: proj_size={proj_size} is not supported (rnnkit has no "
                "projected LSTM); use torch.nn.LSTM for it"
            )
        for option, value in (("input_size", input_size), ("hidden_size", hidden_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"rnnkit.nn.{name}: {option} must be a positive integer")
        if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
            raise ValueError(f"rnnkit.nn.{name}: num_layers must be a positive integer")
        if isinstance(dropout, bool) or not 0.0 <= float(dropout) < 1.0:
            # torch also takes 1 (every output between layers zeroed): nothing to learn.
            raise ValueError(f"rnnkit.nn.{name}: dropout must be a number in [0, 1)")
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.bias = bias
        self.batch_first = batch_first
        self.dropout = float(dropout)
        self.bidirectional = bidirectional
        self.proj_size = 0
        self.nonlinearity = nonlinearity
        D = 2 if bidirectional else 1
        G = _GATES[self.mode]
        factory = {"device": device, "dtype": dtype}
        # torch's parameters, in torch's registration order (so the same seed gives the
        # same initial weights, and state dicts match key for key).
        self._flat_weights_names: list[str] = []
        for layer in range(num_layers):
            width = input_size if layer == 0 else hidden_size * D
            for direction in range(D):
                sfx = f"_l{layer}" + ("_reverse" if direction else "")
                shapes: list[tuple[int, ...]] = [
                    (G * hidden_size, width),
                    (G * hidden_size, hidden_size),
                ]
                names = ["weight_ih", "weight_hh"]
                if bias:
                    shapes += [(G * hidden_size,), (G * hidden_size,)]
                    names += ["bias_ih", "bias_hh"]
                for n, shape in zip(names, shapes, strict=True):
                    self.register_parameter(n + sfx, nn.Parameter(torch.empty(shape, **factory)))
                    self._flat_weights_names.append(n + sfx)
        self.reset_parameters()
        # The rnnkit stack that computes; its own parameters are placeholders on the meta
        # device (no memory), replaced at each call by the ones derived from the above.
        # Held outside the module tree: it adds nothing to state_dict() or parameters().
        options: dict[str, Any] = {}
        if self.mode == "RNN":
            options["nonlinearity"] = nonlinearity
        elif self.mode == "GRU":
            options = {"update": "keep", "reset": "after"}
        layer_class = {"RNN": cell_stacks.RNN, "LSTM": cell_stacks.LSTM, "GRU": cell_stacks.GRU}[
            self.mode
        ]
        with torch.device("meta"):
            inner = layer_class(
                input_size,
                hidden_size,
                num_layers,
                bidirectional,
                self.dropout,
                batch_first,
                **options,
            )
        self.__dict__["_inner"] = inner
        index = {id(p): n for n, p in inner.named_parameters()}
        self._inner_prefixes = [index[id(c.weight_ih)][: -len("weight_ih")] for c in inner.cells()]

    # ---- torch's small API ------------------------------------------------------------

    def reset_parameters(self) -> None:
        """torch's initialisation: every parameter uniform in ``(-1/√H, 1/√H)``."""
        stdv = 1.0 / math.sqrt(self.hidden_size) if self.hidden_size > 0 else 0
        for weight in self.parameters():
            nn.init.uniform_(weight, -stdv, stdv)

    def flatten_parameters(self) -> None:
        """A no-op (cuDNN's weight layout does not apply); kept so torch code runs."""

    @property
    def all_weights(self) -> list[list[nn.Parameter]]:
        per = 4 if self.bias else 2
        names = self._flat_weights_names
        return [[getattr(self, n) for n in names[i : i + per]] for i in range(0, len(names), per)]

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if self.mode == "RNN" and self.nonlinearity != "tanh":
            s += f", nonlinearity={self.nonlinearity!r}"
        if self.bias is not True:
            s += f", bias={self.bias}"
        if self.batch_first is not False:
            s += f", batch_first={self.batch_first}"
        if self.dropout != 0:
            s += f", dropout={self.dropout}"
        if self.bidirectional is not False:
            s += f", bidirectional={self.bidirectional}"
        return s

    # ---- computation -----------------------------------------------------------------

    def _cell_tensors(self) -> dict[str, Tensor]:
        """The inner stack's parameters from torch's: one bias per gate."""
        H = self.hidden_size
        D = 2 if self.bidirectional else 1
        out: dict[str, Tensor] = {}
        for index, prefix in enumerate(self._inner_prefixes):
            layer, direction = divmod(index, D)
            sfx = f"_l{layer}" + ("_reverse" if direction else "")
            w_ih = getattr(self, "weight_ih" + sfx)
            out[prefix + "weight_ih"] = w_ih
            out[prefix + "weight_hh"] = getattr(self, "weight_hh" + sfx)
            if self.bias:
                b_ih, b_hh = getattr(self, "bias_ih" + sfx), getattr(self, "bias_hh" + sfx)
            else:
                b_ih = b_hh = w_ih.new_zeros(w_ih.shape[0])
            if self.mode == "GRU":
                out[prefix + "bias"] = torch.cat([b_ih[: 2 * H] + b_hh[: 2 * H], b_ih[2 * H :]])
                out[prefix + "bias_hn"] = b_hh[2 * H :]
            else:
                out[prefix + "bias"] = b_ih + b_hh
        return out

    def _check_hx(self, hx: Tensor, B: int, batched: bool, what: str) -> Tensor:
        D = 2 if self.bidirectional else 1
        expected = (self.num_layers * D, B, self.hidden_size)
        if not isinstance(hx, Tensor):
            raise TypeError(f"{what} must be a torch.Tensor, got {type(hx).__name__}")
        if not batched:
            if hx.dim() != 2:
                raise RuntimeError(
                    f"For unbatched 2-D input, {what} should also be 2-D but got "
                    f"{hx.dim()}-D tensor"
                )
            hx = hx.unsqueeze(1)
        if tuple(hx.shape) != expected:
            raise RuntimeError(
                f"Expected {what} size {expected} (num_layers·num_directions, batch, "
                f"hidden_size), got {list(hx.shape)}"
            )
        return hx

    def forward(self, input: Tensor | PackedSequence, hx: Any = None) -> tuple[Any, Any]:
        """torch's forward: ``(output, h_n)``, or ``(output, (h_n, c_n))`` for the LSTM.

        Args:
            input: ``(T, B, I)`` (``(B, T, I)`` with ``batch_first``), ``(T, I)``
                unbatched, or a ``PackedSequence``.
            hx: ``h_0 (L·D, B, H)`` (LSTM: the pair ``(h_0, c_0)``); None = zeros.

        Returns:
            ``output`` of the input's kind (``(T, B, D·H)``, ``(T, D·H)`` or packed) and
            the final states ``(L·D, B, H)``, each sequence's after its last real step.
        """
        name = f"rnnkit.nn.{type(self).__name__}"
        packed_input = input if isinstance(input, PackedSequence) else None
        lengths = None
        if packed_input is not None:
            x, lengths = pad_packed_sequence(packed_input, batch_first=self.batch_first)
            batched = True
        else:
            if not isinstance(input, Tensor):
                raise TypeError(f"{name}: input must be a Tensor or a PackedSequence")
            if input.dim() not in (2, 3):
                raise ValueError(
                    f"{name}: Expected input to be 2D or 3D, got {input.dim()}D instead"
                )
            batched = input.dim() == 3
            x = input if batched else input.unsqueeze(1 if not self.batch_first else 0)
        B = x.shape[0] if self.batch_first else x.shape[1]
        state: Any = None
        if hx is not None:
            if self.mode == "LSTM":
                if not isinstance(hx, tuple | list) or len(hx) != 2:
                    raise TypeError(f"{name}: hx must be the pair (h_0, c_0), as for torch")
                h0 = self._check_hx(hx[0], B, batched, "hx[0]")
                c0 = self._check_hx(hx[1], B, batched, "hx[1]")
                state = LSTMState(self._split(h0), self._split(c0))
            else:
                if isinstance(hx, tuple | list):
                    raise TypeError(f"{name}: hx must be one tensor (L·D, B, H), as for torch")
                state = self._split(self._check_hx(hx, B, batched, "hx"))
        inner: StackedRecurrent = self.__dict__["_inner"]
        inner.train(self.training)
        if lengths is not None:
            lengths = lengths.to(x.device)
        out = functional_call(
            inner, self._cell_tensors(), (x,), {"lengths": lengths, "state": state}
        )
        outputs = out.outputs
        if isinstance(out.state, LSTMState):
            final: Any = (self._join(out.state.h), self._join(out.state.c))
        else:
            final = self._join(out.state)
        if packed_input is not None:
            outputs = _repack(outputs, packed_input, self.batch_first)
        elif not batched:
            outputs = outputs.squeeze(0 if self.batch_first else 1)
            final = tuple(f.squeeze(1) for f in final) if isinstance(final, tuple) else final
            if not isinstance(final, tuple):
                final = final.squeeze(1)
        return outputs, final

    def _split(self, h: Tensor) -> Tensor:
        """``(L·D, B, H)`` → ``(L, D, B, H)`` (torch orders layers, then directions)."""
        D = 2 if self.bidirectional else 1
        return h.reshape(self.num_layers, D, *h.shape[1:])

    def _join(self, h: Tensor) -> Tensor:
        return h.reshape(-1, *h.shape[2:])


def _repack(outputs: Tensor, like: PackedSequence, batch_first: bool) -> PackedSequence:
    """Padded outputs as a PackedSequence laid out exactly like the input ``like``."""
    lengths = _lengths_of(like)
    order = like.sorted_indices
    if order is not None:
        outputs = outputs.index_select(0 if batch_first else 1, order.to(outputs.device))
        lengths = lengths[order.cpu()]
    data = pack_padded_sequence(outputs, lengths, batch_first=batch_first).data
    return PackedSequence(data, like.batch_sizes, like.sorted_indices, like.unsorted_indices)


def _lengths_of(packed: PackedSequence) -> Tensor:
    """Each sequence's length, in the original batch order."""
    sizes = packed.batch_sizes  # (T,), how many sequences are still running at each step
    B = int(sizes[0])
    sorted_lengths = (sizes.unsqueeze(0) > torch.arange(B).unsqueeze(1)).sum(1)  # (B,)
    if packed.unsorted_indices is None:
        return sorted_lengths
    return sorted_lengths[packed.unsorted_indices.cpu()]


class RNN(_TorchRNNBase):
    """``torch.nn.RNN``: ``RNN(input_size, hidden_size, num_layers=1, nonlinearity="tanh",
    bias=True, batch_first=False, dropout=0.0, bidirectional=False, device=None,
    dtype=None)``.

    >>> rnn = RNN(3, 4, 2)
    >>> out, h_n = rnn(torch.zeros(5, 2, 3))  # (T, B, I)
    >>> out.shape, h_n.shape
    (torch.Size([5, 2, 4]), torch.Size([2, 2, 4]))
    """

    mode = "RNN"

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        nonlinearity: str = "tanh",
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        device: Any = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(
                f"Unknown nonlinearity '{nonlinearity}'. Select from 'tanh' or 'relu'."
            )
        super().__init__(
            input_size,
            hidden_size,
            num_layers,
            bias,
            batch_first,
            dropout,
            bidirectional,
            0,
            device,
            dtype,
            nonlinearity=nonlinearity,
        )


class LSTM(_TorchRNNBase):
    """``torch.nn.LSTM``: ``LSTM(input_size, hidden_size, num_layers=1, bias=True,
    batch_first=False, dropout=0.0, bidirectional=False, proj_size=0, device=None,
    dtype=None)``; ``proj_size`` other than 0 is refused.

    >>> lstm = LSTM(3, 4, batch_first=True)
    >>> out, (h_n, c_n) = lstm(torch.zeros(2, 5, 3))  # (B, T, I)
    >>> out.shape, h_n.shape, c_n.shape
    (torch.Size([2, 5, 4]), torch.Size([1, 2, 4]), torch.Size([1, 2, 4]))
    """

    mode = "LSTM"


class GRU(_TorchRNNBase):
    """``torch.nn.GRU``: ``GRU(input_size, hidden_size, num_layers=1, bias=True,
    batch_first=False, dropout=0.0, bidirectional=False, device=None, dtype=None)``.

    >>> out, h_n = GRU(3, 4, bidirectional=True)(torch.zeros(5, 3))  # unbatched (T, I)
    >>> out.shape, h_n.shape
    (torch.Size([5, 8]), torch.Size([2, 4]))
    """

    mode = "GRU"

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        device: Any = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(
            input_size,
            hidden_size,
            num_layers,
            bias,
            batch_first,
            dropout,
            bidirectional,
            0,
            device,
            dtype,
        )
