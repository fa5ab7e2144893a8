"""Layers that compose: directions side by side, layers on top of each other.

``Bidirectional`` holds a forward and a reverse ``Recurrent`` and concatenates their
outputs, ``h_t = [h^f_t; h^b_t]``; ``StackedRecurrent`` feeds each layer's outputs to the
next (dropout between layers). ``RNN``/``LSTM``/``GRU`` are conveniences that build this
from cells (``rnnkit.layers.cell_stacks``; importable from here as well). Every layer
returns ``RecurrentOutput(outputs, state)`` whatever the flags.

With ``window=τ`` the stack trains with the windowed BPTT(τ) of the whole stack, one
autograd node over all layers (``rnnkit.layers.windowed``); ``resets`` zero the state of
some rows inside the batch (document starts): between resets the layers run as usual.
Where PyTorch's fused kernels run the layers (cuDNN on a GPU) and nothing acts between
them, the whole stack is one fused call; a call of one time step is one fused cell
operator per layer and direction (``rnnkit.layers.fused_stack``).
"""

from __future__ import annotations

import itertools
import sys
import warnings
from collections.abc import Callable
from types import FrameType
from typing import NamedTuple, cast, overload

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rnnkit.bptt.recurrence import takes_projected, takes_resets
from rnnkit.bptt.tracing import tracing
from rnnkit.cells.amp import autocast_devices_on, low_precision_to
from rnnkit.cells.base import CellBase
from rnnkit.errors import ConfigError
from rnnkit.layers.fused_stack import (
    one_step,
    one_step_applies,
    quick_step,
    run_whole_stack,
    whole_stack_form,
)
from rnnkit.layers.masking import resolve_mask
from rnnkit.layers.recurrent import Recurrent
from rnnkit.layers.regularization import (
    REGULARIZERS,
    CellMasks,
    StackMasks,
    check_masks,
    check_probability,
    draw_stack_masks,
    locked,
    steps_of,
)
from rnnkit.layers.windowed import run_windowed_stack
from rnnkit.types import LSTMState, RecurrentOutput, State

__all__ = [
    "Bidirectional",
    "StackedRecurrent",
    "between_layers",
    "direction_widths",
    "reset_rows",
]


@overload
def reset_rows(state: None, rows: Tensor) -> None: ...
@overload
def reset_rows(state: State, rows: Tensor) -> State: ...
def reset_rows(state: State | None, rows: Tensor) -> State | None:
    """Zero the state ``(L, D, B, H)`` of the batch rows where ``rows (B,)`` is True
    (selection, no ×0)."""
    if state is None:
        return None
    keep = ~rows.view(1, 1, -1, 1)
    if isinstance(state, LSTMState):
        return LSTMState(*(torch.where(keep, s, 0.0) for s in state))
    return torch.where(keep, state, 0.0)


class Bidirectional(nn.Module):
    """A forward and a backward ``Recurrent`` over the same input; outputs concatenated.

    The backward direction reads each sequence from its own last real step.

    Args:
        forward_layer: a ``Recurrent``.  backward_layer: a ``Recurrent(reverse=True)``.
        batch_first: inputs, masks and outputs are ``(B, T, ·)``, as everywhere else in
            the library; False means ``(T, B, ·)``, the layout of ``Recurrent`` itself
            (a stack runs its bidirectional layers so, converting its input once).
    """

    # one pickled before the layout was a choice read time-major (its __init__ does not run)
    batch_first: bool = False

    def __init__(
        self, forward_layer: Recurrent, backward_layer: Recurrent, *, batch_first: bool = True
    ) -> None:
        super().__init__()
        if forward_layer.reverse or not backward_layer.reverse:
            raise ValueError("Bidirectional needs a forward layer and a reverse=True layer")
        self.directions = nn.ModuleList([forward_layer, backward_layer])
        self.batch_first = _flag("batch_first", batch_first)

    def forward(
        self, x, mask=None, states=None, window=None, recompute=None, masks=None, time_major=None
    ):
        """``x (B, T, I)`` → ``(outputs (B, T, 2H), [final_f, final_b])`` (``(T, B, ·)``
        for both if not ``batch_first``); ``mask (B, T)`` (``(T, B)``) bool or None;
        ``masks``: one ``CellMasks`` per direction, or None. ``time_major``: this call's
        layout, whatever ``batch_first`` says (True ``(T, B, ·)``, False ``(B, T, ·)``;
        None: the layer's own). A stack calls its layers time-major, so a layer put into
        a stack reads the stack's tensors."""
        batch_first = (
            self.batch_first if time_major is None else not _flag("time_major", time_major)
        )
        if batch_first:
            x = x.transpose(0, 1)
            mask = None if mask is None else mask.transpose(0, 1)
        outs, finals = [], []
        for d, layer in enumerate(self.directions):
            state = None if states is None else states[d]
            cell_masks = None if masks is None else masks[d]
            o, s = layer(x, mask, state, window, recompute, masks=cell_masks)
            outs.append(o)
            finals.append(s)
        out = torch.cat(outs, dim=-1)
        return (out.transpose(0, 1) if batch_first else out), finals


def _padded(t: Tensor, width: int) -> Tensor:
    """``t (B, H_d)`` with zero units appended up to ``width`` (directions of different
    widths share one state tensor)."""
    return t if t.shape[-1] == width else F.pad(t, (0, width - t.shape[-1]))


def stack_states(finals: list[list[State]], is_lstm: bool) -> State:
    """``finals[l][d]`` of ``(B, H_d)`` → ``(L, D, B, max H_d)`` (or an ``LSTMState`` of
    them); a narrower direction's units come first, zeros after them."""
    L, D = len(finals), len(finals[0])
    if is_lstm:
        # An LSTM stack's directions all end in an LSTMState, the others in a tensor.
        pairs = cast("list[list[LSTMState]]", finals)
        return LSTMState(
            _stacked([s.h for layer in pairs for s in layer], L, D),
            _stacked([s.c for layer in pairs for s in layer], L, D),
        )
    return _stacked([s for layer in cast("list[list[Tensor]]", finals) for s in layer], L, D)


def _stacked(flat: list[Tensor], L: int, D: int) -> Tensor:
    """``L·D`` tensors ``(B, H_d)`` (layer-major) → ``(L, D, B, max H_d)``, one stack."""
    H = max(t.shape[-1] for t in flat)
    stacked = torch.stack([_padded(t, H) for t in flat])
    return stacked.view(L, D, *stacked.shape[1:])


def between_layers(dropout: float, num_layers: int) -> float:
    """The ``dropout`` of a stack of ``num_layers``: it acts between layers, so a stack of
    one has none (and would warn that it does nothing, as ``torch.nn.LSTM`` does).

    >>> between_layers(0.3, 2), between_layers(0.3, 1)
    (0.3, 0.0)
    """
    return dropout if num_layers > 1 else 0.0


def _first_frame_outside_rnnkit() -> int:
    """The ``stacklevel`` of the first caller outside the rnnkit package, for a warning
    raised by the function calling this: the user's own line, however many of rnnkit's
    constructors (``LSTM``, a subclass without an ``__init__``) lie between."""
    # by module name, not file: an install of .pyc files compiled elsewhere (PyInstaller,
    # compileall -d) carries the compile-time paths
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and _in_rnnkit(frame):
        frame, level = frame.f_back, level + 1
    return level


def _in_rnnkit(frame: FrameType) -> bool:
    return str(frame.f_globals.get("__name__", "")).partition(".")[0] == "rnnkit"


def _flag(name: str, value: object) -> bool:
    """A switch given as ``True`` or ``False``; anything else is refused, where its truth
    would decide in silence (``bidirectional="no"`` is truthy)."""
    if not isinstance(value, bool):
        raise ConfigError(f"{name} must be True or False, got {value!r}")
    return value


def direction_widths(hidden_size: int | tuple[int, int], bidirectional: bool) -> tuple[int, ...]:
    """The width of every direction: ``hidden_size`` for each, or a pair ``(H_f, H_b)``
    (forward, backward) for a bidirectional layer whose directions differ.

    >>> direction_widths(4, True), direction_widths((64, 32), True), direction_widths(4, False)
    ((4, 4), (64, 32), (4,))
    """
    if isinstance(hidden_size, int) and not isinstance(hidden_size, bool):
        if hidden_size < 1:
            raise ValueError(f"hidden_size must be a positive integer, got {hidden_size!r}")
        return (hidden_size,) * (2 if bidirectional else 1)
    widths = tuple(hidden_size) if isinstance(hidden_size, (tuple, list)) else ()
    ok = len(widths) == 2 and all(
        isinstance(w, int) and not isinstance(w, bool) and w >= 1 for w in widths
    )
    if not ok:
        raise ValueError(
            f"hidden_size must be a positive integer or a pair (H_f, H_b), got {hidden_size!r}"
        )
    if not bidirectional:
        raise ValueError(
            f"hidden_size={tuple(widths)} gives each direction its width: it needs "
            "bidirectional=True"
        )
    return widths


def _directions(layer: nn.Module) -> list[Recurrent]:
    """One layer of a stack as its directions: forward, then reverse if bidirectional."""
    # A stack's layers are the Recurrent and Bidirectional modules its constructor built;
    # nn.ModuleList types its items as Module only.
    dirs = layer.directions if isinstance(layer, Bidirectional) else [layer]
    return [cast(Recurrent, d) for d in dirs]


class _Resets(NamedTuple):
    """Checked resets: ``bt (B, T)`` bool on the input's device, and the columns where
    some row resets, found where the caller made them (on the host, without a wait)."""

    bt: Tensor
    columns: list[int]


class StackedRecurrent(nn.Module):
    """A stack of recurrent layers, each one or two directions, batch-first by default.

    Args:
        cell_factory: ``cell_factory(input_size)`` returns a new cell; called once per
            layer and direction (bottom layer first, forward direction before backward),
            each cell as wide as its direction.
        input_size: ``I``.  hidden_size: ``H``, or for a bidirectional stack a pair
            ``(H_f, H_b)``: the forward direction ``H_f`` units wide, the backward ``H_b``
            (the outputs ``[h^f_t; h^b_t]`` are ``H_f + H_b`` wide, :attr:`output_size`,
            and every layer above reads that width). The state is then
            ``(L, 2, B, max(H_f, H_b))``: direction ``d``'s units first, zeros after them
            (an initial state is read the same way, the units past ``H_d`` ignored).
        num_layers: ``L`` ≥ 1.  bidirectional: ``D = 2`` if True.
        dropout: dropout probability on the outputs of every layer but the last.
        batch_first: inputs/outputs are ``(B, T, ·)``; False means ``(T, B, ·)`` and must
            be asked for (a layout is never guessed from shapes).
        recompute: None (store every step for the backward), or k ≥ 1: store only the
            state every k steps and recompute the rest during the backward — memory
            ``O(T/k + k)`` per layer instead of ``O(T)`` for about a third more time
            (``rnnkit.bptt.recompute``; k ≈ √T is the usual choice). Settable attribute.
        input_dropout: variational dropout on the stack's input: one mask per sequence,
            the same at every step.
        locked_dropout: dropout on the input of every layer but the first with one mask
            per sequence (unlike ``dropout``, which draws one per step).
        output_dropout: the same on the last layer's outputs.
        recurrent_dropout: one mask per sequence on ``h_{t-1}`` where the recurrent
            product reads it: ``(h_{t-1} ⊙ m) W_hhᵀ``.
        weight_drop: DropConnect on every ``weight_hh``, one mask per forward call.
        zoneout: each unit keeps its previous value (``h``; the LSTM's ``c`` too) with
            this probability at each step; at evaluation ``h_t = p h_{t-1} + (1 − p) h̃_t``.

    Every probability is in ``[0, 1)``; the masks are drawn in training only (or given
    to :meth:`forward`, see :meth:`draw_masks`); docs/regularization.md has the
    equations. ``recurrent_dropout`` and ``zoneout`` run in either time loop, never on
    PyTorch's fused kernels (``rnnkit.bptt.regularized``).
    """

    def __init__(
        self,
        cell_factory: Callable[[int], CellBase],
        input_size: int,
        hidden_size: int | tuple[int, int],
        num_layers: int = 1,
        bidirectional: bool = False,
        dropout: float = 0.0,
        batch_first: bool = True,
        recompute: int | None = None,
        *,
        input_dropout: float = 0.0,
        locked_dropout: float = 0.0,
        output_dropout: float = 0.0,
        recurrent_dropout: float = 0.0,
        weight_drop: float = 0.0,
        zoneout: float = 0.0,
    ) -> None:
        super().__init__()
        if recompute is not None and (
            isinstance(recompute, bool) or not isinstance(recompute, int) or recompute < 1
        ):
            raise ValueError(f"recompute must be a positive integer or None, got {recompute!r}")
        self.recompute = recompute
        if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
            raise ValueError(f"num_layers must be a positive integer, got {num_layers!r}")
        if not 0.0 <= float(dropout) < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
        if dropout and num_layers == 1:  # as torch.nn.LSTM warns: nothing is dropped
            warnings.warn(
                f"dropout={dropout!r} does nothing with num_layers=1: it acts between stacked "
                "layers; input_dropout= and output_dropout= act on one layer's input and "
                "outputs",
                UserWarning,
                stacklevel=_first_frame_outside_rnnkit(),
            )
        self.input_dropout = check_probability("input_dropout", input_dropout)
        self.locked_dropout = check_probability("locked_dropout", locked_dropout)
        self.output_dropout = check_probability("output_dropout", output_dropout)
        self.recurrent_dropout = check_probability("recurrent_dropout", recurrent_dropout)
        self.weight_drop = check_probability("weight_drop", weight_drop)
        self.zoneout = check_probability("zoneout", zoneout)
        self.input_size = input_size
        bidirectional = _flag("bidirectional", bidirectional)
        batch_first = _flag("batch_first", batch_first)
        self.bidirectional = bidirectional
        #: the width of each direction (forward first)
        self.hidden_sizes: tuple[int, ...] = direction_widths(hidden_size, self.bidirectional)
        #: the width of the outputs, Σ_d H_d
        self.output_size = sum(self.hidden_sizes)
        self.num_layers = num_layers
        self.num_directions = 2 if bidirectional else 1
        self.dropout = float(dropout)
        self.batch_first = batch_first
        layers: list[nn.Module] = []
        for layer_index in range(num_layers):
            width = input_size if layer_index == 0 else self.output_size
            directions = []
            for d, H in enumerate(self.hidden_sizes):
                cell = cell_factory(width)
                if cell.hidden_size != H:
                    raise ValueError(
                        f"cell_factory built a cell of {cell.hidden_size} units for a direction "
                        f"of {H}"
                    )
                directions.append(Recurrent(cell, d == 1))
            layers.append(
                Bidirectional(*directions, batch_first=False)
                if self.bidirectional
                else directions[0]
            )
        self.layers = nn.ModuleList(layers)
        self.drop = nn.Dropout(self.dropout)
        self._cell_tuple()  # kept from now on (a traced forward finds it, mutates nothing)

    @property
    def hidden_size(self) -> int:
        """``H``, the width of every direction; a ``ValueError`` for directions of
        different widths (read :attr:`hidden_sizes`, :attr:`output_size`): what needs one
        width (a model's bridge, ``torch.nn``) cannot take such a stack."""
        if len(set(self.hidden_sizes)) > 1:
            raise ValueError(
                f"this stack's directions are {self.hidden_sizes} units wide: no single "
                "hidden_size (see hidden_sizes and output_size)"
            )
        return self.hidden_sizes[0]

    @property
    def is_lstm(self) -> bool:
        return self._first_cell().is_lstm

    def _first_cell(self) -> CellBase:
        """The first layer's (forward) cell."""
        return self._cell_tuple()[0]

    def cells(self) -> list[CellBase]:
        """All cells, ordered by layer then direction."""
        return list(self._cell_tuple())

    def _cell_tuple(self) -> tuple[CellBase, ...]:
        """:meth:`cells`, kept between calls: a call asks for them several times, and
        walking the layers' modules costs more than the rest of a small call's checks.
        The same tuple while every cell is the same module (what is kept per stack, such
        as the single step's plan, is keyed on it); a new one when a layer, a direction or
        a cell was replaced (``stack.layers[0].cell = ...``)."""
        # (from _modules directly: self.layers goes through nn.Module.__getattr__, ~0.7 µs)
        cells = tuple(
            cast(CellBase, cast(nn.Module, d)._modules["cell"])
            for layer in cast(nn.Module, self._modules["layers"])._modules.values()
            for d in (
                cast(nn.Module, layer._modules["directions"])._modules.values()
                if isinstance(layer, Bidirectional)
                else (cast(nn.Module, layer),)
            )
        )
        kept = self.__dict__.get("_cells_kept")
        if kept is None or kept != cells:  # Modules compare by identity
            kept = cells
            self.__dict__["_cells_kept"] = kept
        return kept

    def _check_input(self, x: Tensor, projected: bool = False) -> None:
        if not isinstance(x, Tensor):
            raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
        layout = "(B, T, I)" if self.batch_first else "(T, B, I)"
        p = self._first_cell().weight_ih
        # a projected input is the first layer's input product: G·H wide
        width = p.shape[0] if projected else self.input_size
        if x.dim() != 3:
            raise ValueError(
                f"x must have 3 dimensions {layout} with I = {width}, got shape {tuple(x.shape)}"
            )
        if x.shape[2] != width:
            raise ValueError(f"x must have shape {layout} with I = {width}, got {tuple(x.shape)}")
        if x.dtype != p.dtype or x.device != p.device:
            raise TypeError(
                f"{type(self).__name__}: x is {x.dtype} on {x.device} but the parameters "
                f"are {p.dtype} on {p.device}; convert one of them (e.g. layer.to(x))"
            )

    def _check_state(self, state: State | None, x: Tensor) -> None:
        """A ``TypeError``/``ValueError`` naming what is wrong with an initial state for
        ``x (T, B, I)``: its type, shape ``(L, D, B, H)``, dtype or device."""
        if state is None:
            return
        B = x.shape[1]
        L, D, H = self.num_layers, self.num_directions, max(self.hidden_sizes)
        expected = (L, D, B, H)
        if self.is_lstm:
            if not isinstance(state, LSTMState):
                raise TypeError("the state of an LSTM layer must be LSTMState(h, c)")
            parts = {"state.h": state.h, "state.c": state.c}
        else:
            if isinstance(state, tuple):
                raise TypeError("the state of an RNN/GRU layer is one tensor (L, D, B, H)")
            parts = {"state": state}
        for name, t in parts.items():
            if not isinstance(t, Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
            if tuple(t.shape) != expected:
                raise ValueError(
                    f"{name} must have shape (L, D, B, H) = {expected}, got {tuple(t.shape)}"
                )
            if t.dtype != x.dtype or t.device != x.device:
                where = f"{type(self).__name__}: {name} is {t.dtype} on {t.device}"
                raise TypeError(f"{where}, x is {x.dtype} on {x.device}; convert {name}")

    def split_state(self, state: State | None) -> list[list[State]] | None:
        """A checked initial state (:meth:`_check_state`) as ``[l][d]`` views per layer
        and direction, each ``(B, H_d)`` (an ``LSTMState`` of them), or None."""
        if state is None:
            return None
        if isinstance(state, LSTMState):  # is_lstm: checked
            hs, cs = self._per_direction(state.h), self._per_direction(state.c)
            return [
                [LSTMState(h, c) for h, c in zip(*lc, strict=True)]
                for lc in zip(hs, cs, strict=True)
            ]
        return cast("list[list[State]]", self._per_direction(state))

    def _per_direction(self, t: Tensor) -> list[list[Tensor]]:
        """``t (L, D, B, H)`` → ``[l][d]`` views ``(B, H_d)``: a narrower direction reads
        its own first units."""
        L, D, w = self.num_layers, self.num_directions, self.hidden_sizes
        flat = t.view(L * D, *t.shape[2:]).unbind(0)  # one operator for all the views
        if len(set(w)) > 1:
            flat = tuple(f[:, : w[i % D]] for i, f in enumerate(flat))
        return [list(flat[l * D : (l + 1) * D]) for l in range(L)]

    def input_table(self, embedding: Tensor) -> Tensor:
        """``E W_ihᵀ`` ``(V, G·H)``: the first layer's input product of every row of an
        embedding ``E (V, I)`` (no bias), for ``forward(..., projected=True)`` with
        ``x = table[tokens]``. Differentiable: the gradients reach ``E`` and ``W_ih``."""
        return embedding @ self._first_cell().weight_ih.T

    def takes_projected(self, like: Tensor) -> bool:
        """Whether ``forward(..., projected=True)`` runs for inputs like ``like``: one
        direction, no ``recompute``, no input dropout in force (its mask is on the input
        itself, not on its product; recurrent dropout and zoneout act inside the loop and
        take a projected input as they take any), and the compiled loop for these tensors
        (CPU float32/float64, not while tracing)."""
        if self.bidirectional or self.recompute is not None or autocast_devices_on():
            return False
        if self.training and self.input_dropout:
            return False
        layer = _directions(self.layers[0])[0]
        cell = layer.cell
        return takes_projected(cell.kernel, like, cell.weights())

    def forward(
        self,
        x: Tensor,
        lengths: Tensor | None = None,
        mask: Tensor | None = None,
        state: State | None = None,
        window: int | None = None,
        resets: Tensor | None = None,
        projected: bool = False,
        masks: StackMasks | None = None,
    ) -> RecurrentOutput:
        """Run the stack over a batch of sequences.

        Args:
            x: ``(B, T, I)`` (``(T, B, I)`` if ``batch_first=False``).
            lengths: ``(B,)`` integers in ``[0, T]``, or None.
            mask: ``(B, T)`` bool, True at real steps (holes hold the state), or None.
                Not both ``lengths`` and ``mask``.
            state: initial state ``(L, D, B, H)`` (``LSTMState`` for LSTM), None = zeros.
            window: None for full BPTT; τ ≥ 1 for the exact windowed BPTT(τ) of the whole
                stack: the loss at step t reaches steps ``t−τ … t`` of every layer.
            resets: ``(B, T)`` bool (``(T, B)`` if not ``batch_first``), True where a new
                document starts: the state entering that step is zero in every layer, and
                no gradient crosses it. Unidirectional stacks only.
            projected: ``x`` is the first layer's input product ``x W_ihᵀ`` (no bias),
                ``(B, T, G·H)`` — e.g. ``input_table(E)[tokens]``, which for a vocabulary
                smaller than the batch's tokens costs far less than the product; where
                :meth:`takes_projected` says so, with full BPTT and no ``resets``.
            masks: the regularizers' masks for this call (:meth:`draw_masks`); None: drawn
                here (in training; at evaluation only zoneout's expectation applies).

        Returns:
            ``RecurrentOutput(outputs (B, T, D·H), state (L, D, B, H))`` (outputs
            ``H_f + H_b`` and state ``max(H_f, H_b)`` wide for directions of different
            widths); the final state of each sequence is its state after its last real step.
        """
        plain = lengths is None and mask is None and window is None and resets is None
        # (a subclass's own draw_masks: the masks it draws decide, below)
        own_masks = type(self).draw_masks is StackedRecurrent.draw_masks
        if plain and masks is None and not projected and own_masks:
            # a generator's or a decoder's single step: its checks in a few looks
            quick = quick_step(self, x, state)
            if quick is not None:
                return quick
        if autocast_devices_on():  # a float16/bfloat16 product upstream: see rnnkit.cells.amp
            dtype = self._first_cell().weight_ih.dtype
            x, state = low_precision_to(x, dtype), low_precision_to(state, dtype)
        self._check_input(x, projected)
        if projected and (window is not None or resets is not None or not self.takes_projected(x)):
            raise ValueError(
                "projected=True needs takes_projected(x) (one direction, no recompute, the "
                "compiled loop), full BPTT and no resets"
            )
        if window is not None and (
            isinstance(window, bool) or not isinstance(window, int) or window < 1
        ):
            raise ValueError(f"window must be a positive integer or None, got {window!r}")
        if window is not None and self.recompute is not None:
            raise ValueError(
                f"window={window} cannot be combined with recompute={self.recompute}: "
                "windowed BPTT keeps every step; set layer.recompute = None"
            )
        mask_bt = resolve_mask(x, lengths, mask, batch_first=self.batch_first)
        resets_found = self._check_resets(resets, x)
        resets_bt = None if resets_found is None else resets_found.bt
        xt = x.transpose(0, 1) if self.batch_first else x  # (T, B, I)
        mask_t = mask_bt.T if mask_bt is not None else None  # (T, B)
        self._check_state(state, xt)
        if masks is None:
            masks = self.draw_masks(xt.shape[1], xt.shape[0], xt)
        else:
            masks = check_masks(masks, self, xt.shape[1], xt.shape[0])
        if projected and masks is not None and masks.input is not None:
            raise ConfigError("input_dropout needs the input itself, not its product")
        windowed = window is not None and self._needs_grad(xt, state)
        if window is not None and not windowed and not tracing():
            window = None  # a window shapes the gradient only: without one, the plain paths
        if windowed and window is not None and xt.shape[0] > 0:
            init = self.split_state(state)
            columns = [] if resets_found is None else resets_found.columns
            h, finals = self._run_windowed(xt, mask_t, init, window, resets_bt, columns, masks)
        elif resets_bt is not None and self._resets_in_one_call(xt, mask_t, window):
            assert resets_found is not None
            init = self.split_state(state)
            drops = self._piece_drops(xt, resets_found.columns)
            h, finals = self._run_layers(
                xt, mask_t, init, window, masks=masks, reset=resets_bt.T, drops=drops
            )
        elif resets_bt is not None:
            assert resets_found is not None
            return self._run_pieces(x, mask_bt, state, window, resets_found, masks)
        elif one_step_applies(self, xt, window, projected, masks):
            h, ends = one_step(self, xt, mask_t, state)
            L, D = self.num_layers, self.num_directions
            stacked_parts = [_stacked(part, L, D) for part in ends]
            outputs = h.transpose(0, 1).contiguous() if self.batch_first else h
            final = LSTMState(*stacked_parts) if len(ends) == 2 else stacked_parts[0]
            return RecurrentOutput(outputs, final)
        else:
            whole = whole_stack_form(self, xt, mask_t, window, projected, masks)
            if whole is not None:
                h, stacked_state = run_whole_stack(self, xt, state, *whole, masks)
                outputs = h.transpose(0, 1).contiguous() if self.batch_first else h
                return RecurrentOutput(outputs, stacked_state)
            init = self.split_state(state)
            h, finals = self._run_layers(xt, mask_t, init, window, projected, masks)
        outputs = h.transpose(0, 1).contiguous() if self.batch_first else h
        return RecurrentOutput(outputs, stack_states(finals, self.is_lstm))

    def _run_layers(
        self,
        xt: Tensor,
        mask_t: Tensor | None,
        init: list[list[State]] | None,
        window,
        projected: bool = False,
        masks: StackMasks | None = None,
        reset: Tensor | None = None,
        drops: list[Tensor | None] | None = None,
    ) -> tuple[Tensor, list[list[State]]]:
        """Layer after layer, one autograd node per direction (``(T, B, ·)`` inside);
        ``projected``: ``xt`` is the first layer's input product; ``reset (T, B)``: each
        layer zeroes those rows' state inside its call (:meth:`_resets_in_one_call`);
        ``drops``: the dropout multiplier of each layer's input, drawn before
        (:meth:`_piece_drops`), else drawn here."""
        finals: list[list[State]] = []
        h = xt if masks is None else locked(xt, masks.input)
        D = self.num_directions
        for index, layer in enumerate(self.layers):
            given = None if drops is None else drops[index]
            if given is not None:
                h = h * given
            elif index > 0 and self.dropout > 0:
                # nn.Dropout draws its mask in the memory order of h: always over (T, B, ·)
                # (not the batch-first view the compiled loop may hand on), so that the
                # draws, and a trained model, do not depend on which loop or path ran
                h = self.drop(h.contiguous() if self.drop.training else h)
            cell_masks: tuple[CellMasks, ...] | None = None
            if masks is not None:
                h = locked(h, masks.between[index])
                cell_masks = masks.cells[index * D : (index + 1) * D]
            layer_state = None if init is None else init[index]
            if isinstance(layer, Bidirectional):
                h, fin = layer(
                    h, mask_t, layer_state, window, self.recompute, cell_masks, time_major=True
                )
            else:
                s0 = None if layer_state is None else layer_state[0]
                first = projected and index == 0
                one = None if cell_masks is None else cell_masks[0]
                h, f = layer(h, mask_t, s0, window, self.recompute, first, one, reset)
                fin = [f]
            finals.append(fin)
        return (h if masks is None else locked(h, masks.output)), finals

    def draw_masks(self, batch_size: int, steps: int, like: Tensor) -> StackMasks | None:
        """The regularizers' masks of one forward call over ``batch_size`` sequences of
        ``steps`` steps, in ``like``'s dtype and device: drawn from torch's generator in
        training; at evaluation only zoneout's constant factor ``p``. None when no
        regularizer applies. Pass them to :meth:`forward` to hold them fixed."""
        return draw_stack_masks(self, batch_size, steps, like)

    def _run_windowed(
        self,
        xt: Tensor,
        mask_t: Tensor | None,
        init: list[list[State]] | None,
        window: int,
        resets_bt: Tensor | None,
        columns: list[int],
        masks: StackMasks | None = None,
    ) -> tuple[Tensor, list[list[State]]]:
        """The windowed BPTT(τ) of the whole stack: one node (``rnnkit.layers.windowed``);
        ``columns``: the steps where some row starts a document (``resets_bt``)."""
        T, B = xt.shape[0], xt.shape[1]
        width = self.output_size
        # the multipliers nn.Dropout applies (the same random draws as on the outputs),
        # drawn piece by piece between the reset columns as the paths without a window
        # draw them: the same seed gives the same forward with or without the window
        drawn = self._piece_drops(xt, columns)
        drops: list[Tensor | None] = [None]
        for index in range(1, self.num_layers):
            drop = None if drawn is None else drawn[index]
            lock = None if masks is None else masks.between[index]
            if lock is not None:
                drop = lock.expand(T, B, width) if drop is None else drop * lock
            drops.append(drop)
        layers = [_directions(layer) for layer in self.layers]
        reset_t = None if resets_bt is None else resets_bt.T
        x_in = xt if masks is None else locked(xt, masks.input)
        cells = None if masks is None else masks.cells  # weight drop, recurrent dropout, zoneout
        h, finals = run_windowed_stack(layers, x_in, mask_t, init, window, drops, reset_t, cells)
        return (h if masks is None else locked(h, masks.output)), finals

    def _piece_drops(self, xt: Tensor, columns: list[int]) -> list[Tensor | None] | None:
        """The dropout multipliers between the layers of a call that resets rows inside
        the loop, drawn as the pieces between the reset columns draw them
        (:meth:`_run_pieces`: each piece, each layer in turn, over its steps), so that
        either path gives the same masks for the same random state. None outside
        training or without dropout between layers."""
        if not (self.drop.training and self.dropout > 0 and self.num_layers > 1):
            return None
        T, B, width = xt.shape[0], xt.shape[1], self.output_size
        parts: list[list[Tensor]] = [[] for _ in range(self.num_layers)]
        for a, b in itertools.pairwise(sorted({0, *columns, T})):
            for index in range(1, self.num_layers):
                parts[index].append(self.drop(xt.new_ones(b - a, B, width)))
        return [None, *(torch.cat(p) for p in parts[1:])]

    def _resets_in_one_call(self, xt: Tensor, mask_t: Tensor | None, window: int | None) -> bool:
        """Whether every layer takes the resets inside one call (the Triton steps on a GPU,
        ``rnnkit.bptt.gpu_steps``, which take the regularizers' masks too): no recompute
        and each layer's route the Triton steps. Elsewhere the stack runs the pieces."""
        if self.recompute is not None:
            return False
        for layer in self.layers:
            cell = _directions(layer)[0].cell
            if not isinstance(layer, Recurrent):
                return False
            if not takes_resets(cell.kernel, xt, cell.weights(), mask_t, window):
                return False
        return True

    def _run_pieces(
        self,
        x: Tensor,
        mask_bt: Tensor | None,
        state: State | None,
        window: int | None,
        resets: _Resets,
        masks: StackMasks | None = None,
    ) -> RecurrentOutput:
        """Resets without a gradient window: run between the columns where some row
        starts, zeroing those rows' state. Document starts are rare (a few per batch), so
        this is a few calls of the time loop, each exact."""
        resets_bt, cols = resets.bt, resets.columns
        B, T = resets_bt.shape
        outs = []
        # Some row resets (the caller checked), so there is at least one piece.
        current = self.zero_state(B, x) if state is None else state
        for a, b in itertools.pairwise(sorted({0, *cols, T})):
            current = reset_rows(current, resets_bt[:, a])
            piece = x[:, a:b] if self.batch_first else x[a:b]
            piece_mask = None
            if mask_bt is not None:
                piece_mask = mask_bt[:, a:b] if self.batch_first else mask_bt[:, a:b].T
            steps = None if masks is None else steps_of(masks, a, b)  # zoneout's steps a..b
            out = self(piece, mask=piece_mask, state=current, window=window, masks=steps)
            outs.append(out.outputs)
            current = out.state
        return RecurrentOutput(torch.cat(outs, dim=1 if self.batch_first else 0), current)

    def zero_state(self, batch_size: int, like: Tensor) -> State:
        """The zero state ``(L, D, B, H)`` (an ``LSTMState`` for LSTM) in ``like``'s dtype
        (``H = max(H_f, H_b)`` for directions of different widths)."""
        shape = (self.num_layers, self.num_directions, batch_size, max(self.hidden_sizes))
        h = like.new_zeros(shape)
        return LSTMState(h, torch.zeros_like(h)) if self.is_lstm else h

    def _needs_grad(self, xt: Tensor, state: State | None) -> bool:
        """Whether a backward can follow (the window changes gradients only)."""
        if not torch.is_grad_enabled() or tracing():
            return False  # traced: the per-layer path refuses a window (rnnkit.bptt.tracing)
        tensors = [xt, *self.parameters()]
        if state is not None:
            tensors += list(state) if isinstance(state, LSTMState) else [state]
        return any(t.requires_grad for t in tensors)

    def _check_resets(self, resets: Tensor | None, x: Tensor) -> _Resets | None:
        """``resets`` as ``(B, T)`` bool on ``x``'s device with the columns where some row
        resets, or None when it resets nothing."""
        if resets is None:
            return None
        if not isinstance(resets, Tensor):
            raise TypeError(f"resets must be a torch.Tensor, got {type(resets).__name__}")
        B, T = (x.shape[0], x.shape[1]) if self.batch_first else (x.shape[1], x.shape[0])
        expected = (B, T) if self.batch_first else (T, B)
        if tuple(resets.shape) != expected:
            layout = "(B, T)" if self.batch_first else "(T, B)"
            raise ValueError(
                f"resets must have shape {layout} = {expected}, got {tuple(resets.shape)}"
            )
        if resets.dtype != torch.bool:
            raise TypeError(f"resets must be bool, got dtype {resets.dtype}")
        if self.bidirectional:
            raise ValueError("resets need a unidirectional stack (a document start is in time)")
        # asked where the resets are (resets made on the host, as data loaders make
        # them, are read without waiting for the GPU), then moved
        columns = torch.nonzero(resets.any(0 if self.batch_first else 1)).view(-1).tolist()
        if not columns:
            return None
        moved = resets.to(x.device, non_blocking=True)
        return _Resets(moved if self.batch_first else moved.T, columns)

    def _widths_repr(self) -> str:
        w = self.hidden_sizes
        return str(w[0]) if len(set(w)) == 1 else str(w)

    def extra_repr(self) -> str:
        regularizers = "".join(
            f", {name}={getattr(self, name)}" for name in REGULARIZERS if getattr(self, name)
        )
        return (
            f"{self.input_size}, {self._widths_repr()}, num_layers={self.num_layers}, "
            f"bidirectional={self.bidirectional}, dropout={self.dropout}{regularizers}"
        )


def __getattr__(name: str) -> object:
    """``RNN``, ``LSTM`` and ``GRU``, importable from here as before they moved: they live in
    ``rnnkit.layers.cell_stacks``, which imports this module, so they are fetched on first
    use rather than at import."""
    if name in ("GRU", "LSTM", "RNN"):
        from rnnkit.layers import cell_stacks

        return getattr(cell_stacks, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
