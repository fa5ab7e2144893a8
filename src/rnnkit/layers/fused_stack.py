"""A stack's calls that PyTorch's fused operators run whole, around the layer-by-layer
route of :class:`~rnnkit.layers.stacked.StackedRecurrent`:

* a call of ONE time step: one fused cell operator per layer and direction
  (``torch.lstm_cell``, ``gru_cell``, ``rnn_tanh_cell``, ``rnn_relu_cell``,
  :func:`rnnkit.bptt.fused.cell_step`) under the default path, on the CPU and on a GPU: a
  decoder's or a generator's step has no time loop to run, only the loop's fixed cost;
* where the fused kernels run the layers (cuDNN on a GPU) and nothing acts inside them,
  the whole stack, every layer and both directions, in ONE call of the fused kernel
  (:func:`rnnkit.bptt.fused.run_fused_stack`), as ``torch.nn``'s layers do; with dropout
  drawn between the layers, one call per layer, both directions in it.

Each is the same function as the layers' route (the tests hold both to the explicit
BPTT in float64); each ``*_applies``/``*_form`` function says when it runs.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, NamedTuple, cast

import torch
from torch import Tensor

from rnnkit.bptt.fused import (
    cell_step,
    fused_form,
    fused_path_on,
    run_fused_stack,
    step_in_one_call,
    wants_fused,
)
from rnnkit.bptt.tracing import tracing
from rnnkit.cells.amp import autocast_devices_on, float32_on_cpu
from rnnkit.layers.regularization import StackMasks, locked
from rnnkit.types import LSTMState, State

if TYPE_CHECKING:  # the stack calls these: no import of it at run time
    from rnnkit.layers.stacked import StackedRecurrent

# Nothing public: the stack's own routes (StackedRecurrent.forward calls them).
__all__: list[str] = []


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
    return _forms(stack, stack._cell_tuple()).each is not None


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
    cells, L, D = stack._cell_tuple(), stack.num_layers, stack.num_directions
    forms = _forms(stack, cells).each
    assert forms is not None  # one_step_applies checked every cell
    # the initial states as L·D views (B, H_d) per part, in the cells' order
    starts: list[tuple[Tensor, ...]] | None = None
    if state is not None:
        parts = tuple(state) if isinstance(state, LSTMState) else (state,)
        widths, B = stack.hidden_sizes, xt.shape[1]
        starts = [p.view(L * D, B, p.shape[-1]).unbind(0) for p in parts]
        if len(set(widths)) > 1:  # a narrower direction reads its own first units
            starts = [tuple(v[:, : widths[i % D]] for i, v in enumerate(s)) for s in starts]
    ends: list[list[Tensor]] = [[], []] if cells[0].is_lstm else [[]]
    h = xt[0]  # (B, I)
    for index in range(L):
        if index > 0 and stack.dropout > 0:
            h = stack.drop(h)
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
                states0 = tuple(s[i] for s in starts)
            new = cell_step(cell.kernel, forms[i], h, cell.weights(), states0)
            if keep is not None:
                new = tuple(torch.where(keep, n, s) for n, s in zip(new, states0, strict=True))
            for end, n in zip(ends, new, strict=True):
                end.append(n)
            outs.append(new[0])
        h = outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)
    return h[None], ends


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
    # the path's own test first: on the CPU's default path it answers at once
    if not fused_path_on(xt.device) or tracing() or autocast_devices_on():
        return None
    cells = stack._cell_tuple()
    wanted = wants_fused(cells[0].kernel, xt, mask_t, window, projected)
    if wanted is None or float32_on_cpu(cells[0].weight_hh):
        return None
    if _forms(stack, cells).one != wanted[0]:
        return None
    lengths = wanted[1]
    if lengths is not None and not bool((lengths > 0).any()):  # on the host
        return None  # no step runs: the layers' path gives the loop's zero gradients
    return wanted


class _Forms(NamedTuple):
    """The fused forms of a stack's cells (:func:`rnnkit.bptt.fused.fused_form`)."""

    cells: tuple  # the cells they were read from
    each: tuple[str, ...] | None  # every cell's form, in the cells' order; None: one has none
    one: str | None  # the form of every cell, all of one width and none layer-normalised


# Each stack's fused forms: properties of its cells, asked at every call.
_FORMS: weakref.WeakKeyDictionary[StackedRecurrent, _Forms] = weakref.WeakKeyDictionary()


def _forms(stack: StackedRecurrent, cells: tuple) -> _Forms:
    """``stack``'s :class:`_Forms`, read again when its cells are not ``cells``."""
    kept = _FORMS.get(stack)
    if kept is None or kept.cells is not cells:
        each = tuple(fused_form(c.kernel) for c in cells)
        one = len(set(stack.hidden_sizes)) == 1 and len(set(each)) == 1
        one = one and not any(hasattr(type(c), "input_part") for c in cells)
        known = None if None in each else cast("tuple[str, ...]", each)
        kept = _Forms(cells, known, each[0] if one else None)
        _FORMS[stack] = kept
    return kept


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
