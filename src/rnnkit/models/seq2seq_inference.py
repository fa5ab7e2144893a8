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
* padding positions are excluded by one in-place fill of ``−∞`` with the mask inverted
  once (a source with no real position at all keeps the general step, whose weights
  are all zero there);
* each decoder layer's gates in one call of the compiled library (``lstm_step``), after
  one product for the input and one for the recurrence;
* weights are transposed once, not at every step.

The values equal the general step's to float rounding (tested in float64 and float32);
the general step stays the definition and runs wherever this one does not apply
(:meth:`InferenceStep.build` returns None): a GRU or simple-RNN decoder, a length
mechanism, training mode or gradients, autocast, or where the compiled loop does not run
(not CPU float32/float64, ``use_native(False)``, no compiler).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

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

    def prepare(self, state: DecoderState) -> DecoderState | None:
        """The encoder's :class:`DecoderState` in this step's form (keys scaled, mask
        inverted), or None where a source has no real position (the general step then)."""
        mask = state.source_mask
        if self.attention is None:
            return state
        if mask is not None and not bool(mask.any(dim=-1).all()):
            return None
        assert state.keys is not None
        # additive: 2k (the factor of tanh a = 2σ(2a) − 1); dot, bilinear: Kᵀ (B, A, S), so
        # that a step's scores are a row times a matrix (torch's batched matrix-times-column
        # product is several times slower)
        keys = 2 * state.keys if self.additive else state.keys.transpose(1, 2).contiguous()
        return state._replace(keys=keys, source_mask=None if mask is None else ~mask)

    def _attend(self, query: Tensor, state: DecoderState) -> Tensor:
        """The context ``(B, d_e)`` for ``query (B, d_q)``."""
        keys, memory, padding = state.keys, state.memory, state.source_mask
        assert keys is not None and memory is not None
        if self.additive:
            q = torch.addmm(self.query_bias, query, self.query_weight_t)  # 2 (W_q q + b)
            scores = keys.new_empty(keys.shape[:2])  # (B, S)
            # vᵀσ(k_j + q) for every j in one pass (the compiled loop's sigmoid)
            self.lib.sigmoid_scores(keys.contiguous(), q, self.v, scores)
        else:  # dot, bilinear: keys are (the memory or W_s h^e) transposed
            scores = torch.bmm(query.unsqueeze(1), keys).squeeze(1)
        if padding is not None:
            scores.masked_fill_(padding, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        return torch.bmm(weights.unsqueeze(1), memory).squeeze(1)

    @property
    def vocab_size(self) -> int:
        return self.model.vocab_size

    def step(self, token: Tensor, state: DecoderState) -> tuple[Tensor, DecoderState]:
        """One step for the search: ``token (B,)`` → ``(log-probabilities (B, V_t), state)``."""
        hidden = state.hidden
        assert isinstance(hidden, LSTMState)
        L, B, H = hidden.h.shape[0], token.shape[0], self.hidden
        ctx = None
        parts: list[Tensor] = []
        if self.before:
            ctx = self._attend(hidden.h[L - 1, 0], state)
            parts.append(ctx)
        if state.context is not None:
            parts.append(state.context)
        # The embedding's part of the first layer's input product, then the rest's.
        xp = torch.index_select(self.table, 0, token)  # (B, 4H), a new tensor (table[token]
        # is the same rows through advanced indexing, four times slower at this size)
        if parts:
            rest = torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]
            xp = torch.addmm(xp, rest, self.rest_t)
        hs: list[Tensor] = []
        cs: list[Tensor] = []
        for l in range(L):
            if l > 0:  # the layer below's new state is this layer's input
                xp = torch.mm(hs[-1], self.upper_ih_t[l - 1])
            # The recurrent product here, the gate math in one call (the whole-loop
            # lstm_forward would repack W_hh for this one step).
            rec = torch.mm(hidden.h[l, 0], self.weight_hh_t[l])  # (B, 4H)
            h, c, tanh_c = (xp.new_empty(B, H) for _ in range(3))
            self.lib.lstm_step(xp, rec, self.bias[l], hidden.c[l, 0].contiguous(), h, c, tanh_c)
            hs.append(h)
            cs.append(c)
        x = hs[-1]
        if self.attention is not None and not self.before:
            ctx = self._attend(x, state)
        features = x if ctx is None else torch.cat([x, ctx], dim=1)
        log_probs = torch.log_softmax(self.head(features), dim=-1)
        if L == 1:
            new = LSTMState(hs[0].view(1, 1, B, H), cs[0].view(1, 1, B, H))
        else:
            new = LSTMState(torch.stack(hs).unsqueeze(1), torch.stack(cs).unsqueeze(1))
        return log_probs, state._replace(hidden=new)


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
