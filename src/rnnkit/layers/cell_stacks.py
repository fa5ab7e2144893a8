"""``RNN``, ``LSTM`` and ``GRU``: a ``StackedRecurrent`` of one cell kind, built from the
cell's own options.

Each takes the stack's arguments (``input_size``, ``hidden_size``, ``num_layers``,
``bidirectional``, ``dropout``, ``batch_first``, ``recompute`` and the regularizers
``input_dropout``, ``locked_dropout``, ``output_dropout``, ``recurrent_dropout``,
``weight_drop``, ``zoneout``) and passes the rest to every cell it builds; ``RNN`` also
takes one nonlinearity per layer. A bidirectional stack may give its directions
different widths, ``hidden_size=(H_f, H_b)``: outputs ``[h^f_t; h^b_t]`` of
``H_f + H_b`` features, the state ``(L, 2, B, max(H_f, H_b))`` with each direction's
units first (``rnnkit.layers.stacked.StackedRecurrent``). Everything else (the forward
pass, states, windows, resets) is ``rnnkit.layers.stacked``'s.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import ClassVar

from rnnkit.cells.base import CellBase
from rnnkit.cells.gru import GRUCell
from rnnkit.cells.layer_norm import LayerNormGRUCell, LayerNormLSTMCell
from rnnkit.cells.lstm import LSTMCell
from rnnkit.cells.rnn import RNNCell
from rnnkit.errors import ConfigError
from rnnkit.layers.regularization import REGULARIZERS
from rnnkit.layers.stacked import StackedRecurrent, direction_widths

__all__ = ["GRU", "LSTM", "RNN"]


def _split(options: dict[str, object]) -> dict[str, float]:
    """Remove the stack's regularizers (the stack's own keywords, the rest go to the
    cells) from ``options`` and return them."""
    return {k: options.pop(k) for k in REGULARIZERS if k in options}  # type: ignore[misc]


class _CellStack(StackedRecurrent):
    """A stack of one cell kind: the constructor of ``RNN``, ``LSTM`` and ``GRU``."""

    # The cell's constructor: (input_size, hidden_size, **cell_options) → a cell; each
    # kind takes its own options (nonlinearity, forget_bias, update, reset, init).
    cell_class: ClassVar[Callable[..., CellBase]]

    def __init__(
        self,
        input_size: int,
        hidden_size: int | tuple[int, int],
        num_layers: int = 1,
        bidirectional: bool = False,
        dropout: float = 0.0,
        batch_first: bool = True,
        recompute: int | None = None,
        **cell_options: object,
    ) -> None:
        cell_class = self.cell_class
        regularizers = _split(cell_options)
        # StackedRecurrent asks for the cells layer by layer, bottom first (forward
        # direction, then backward): the k-th cell built is direction k % D.
        widths = direction_widths(hidden_size, bidirectional)
        built = itertools.count()

        def factory(width: int) -> CellBase:
            return cell_class(width, widths[next(built) % len(widths)], **cell_options)

        super().__init__(
            factory,
            input_size,
            hidden_size,
            num_layers,
            bidirectional,
            dropout,
            batch_first,
            recompute,
            **regularizers,
        )


class RNN(_CellStack):
    """Stacked (bi)directional Elman layers; ``nonlinearity`` as in ``RNNCell``, one for
    every layer or a sequence of one per layer (bottom first).

    >>> import torch
    >>> out = RNN(3, 4, num_layers=2, bidirectional=True)(torch.zeros(2, 5, 3))
    >>> out.outputs.shape, out.state.shape
    (torch.Size([2, 5, 8]), torch.Size([2, 2, 2, 4]))
    >>> [c.nonlinearity for c in RNN(3, 4, 2, nonlinearity=("tanh", "sigmoid")).cells()]
    ['tanh', 'sigmoid']
    >>> out = RNN(3, (4, 2), bidirectional=True)(torch.zeros(2, 5, 3))  # widths 4 and 2
    >>> out.outputs.shape, out.state.shape
    (torch.Size([2, 5, 6]), torch.Size([1, 2, 2, 4]))
    """

    cell_class = RNNCell

    def __init__(
        self,
        input_size: int,
        hidden_size: int | tuple[int, int],
        num_layers: int = 1,
        bidirectional: bool = False,
        dropout: float = 0.0,
        batch_first: bool = True,
        recompute: int | None = None,
        nonlinearity: str | Sequence[str] = "tanh",
        **cell_options: object,
    ) -> None:
        regularizers = _split(cell_options)
        per_layer = None if isinstance(nonlinearity, str) else list(nonlinearity)
        if per_layer is not None and len(per_layer) != num_layers:
            raise ValueError(
                f"nonlinearity has {len(per_layer)} entries for {num_layers} layers: "
                "give one, or one per layer"
            )
        # StackedRecurrent asks for the cells layer by layer, bottom first (forward
        # direction, then backward): the k-th cell built belongs to layer k // directions.
        widths = direction_widths(hidden_size, bidirectional)
        directions = len(widths)
        built = itertools.count()

        def factory(width: int) -> CellBase:
            index = next(built)
            phi = nonlinearity if per_layer is None else per_layer[index // directions]
            H = widths[index % directions]
            return RNNCell(width, H, nonlinearity=phi, **cell_options)  # type: ignore[arg-type]

        StackedRecurrent.__init__(
            self,
            factory,
            input_size,
            hidden_size,
            num_layers,
            bidirectional,
            dropout,
            batch_first,
            recompute,
            **regularizers,
        )


def _check_flag(layer_norm: object) -> None:
    """``layer_norm`` must be a bool: ``"no"`` or ``"false"`` is truthy, and built the
    layer-normalised cells in silence."""
    if not isinstance(layer_norm, bool):
        raise ConfigError(f"layer_norm must be True or False, got {layer_norm!r}")


def _lstm_cell(input_size: int, hidden_size: int, layer_norm: bool = False, **options) -> CellBase:
    """An ``LSTMCell``, or with ``layer_norm=True`` a ``LayerNormLSTMCell``."""
    _check_flag(layer_norm)
    if not layer_norm:
        return LSTMCell(input_size, hidden_size, **options)
    if "forget_bias" in options:
        raise ConfigError("layer_norm=True takes no forget_bias (the gates are normalised)")
    return LayerNormLSTMCell(input_size, hidden_size, **options)


class LSTM(_CellStack):
    """Stacked (bi)directional LSTM layers; the state is ``LSTMState(h, c)``.
    ``layer_norm=True`` builds layer-normalised cells (``rnnkit.cells.layer_norm``).

    >>> import torch
    >>> out = LSTM(3, 4)(torch.zeros(2, 5, 3), lengths=torch.tensor([5, 2]))
    >>> out.state.h.shape
    torch.Size([1, 1, 2, 4])
    """

    cell_class = staticmethod(_lstm_cell)


def _gru_cell(
    input_size: int, hidden_size: int, layer_norm: bool = False, reset: str = "before", **options
) -> CellBase:
    """A ``GRUCell``, or with ``layer_norm=True`` a ``LayerNormGRUCell`` (reset after)."""
    _check_flag(layer_norm)
    if not layer_norm:
        return GRUCell(input_size, hidden_size, reset=reset, **options)
    if reset != "after":
        raise ConfigError(
            f"layer_norm=True needs reset='after' (the normalised GRU's form), got {reset!r}"
        )
    return LayerNormGRUCell(input_size, hidden_size, **options)


class GRU(_CellStack):
    """Stacked (bi)directional GRU layers; ``update``/``reset`` as in ``GRUCell``;
    ``layer_norm=True`` (with ``reset="after"``) builds layer-normalised cells.

    >>> import torch
    >>> GRU(3, 4, update="keep", reset="after")(torch.zeros(2, 5, 3)).outputs.shape
    torch.Size([2, 5, 4])
    """

    cell_class = staticmethod(_gru_cell)
