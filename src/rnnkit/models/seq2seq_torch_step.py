"""The decoder step of decoding in few torch operations: the step a GPU takes.

On a GPU each ATen operation is (at least) one kernel launch, and decoding a small
encoder–decoder is bound by launches, not by arithmetic. :class:`TorchInferenceStep`
computes the same function as :meth:`rnnkit.models.seq2seq.Seq2Seq.step` — the equations
of :mod:`rnnkit.models.seq2seq_decoder`, then ``log softmax(V [h^d_i; c_i] + b)`` — from
torch operations only (no compiled library), in about half the general step's kernels, by
rearranging what does not change the value:

* the first layer's input product of the embedding is a table read by row,
  ``T = E W_ih[:, :E]ᵀ + b`` ``(V_t, G)`` (one ``index_select`` a step, kept on the model
  between decodings while the weights are unchanged), where the table holds at most
  :data:`TABLE_MAX_ELEMENTS` numbers; a larger vocabulary or layer reads the embedding's
  rows and multiplies them at each step (one product more a step, no ``V_t × G`` copy
  of the weights: 32,000 words and a 1,024-wide LSTM would make it 512 MiB);
* every product of a layer's new state is ONE product: ``h^l_i`` is multiplied at once by
  the layer above's input weights (this step's input gates there) and by its own
  recurrent weights (the next step's recurrent gates, carried in the state); the top
  layer's by its recurrent weights, the additive attention's ``W_q`` (the next query, or
  this one with attention after the step) and the head's ``V_h`` (``V [h; c] + b =
  V_h h + V_c c + b``): one product and its biases where the general step has three to
  five;
* each layer's gate math in torch's fused cell kernel on a GPU (``_thnn_fused_lstm_cell``,
  ``_thnn_fused_gru_cell``; elsewhere a few elementwise operations), from the input and
  recurrent gates already summed with their biases. A GRU's ``update="candidate"`` is
  the fused kernel's ``"keep"`` with the ``z`` rows negated (``1 − σ(a) = σ(−a)``);
  ``reset="before"``, which the fused kernel does not compute, takes its few operations
  on every device;
* the attention's keys are prepared once per decoding (dot and bilinear: transposed, so
  that the scores are a row times a matrix), and its mask too: ``0`` at real positions,
  ``−∞`` at padding, added to the scores inside their product (``addmv``, ``baddbmm``);
  a source without any real position gets ``0`` everywhere and its memory zeroed, so
  that its context is exactly zero as the general step's (no ``any`` nor ``where`` per
  step); additive scores ``vᵀ tanh(W_q q + b + k_j)`` are ``2 vᵀ σ(2 (W_q q + b + k_j))``
  (``tanh a = 2σ(2a) − 1``, less the constant ``− Σ v``: a softmax does not change when
  the same number is added to every score), the factors 2 folded into the weights and
  keys once: three kernels as tanh's form, where a tanh costs 3–4 times a sigmoid on
  the CPU;
* the context fed at every step (``context="input"``/``"both"``) enters the first
  layer's input gates as its product with the weights, made once per decoding;
* the state holds each layer's ``(B, H)`` tensors and the carried products (batch
  dimension 0 everywhere, :attr:`TorchInferenceStep.state_batch_dim`).

The values equal the general step's to float rounding (tested in float64); the general
step stays the definition and runs wherever this one does not apply
(:meth:`TorchInferenceStep.build` returns None): a length mechanism, training mode or
gradients, autocast or tracing, weights or states of different dtypes or devices.
Decoding (:meth:`rnnkit.models.seq2seq.Seq2Seq.decode`, ``sample``) takes this step where
the compiled library's (:mod:`rnnkit.models.seq2seq_inference`: an LSTM decoder on the
CPU) does not run: on a GPU, with ``use_native(False)``, for a GRU or simple-RNN decoder
on the CPU (where it is faster than the general step too), for a source without any
real position.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple, cast

import torch
from torch import Tensor, nn

from rnnkit.bptt.tracing import tracing
from rnnkit.cells.amp import autocast_devices_on
from rnnkit.cells.gru import GRUCell
from rnnkit.cells.lstm import LSTMCell
from rnnkit.cells.rnn import RNNCell, activate
from rnnkit.models.seq2seq_decoder import DecoderState
from rnnkit.types import LSTMState

if TYPE_CHECKING:
    from rnnkit.models.seq2seq import Seq2Seq

__all__ = ["TorchInferenceStep"]

#: The most numbers of the first layer's embedding table ``(V_t, G)``: 2²⁴, 64 MiB in
#: float32. Past it each step multiplies the embedding's rows instead (module docstring).
TABLE_MAX_ELEMENTS = 1 << 24


class _Cell(NamedTuple):
    """One decoder layer in this step's form.

    ``kind``: ``"lstm"``, ``"gru"`` (reset after, update keep: the fused kernel's form),
    ``"gru_before"`` (reset before, update keep) or ``"rnn"``; ``hidden``: ``H``;
    ``recurrent``: the width of its carried recurrent gates (``4H``, ``3H``, ``2H``: the
    r and z rows only for reset before, ``H``); ``weight_n_t``: ``W_nhᵀ`` ``(H, H)`` for
    reset before (its product reads ``r ⊙ h``, known only inside the step);
    ``nonlinearity``: a simple cell's.
    """

    kind: str
    hidden: int
    recurrent: int
    weight_n_t: Tensor | None
    nonlinearity: str


class _Weights(NamedTuple):
    """One layer's weights in this step's form: ``(W_ih, W_hh, input bias, recurrent
    bias)``, the recurrent ones restricted to the carried rows (``None``: no bias)."""

    weight_ih: Tensor
    weight_hh: Tensor
    bias_ih: Tensor
    bias_hh: Tensor | None


def _cell_weights(cell: nn.Module) -> tuple[_Cell, _Weights] | None:
    """``cell`` in this step's form, or None where it has none (a cell other than the
    plain three)."""
    if type(cell) is LSTMCell:
        H = cell.hidden_size
        w = _Weights(cell.weight_ih, cell.weight_hh, cell.bias, None)
        return _Cell("lstm", H, 4 * H, None, ""), w
    if type(cell) is RNNCell:
        H = cell.hidden_size
        w = _Weights(cell.weight_ih, cell.weight_hh, cell.bias, None)
        return _Cell("rnn", H, H, None, cell.nonlinearity), w
    if type(cell) is GRUCell:
        H = cell.hidden_size
        w_ih: Tensor = cell.weight_ih
        w_hh: Tensor = cell.weight_hh
        bias: Tensor = cell.bias
        if cell.update == "candidate":
            # 1 − σ(a) = σ(−a): z's rows negated turn "candidate" into the kernel's "keep"
            sign = torch.ones(3 * H, 1, dtype=w_ih.dtype, device=w_ih.device)
            sign[H : 2 * H] = -1
            w_ih, w_hh, bias = w_ih * sign, w_hh * sign, bias * sign.view(-1)
        if cell.reset == "after":
            assert cell.bias_hn is not None
            zeros = bias.new_zeros(2 * H)
            return _Cell("gru", H, 3 * H, None, ""), _Weights(
                w_ih, w_hh, bias, torch.cat([zeros, cell.bias_hn])
            )
        return _Cell("gru_before", H, 2 * H, w_hh[2 * H :].t().contiguous(), ""), _Weights(
            w_ih, w_hh[: 2 * H], bias, None
        )
    return None


class TorchInferenceStep:
    """``step(token (B,), state) -> (log-probabilities (B, V_t), state)`` of a
    :class:`~rnnkit.models.seq2seq.Seq2Seq` for decoding, in few torch operations (the
    module docstring lists them).

    Built once per decoding by :meth:`build` from the model's weights as they are then
    (decoding runs without gradients, so they do not change while it runs); the state it
    takes and returns is the :class:`DecoderState` of :meth:`prepare`, whose rows the
    search selects as usual: ``hidden`` is ``(layers, carried)``, each layer's ``(B, H)``
    state and its carried product ``(B, ·)``; the attention's keys, mask and memory and
    the fixed context's product are in this step's form (only this step reads them).
    """

    def __init__(self, model: Seq2Seq, cells: list[_Cell], weights: list[_Weights]) -> None:
        self.model = model
        self.cells = cells
        E = model.target_embedding.embedding_dim
        first = weights[0]
        # (V_t, G_0) with the bias in it, or None: the embedding's rows multiplied a step
        self.table = _embedding_table(model, first)
        self.embedding = model.target_embedding.weight  # (V_t, E)
        self.embedded_t = first.weight_ih[:, :E].t()  # (E, G_0)
        self.first_bias = first.bias_ih
        att = model.attention
        self.attention = att
        self.before = att is not None and model.attention_wiring == "before"
        self.additive = att is not None and att.kind == "additive"
        D = model.memory_size
        # The first layer's input columns after the embedding: [c_i (before); context].
        at = E
        self.attended_t: Tensor | None = None  # (D, G_0)
        if self.before:
            self.attended_t = first.weight_ih[:, at : at + D].t().contiguous()
            at += D
        self.context_weight = first.weight_ih[:, at:] if model.context_mode != "init" else None
        # Each layer's one product: [W_ih of the layer above | own carried W_hh] below the
        # top; [W_hh | W_q (additive) | V_h (a linear head)] at the top. Transposed once.
        self.products_t: list[Tensor] = []
        self.products_bias: list[Tensor] = []
        top = len(cells) - 1
        for l, (cell, w) in enumerate(zip(cells, weights, strict=True)):
            rec_bias = w.bias_hh if w.bias_hh is not None else w.weight_hh.new_zeros(cell.recurrent)
            if l < top:
                above = weights[l + 1]
                parts, biases = [above.weight_ih, w.weight_hh], [above.bias_ih, rec_bias]
            else:
                parts, biases = [w.weight_hh], [rec_bias]
            self.products_t.append(torch.cat(parts).t().contiguous())
            self.products_bias.append(torch.cat(biases))
        # where each product's columns are: the layer above's input gates (below the top),
        # then the carried recurrent gates
        self.carried_at = [
            (weights[l + 1].weight_ih.shape[0] if l < top else 0) for l in range(len(cells))
        ]
        # The top product's extra columns: the query projection, the head's h part.
        H = cells[-1].hidden
        extra, extra_bias = [], []
        at = cells[-1].recurrent
        self.query_at: tuple[int, int] | None = None
        if self.additive:
            assert att is not None
            # 2 (W_q q + b) and 2v: the factors of tanh a = 2σ(2a) − 1 (the keys' at prepare)
            proj = att.query_proj
            extra.append(2 * proj.weight)
            extra_bias.append(2 * proj.bias)
            self.query_at = (at, at + proj.weight.shape[0])
            at += proj.weight.shape[0]
            self.v = 2 * att.v
        # A linear head: with attention, V_h's columns here and V_c c added to them (the
        # logits a new tensor); without, one product of its own (a column slice of the
        # top product would be copied by a GPU's log softmax).
        self.head_at: tuple[int, int] | None = None
        self.head_context_t: Tensor | None = None
        self.head_t: Tensor | None = None
        head = model.head
        if isinstance(head, nn.Linear):  # rnnkit.layers.Linear is one
            weight = head.weight  # (V_t, H [+ D])
            bias = head.bias if head.bias is not None else weight.new_zeros(weight.shape[0])
            self.head_bias = bias
            if att is not None:
                extra.append(weight[:, :H])
                extra_bias.append(bias)
                self.head_at = (at, at + weight.shape[0])
                self.head_context_t = weight[:, H:].t().contiguous()  # (D, V_t)
            else:
                self.head_t = weight.t().contiguous()  # (H, V_t)
        if extra:
            self.products_t[-1] = torch.cat([self.products_t[-1], torch.cat(extra).t()], dim=1)
            self.products_bias[-1] = torch.cat([self.products_bias[-1], *extra_bias])
            self.products_t[-1] = self.products_t[-1].contiguous()

    @classmethod
    def build(cls, model: Seq2Seq) -> TorchInferenceStep | None:
        """This step for ``model`` as it is now, or None where the general step must run
        (the module docstring lists when)."""
        if model.training or torch.is_grad_enabled() or autocast_devices_on() or tracing():
            return None
        if torch.jit.is_tracing() or model.length is not None:
            return None
        forms = [_cell_weights(c) for c in model.decoder.cells()]
        if not forms or any(f is None for f in forms):
            return None
        cells = [f[0] for f in forms if f is not None]
        weights = [f[1] for f in forms if f is not None]
        params = list(model.parameters())
        first = params[0]
        if any(p.dtype != first.dtype or p.device != first.device for p in params):
            return None
        return cls(model, cells, weights)

    #: The batch dimension of every part of this step's state (for the search's row
    #: selection): 0 everywhere.
    state_batch_dim = DecoderState._make((0,) * len(DecoderState._fields))

    def prepare(self, state: DecoderState) -> DecoderState | None:
        """The encoder's :class:`DecoderState` in this step's form (module docstring), or
        None where its tensors are not of the weights' dtype and device."""
        like = self.embedding
        tensors = [t for t in state if isinstance(t, Tensor) and t.is_floating_point()]
        hidden = state.hidden
        tensors += list(hidden) if isinstance(hidden, LSTMState) else [hidden]
        if any(t.dtype != like.dtype or t.device != like.device for t in tensors):
            return None
        if isinstance(hidden, LSTMState):
            layers: tuple[Any, ...] = tuple(
                LSTMState(h[0], c[0]) for h, c in zip(hidden.h, hidden.c, strict=True)
            )
        else:
            layers = tuple(h[0] for h in hidden)
        carried = tuple(
            torch.addmm(b, _top(s), w)
            for s, w, b in zip(layers, self.products_t, self.products_bias, strict=True)
        )
        context = None
        if self.context_weight is not None:
            assert state.context is not None
            context = state.context @ self.context_weight.t()  # (B, G_0), once
        keys, memory, mask = state.keys, state.memory, state.source_mask
        if self.attention is not None:
            assert keys is not None and memory is not None
            B, S = memory.shape[:2]
            # additive: 2k, the factor of tanh a = 2σ(2a) − 1; dot, bilinear: Kᵀ (B, d, S),
            # so that a step's scores are a row times a matrix
            keys = 2 * keys if self.additive else keys.transpose(1, 2).contiguous()
            if mask is not None:
                real = mask.to(device=memory.device, dtype=torch.bool)
                some = real.any(dim=-1, keepdim=True)  # (B, 1)
                # 0 at real positions, −∞ at padding; a row with none: 0 everywhere and its
                # memory zeroed (its context is exactly 0, as the general step's)
                mask = torch.zeros(B, 1, S, dtype=memory.dtype, device=memory.device)
                mask.masked_fill_((~real & some).unsqueeze(1), float("-inf"))
                memory = memory.masked_fill(~some.unsqueeze(-1), 0.0)
        return state._replace(
            hidden=cast(Any, (layers, carried)),
            keys=keys,
            memory=memory,
            source_mask=mask,
            context=context,
        )

    def hidden_state(self, state: DecoderState) -> Any:
        """The decoder state of this step's ``state`` as :class:`DecoderState` holds it,
        ``(L, 1, B, H)`` (an ``LSTMState`` of two for an LSTM decoder)."""
        layers = _layers(state)
        if isinstance(layers[0], LSTMState):
            return LSTMState(
                torch.stack([s.h for s in layers]).unsqueeze(1),
                torch.stack([s.c for s in layers]).unsqueeze(1),
            )
        return torch.stack(list(layers)).unsqueeze(1)

    @property
    def vocab_size(self) -> int:
        return self.model.vocab_size

    def _attend(self, query: Tensor, state: DecoderState) -> Tensor:
        """The context ``(B, d_e)`` for ``query``: ``(B, A)`` ``W_q q + b`` (additive) or
        the state ``(B, d_q)`` (dot, bilinear)."""
        keys, memory, mask = state.keys, state.memory, state.source_mask
        assert keys is not None and memory is not None
        B, S, D = memory.shape
        if self.additive:
            # 2 vᵀσ(2 (W_q q + b + k_j)), without the − Σ v of tanh's form (a softmax does
            # not change when the same number is added to every score)
            hidden = torch.sigmoid(keys + query.unsqueeze(1)).view(B * S, keys.shape[-1])
            if mask is None:
                scores = torch.mv(hidden, self.v)
            else:  # the mask added inside the product
                scores = torch.addmv(mask.view(B * S), hidden, self.v)
            scores = scores.view(B, 1, S)
        elif mask is None:
            scores = torch.bmm(query.unsqueeze(1), keys)  # (B, 1, S)
        else:
            scores = torch.baddbmm(mask, query.unsqueeze(1), keys)
        weights = torch.softmax(scores, dim=-1)
        return torch.bmm(weights, memory).view(B, D)

    def step(self, token: Tensor, state: DecoderState) -> tuple[Tensor, DecoderState]:
        """One step for the search: ``token (B,)`` → ``(log-probabilities (B, V_t), state)``."""
        layers, carried = cast("tuple[tuple[Any, ...], tuple[Tensor, ...]]", state.hidden)
        top = len(self.cells) - 1
        ctx = None
        if self.before:
            ctx = self._attend(self._query(carried[top], _top(layers[top])), state)
        # the first layer's input gates: the table's row, the context's products
        if self.table is not None:
            gates = torch.index_select(self.table, 0, token)  # (B, G_0)
        else:
            rows = torch.index_select(self.embedding, 0, token)  # (B, E)
            gates = torch.addmm(self.first_bias, rows, self.embedded_t)
        if ctx is not None:
            assert self.attended_t is not None
            gates = torch.addmm(gates, ctx, self.attended_t)
        if state.context is not None:
            gates = gates + state.context
        new_layers: list[Any] = []
        new_carried: list[Tensor] = []
        for l, cell in enumerate(self.cells):
            at = self.carried_at[l]
            rec = carried[l][:, at : at + cell.recurrent]  # this layer's recurrent gates
            s = self._cell(cell, gates, rec, layers[l])
            product = torch.addmm(self.products_bias[l], _top(s), self.products_t[l])
            new_layers.append(s)
            new_carried.append(product)
            if l < top:
                gates = product[:, :at]  # the layer above's input gates
        h, product = _top(new_layers[top]), new_carried[top]
        if self.attention is not None and not self.before:
            ctx = self._attend(self._query(product, h), state)
        if self.head_at is not None:  # V_h h + b, then + V_c c
            assert ctx is not None and self.head_context_t is not None
            logits = product[:, self.head_at[0] : self.head_at[1]]
            logits = torch.addmm(logits, ctx, self.head_context_t)
        elif self.head_t is not None:  # no attention
            logits = torch.addmm(self.head_bias, h, self.head_t)
        else:
            features = h if ctx is None else torch.cat([h, ctx], dim=1)
            logits = self.model.head(features)
        log_probs = torch.log_softmax(logits, dim=-1)
        hidden = (tuple(new_layers), tuple(new_carried))
        return log_probs, state._replace(hidden=cast(Any, hidden))

    def _query(self, product: Tensor, h: Tensor) -> Tensor:
        """The attention's query: ``W_q h + b`` from the top product (additive), else
        ``h``."""
        if self.query_at is None:
            return h
        return product[:, self.query_at[0] : self.query_at[1]]

    @staticmethod
    def _cell(cell: _Cell, gates: Tensor, rec: Tensor, state: Any) -> Any:
        """One layer's new state from its input gates and its recurrent gates (each with
        its biases)."""
        H = cell.hidden
        if cell.kind == "lstm":
            if gates.is_cuda:
                h, c, _ = torch.ops.aten._thnn_fused_lstm_cell(gates, rec, state.c)
                return LSTMState(h, c)
            a = gates + rec  # (B, 4H): i, f, g, o
            i_f = torch.sigmoid(a[:, : 2 * H])
            g = torch.tanh(a[:, 2 * H : 3 * H])
            o = torch.sigmoid(a[:, 3 * H :])
            c = torch.addcmul(i_f[:, H:] * state.c, i_f[:, :H], g)
            return LSTMState(o * torch.tanh(c), c)
        if cell.kind == "rnn":
            return activate(gates + rec, cell.nonlinearity)
        if cell.kind == "gru":
            if gates.is_cuda:
                return torch.ops.aten._thnn_fused_gru_cell(gates, rec, state)[0]
            r_z = torch.sigmoid(gates[:, : 2 * H] + rec[:, : 2 * H])
            n = torch.tanh(torch.addcmul(gates[:, 2 * H :], r_z[:, :H], rec[:, 2 * H :]))
        else:  # reset before: the n block's product reads r ⊙ h
            assert cell.weight_n_t is not None
            r_z = torch.sigmoid(gates[:, : 2 * H] + rec)
            n = torch.tanh(torch.addmm(gates[:, 2 * H :], r_z[:, :H] * state, cell.weight_n_t))
        # update "keep": h = z h_prev + (1 − z) n = n + z (h_prev − n)
        return torch.lerp(n, state, r_z[:, H:])


def _top(state: Any) -> Tensor:
    return state.h if isinstance(state, LSTMState) else state


def _layers(state: DecoderState) -> tuple[Any, ...]:
    """The layers' states of this step's ``state``: one ``(B, H)`` state per layer."""
    return cast("tuple[tuple[Any, ...], Any]", state.hidden)[0]


def _embedding_table(model: Seq2Seq, first: _Weights) -> Tensor | None:
    """``E W_ih[:, :E]ᵀ + b`` ``(V_t, G)`` of the decoder's first layer, kept on the model
    between decodings while the weights it reads are the same tensors, unchanged (their
    version counters count in-place updates: an optimizer step, ``load_state_dict``);
    None where it would hold more than :data:`TABLE_MAX_ELEMENTS` numbers."""
    embedding = model.target_embedding.weight
    if embedding.shape[0] * first.weight_ih.shape[0] > TABLE_MAX_ELEMENTS:
        model.__dict__.pop("_torch_inference_table", None)  # none kept from a larger bound
        return None
    cell = model.decoder.cells()[0]
    read = [embedding, *(p for p in cell.parameters())]
    key = tuple((id(t), t._version, t.data_ptr()) for t in read)
    cached = model.__dict__.get("_torch_inference_table")
    if cached is not None and cached[0] == key:
        return cast(Tensor, cached[1])
    E = embedding.shape[1]
    table = torch.addmm(first.bias_ih, embedding, first.weight_ih[:, :E].t())
    model.__dict__["_torch_inference_table"] = (key, table)
    return table
