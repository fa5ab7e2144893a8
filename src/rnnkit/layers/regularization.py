"""The regularizers of a recurrent stack and their masks (docs/regularization.md).

Each is a mask drawn from torch's random generator once per forward call in training
(``torch.manual_seed`` makes a run repeatable) and absent at evaluation, where every
dropout is the identity (its expectation) and zoneout mixes with its probability:

* ``input_dropout``: one mask ``(B, I)`` per sequence on the stack's input, the same at
  every step (variational dropout; Keras ``dropout``);
* ``locked_dropout``: one mask ``(B, D·H)`` per sequence on the input of every layer above
  the first (AWD-LSTM's locked dropout between layers); ``output_dropout``: the same on
  the last layer's outputs;
* ``weight_drop``: DropConnect on ``weight_hh``, one mask ``(G·H, H)`` per forward call and
  direction; the masked weight goes to the time loop (every loop and PyTorch's fused
  kernels compute the same function of it), autograd carries the gradient to the weight;
* ``recurrent_dropout`` and ``zoneout``: inside the loop (``rnnkit.bptt.regularized``).

A dropout mask holds ``0`` or ``1/(1 − p)``, so that its mean is 1. ``embedding_dropout``
drops whole rows of an embedding matrix (every occurrence of a word in the batch).
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import Tensor, nn

from rnnkit.bptt.regularized import regularized
from rnnkit.cells.amp import float32
from rnnkit.cells.kernel import Kernel, Weights
from rnnkit.errors import ConfigError

if TYPE_CHECKING:  # the stack's module imports this one
    from rnnkit.layers.stacked import StackedRecurrent

__all__ = [
    "REGULARIZERS",
    "CellMasks",
    "DropoutEmbedding",
    "StackMasks",
    "check_masks",
    "check_probability",
    "dropout_mask",
    "embedding_dropout",
    "float32_masks",
    "locked",
    "masked_loop",
    "regularizing",
    "steps_of",
]


#: A stack's regularizer options, in the order of its constructor.
REGULARIZERS = (
    "input_dropout",
    "locked_dropout",
    "output_dropout",
    "recurrent_dropout",
    "weight_drop",
    "zoneout",
)


def check_probability(name: str, p: object) -> float:
    """``p`` as a float in ``[0, 1)``, or a :class:`ConfigError` naming ``name``.

    >>> check_probability("zoneout", 0.1)
    0.1
    """
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= float(p) < 1.0:
        raise ConfigError(f"{name} must be a probability in [0, 1), got {p!r}")
    return float(p)


def dropout_mask(shape: tuple[int, ...], p: float, like: Tensor) -> Tensor:
    """A mask of ``shape`` in ``like``'s dtype and device: ``0`` with probability ``p``,
    else ``1/(1 − p)``."""
    keep = like.new_empty(shape).bernoulli_(1.0 - p)
    return keep.div_(1.0 - p)


def locked(x: Tensor, mask: Tensor | None) -> Tensor:
    """``x (T, B, F)`` times one mask ``(B, F)`` at every step (None: ``x``)."""
    return x if mask is None else x * mask


class CellMasks(NamedTuple):
    """The masks of one direction of one layer for one forward call."""

    weight_hh: Tensor | None  # (G·H, H) DropConnect mask on weight_hh
    recurrent: Tensor | None  # (B, H) on h_{t-1} in the recurrent product
    keep: tuple[Tensor, ...] | None  # zoneout keep factor per state, each (T, B, H)

    @property
    def in_loop(self) -> bool:
        """Whether the time loop itself changes (recurrent dropout or zoneout)."""
        return self.recurrent is not None or self.keep is not None


class StackMasks(NamedTuple):
    """Every mask of a stack for one forward call (``StackedRecurrent.draw_masks``).

    For a reverse direction, step ``t`` of ``keep`` is the t-th step that direction runs
    (each sequence read from its own last real step)."""

    input: Tensor | None  # (B, I)
    between: tuple[Tensor | None, ...]  # per layer: (B, D·H) on its input; [0] is None
    output: Tensor | None  # (B, D·H)
    cells: tuple[CellMasks, ...]  # per cell, layer by layer, forward direction first


def masked_loop(
    kernel: Kernel, weights: Weights, masks: CellMasks | None
) -> tuple[Kernel, Weights]:
    """The kernel and weights one direction's time loop runs with its regularizers'
    masks: ``W_hh ⊙ M`` (weight drop; autograd reaches the raw weight through the
    product), recurrent dropout and zoneout in the step (``rnnkit.bptt.regularized``,
    the compiled loop's form where there is one)."""
    if masks is None:
        return kernel, weights
    if masks.weight_hh is not None:
        weights = weights._replace(weight_hh=weights.weight_hh * masks.weight_hh)
    if masks.in_loop:
        kernel = regularized(kernel, masks.recurrent, masks.keep)  # type: ignore[assignment]
    return kernel, weights


def float32_masks(masks: CellMasks | None) -> CellMasks | None:
    """``masks`` in float32, for a loop of float16/bfloat16 weights on the CPU, which
    computes in float32 (``rnnkit.cells.amp.computes_in_float32``)."""
    if masks is None:
        return None
    keep = None if masks.keep is None else tuple(k.float() for k in masks.keep)
    return CellMasks(float32(masks.weight_hh), float32(masks.recurrent), keep)


def steps_of(masks: StackMasks, a: int, b: int) -> StackMasks:
    """``masks`` for steps ``a … b − 1`` only (the per-sequence masks as they are)."""
    cells = tuple(
        c._replace(keep=None if c.keep is None else tuple(k[a:b] for k in c.keep))
        for c in masks.cells
    )
    return masks._replace(cells=cells)


def embedding_dropout(weight: Tensor, p: float, training: bool) -> Tensor:
    """``weight (V, E)`` with whole rows zeroed with probability ``p`` and the others
    scaled by ``1/(1 − p)`` in training (AWD-LSTM's embedding dropout: a dropped word is
    dropped at every occurrence in the batch); ``weight`` itself at evaluation or ``p = 0``.

    >>> w = torch.ones(4, 2)
    >>> bool(torch.equal(embedding_dropout(w, 0.5, training=False), w))
    True
    """
    if not training or p == 0.0:
        return weight
    return weight * dropout_mask((weight.shape[0], 1), p, weight)


class DropoutEmbedding(nn.Embedding):
    """``nn.Embedding`` with :func:`embedding_dropout` of probability ``dropout`` in
    training: whole rows of the matrix dropped for the call, the rest rescaled. The same
    parameters and state as ``nn.Embedding`` (a checkpoint reads into either).

    >>> emb = DropoutEmbedding(10, 4, dropout=0.5).eval()
    >>> bool(torch.equal(emb(torch.tensor([3])), emb.weight[3:4]))
    True
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, dropout: float = 0.0, **kw):
        super().__init__(num_embeddings, embedding_dim, **kw)
        self.dropout = check_probability("embedding_dropout", dropout)

    def dropped_weight(self) -> Tensor:
        """The matrix with this call's rows dropped (``weight`` itself at evaluation): for
        a loop that looks up one step at a time with one mask for the whole batch."""
        return embedding_dropout(self.weight, self.dropout, self.training)

    def lookup(self, input: Tensor, weight: Tensor) -> Tensor:
        """``input``'s rows of ``weight`` (this embedding's or :meth:`dropped_weight`)."""
        return nn.functional.embedding(
            input, weight, self.padding_idx, None, self.norm_type, self.scale_grad_by_freq,
            self.sparse,
        )  # fmt: skip

    def forward(self, input: Tensor) -> Tensor:
        if not self.training or self.dropout == 0.0:
            return super().forward(input)
        return self.lookup(input, self.dropped_weight())

    def extra_repr(self) -> str:
        return super().extra_repr() + (f", dropout={self.dropout}" if self.dropout else "")


def zoneout_keep(T: int, B: int, H: int, p: float, like: Tensor, training: bool) -> Tensor:
    """The keep factor ``d (T, B, H)``: Bernoulli(p) per step and unit in training, the
    constant ``p`` at evaluation (the expectation of the mix)."""
    if training:
        return like.new_empty(T, B, H).bernoulli_(p)
    return like.new_full((1, 1, 1), p).expand(T, B, H)


_probabilities = operator.attrgetter(*REGULARIZERS)


def regularizing(stack: StackedRecurrent) -> bool:
    """Whether any of ``stack``'s regularizers is set (a probability above 0)."""
    if torch.compiler.is_compiling():  # dynamo cannot trace an attrgetter's call
        return any(getattr(stack, name) for name in REGULARIZERS)
    return any(_probabilities(stack))  # one C call where it runs at every step


def draw_stack_masks(stack: StackedRecurrent, B: int, T: int, like: Tensor) -> StackMasks | None:
    """``StackedRecurrent.draw_masks``: the masks of ``stack`` (its regularizers, sizes,
    cells and training mode) for ``B`` sequences of ``T`` steps; None when none applies."""
    if not regularizing(stack):
        return None  # the plain stack: nothing to build on every call
    on = stack.training

    def drop(width: int, p: float) -> Tensor | None:
        return dropout_mask((B, width), p, like) if on and p else None

    between = (None, *(drop(stack.output_size, stack.locked_dropout) for _ in stack.layers[1:]))
    cells = tuple(
        draw_cell_masks(
            c, B, T, like, on, stack.weight_drop, stack.recurrent_dropout, stack.zoneout
        )
        for c in stack.cells()
    )
    masks = StackMasks(
        drop(stack.input_size, stack.input_dropout),
        between,
        drop(stack.output_size, stack.output_dropout),
        cells,
    )
    idle = all(c.weight_hh is None and not c.in_loop for c in cells)
    if idle and masks.input is None and masks.output is None and between[-1] is None:
        return None
    return masks


def check_masks(masks: object, stack: StackedRecurrent, B: int, T: int) -> StackMasks:
    """``masks`` given to ``stack.forward`` for ``B`` sequences of ``T`` steps: a
    :class:`StackMasks` with one entry per layer and cell and the shapes they act on, or a
    :class:`ConfigError` naming what differs."""
    if not isinstance(masks, StackMasks):
        raise ConfigError(f"masks must be a StackMasks (draw_masks), got {type(masks).__name__}")
    cells = stack.cells()
    if len(masks.between) != stack.num_layers or len(masks.cells) != len(cells):
        raise ConfigError(
            f"masks are for {len(masks.between)} layers and {len(masks.cells)} cells; this "
            f"stack has {stack.num_layers} and {len(cells)} (draw_masks)"
        )
    width = stack.output_size
    expected: list[tuple[str, Tensor | None, tuple[int, ...]]] = [
        ("input", masks.input, (B, stack.input_size)),
        ("output", masks.output, (B, width)),
        *((f"between[{k}]", m, (B, width)) for k, m in enumerate(masks.between)),
    ]
    for k, (c, cell) in enumerate(zip(masks.cells, cells, strict=True)):
        H = cell.hidden_size
        expected += [(f"cells[{k}].weight_hh", c.weight_hh, tuple(cell.weight_hh.shape))]
        expected += [(f"cells[{k}].recurrent", c.recurrent, (B, H))]
        expected += [(f"cells[{k}].keep", d, (T, B, H)) for d in (c.keep or ())]
    for name, t, shape in expected:
        if t is not None and tuple(t.shape) != shape:
            raise ConfigError(f"masks.{name} must have shape {shape}, got {tuple(t.shape)}")
    return masks


def draw_cell_masks(
    cell: torch.nn.Module,
    B: int,
    T: int,
    like: Tensor,
    training: bool,
    weight_drop: float,
    recurrent_dropout: float,
    zoneout: float,
) -> CellMasks:
    """The masks of one direction (``cell`` has ``weight_hh``, ``hidden_size``,
    ``is_lstm``)."""
    H = int(cell.hidden_size)  # type: ignore[arg-type]
    w_hh: Tensor = cell.weight_hh  # type: ignore[assignment]
    drop_w = (
        dropout_mask(tuple(w_hh.shape), weight_drop, w_hh) if training and weight_drop else None
    )
    rec = dropout_mask((B, H), recurrent_dropout, like) if training and recurrent_dropout else None
    keep = None
    if zoneout:
        states = 2 if cell.is_lstm else 1
        keep = tuple(zoneout_keep(T, B, H, zoneout, like, training) for _ in range(states))
    return CellMasks(drop_w, rec, keep)
