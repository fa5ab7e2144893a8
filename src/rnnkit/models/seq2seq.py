"""Encoder–decoder: encoder stack → context / attention → step-wise decoder.

The encoder reads the source ``x_1..x_S`` into states ``h^e_1..h^e_S`` (``D·H_e`` wide,
both directions concatenated) and a final state per layer (each sequence's own last real
step; for the backward direction the state after reading back to ``x_1``). The context
``c`` is the top layer's final state, directions concatenated: ``[h^f_S; h^b_1]``.

``context`` decides where it goes:

* ``"init"``: it initialises the decoder, layer by layer: ``h^d_0 = c`` when the widths
  agree (one direction, ``H_e = H_d``), else ``h^d_0 = tanh(W_b [h^f; h^b] + b_b)`` (for an
  LSTM the memory cell gets its own linear projection, no tanh);
* ``"input"``: it is appended to the decoder's input at every step (the state starts at 0);
* ``"both"``.

With attention, ``attention_wiring`` says where it sits in a decoder step, ``"before"``
(Bahdanau et al. 2015) or ``"after"`` (Luong et al. 2015); the decoder side (its state,
one step, the teacher-forced run) is :mod:`rnnkit.models.seq2seq_decoder`, whose
docstring gives the equations.

Training: teacher forcing (input ``y_{i−1}``), or scheduled sampling: with probability
``p``, per sequence and per step, the input is the model's own greedy choice at the
previous step instead. A sequence whose fed token is its own ``</s>`` has ended, as it
would in free running: its later steps carry no loss (their inputs are irrelevant).
Scheduled sampling runs the decoder one step at a time; pure teacher forcing runs all
steps at once where it can (:mod:`rnnkit.models.seq2seq_decoder`).

``length="stop"`` / ``"predict"`` (a :class:`~rnnkit.models.length.SequenceLength`) replaces
``</s>`` by a stop output per decoder step (reading the head's features), or by a length
predicted from the encoder context ``c`` with the steps remaining appended to every
decoder input ``[E y_{i−1}; E_r[r_i]; …]``; the default (None) is the ``</s>`` decoder.
Scheduled sampling is not combined with a mechanism.

Decoding (greedy or beam search with length normalisation, batched) goes through
:func:`rnnkit.generation.search.generate_batch` with :meth:`Seq2Seq.step`: the encoder runs once,
then one decoder step per token; finished rows leave the batch.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

from rnnkit.data.pairs import PairBatch
from rnnkit.data.vocab import BOS_ID, EOS_ID, NEVER_GENERATED
from rnnkit.deferred import figure_of
from rnnkit.errors import ConfigError
from rnnkit.generation.options import greedy_choice
from rnnkit.generation.search import GenerationResult, generate_batch
from rnnkit.generation.seq2seq_search import decode_batch
from rnnkit.layers.attention import Attention
from rnnkit.layers.linear import Linear
from rnnkit.layers.stacked import StackedRecurrent
from rnnkit.metrics.losses import training_loss
from rnnkit.models.builders import build_embedding, build_encoder, build_length, check_vocab_size
from rnnkit.models.heads import TiedHead
from rnnkit.models.language_model import LossOutput, check_token_ids
from rnnkit.models.length import SequenceLength, length_targets
from rnnkit.models.pooling import directions_side_by_side
from rnnkit.models.seq2seq_decoder import (
    PER_SOURCE,
    STATE_BATCH_DIM,
    DecoderState,
    _decoder_step,
    _stack,
    _teacher_forced,
    _top,
    _unstack,
    check_stepped_decoder,
)
from rnnkit.models.seq2seq_inference import InferenceStep
from rnnkit.models.seq2seq_torch_step import TorchInferenceStep
from rnnkit.models.spec import ModelSpec
from rnnkit.types import LSTMState, State

__all__ = [
    "ATTENTION_WIRINGS",
    "CONTEXT_MODES",
    "STATE_BATCH_DIM",
    "DecoderState",
    "Seq2Seq",
    "Seq2SeqOutput",
    "build_seq2seq",
]

CONTEXT_MODES = ("init", "input", "both")
ATTENTION_WIRINGS = ("before", "after")


class Seq2SeqOutput(NamedTuple):
    """Teacher-forced (or scheduled-sampling) outputs.

    Attributes:
        logits: ``(B, T, V)`` over the target vocabulary at every decoder step.
        attention: ``(B, T, S)`` attention weights (exactly 0 at source padding), or None.
        mask: ``(B, T)`` the steps that carry a loss: the target mask, less the steps after
            a sequence was fed its own ``</s>`` (scheduled sampling).
        features: ``(B, T, F)`` what the head read (with a length mechanism), or None.
        context: ``(B, D·H_e)`` the encoder context (with a length mechanism), or None.
    """

    logits: Tensor
    attention: Tensor | None
    mask: Tensor
    features: Tensor | None = None
    context: Tensor | None = None


def _coins(n: int, generator: torch.Generator | None, device: torch.device) -> Tensor:
    """``n`` uniform draws on ``device``, from ``generator`` (where it lives) if given."""
    where = generator.device if generator is not None else device
    return torch.rand(n, generator=generator, device=where).to(device)


def _directions(t: Tensor) -> Tensor:
    """``(D, B, H)`` → ``(B, D·H)``: ``[h^f; h^b]``."""
    return directions_side_by_side(t)


class Seq2Seq(nn.Module):
    """Encoder–decoder with optional attention; parts injected, :func:`build_seq2seq` sizes.

    Args:
        source_embedding: ``nn.Embedding(V_s, E_s)``.
        encoder: a stack (``RNN``/``LSTM``/``GRU``, may be bidirectional) over ``E_s``.
        target_embedding: ``nn.Embedding(V_t, E_t)``.
        decoder: a unidirectional stack whose ``input_size`` is ``E_t`` (+ ``D·H_e`` with
            attention, + ``D·H_e`` for ``context`` input/both); stepped cell by cell.
        head: maps ``(…, H_d [+ D·H_e with attention])`` to logits ``(…, V_t)``.
        attention: an :class:`~rnnkit.layers.attention.Attention` with ``query_size = H_d`` and
            ``memory_size = D·H_e``, or None.
        attention_wiring: ``"before"`` or ``"after"`` the decoder step
            (:mod:`rnnkit.models.seq2seq_decoder`); with ``"after"`` the decoder's input has
            no attention context.
        context: ``"init"``, ``"input"`` or ``"both"`` (see the module docstring).
        dropout: on embeddings and before the head.
        length: a :class:`~rnnkit.models.length.SequenceLength` with ``features_size`` the
            head's input width and ``context_size = D·H_e``, or None (``</s>``). With
            ``"predict"`` the decoder input grows by its ``input_size`` ``R``.

    >>> from rnnkit import GRU
    >>> model = Seq2Seq(nn.Embedding(9, 4), GRU(4, 6, bidirectional=True),
    ...                 nn.Embedding(7, 4), GRU(4 + 12, 6), nn.Linear(6 + 12, 7),
    ...                 attention=Attention("additive", 6, 12))
    >>> src, tgt = torch.tensor([[4, 5, 6], [7, 8, 0]]), torch.tensor([[2, 4], [2, 5]])
    >>> out = model(src, src != 0, tgt, torch.ones(2, 2, dtype=torch.bool))
    >>> out.logits.shape, out.attention.shape, out.attention[1, :, 2].tolist()
    (torch.Size([2, 2, 7]), torch.Size([2, 2, 3]), [0.0, 0.0])
    """

    #: How the training loss averages token losses: "token" (every target token weighs
    #: the same) or "sequence" (the mean within each sequence, then over sequences).
    loss_reduction: str = "token"

    def __init__(
        self,
        source_embedding: nn.Embedding,
        encoder: StackedRecurrent,
        target_embedding: nn.Embedding,
        decoder: StackedRecurrent,
        head: nn.Module,
        attention: Attention | None = None,
        context: str = "init",
        dropout: float = 0.0,
        length: SequenceLength | None = None,
        attention_wiring: str = "before",
    ) -> None:
        super().__init__()
        if context not in CONTEXT_MODES:
            raise ConfigError(f"context must be one of {', '.join(CONTEXT_MODES)}, got {context!r}")
        if attention_wiring not in ATTENTION_WIRINGS:
            raise ConfigError(
                f"attention_wiring must be one of {', '.join(ATTENTION_WIRINGS)}, "
                f"got {attention_wiring!r}"
            )
        if decoder.bidirectional:
            raise ValueError("the decoder must be unidirectional (it generates left to right)")
        check_stepped_decoder(decoder)
        if encoder.input_size != source_embedding.embedding_dim:
            raise ValueError(
                f"encoder input_size {encoder.input_size} != source embedding_dim "
                f"{source_embedding.embedding_dim}"
            )
        memory_size = encoder.num_directions * encoder.hidden_size
        H = decoder.hidden_size
        expected = target_embedding.embedding_dim + (0 if length is None else length.input_size)
        if attention is not None:
            if (attention.query_size, attention.memory_size) != (H, memory_size):
                raise ValueError(
                    f"attention widths ({attention.query_size}, {attention.memory_size}) must be "
                    f"(decoder hidden {H}, encoder states {memory_size})"
                )
            if attention_wiring == "before":
                expected += memory_size
        fed = attention is not None and attention_wiring == "before"
        if context in ("input", "both"):
            expected += memory_size
        if decoder.input_size != expected:
            raise ValueError(
                f"decoder input_size must be {expected} (target embedding"
                f"{' + steps remaining' if length is not None and length.input_size else ''}"
                f"{' + attention context' if fed else ''}"
                f"{' + fixed context' if context != 'init' else ''}), got {decoder.input_size}"
            )
        if length is not None:
            features = H + (memory_size if attention is not None else 0)
            if length.features_size != features:
                raise ValueError(f"length features_size must be {features} (the head's input)")
            if length.mode == "predict" and length.context_size != memory_size:
                raise ValueError(f"length context_size must be {memory_size} (D·H_e)")
        self.length = length
        self.source_embedding = source_embedding
        self.encoder = encoder
        self.target_embedding = target_embedding
        self.decoder = decoder
        self.head = head
        self.attention = attention
        self.attention_wiring = attention_wiring
        self.context_mode = context
        self.memory_size = memory_size
        self.drop = nn.Dropout(dropout)
        # Bridges from the encoder's final states to the decoder's initial ones.
        self.bridge_h = nn.ModuleList()
        self.bridge_c = nn.ModuleList()
        if context in ("init", "both"):
            same = encoder.num_directions == 1 and encoder.hidden_size == H
            for _ in range(decoder.num_layers):
                self.bridge_h.append(nn.Identity() if same else nn.Linear(memory_size, H))
                if decoder.is_lstm:
                    copy_c = same and encoder.is_lstm
                    self.bridge_c.append(nn.Identity() if copy_c else nn.Linear(memory_size, H))
        self._project_h = not (encoder.num_directions == 1 and encoder.hidden_size == H)

    @property
    def vocab_size(self) -> int:
        """``V_t``, the size of the target vocabulary."""
        return self.target_embedding.num_embeddings

    # ------------------------------------------------------------------------ encoder
    def encode(self, source: Tensor, source_mask: Tensor) -> DecoderState:
        """Run the encoder; return the decoder's initial :class:`DecoderState`.

        Args:
            source: ``(B, S)`` source ids.  source_mask: ``(B, S)`` bool.
        """
        return self._encode(source, source_mask)[0]

    def _encode(self, source: Tensor, source_mask: Tensor) -> tuple[DecoderState, Tensor]:
        """:meth:`encode`, and the context ``c (B, D·H_e)``."""
        source = check_token_ids(
            source, getattr(self.source_embedding, "num_embeddings", None), "source"
        )
        x = self.drop(self.source_embedding(source))  # (B, S, E_s)
        out = self.encoder(x, mask=source_mask)
        memory = out.outputs  # (B, S, D·H_e)
        enc_h = _top(out.state)  # (L_e, D, B, H_e)
        B = source.shape[0]
        context = _directions(enc_h[-1])  # (B, D·H_e)
        L_d, L_e = self.decoder.num_layers, enc_h.shape[0]
        H = self.decoder.hidden_size
        if self.context_mode == "input":
            h0 = memory.new_zeros(L_d, 1, B, H)
            hidden: State = LSTMState(h0, torch.zeros_like(h0)) if self.decoder.is_lstm else h0
        else:
            layers: list[State] = []
            for l in range(L_d):
                src = l if L_e == L_d else L_e - 1
                h = self.bridge_h[l](_directions(enc_h[src]))  # (B, H_d)
                if self._project_h:
                    h = torch.tanh(h)
                if self.decoder.is_lstm:
                    if isinstance(out.state, LSTMState):
                        c = self.bridge_c[l](_directions(out.state.c[src]))
                    else:
                        c = self.bridge_c[l](torch.zeros_like(context))
                    layers.append(LSTMState(h, c))
                else:
                    layers.append(h)
            hidden = _stack(layers)
        keys = self.attention.prepare(memory) if self.attention is not None else None
        return DecoderState(
            hidden=hidden,
            memory=memory if self.attention is not None else None,
            keys=keys,
            source_mask=source_mask if self.attention is not None else None,
            context=context if self.context_mode in ("input", "both") else None,
            length=None if self.length is None else self.length.start(B, context),
        ), context

    # ------------------------------------------------------------------------ decoder
    def _step(
        self, emb: Tensor, hidden: list[State], state: DecoderState
    ) -> tuple[Tensor, list[State], Tensor | None]:
        """One decoder step: ``emb (B, E_t)`` → (head input ``(B, ·)``, new layers, α)."""
        return _decoder_step(
            self.decoder, self.attention, self.attention_wiring, emb, hidden, state
        )

    def _dropout(self, x: Tensor) -> Tensor:
        """``self.drop(x)``, without the module call where it is the identity (a
        generation step pays for every call)."""
        return self.drop(x) if self.training and self.drop.p > 0 else x

    def step(self, token: Tensor, state: DecoderState) -> tuple[Tensor, DecoderState]:
        """One generation step: ``token (B,)`` → ``(log-probabilities (B, V_t), state)``."""
        emb = self._dropout(self.target_embedding(token))  # (B, E_t)
        if self.length is None:
            features, hidden, _ = self._step(emb, _unstack(state.hidden), state)
            log_probs = torch.log_softmax(self.head(self._dropout(features)), dim=-1)
            return log_probs, state._replace(hidden=_stack(hidden))
        assert state.length is not None  # encode() starts it with a mechanism
        remaining = self.length.step_input(state.length)
        if remaining is not None:
            emb = torch.cat([emb, remaining], dim=-1)  # (B, E_t + R)
        features, hidden, _ = self._step(emb, _unstack(state.hidden), state)
        logits = self.head(self._dropout(features))
        log_probs, extra = self.length.step_output(logits, features, state.length)
        return log_probs, state._replace(hidden=_stack(hidden), length=extra)

    def forward(
        self,
        source: Tensor,
        source_mask: Tensor,
        target_in: Tensor,
        target_mask: Tensor,
        sampling_p: float | None = None,
        generator: torch.Generator | None = None,
    ) -> Seq2SeqOutput:
        """Decoder outputs for every target step.

        Args:
            source: ``(B, S)`` ids.  source_mask: ``(B, S)`` bool.
            target_in: ``(B, T)`` decoder inputs ``<s> y_1 … y_m`` (padded).
            target_mask: ``(B, T)`` bool, True at real target steps.
            sampling_p: None for teacher forcing; else the probability ``p`` of feeding the
                model's own greedy choice of the previous step, per sequence and step
                (``0.0`` is teacher forcing, ``1.0`` free running).
            generator: random source of the coin tosses (default: torch's global one).
        """
        target_in = check_token_ids(
            target_in, getattr(self.target_embedding, "num_embeddings", None), "target_in"
        )
        if self.length is not None:
            return self._length_forward(source, source_mask, target_in, target_mask, sampling_p)
        state = self.encode(source, source_mask)
        B, T = target_in.shape
        if sampling_p is None:
            emb = self.drop(self.target_embedding(target_in))  # (B, T, E_t)
            features, attention = self._teacher_forced(emb, state, target_mask)
            return Seq2SeqOutput(self.head(self.drop(features)), attention, target_mask)
        hidden = _unstack(state.hidden)
        weights, logits_steps = [], []
        step_masks = []
        ended = torch.zeros(B, dtype=torch.bool, device=target_in.device)
        prev_logits: Tensor | None = None
        for t in range(T):
            token = target_in[:, t]
            if t > 0:
                assert prev_logits is not None
                own = greedy_choice(prev_logits, NEVER_GENERATED)  # (B,), as greedy search
                use_own = _coins(B, generator, target_in.device) < sampling_p
                token = torch.where(use_own, own, token)
                ended = ended | (use_own & (own == EOS_ID))
            emb = self.drop(self.target_embedding(token))
            step_masks.append(target_mask[:, t] & ~ended)
            feat, hidden, w = self._step(emb, hidden, state)
            if w is not None:
                weights.append(w)
            step_logits = self.head(self.drop(feat))  # (B, V)
            logits_steps.append(step_logits)
            prev_logits = step_logits.detach()
        logits = torch.stack(logits_steps, dim=1)  # (B, T, V)
        attention = torch.stack(weights, dim=1) if weights else None  # (B, T, S)
        return Seq2SeqOutput(logits, attention, torch.stack(step_masks, dim=1))

    def _teacher_forced(
        self, emb: Tensor, state: DecoderState, mask: Tensor | None
    ) -> tuple[Tensor, Tensor | None]:
        """Head inputs ``(B, T, F)`` and attention weights ``(B, T, S)`` (or None) of all
        teacher-forced steps (:func:`rnnkit.models.seq2seq_decoder._teacher_forced`)."""
        return _teacher_forced(
            self.decoder, self.attention, self.attention_wiring, self.memory_size, emb, state, mask
        )

    def _length_forward(
        self,
        source: Tensor,
        source_mask: Tensor,
        target_in: Tensor,
        target_mask: Tensor,
        sampling_p: float | None,
    ) -> Seq2SeqOutput:
        """Teacher forcing with a length mechanism: features and context kept for the loss."""
        assert self.length is not None
        if sampling_p is not None:
            raise ConfigError("scheduled sampling is not supported with length='stop'/'predict'")
        state, context = self._encode(source, source_mask)
        T = target_in.shape[1]
        emb = self.drop(self.target_embedding(target_in))  # (B, T, E_t)
        if self.length.input_size:
            lengths = target_mask.sum(1) - 1  # the </s> step is not a token
            self.length.check_lengths(lengths)
            remaining = self.length.remaining_steps(lengths, T)  # (B, T)
            emb = torch.cat([emb, self.length.remaining_inputs(remaining)], dim=-1)
        # padding is at the end: it never reaches a real step
        feats, attention = self._teacher_forced(emb, state, None)  # (B, T, F)
        logits = self.head(self.drop(feats))
        return Seq2SeqOutput(logits, attention, target_mask, feats, context)

    # ---------------------------------------------------------------------- task API
    def loss(
        self,
        batch: PairBatch,
        sampling_p: float | None = None,
        generator: torch.Generator | None = None,
    ) -> LossOutput:
        """Masked token-mean cross-entropy (nats) of a ``PairBatch``."""
        out = self(
            batch.source,
            batch.source_mask,
            batch.target_in,
            batch.target_mask,
            sampling_p=sampling_p,
            generator=generator,
        )
        return self._loss_of(out, batch)

    def _loss_of(self, out: Seq2SeqOutput, batch: PairBatch) -> LossOutput:
        """:meth:`loss` of a forward pass already run on ``batch``."""
        if self.length is not None:
            assert out.features is not None
            lt = length_targets(batch.target_out, out.mask, EOS_ID)
            total, count = self.length.loss(
                out.logits, batch.target_out, out.features, out.context, lt
            )
            return LossOutput(total / count, figure_of(total), count, None)
        loss, nats, tokens = training_loss(
            out.logits, batch.target_out, out.mask, self.loss_reduction
        )
        return LossOutput(loss, nats, tokens, None)

    def scored(self, batch: PairBatch) -> tuple[LossOutput, Tensor]:
        """:meth:`loss` and :meth:`target_logits` of ``batch`` from one teacher-forced pass
        (an evaluation that reports both runs the model once)."""
        out = self(batch.source, batch.source_mask, batch.target_in, batch.target_mask)
        return self._loss_of(out, batch), self._token_logits(out.logits)

    def target_logits(self, batch: PairBatch) -> Tensor:
        """Teacher-forced logits ``(B, T, V_t)`` aligned with ``batch.target_out``.

        With a length mechanism ``</s>`` is not a token: its logit is ``−inf`` (never the
        argmax), and its step is outside :meth:`token_mask`.
        """
        logits = self(batch.source, batch.source_mask, batch.target_in, batch.target_mask).logits
        return self._token_logits(logits)

    def _token_logits(self, logits: Tensor) -> Tensor:
        """``logits`` with a length mechanism's ``</s>`` made no token (``−inf``)."""
        return logits if self.length is None else self.length.token_logits(logits)

    def token_mask(self, batch: PairBatch) -> Tensor:
        """``(B, T)`` the target steps scored as tokens (teacher-forced accuracy).

        ``batch.target_mask``; with a length mechanism, less each row's ``</s>`` step (the
        stop output or the predicted length models the end, not a token).
        """
        if self.length is None:
            return batch.target_mask
        return length_targets(batch.target_out, batch.target_mask, EOS_ID).token_mask

    def _decoding(
        self, state: DecoderState
    ) -> tuple[Seq2Seq | InferenceStep | TorchInferenceStep, DecoderState, DecoderState]:
        """What decoding steps with, its first state and that state's batch dimensions:
        the same step in fewer operations where one applies — the compiled library's
        (:class:`~rnnkit.models.seq2seq_inference.InferenceStep`: an LSTM decoder on the
        CPU), else torch's (:class:`~rnnkit.models.seq2seq_torch_step.TorchInferenceStep`:
        on a GPU, with ``use_native(False)``, other decoders on the CPU, where it is faster
        than the general step too) — else :meth:`step`."""
        fast = InferenceStep.build(self)
        prepared = None if fast is None else fast.prepare(state)
        if fast is not None and prepared is not None:
            return fast, prepared, fast.state_batch_dim
        step = TorchInferenceStep.build(self)
        prepared = None if step is None else step.prepare(state)
        if step is None or prepared is None:
            return self, state, STATE_BATCH_DIM
        return step, prepared, step.state_batch_dim

    @torch.no_grad()
    def decode(
        self,
        source: Tensor,
        source_mask: Tensor,
        beam: int = 1,
        max_length: int = 100,
        length_penalty: float = 1.0,
        num: int = 1,
    ) -> list[list[GenerationResult]]:
        """Greedy (``beam=1``) or beam search for every source of the batch at once.

        Args:
            source: ``(B, S)``.  source_mask: ``(B, S)``.
            beam: beam width ``K``.  max_length: most tokens drawn (``</s>`` included).
            length_penalty: ``α`` of ``score = log p / n^α`` (1: per-token log-prob).
            num: hypotheses per source (``≤ beam``).

        Returns:
            ``B`` lists of :class:`~rnnkit.generation.search.GenerationResult`, best first.
        """
        stepper, state, dims = self._decoding(self.encode(source, source_mask))
        return decode_batch(
            stepper,
            state,
            dims,
            beam=beam,
            max_length=max_length,
            bos_id=BOS_ID,
            eos_id=EOS_ID,
            forbid=NEVER_GENERATED,
            length_penalty=length_penalty,
            num=num,
            per_source=PER_SOURCE,
        )

    @torch.no_grad()
    def sample(
        self,
        source: Tensor,
        source_mask: Tensor,
        *,
        num: int = 1,
        max_length: int = 100,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        generator: torch.Generator | None = None,
    ) -> list[list[GenerationResult]]:
        """``num`` independent samples per source from ``p(y | x)`` (temperature, top-k and
        nucleus filtering as :func:`rnnkit.generation.search.filter_log_probs`), all in one batch.

        Returns:
            ``B`` lists of ``num`` results, in draw order.
        """
        stepper, state, dims = self._decoding(self.encode(source, source_mask))
        return generate_batch(
            stepper,
            None,
            max_length=max_length,
            eos_id=EOS_ID,
            bos_id=BOS_ID,
            forbid=NEVER_GENERATED,
            strategy="sample",
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            num=num,
            generator=generator,
            state=state,
            state_batch_dim=dims,
        )


def build_seq2seq(spec: ModelSpec, source_vocab_size: int, target_vocab_size: int) -> Seq2Seq:
    """The encoder–decoder ``spec`` asks for: widths, depth, cell, attention, context.

    Encoder and decoder share ``--cell``, ``--hidden``, ``--layers`` and ``--embedding``;
    only the encoder is bidirectional (``--bidirectional``). ``--length stop|predict``
    adds the mechanism (``--max-len`` the longest predicted target).

    >>> spec = ModelSpec(hidden=8, embedding=4, attention="bilinear")
    >>> m = build_seq2seq(spec, 10, 12)
    >>> m.vocab_size, m.decoder.input_size
    (12, 12)
    """
    E, H = spec.embedding, spec.hidden
    source_embedding = build_embedding(spec, source_vocab_size, E, "source_vocab_size")
    check_vocab_size(target_vocab_size, "target_vocab_size")
    target_embedding = nn.Embedding(target_vocab_size, E)
    encoder = build_encoder(spec, E)
    memory = encoder.num_directions * H
    attention = None
    decoder_in = E
    if spec.attention != "none":
        attention = Attention(spec.attention, H, memory)
        if spec.attention_wiring == "before":  # "after": the context reaches the head only
            decoder_in += memory
    if spec.context in ("input", "both"):
        decoder_in += memory
    head_in = H + (memory if attention is not None else 0)
    # --length: the stop output reads the head's input; the length output reads c.
    length = build_length(spec, head_in, memory)
    decoder_in += 0 if length is None else length.input_size
    # the decoder steps through its cells (attention, decoding): no regularizers there
    decoder = build_encoder(spec, decoder_in, bidirectional=False, regularize=False)
    head: nn.Module = (
        TiedHead(target_embedding, head_in)
        if spec.tie_weights
        else Linear(head_in, target_vocab_size)
    )
    return Seq2Seq(
        source_embedding,
        encoder,
        target_embedding,
        decoder,
        head,
        attention=attention,
        context=spec.context,
        dropout=spec.dropout,
        length=length,
        attention_wiring=spec.attention_wiring,
    )
