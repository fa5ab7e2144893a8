"""The decoder side of an encoder–decoder: its state, one step, all teacher-forced steps.

With attention, ``attention_wiring`` says where it sits in a decoder step:

* ``"before"`` (the default; Bahdanau et al. 2015): the previous top decoder state scores
  the encoder states (:mod:`rnnkit.layers.attention`), ``c_i = Σ_j α_ij h^e_j`` is appended to the
  input, ``h^d_i = g([E y_{i−1}; c_i (; c)], h^d_{i−1})``;
* ``"after"`` (Luong et al. 2015's global attention, without input feeding): the step
  runs first, ``h^d_i = g([E y_{i−1} (; c)], h^d_{i−1})``, then the NEW top state scores
  the encoder states for ``c_i``. Nothing of the attention enters the recurrence.

Either way the output layer reads ``[h^d_i; c_i]``: ``ŷ_i = softmax(V [h^d_i; c_i] + b)``.

With pure teacher forcing, without attention or with ``"after"``, the decoder runs as
one layer call (the library's time loop and explicit BPTT over the whole target), and
the attention of all steps is a few batched products after it. With ``"before"`` and one
decoder layer it runs as one autograd node with a hand-written backward
(:mod:`rnnkit.layers.attention_loop`); otherwise (several decoder layers, tracing) a
cell-level loop of :func:`_decoder_step`, the step that generation and scheduled sampling
take too (a GRU decoder's cell step without gradients, on a GPU, in Triton launches:
:func:`_cell_step`).
"""

from __future__ import annotations

from typing import NamedTuple, cast

import torch
from torch import Tensor

from rnnkit.bptt.gpu_route import wants_steps
from rnnkit.bptt.gpu_step_lib import TritonGRUStep, triton_step
from rnnkit.bptt.tracing import tracing
from rnnkit.cells.amp import autocast_devices_on
from rnnkit.cells.base import CellBase
from rnnkit.cells.gru import GRUCell, GRUKernel
from rnnkit.cells.lstm import LSTMCell
from rnnkit.cells.rnn import RNNCell
from rnnkit.layers.attention import Attention
from rnnkit.layers.attention_loop import attention_decoder
from rnnkit.layers.regularization import REGULARIZERS
from rnnkit.layers.stacked import StackedRecurrent
from rnnkit.types import LSTMState, State

__all__ = ["STATE_BATCH_DIM", "DecoderState", "check_stepped_decoder"]


class DecoderState(NamedTuple):
    """Everything a decoder step needs; rows are batch rows (select with ``STATE_BATCH_DIM``).

    Attributes:
        hidden: decoder state ``(L, 1, B, H_d)`` (``LSTMState`` for an LSTM decoder).
        memory: ``(B, S, D·H_e)`` encoder states (attention), or None.
        keys: ``(B, S, ·)`` the attention's query-independent part, or None.
        source_mask: ``(B, S)`` bool, True at real source positions, or None.
        context: ``(B, D·H_e)`` the context fed at every step (``input``/``both``), or None.
        length: ``(B,)`` the length mechanism's value (previous stop logit, or tokens
            left), or None without a mechanism.
    """

    hidden: State
    memory: Tensor | None
    keys: Tensor | None
    source_mask: Tensor | None
    context: Tensor | None
    length: Tensor | None = None


# The batch dimension of every part of a DecoderState (for generation's row selection): a
# DecoderState of ints (``_make`` takes values of any type).
STATE_BATCH_DIM = DecoderState._make((2, 0, 0, 0, 0, 0))
# Per part, whether it depends on the source only: equal in all beams of a source (beam
# search).
PER_SOURCE = tuple(
    name in ("memory", "keys", "source_mask", "context") for name in DecoderState._fields
)


def _stack(states: list[State]) -> State:
    """Per-layer ``(B, H)`` states → ``(L, 1, B, H)`` (one layer: a view, no copy; one
    operation, not an unsqueeze per dimension: a decoding step pays for each)."""
    # The layers of one decoder: all LSTMState, or all tensors.
    if isinstance(states[0], LSTMState):
        pairs = cast("list[LSTMState]", states)
        if len(pairs) == 1:
            h, c = pairs[0]
            return LSTMState(h.view(1, 1, *h.shape), c.view(1, 1, *c.shape))
        return LSTMState(
            torch.stack([s.h for s in pairs]).unsqueeze(1),
            torch.stack([s.c for s in pairs]).unsqueeze(1),
        )
    tensors = cast("list[Tensor]", states)
    if len(tensors) == 1:
        return tensors[0].view(1, 1, *tensors[0].shape)
    return torch.stack(tensors).unsqueeze(1)


def _unstack(state: State) -> list[State]:
    """``(L, 1, B, H)`` → per-layer ``(B, H)`` states (one layer: one view each)."""
    if isinstance(state, LSTMState):
        if state.h.shape[0] == 1:
            return [LSTMState(state.h.view(state.h.shape[2:]), state.c.view(state.c.shape[2:]))]
        return [LSTMState(h[0], c[0]) for h, c in zip(state.h, state.c, strict=True)]
    if state.shape[0] == 1:
        return [state.view(state.shape[2:])]
    return [s[0] for s in state]


def _top(state: State) -> Tensor:
    return state.h if isinstance(state, LSTMState) else state


def _cell_step(cell: CellBase, x: Tensor, h: State) -> State:
    """One decoder cell's step, ``cell(x, h)``; a GRU's without gradients (decoding)
    where the Triton steps would run (a GPU, :func:`rnnkit.bptt.gpu_route.wants_steps`)
    with its gate math in Triton launches (:class:`rnnkit.bptt.gpu_step_lib.TritonGRUStep`,
    the same function) instead of some ten eager kernels. An LSTM cell's own step is
    torch's fused one already, a simple cell's one product and one activation."""
    if torch.is_grad_enabled() or not isinstance(cell, GRUCell) or not isinstance(h, Tensor):
        return cell(x, h)
    kernel = cell.kernel
    if (
        type(kernel) is not GRUKernel
        or x.dtype != cell.weight_hh.dtype
        or tracing()
        or torch.jit.is_tracing()
        or autocast_devices_on()
        or not wants_steps(kernel, x, None, False)
    ):
        return cell(x, h)
    step = cast(TritonGRUStep, triton_step(kernel))
    w = cell.weights()
    # the input pre-activations (B, 2H) and (B, H), the bias included
    rz, n = (p[0] for p in step.project_inputs(x, w, 1, h.shape[0]))
    h_new = torch.empty_like(h)
    cache = (rz, n, torch.empty_like(h))
    step.step_into((rz, n), (h.contiguous(),), (h_new,), cache, step.prepare(w))
    return h_new


def _decoder_step(
    decoder: StackedRecurrent,
    attention: Attention | None,
    wiring: str,
    emb: Tensor,
    hidden: list[State],
    state: DecoderState,
) -> tuple[Tensor, list[State], Tensor | None]:
    """One decoder step: ``emb (B, E_t)`` → (head input ``(B, ·)``, new layers, α)."""
    parts = [emb]
    attn_ctx, weights = None, None
    before = wiring == "before"
    if attention is not None:
        assert state.keys is not None and state.memory is not None
    if attention is not None and before:
        attn_ctx, weights = attention(_top(hidden[-1]), state.keys, state.memory, state.source_mask)
        parts.append(attn_ctx)
    if state.context is not None:
        parts.append(state.context)
    x = torch.cat(parts, dim=-1) if len(parts) > 1 else emb
    new: list[State] = []
    for l, cell in enumerate(decoder.cells()):
        if l > 0 and decoder.dropout > 0:
            x = decoder.drop(x)
        s = _cell_step(cell, x, hidden[l])
        new.append(s)
        x = _top(s)
    if attention is not None and not before:
        attn_ctx, weights = attention(x, state.keys, state.memory, state.source_mask)
    features = x if attn_ctx is None else torch.cat([x, attn_ctx], dim=-1)
    return features, new, weights


def _teacher_forced(
    decoder: StackedRecurrent,
    attention: Attention | None,
    wiring: str,
    memory_size: int,
    emb: Tensor,
    state: DecoderState,
    mask: Tensor | None,
) -> tuple[Tensor, Tensor | None]:
    """Head inputs ``(B, T, F)`` and attention weights ``(B, T, S)`` (or None) of all
    teacher-forced steps; ``emb (B, T, ·)``: the decoder inputs but the contexts.

    ``mask`` (``(B, T)`` or None) lets the layer call hold the state at padded steps
    (faster: finished rows stop costing); the real steps are the same either way.
    """
    B, T = emb.shape[:2]
    if attention is None or wiring == "after":
        # One call of the layer (the time loop, explicit BPTT), attention after it.
        x = emb
        if state.context is not None:
            x = torch.cat([x, state.context.unsqueeze(1).expand(B, T, -1)], dim=-1)
        out = decoder(x, mask=mask, state=state.hidden)
        if attention is None:
            return out.outputs, None
        assert state.keys is not None and state.memory is not None
        att = attention.attend_all(out.outputs, state.keys, state.memory, state.source_mask)
        return torch.cat([out.outputs, att.context], dim=-1), att.weights
    if decoder.num_layers == 1 and not tracing() and not torch.jit.is_tracing():
        return _attention_node(decoder, attention, memory_size, emb, state)
    hidden = _unstack(state.hidden)
    features, weights = [], []
    for t in range(T):  # padded steps are computed too: they carry no loss
        feat, hidden, w = _decoder_step(decoder, attention, wiring, emb[:, t], hidden, state)
        assert w is not None  # the attention weighs the source at every step
        features.append(feat)
        weights.append(w)
    return torch.stack(features, dim=1), torch.stack(weights, dim=1)


def _attention_node(
    decoder: StackedRecurrent,
    attention: Attention | None,
    memory_size: int,
    emb: Tensor,
    state: DecoderState,
) -> tuple[Tensor, Tensor]:
    """:func:`_teacher_forced` with attention before the step, one decoder layer: the
    same steps as one autograd node (:func:`rnnkit.layers.attention_loop.attention_decoder`)."""
    assert attention is not None and state.keys is not None
    assert state.memory is not None
    cell = decoder.cells()[0]
    w = cell.weights()
    B, T, E = emb.shape
    D = memory_size
    # The step's input is [emb; c_t (; context)]: weight_ih's columns split the same way.
    x, weight_x = emb, w.weight_ih[:, :E]
    if state.context is not None:
        x = torch.cat([emb, state.context.unsqueeze(1).expand(B, T, -1)], dim=-1)
        weight_x = torch.cat([weight_x, w.weight_ih[:, E + D :]], dim=1)
    hidden = state.hidden
    states0 = (hidden.h[0, 0], hidden.c[0, 0]) if isinstance(hidden, LSTMState) else (hidden[0, 0],)
    out = attention_decoder(
        cell.kernel,
        x.transpose(0, 1),
        weight_x,
        w.weight_ih[:, E : E + D],
        w,
        attention,
        state.keys,
        state.memory,
        state.source_mask,
        states0,
    )
    features = torch.cat([out.hidden, out.context], dim=-1).transpose(0, 1)  # (B, T, F)
    return features, out.weights.transpose(0, 1)


def check_stepped_decoder(decoder: StackedRecurrent) -> None:
    """The decoder's cells are stepped one by one (attention, decoding): a regularizer of
    the stack or a layer-normalised cell would act in training and not there."""
    used = [name for name in REGULARIZERS if getattr(decoder, name, 0.0)]
    plain = all(type(c) in (RNNCell, LSTMCell, GRUCell) for c in decoder.cells())
    if used or not plain:
        what = ", ".join(used) if used else "layer-normalised cells"
        raise ValueError(
            f"the decoder steps through its cells, where {what} would not act: give the "
            "regularizers to the encoder (the decoder's stack none, plain cells)"
        )
