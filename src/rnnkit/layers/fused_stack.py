"""A stack's calls that PyTorch's fused operators run whole, around the layer-by-layer
route of :class:`~rnnkit.layers.stacked.StackedRecurrent`:

* a call of ONE time step: one fused cell operator per layer and direction
  (``torch.lstm_cell``, ``gru_cell``, ``rnn_tanh_cell``, ``rnn_relu_cell``,
  :func:`rnnkit.bptt.fused.cell_step`) under the default path, on the CPU and on a GPU: a
  decoder's or a generator's step has no time loop to run, only the loop's fixed cost;
  the common such call (no lengths, no mask, the state as the last step returned it) is
  recognised in a few looks (:func:`quick_step`), what it reads of the cells kept
  between calls (:class:`_Plan`);
* where the fused kernels run the layers (cuDNN on a GPU) and nothing acts inside them,
  the whole stack, every layer and both directions, in ONE call of the fused kernel
  (:func:`rnnkit.bptt.fused.run_fused_stack`), as ``torch.nn``'s layers do; with dropout
  drawn between the layers, one call per layer, both directions in it.

Each is the same function as the layers' route (the tests hold both to the explicit
BPTT in float64); each ``*_applies``/``*_form`` function says when it runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, cast

import torch
from torch import Tensor

from rnnkit.bptt.fused import (
    cell_step,
    fused_form,
    fused_path_on,
    plain_step_call,
    run_fused_stack,
    step_in_one_call,
    wants_fused,
)
from rnnkit.bptt.tracing import tracing
from rnnkit.cells.amp import computes_in_float32
from rnnkit.cells.base import CellBase
from rnnkit.cells.gru import GRUCell
from rnnkit.cells.kernel import Kernel, Weights
from rnnkit.cells.lstm import LSTMCell
from rnnkit.cells.rnn import RNNCell
from rnnkit.layers.regularization import StackMasks, locked, regularizing
from rnnkit.types import LSTMState, RecurrentOutput, State

if TYPE_CHECKING:  # the stack calls these: no import of it at run time
    from rnnkit.layers.stacked import StackedRecurrent

# Nothing public: the stack's own routes (StackedRecurrent.forward calls them).
__all__: list[str] = []


class _Plan(NamedTuple):
    """What a stack's fused single step reads from its modules, kept between calls
    (:func:`_plan`): read again when the stack's cells are others
    (``StackedRecurrent._cell_tuple``: a layer replaced). It holds nothing a step could
    change otherwise: no tensor (the weights are read from the cells at every step, so a
    parameter replaced, a ``.double()``, ``.to(device)`` or an optimizer's step is seen),
    no mode (training, dropout and the regularizers are read at every call)."""

    cells: tuple[CellBase, ...]  # the cells it was read from
    each: tuple[str, ...] | None  # every cell's fused form, in the cells' order; None: one has none
    one: str | None  # the form of every cell, all of one width and none layer-normalised
    width: int | None  # the one width of every direction, None where they differ
    # each cell's kernel where the step needs no newer one (None: a GRU's, whose update
    # convention the step reads, asked of the cell at every step as before)
    kernels: tuple[Kernel | None, ...]
    # each cell's class where it is the library's own (its weights are the parameters of
    # those names: read from its _parameters, not through nn.Module.__getattr__), else None
    own: tuple[type | None, ...]


#: The library's cells whose ``weights()`` are their parameters ``weight_ih``,
#: ``weight_hh``, ``bias`` (and a GRU's ``bias_hn``), read as they are.
_OWN_CELLS = (LSTMCell, GRUCell, RNNCell)


def _plan(stack: StackedRecurrent) -> _Plan:
    """``stack``'s :class:`_Plan`, read again when its cells are not the kept ones."""
    cells = stack._cell_tuple()
    kept = stack.__dict__.get("_step_plan")
    if kept is None or kept.cells is not cells:
        each = tuple(fused_form(c.kernel) for c in cells)
        widths = stack.hidden_sizes
        one = len(set(widths)) == 1 and len(set(each)) == 1
        one = one and not any(hasattr(type(c), "input_part") for c in cells)
        known = None if None in each else cast("tuple[str, ...]", each)
        kernels = tuple(None if f == "gru" else c.kernel for c, f in zip(cells, each, strict=True))
        own = tuple(type(c) if type(c) in _OWN_CELLS else None for c in cells)
        width = widths[0] if len(set(widths)) == 1 else None
        kept = _Plan(cells, known, each[0] if one else None, width, kernels, own)
        stack.__dict__["_step_plan"] = kept  # as _cell_tuple keeps the cells
    return kept


def _weights(plan: _Plan) -> list[Weights]:
    """Every cell's weights now, in the cells' order: ``cell.weights()``, read directly
    from ``_parameters`` for the library's own cells (the same tensors, in a dictionary
    look each instead of ~0.6 µs of ``nn.Module.__getattr__``). Where the class is no
    longer the one kept (a parametrization makes a subclass whose properties compute
    the weights) or a name is missing there (moved out by a hook that recomputes it),
    the cell's own ``weights()``."""
    weights = []
    for cell, own in zip(plan.cells, plan.own, strict=True):
        if own is type(cell):
            p = cell._parameters
            w_ih, w_hh, bias = p.get("weight_ih"), p.get("weight_hh"), p.get("bias")
            hn = p.get("bias_hn") if own is GRUCell else None
            # (a GRU without bias_hn there: its own weights() says what it has)
            gru_ok = hn is not None or own is not GRUCell
            if w_ih is not None and w_hh is not None and bias is not None and gru_ok:
                weights.append(Weights(w_ih, w_hh, bias, hn))
                continue
        weights.append(cell.weights())
    return weights


def one_step_applies(
    stack: StackedRecurrent,
    xt: Tensor,
    window: int | None,
    projected: bool,
    masks: StackMasks | None,
) -> bool:
    """Whether this call is one time step that runs as PyTorch's fused cell operators,
    one call per layer and direction (:func:`one_step`): a single step ``xt (1, B, I)``
    on the default path (:func:`rnnkit.bptt.fused.step_in_one_call`), every cell one
    whose function they compute (:func:`rnnkit.bptt.fused.fused_form`), no regularizer
    acting in or around the layers but dropout between them, no window or recompute."""
    if xt.shape[0] != 1 or window is not None or projected or masks is not None:
        return False
    if stack.recompute is not None or not step_in_one_call(xt):
        return False
    return _plan(stack).each is not None


def quick_step(stack: StackedRecurrent, x: Tensor, state: State | None) -> RecurrentOutput | None:
    """``stack.forward(x, state=state)`` for the common single step, where it is
    :func:`one_step` (a generator's or a decoder's call at every token), with the stack's
    checks in a few looks: ``x`` ``(B, 1, I)`` (``(1, B, I)`` time-major), ``B ≥ 1``,
    in the parameters' dtype and device (:func:`rnnkit.bptt.fused.plain_step_call`),
    every cell with a fused operator and every direction of one width ``H``, no
    recompute, no regularizer's mask (none set, or at evaluation none drawn), and
    ``state`` None or of shape ``(L, D, B, H)`` in ``x``'s dtype and device (an
    ``LSTMState`` of two for an LSTM). Returns ``RecurrentOutput(outputs (B, 1, D·H),
    state (L, D, B, H))`` as :meth:`StackedRecurrent.forward` does, the same operators on
    the same tensors; None for anything else: the stack's own path decides (and says
    what is wrong)."""
    if not plain_step_call(x) or x.dim() != 3 or stack.recompute is not None:
        return None
    time_axis, size = (1 if stack.batch_first else 0), x.shape
    B = size[1 - time_axis]
    if size[time_axis] != 1 or B == 0 or size[2] != stack.input_size:
        return None
    plan = _plan(stack)
    H = plan.width
    if plan.each is None or H is None:
        return None
    weights = _weights(plan)
    w = weights[0].weight_ih
    if x.dtype != w.dtype or x.device != w.device:
        return None
    # in training a regularizer draws its masks (which the stack's path would draw again)
    if regularizing(stack) and (stack.training or stack.draw_masks(B, 1, x) is not None):
        return None
    L, D = stack.num_layers, stack.num_directions
    starts: list[tuple[Tensor, ...]] | None = None
    if state is not None:
        if plan.cells[0].is_lstm:
            if type(state) is not LSTMState:
                return None
            parts: tuple[Tensor, ...] = tuple(state)
        else:
            parts = (cast(Tensor, state),)
        shape = (L, D, B, H)
        for p in parts:
            if type(p) is not Tensor or p.shape != shape:
                return None
            if p.dtype != x.dtype or p.device != x.device:
                return None
        # each cell's initial states (B, H): one view and one unbind a part
        starts = list(zip(*(p.view(L * D, B, H).unbind(0) for p in parts), strict=True))
    h, ends = _steps(stack, plan, weights, x.select(time_axis, 0), None, starts)
    finals = [torch.stack(end).view(L, D, B, H) for end in ends]
    return RecurrentOutput(
        h.unsqueeze(time_axis), LSTMState(*finals) if len(finals) == 2 else finals[0]
    )


def one_step(
    stack: StackedRecurrent, xt: Tensor, mask_t: Tensor | None, state: State | None
) -> tuple[Tensor, list[list[Tensor]]]:
    """One time step of every layer and direction, ``xt (1, B, I)`` → ``(h (1, B, D·H),
    ends)``, each cell's step one fused operator (:func:`rnnkit.bptt.fused.cell_step`);
    ``state (L, D, B, H)`` checked (an ``LSTMState`` of them), or None (zeros); ``ends``
    the new states per part (``[h's, c's]`` or ``[h's]``), each ``L·D`` tensors
    ``(B, H_d)`` in the cells' order, for the caller to stack. The same function as the
    time loop: a row whose step is padding (``mask_t (1, B)`` False) keeps its state, and
    its input is zeroed first (the padding may hold NaN, which would reach the weights'
    gradients through a product by zero); the dropout between layers is the stack's
    module drawing over the same ``B·D·H`` values."""
    keep = None if mask_t is None else mask_t[0, :, None]  # (B, 1)
    plan = _plan(stack)
    L, D = stack.num_layers, stack.num_directions
    # the initial states as L·D views (B, H_d) per part, in the cells' order
    starts: list[tuple[Tensor, ...]] | None = None
    if state is not None:
        parts = tuple(state) if isinstance(state, LSTMState) else (state,)
        widths, B = stack.hidden_sizes, xt.shape[1]
        views = [p.view(L * D, B, p.shape[-1]).unbind(0) for p in parts]
        if len(set(widths)) > 1:  # a narrower direction reads its own first units
            views = [tuple(v[:, : widths[i % D]] for i, v in enumerate(s)) for s in views]
        starts = list(zip(*views, strict=True))
    h, ends = _steps(stack, plan, _weights(plan), xt[0], keep, starts)
    return h[None], ends


def _steps(
    stack: StackedRecurrent,
    plan: _Plan,
    weights: list[Weights],
    h: Tensor,
    keep: Tensor | None,
    starts: list[tuple[Tensor, ...]] | None,
) -> tuple[Tensor, list[list[Tensor]]]:
    """:func:`one_step`'s layers: ``h (B, I)`` → ``(h (B, D·H), ends)``; ``starts`` each
    cell's initial states (``(h, c)`` or ``(h,)``, each ``(B, H_d)``), or None (zeros);
    ``keep (B, 1)`` False on a padded row, or None."""
    cells, forms = plan.cells, plan.each
    assert forms is not None  # the callers checked every cell
    L, D = stack.num_layers, stack.num_directions
    ends: list[list[Tensor]] = [[], []] if cells[0].is_lstm else [[]]
    for index in range(L):
        if index > 0 and stack.dropout > 0:
            # the stack's dropout takes (T, B, D·H), as between the loop's layers (a
            # drop-in's draws over a packed input's rows read the time axis)
            h = stack.drop(h[None])[0]
        if keep is not None:
            h = torch.where(keep, h, 0.0)
        outs = []
        for d in range(D):
            i = index * D + d
            cell = cells[i]
            if starts is None:
                s0 = cell.zero_state(h.shape[0], h)
                states0 = tuple(s0) if isinstance(s0, LSTMState) else (s0,)
            else:
                states0 = starts[i]
            kernel = plan.kernels[i]
            if kernel is None:
                kernel = cell.kernel
            new = cell_step(kernel, forms[i], h, weights[i], states0)
            if keep is not None:
                new = tuple(torch.where(keep, n, s) for n, s in zip(new, states0, strict=True))
            for end, n in zip(ends, new, strict=True):
                end.append(n)
            outs.append(new[0])
        h = outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)
    return h, ends


def whole_stack_form(
    stack: StackedRecurrent,
    xt: Tensor,
    mask_t: Tensor | None,
    window: int | None,
    projected: bool,
    masks: StackMasks | None,
) -> tuple[str, Tensor | None] | None:
    """``(form, lengths)`` when the stack runs as PyTorch's fused kernel over whole
    layers, both directions of a layer in one call (:func:`run_whole_stack`), else None:
    where each layer would run the fused kernels (:func:`rnnkit.bptt.fused.wants_fused`:
    cuDNN on a GPU), every cell of one form and width, and nothing inside the layers
    that cuDNN would do otherwise: no recompute, no regularizer acting in the time loop
    or on its weights (locked dropout acts between the layers: it is the stack's, as
    the dropout), at least one real step. ``lengths (B,)`` on the host, or None (every
    step real)."""
    if stack.recompute is not None or xt.shape[0] == 0:
        return None
    if masks is not None and any(c.weight_hh is not None or c.in_loop for c in masks.cells):
        return None
    # the path's own test first: on the CPU's default path it answers at once. (Under
    # autocast too: the stack's input and state are in the weights' dtype by now, and
    # run_fused_stack calls the kernel with autocast off, as each layer's call would.)
    if not fused_path_on(xt.device) or tracing():
        return None
    cells = stack._cell_tuple()
    wanted = wants_fused(cells[0].kernel, xt, mask_t, window, projected)
    if wanted is None or computes_in_float32(cells[0].weight_hh, fused=True):
        return None
    if _plan(stack).one != wanted[0]:
        return None
    lengths = wanted[1]
    if lengths is not None and not bool((lengths > 0).any()):  # on the host
        return None  # no step runs: the layers' path gives the loop's zero gradients
    return wanted


def run_whole_stack(
    stack: StackedRecurrent,
    xt: Tensor,
    state: State | None,
    form: str,
    lengths: Tensor | None,
    masks: StackMasks | None = None,
) -> tuple[Tensor, State]:
    """The stack through PyTorch's fused kernel (:func:`whole_stack_form` said so):
    ``xt (T, B, I)``, ``state (L, D, B, H)`` or None (zeros) → ``(h (T, B, D·H), final
    state (L, D, B, H))``. ONE call for every layer and direction, as ``torch.nn``'s
    layers make; where dropout is drawn between the layers, or a locked dropout mask
    acts there (``masks``: only the stack's input, between and output masks act), one
    call per layer (both directions), the stack's own masks between them: cuDNN's
    dropout would draw its masks from a state a checkpoint cannot hold, so a resumed
    run would differ. The masks act where the layers' route applies them."""
    cells = stack._cell_tuple()
    is_lstm = cells[0].is_lstm
    L, D, B, H = stack.num_layers, stack.num_directions, xt.shape[1], stack.hidden_sizes[0]
    hx: tuple[Tensor, ...]
    if state is None:
        zeros = xt.new_zeros(L * D, B, H)
        hx = (zeros, zeros) if is_lstm else (zeros,)
    else:
        parts = tuple(state) if isinstance(state, LSTMState) else (state,)
        hx = tuple(p.reshape(L * D, B, H) for p in parts)  # torch's order: a view
    kernels = [c.kernel for c in cells]
    weights = [c.weights() for c in cells]
    bi = stack.bidirectional
    between = (None,) * L if masks is None else masks.between
    drawn = stack.training and stack.dropout > 0
    x = xt if masks is None else locked(xt, masks.input)
    if L == 1 or not (drawn or any(m is not None for m in between)):
        h, ends = run_fused_stack(kernels, form, x, weights, hx, lengths, bi)
    else:
        h, layer_ends = x, []
        for index in range(L):
            if index > 0 and drawn:  # over (T, B, D·H), as the layers' route draws it
                h = stack.drop(h.contiguous())
            h = locked(h, between[index])
            rows = slice(index * D, (index + 1) * D)
            h, e = run_fused_stack(
                kernels[rows], form, h, weights[rows], tuple(s[rows] for s in hx), lengths, bi
            )
            layer_ends.append(e)
        ends = tuple(torch.cat(part) for part in zip(*layer_ends, strict=True))
    finals = tuple(e.view(L, D, B, H) for e in ends)
    h = h if masks is None else locked(h, masks.output)
    return h, (LSTMState(*finals) if is_lstm else finals[0])
