"""The decoder step of decoding in fewer operations, for an LSTM decoder.

Greedy and beam search call the decoder once per token for the whole batch, and at the
sizes of a decoder (rows of 64–512, widths of 128–512) a step's time goes as much to the
number of tensor operations (each has a fixed cost of a few microseconds) as to the
arithmetic. :class:`InferenceStep` computes the same function as
:meth:`rnnkit.models.seq2seq.Seq2Seq.step` — the equations of
:mod:`rnnkit.models.seq2seq_decoder`, then ``log softmax(V [h^d_i; c_i] + b)`` — in about
half as many operations, by rearranging what does not change the value:

* additive attention, ``s_j = vᵀ tanh(W_q q + b + k_j)``, is evaluated as
  ``2 vᵀ σ(2 (W_q q + b + k_j)) − Σ v`` (``tanh a = 2 σ(2a) − 1``, one sigmoid pass, as the
  training path does), with ``2 W_q``, ``2 b``, ``2 v`` and ``2 k_j`` scaled once per
  decoding instead of per step, and without the constant ``− Σ v``: a softmax does not
  change when the same number is added to every score; the sigmoid and ``vᵀσ`` of every
  source position in one pass of the compiled library (``sigmoid_scores``);
* dot and bilinear attention read the keys transposed (once per decoding), so that a
  step's scores are a row vector times a matrix, several times faster in torch than the
  batched matrix times a column;
* padding positions are excluded by a fill of ``−∞`` with the mask inverted once (for
  additive attention inside ``sigmoid_scores``'s pass; a source with no real position
  at all keeps the general step, whose weights are all zero there);
* the state holds each layer's ``(B, H)`` tensors (batch dimension 0 everywhere,
  :attr:`InferenceStep.state_batch_dim`), not the ``(L, 1, B, H)`` stack that a step
  would take apart and put together again in views;
* the scores and the context are written into buffers kept per batch size, shaped
  ``(B, 1, S)`` and ``(B, 1, D)`` for the batched products, so that no view is taken
  at a step;
* each decoder layer's gates in one call of the compiled library (``lstm_step``), after
  one product for the input and one for the recurrence;
* weights are transposed once, not at every step.

The values equal the general step's to float rounding (tested in float64 and float32);
the general step stays the definition. Where this one does not apply
(:meth:`InferenceStep.build` returns None: a GRU or simple-RNN decoder, a length
mechanism, training mode or gradients, autocast, or where the compiled loop does not run
— not CPU float32/float64, ``use_native(False)``, no compiler) decoding takes the step of
torch operations (:mod:`rnnkit.models.seq2seq_torch_step`) where that one applies, else
the general step.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import torch
from torch import Tensor, nn

from rnnkit.bptt import native
from rnnkit.bptt.tracing import tracing
from rnnkit.cells.amp import autocast_devices_on
from rnnkit.cells.lstm import LSTMCell
from rnnkit.models.seq2seq_decoder import DecoderState
from rnnkit.types import LSTMState

if TYPE_CHECKING:
    from rnnkit.models.seq2seq import Seq2Seq

__all__ = ["InferenceStep"]


class InferenceStep:
    """``step(token (B,), state) -> (log-probabilities (B, V_t), state)`` of a
    :class:`~rnnkit.models.seq2seq.Seq2Seq` for decoding, in fewer operations.

    Built once per decoding by :meth:`build` from the model's weights as they are then
    (decoding runs without gradients, so they do not change while it runs); the state it
    takes and returns is the :class:`DecoderState` of :meth:`prepare`, whose rows the
    search selects as usual (its attention keys are scaled and its mask inverted: only
    this step reads them).
    """

    def __init__(self, model: Seq2Seq, lib: Any) -> None:
        self.model = model
        self.lib = lib
        cells = model.decoder.cells()
        E = model.target_embedding.embedding_dim
        # The first layer's input product, split: the embedding's part is a table read by
        # row, T = E W_ih[:, :E]ᵀ (V_t, 4H); the rest (attention context, c) a product.
        self.table = _embedding_table(model)
        self.rest_t = cells[0].weight_ih[:, E:].t().contiguous()  # (I_0 − E, 4H)
        # Layers above the first: their whole input product (H, 4H), transposed once.
        self.upper_ih_t = [c.weight_ih.t().contiguous() for c in cells[1:]]
        self.weight_hh_t = [c.weight_hh.t() for c in cells]  # (H, 4H)
        self.bias = [c.bias.contiguous() for c in cells]
        self.hidden = model.decoder.hidden_size
        # The output layer as one product with its weight transposed once (a Linear
        # module's call costs half as much again as the product at these sizes).
        self.head: Callable[[Tensor], Tensor] = model.head
        if isinstance(model.head, nn.Linear):  # rnnkit.layers.Linear is one
            weight_t, bias = model.head.weight.t().contiguous(), model.head.bias  # (F, V_t)
            if bias is not None:
                self.head = partial(torch.addmm, bias, mat2=weight_t)
            else:
                self.head = partial(torch.mm, mat2=weight_t)
        att = model.attention
        self.attention = att
        self.before = att is not None and model.attention_wiring == "before"
        self.additive = att is not None and att.kind == "additive"
        if self.additive:
            assert att is not None
            proj = att.query_proj
            self.query_weight_t = (2 * proj.weight).t().contiguous()  # (d_q, A)
            self.query_bias = 2 * proj.bias
            self.v = 2 * att.v
        self._by_rows: dict[int, _Buffers] = {}

    @classmethod
    def build(cls, model: Seq2Seq) -> InferenceStep | None:
        """The fast step for ``model`` as it is now, or None where the general step must
        run (the module docstring lists when)."""
        if model.training or torch.is_grad_enabled() or autocast_devices_on() or tracing():
            return None
        if model.length is not None:
            return None
        cells = model.decoder.cells()
        if not cells or any(type(c) is not LSTMCell for c in cells):
            return None
        weights = [w for c in cells for w in (c.weight_ih, c.weight_hh, c.bias)]
        if not native.supports(*weights):
            return None
        lib = native.library()
        return None if lib is None else cls(model, lib)

    #: The batch dimension of every part of this step's state (for the search's row
    #: selection): 0, the hidden state included (``hidden``: one ``LSTMState`` of
    #: ``(B, H)`` tensors per layer).
    state_batch_dim = DecoderState._make((0,) * len(DecoderState._fields))

    def prepare(self, state: DecoderState) -> DecoderState | None:
        """The encoder's :class:`DecoderState` in this step's form (each layer's ``(B, H)``
        state, keys scaled, mask inverted and ``(B, 1, S)``), or None where a source has
        no real position (the general step then)."""
        mask = state.source_mask
        if self.attention is not None and mask is not None and not bool(mask.any(dim=-1).all()):
            return None
        hidden = state.hidden
        assert isinstance(hidden, LSTMState)
        layers = tuple(LSTMState(h[0], c[0]) for h, c in zip(hidden.h, hidden.c, strict=True))
        if self.attention is None:
            return _with_layers(state, layers)
        assert state.keys is not None
        # additive: 2k (the factor of tanh a = 2σ(2a) − 1); dot, bilinear: Kᵀ (B, A, S), so
        # that a step's scores are a row times a matrix (torch's batched matrix-times-column
        # product is several times slower)
        keys = 2 * state.keys if self.additive else state.keys.transpose(1, 2).contiguous()
        padding = None if mask is None else (~mask).unsqueeze(1).contiguous()  # (B, 1, S)
        return _with_layers(state._replace(keys=keys, source_mask=padding), layers)

    def hidden_state(self, state: DecoderState) -> LSTMState:
        """The decoder state of this step's ``state`` as :class:`DecoderState` holds it,
        ``(L, 1, B, H)`` (its ``hidden`` is one ``(B, H)`` pair per layer)."""
        layers = _layers(state)
        return LSTMState(
            torch.stack([s.h for s in layers]).unsqueeze(1),
            torch.stack([s.c for s in layers]).unsqueeze(1),
        )

    def _buffers(self, B: int, like: Tensor, memory: Tensor | None) -> _Buffers:
        """This batch size's work buffers (made at its first step: rows leave the batch
        at a few sizes only)."""
        buffers = self._by_rows.get(B)
        if buffers is None:
            S, D = (0, 0) if memory is None else memory.shape[1:]
            scores = like.new_empty(B, 1, S)
            context = like.new_empty(B, 1, D)
            buffers = _Buffers(
                like.new_empty(B, self.hidden),
                scores,
                scores.view(B, S),
                context,
                context.view(B, D),
            )
            self._by_rows[B] = buffers
        return buffers

    def _attend(self, query: Tensor, state: DecoderState, buffers: _Buffers) -> Tensor:
        """The context ``(B, d_e)`` for ``query (B, d_q)`` (in ``buffers.context``)."""
        keys, memory, padding = state.keys, state.memory, state.source_mask
        assert keys is not None and memory is not None
        if self.additive:
            q = torch.addmm(self.query_bias, query, self.query_weight_t)  # 2 (W_q q + b)
            # vᵀσ(k_j + q) for every j in one pass (the compiled loop's sigmoid), −∞ at padding
            self.lib.sigmoid_scores(
                keys.contiguous(), q, self.v, buffers.scores_2d, padding=padding
            )
            scores = buffers.scores  # (B, 1, S)
        else:  # dot, bilinear: keys are (the memory or W_s h^e) transposed
            scores = torch.bmm(query.unsqueeze(1), keys)  # (B, 1, S)
            if padding is not None:
                scores.masked_fill_(padding, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        torch.bmm(weights, memory, out=buffers.context)  # (B, 1, d_e)
        return buffers.context_2d

    @property
    def vocab_size(self) -> int:
        return self.model.vocab_size

    def step(self, token: Tensor, state: DecoderState) -> tuple[Tensor, DecoderState]:
        """One step for the search: ``token (B,)`` → ``(log-probabilities (B, V_t), state)``."""
        layers = _layers(state)
        B, H = token.shape[0], self.hidden
        buffers = self._buffers(B, self.table, state.memory)
        ctx = None
        parts: list[Tensor] = []
        if self.before:
            ctx = self._attend(layers[-1].h, state, buffers)
            parts.append(ctx)
        if state.context is not None:
            parts.append(state.context)
        # The embedding's part of the first layer's input product, then the rest's.
        xp = torch.index_select(self.table, 0, token)  # (B, 4H), a new tensor (table[token]
        # is the same rows through advanced indexing, four times slower at this size)
        if parts:
            rest = torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]
            xp = torch.addmm(xp, rest, self.rest_t)
        new: list[LSTMState] = []
        for l, (h_prev, c_prev) in enumerate(layers):
            if l > 0:  # the layer below's new state is this layer's input
                xp = torch.mm(new[-1].h, self.upper_ih_t[l - 1])
            # The recurrent product here, the gate math in one call (the whole-loop
            # lstm_forward would repack W_hh for this one step); tanh(c), which only a
            # backward reads, into a buffer.
            rec = torch.mm(h_prev, self.weight_hh_t[l])  # (B, 4H)
            h, c = xp.new_empty(B, H), xp.new_empty(B, H)
            self.lib.lstm_step(xp, rec, self.bias[l], c_prev.contiguous(), h, c, buffers.tanh_c)
            new.append(LSTMState(h, c))
        x = new[-1].h
        if self.attention is not None and not self.before:
            ctx = self._attend(x, state, buffers)
        features = x if ctx is None else torch.cat([x, ctx], dim=1)
        log_probs = torch.log_softmax(self.head(features), dim=-1)
        return log_probs, _with_layers(state, tuple(new))


def _layers(state: DecoderState) -> tuple[LSTMState, ...]:
    """The hidden part of this step's state: one ``(B, H)`` pair per layer."""
    assert isinstance(state.hidden, tuple) and not isinstance(state.hidden, LSTMState)
    return cast("tuple[LSTMState, ...]", state.hidden)


def _with_layers(state: DecoderState, layers: tuple[LSTMState, ...]) -> DecoderState:
    """``state`` holding ``layers`` as its hidden part (a form only this step reads)."""
    return state._replace(hidden=cast(Any, layers))


class _Buffers(NamedTuple):
    """A step's work buffers for one batch size: ``tanh_c (B, H)``, the attention scores
    ``(B, 1, S)`` and context ``(B, 1, D)`` with their ``(B, ·)`` views."""

    tanh_c: Tensor
    scores: Tensor
    scores_2d: Tensor
    context: Tensor
    context_2d: Tensor


def _embedding_table(model: Seq2Seq) -> Tensor:
    """``E W_ih[:, :E]ᵀ`` ``(V_t, 4H)`` of the decoder's first layer, kept on the model
    between decodings while the two weights are the same tensors, unchanged (their
    version counters count in-place updates: an optimizer step, ``load_state_dict``)."""
    embedding = model.target_embedding.weight
    weight = model.decoder.cells()[0].weight_ih
    key = tuple((id(t), t._version, t.data_ptr()) for t in (embedding, weight))
    cached = model.__dict__.get("_inference_table")
    if cached is not None and cached[0] == key:
        return cached[1]
    E = embedding.shape[1]
    table = embedding @ weight[:, :E].t()
    model.__dict__["_inference_table"] = (key, table)
    return table
