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
  change when the same number is added to every score;
* padding positions are excluded by one in-place fill of ``−∞`` with the mask inverted
  once (a source with no real position at all keeps the general step, whose weights
  are all zero there);
* each decoder layer's recurrence and gates run in the compiled time loop for one step
  (``h W_hhᵀ`` and the fused gates in one call), after one product for the input;
* weights are transposed once, not at every step.

The values equal the general step's to float rounding (tested in float64 and float32);
the general step stays the definition and runs wherever this one does not apply
(:meth:`InferenceStep.build` returns None): a GRU or simple-RNN decoder, a length
mechanism, training mode or gradients, autocast, or where the compiled loop does not run
(not CPU float32/float64, ``use_native(False)``, no compiler).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

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
        self.weight_hh = [c.weight_hh.contiguous() for c in cells]  # (4H, H)
        self.bias = [c.bias.contiguous() for c in cells]
        self.hidden = model.decoder.hidden_size
        self.head = model.head
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
        keys = 2 * state.keys if self.additive else state.keys
        return state._replace(keys=keys, source_mask=None if mask is None else ~mask)

    def _attend(self, query: Tensor, state: DecoderState) -> Tensor:
        """The context ``(B, d_e)`` for ``query (B, d_q)``."""
        keys, memory, padding = state.keys, state.memory, state.source_mask
        assert keys is not None and memory is not None
        if self.additive:
            q = torch.addmm(self.query_bias, query, self.query_weight_t)  # 2 (W_q q + b)
            scores = torch.add(keys, q.unsqueeze(1)).sigmoid_() @ self.v  # (B, S)
        else:  # dot, bilinear: keys are the memory or W_s h^e
            scores = torch.bmm(keys, query.unsqueeze(-1)).squeeze(-1)
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
        xp = self.table[token]  # (B, 4H), a new tensor
        if parts:
            rest = torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]
            xp = torch.addmm(xp, rest, self.rest_t)
        hs: list[Tensor] = []
        cs: list[Tensor] = []
        for l in range(L):
            if l > 0:  # the layer below's new state is this layer's input
                xp = torch.mm(hs[-1], self.upper_ih_t[l - 1])
            # The loop reads the input product as (T, B, 4H) and activates it in place.
            h, c, _ = self.lib.lstm_forward(
                xp.view(1, B, 4 * H),
                self.weight_hh[l],
                self.bias[l],
                hidden.h[l, 0],
                hidden.c[l, 0],
                None,
                False,
            )
            hs.append(h[1])
            cs.append(c[1])
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
