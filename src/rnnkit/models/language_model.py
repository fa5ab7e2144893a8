"""Recurrent language model: embedding → recurrent stack → output layer.

``ŷ_t = softmax(V h_t + b)`` over the next token. Trained by teacher forcing (input at
step t is the true token t−1; the prediction at step t never sees token t or later);
generation calls ``step`` once per token, carrying the state, so ``n`` tokens cost ``n``
steps and the prefix is never re-run.

``length="stop"`` / ``"predict"`` (a :class:`~rnnkit.models.length.SequenceLength`) adds
a sequence-length mechanism: a stop output per step, or a length predicted from the
initial state with the steps remaining fed to every step (see that module).
Without one (the default) the model is exactly the plain ``</s>`` language model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, cast

import torch
from torch import Tensor, nn

from rnnkit.bptt.tracing import tracing
from rnnkit.data.vocab import NEVER_GENERATED
from rnnkit.deferred import active_for, figure_of
from rnnkit.generation.options import greedy_choice
from rnnkit.layers.regularization import DropoutEmbedding, steps_of
from rnnkit.layers.stacked import StackedRecurrent, reset_rows
from rnnkit.metrics.losses import training_loss
from rnnkit.models.length import LengthState, SequenceLength, length_targets
from rnnkit.types import LSTMState, State

__all__ = ["LMOutput", "LanguageModel", "LossOutput", "check_token_ids", "reset_rows"]


class LMOutput(NamedTuple):
    logits: Tensor  # (B, T, V)
    state: State  # (L, D, B, H) or LSTMState


class LossOutput(NamedTuple):
    """A training loss with what aggregation needs.

    ``loss`` is the masked token mean (what is backpropagated); ``nats`` the detached sum
    of per-token losses and ``tokens`` their number, so epoch means are exact. Both are
    Python numbers, except inside :func:`rnnkit.deferred.deferring` (a training
    step of the ``Trainer``), where they are 0-dim tensors read with the step's figures.
    """

    loss: Tensor
    nats: float | Tensor
    tokens: int | Tensor
    state: State | None = None


#: Up to this many ids on the CPU, :func:`check_token_ids` reads them on the host.
_FEW_IDS = 64


def check_token_ids(inputs: Tensor, vocab_size: int | None, name: str = "inputs") -> Tensor:
    """``inputs`` unless it is not ``(B, T)`` integer ids in ``[0, V)``: then a
    ``ValueError``/``TypeError`` naming ``inputs`` (torch's embedding said ``index out of
    range in self``, a float tensor failed inside it, and on a GPU an id out of range stops
    the process). The values are not read under graph tracing. Inside
    :func:`rnnkit.deferred.deferring` the range check is read with the step's
    other figures, and the ids returned clamped into range meanwhile (the caller looks up
    what this returns).

    >>> check_token_ids(torch.tensor([[1, 5]]), 5)
    Traceback (most recent call last):
    ...
    ValueError: inputs must hold token ids in [0, 5) (the vocabulary's size), got 5 at (0, 1)
    """
    if not isinstance(inputs, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of token ids, got {type(inputs).__name__}")
    if inputs.dtype.is_floating_point or inputs.is_complex() or inputs.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer token ids, got dtype {inputs.dtype}")
    if inputs.dim() != 2:
        raise ValueError(f"{name} must have shape (B, T), got {tuple(inputs.shape)}")
    if vocab_size is None or inputs.numel() == 0 or tracing():
        return inputs
    deferred = active_for(inputs)
    if deferred is None and inputs.numel() <= _FEW_IDS and inputs.device.type == "cpu":
        # A generation step's few ids: read once on the host (the range test in Python)
        # instead of four tensor operations and a read of their answer.
        ids = inputs.reshape(-1).tolist()
        if min(ids) >= 0 and max(ids) < vocab_size:
            return inputs
    bad = (inputs < 0) | (inputs >= vocab_size)
    if deferred is not None:
        deferred.check(bad.any(), lambda: _id_error(inputs, bad, vocab_size, name))
        return inputs.clamp(0, vocab_size - 1)
    if bool(bad.any()):
        raise _id_error(inputs, bad, vocab_size, name)
    return inputs


def _id_error(inputs: Tensor, bad: Tensor, vocab_size: int, name: str) -> ValueError:
    where = tuple(int(i) for i in torch.nonzero(bad)[0])
    return ValueError(
        f"{name} must hold token ids in [0, {vocab_size}) (the vocabulary's size), "
        f"got {int(inputs[where])} at {where}"
    )


def _hooked(module: nn.Module) -> bool:
    """Whether a forward hook would see ``module`` called (its own or a global one)."""
    # torch keeps the global module hooks in private dicts: read them defensively
    torch_module = nn.modules.module
    return bool(
        module._forward_hooks
        or module._forward_pre_hooks
        or getattr(torch_module, "_global_forward_hooks", None)
        or getattr(torch_module, "_global_forward_pre_hooks", None)
    )


class LanguageModel(nn.Module):
    """``LanguageModel(embedding, encoder, head)``: parts are injected, builders hold sizes.

    Args:
        embedding: ``nn.Embedding(V, E)``.
        encoder: any rnnkit stack (``RNN``/``LSTM``/``GRU``) with ``input_size = E``;
            must be unidirectional (a bidirectional encoder would see the future).
        head: maps ``(B, T, D·H)`` to logits ``(B, T, V)`` (``nn.Linear`` or ``TiedHead``).
        dropout: dropout on the embeddings and before the head (between layers is the
            encoder's own ``dropout``).
        length: a :class:`~rnnkit.models.length.SequenceLength` (``features_size = H``,
            ``context_size = H``: it reads the initial top state), or None for ``</s>``.
            With ``"predict"`` the encoder's ``input_size`` is ``E + R``.

    >>> from rnnkit import LSTM
    >>> emb = nn.Embedding(7, 4)
    >>> lm = LanguageModel(emb, LSTM(4, 5), nn.Linear(5, 7))
    >>> lm(torch.zeros(2, 3, dtype=torch.long)).logits.shape
    torch.Size([2, 3, 7])
    """

    #: How the training loss averages token losses: "token" (every target token weighs
    #: the same) or "sequence" (the mean within each sequence, then over sequences).
    loss_reduction: str = "token"

    def __init__(
        self,
        embedding: nn.Embedding,
        encoder: StackedRecurrent,
        head: nn.Module,
        dropout: float = 0.0,
        length: SequenceLength | None = None,
    ) -> None:
        super().__init__()
        if encoder.bidirectional:
            raise ValueError("a language model needs a unidirectional encoder (causality)")
        extra = 0 if length is None else length.input_size
        if encoder.input_size != embedding.embedding_dim + extra:
            raise ValueError(
                f"encoder input_size {encoder.input_size} != embedding_dim "
                f"{embedding.embedding_dim}" + (f" + length input {extra}" if extra else "")
            )
        if length is not None and length.features_size != encoder.hidden_size:
            raise ValueError(
                f"length features_size {length.features_size} != hidden_size {encoder.hidden_size}"
            )
        self.embedding = embedding
        self.encoder = encoder
        self.head = head
        self.drop = nn.Dropout(dropout)
        self.length = length

    @property
    def vocab_size(self) -> int:
        return self.embedding.num_embeddings

    def _reads_table(
        self, inputs: Tensor, mask: Tensor | None, starts: Tensor | None, window: int | None
    ) -> bool:
        """Whether :meth:`features` reads the first layer's input product from a table of
        the vocabulary: embeddings at least 64 wide and fewer rows than the batch's
        tokens, an unpadded batch, an embedding that is a plain lookup (no dropout on it
        now, no max_norm or gradient scaling, no hook that expects to see it called), no
        length input, full BPTT without document starts, and an encoder that takes a
        projected input (``StackedRecurrent.takes_projected``).

        Why not narrower embeddings or padded batches: the rows of a padded batch are
        sorted and packed, copies of the ``G·H``-wide product instead of the ``E``-wide
        embeddings, which cost more than the product saves (the event model, E 32, 4H
        256, padded: 50 against 35 ms a step; the char LM, E 64, 4H 1024, unpadded: 59
        against 64).
        """
        emb = self.embedding
        return (
            mask is None
            and not tracing()  # before any size test: it would guard a traced graph's sizes
            and emb.num_embeddings < inputs.numel()
            and emb.embedding_dim >= 64
            and not _hooked(emb)
            and not (self.training and self.drop.p > 0)
            and not (self.training and bool(getattr(emb, "dropout", 0.0)))  # DropoutEmbedding
            and emb.max_norm is None
            and not emb.scale_grad_by_freq
            and not emb.sparse
            and (self.length is None or not self.length.input_size)
            and window is None
            and starts is None
            and self.encoder.takes_projected(emb.weight)
        )

    def _dropped(self, x: Tensor) -> Tensor:
        """``self.drop(x)``, or ``x`` itself where the dropout does nothing (evaluation or
        ``p = 0``, no hook): the module's call costs more than a generation step's head."""
        drop = self.drop
        if (drop.training and drop.p > 0) or _hooked(drop):
            return drop(x)
        return x

    def _run(self, x, mask, state, window, resets=None, masks=None):
        out = self.encoder(x, mask=mask, state=state, window=window, resets=resets, masks=masks)
        return out.outputs, out.state

    def forward(
        self,
        inputs: Tensor,
        mask: Tensor | None = None,
        state: State | None = None,
        starts: Tensor | None = None,
        window: int | None = None,
        lengths: Tensor | None = None,
    ) -> LMOutput:
        """Logits of the next token at every step.

        Args:
            inputs: ``(B, T)`` token ids.
            mask: ``(B, T)`` bool, True at real steps, or None.
            state: the state carried in (e.g. from the previous stream segment).
            starts: ``(B, T)`` bool, True where a new document starts: the state entering
                that step is reset to zero (stream batching), and no gradient crosses it.
            window: BPTT(τ) window, or None for full backpropagation: the loss at step t
                reaches steps ``t−τ … t`` of every layer, across other rows' starts.
            lengths: ``(B,)`` tokens per row, for ``length="predict"`` only (the steps
                remaining are fed to every step).
        """
        h, state = self.features(inputs, mask, state, starts, window, lengths)
        return LMOutput(self.head(self.drop(h)), state)

    def features(
        self,
        inputs: Tensor,
        mask: Tensor | None = None,
        state: State | None = None,
        starts: Tensor | None = None,
        window: int | None = None,
        lengths: Tensor | None = None,
    ) -> tuple[Tensor, State]:
        """Top states ``(B, T, H)`` (what the head reads) and the final state."""
        inputs = check_token_ids(inputs, getattr(self.embedding, "num_embeddings", None))
        if lengths is not None and self.length is None:
            # read only by a length mechanism: taken for padding, it was ignored in silence
            # and the padded steps were read as tokens
            raise ValueError(
                "lengths is read by a model with a length mechanism only (this one has none); "
                "mark padding with mask (B, T)"
            )
        return self._features(inputs, mask, state, starts, window, lengths)

    def _features(
        self,
        inputs: Tensor,
        mask: Tensor | None,
        state: State | None,
        starts: Tensor | None = None,
        window: int | None = None,
        lengths: Tensor | None = None,
    ) -> tuple[Tensor, State]:
        """:meth:`features` of ids already checked."""
        if self._reads_table(inputs, mask, starts, window):
            # The first layer's input product x W_ihᵀ of a token is a row of E W_ihᵀ: read
            # from that (V, G·H) table instead of a (B·T, E) × (E, G·H) product, and the
            # backward is a scatter of d_xp into V rows and two (V, ·) products instead of
            # two (B·T, ·) ones — the same function and gradients (tested).
            table = self.encoder.input_table(self.embedding.weight)
            # gathered time-major and handed over as a batch-first view: the layer works
            # in (T, B, ·), so neither the rows nor their gradient need a transposing copy
            pad = self.embedding.padding_idx
            xp = nn.functional.embedding(inputs.T, table, padding_idx=pad).transpose(0, 1)
            out = self.encoder(xp, mask=mask, state=state, projected=True)
            return out.outputs, out.state
        x = self.encoder_inputs(inputs, lengths)
        # Document starts: the encoder zeroes those rows' state (its ``resets``).
        h, state = self._run(x, mask, state, window, starts)
        return h, state

    def encoder_inputs(self, inputs: Tensor, lengths: Tensor | None = None) -> Tensor:
        """What the stack reads, ``(B, T, E)``: the embedded ids ``inputs (B, T)`` (their
        dropout in training), and with ``length="predict"`` the steps remaining of each
        row's ``lengths (B,)`` beside them (``(B, T, E + R)``)."""
        x = self._dropped(self.embedding(inputs))  # (B, T, E)
        if self.length is not None and self.length.input_size:
            if lengths is None:
                raise ValueError("length='predict' needs lengths (B,) in training")
            remaining = self.length.remaining_steps(lengths, inputs.shape[1])  # (B, T)
            x = torch.cat([x, self.length.remaining_inputs(remaining)], dim=-1)  # (B, T, E+R)
        return x

    def loss(
        self,
        inputs: Tensor,
        targets: Tensor,
        mask: Tensor | None = None,
        state: State | None = None,
        starts: Tensor | None = None,
        window: int | None = None,
    ) -> LossOutput:
        """Teacher-forced cross-entropy, masked token mean, in nats.

        With a length mechanism, rows are whole sequences ``y_1 … y_m </s>``; the loss is
        their exact negative log-likelihood per token step (see :mod:`rnnkit.models.length`).
        """
        if self.length is not None:
            if starts is not None:
                raise ValueError("a length mechanism needs whole sequences per row: no starts")
            return self._length_loss(inputs, targets, mask, state, window)
        out = self(inputs, mask=mask, state=state, starts=starts, window=window)
        loss, nats, tokens = training_loss(out.logits, targets, mask, self.loss_reduction)
        return LossOutput(loss, nats, tokens, out.state)

    def scheduled_loss(
        self,
        inputs: Tensor,
        targets: Tensor,
        mask: Tensor | None = None,
        sampling_p: float = 0.0,
        generator: torch.Generator | None = None,
    ) -> LossOutput:
        """The loss under scheduled sampling (Bengio et al. 2015): at every real step
        ``t ≥ 1`` of every sequence a coin decides, with probability ``sampling_p``, to feed
        the model's own greedy choice ``argmax ŷ_{t−1}`` over the tokens generation may
        produce (not ``<pad>``, ``<unk>``, ``<s>``; no gradient through the choice)
        instead of the true token ``inputs[:, t]``. ``sampling_p = 0`` is the teacher-forced
        :meth:`loss` (same value and gradients, one step at a time); ``1`` free running
        from the first token. The steps run one at a time through the stack, carrying the
        state (exact BPTT through all of them); a fed ``</s>`` does not end the sequence.

        Args:
            inputs, targets: ``(B, T)`` ids (``<s> y_1 …`` and ``y_1 … </s>``).
            mask: ``(B, T)`` bool, True at real steps, or None.
            sampling_p: ``p ∈ [0, 1]``.  generator: the coins' random source.
        """
        if self.length is not None:
            raise ValueError("scheduled sampling is not combined with a length mechanism")
        if not 0.0 <= sampling_p <= 1.0:
            raise ValueError(f"sampling_p must be in [0, 1], got {sampling_p}")
        B, T = inputs.shape
        if mask is None:
            mask = torch.ones_like(inputs, dtype=torch.bool)
        state: State | None = None
        steps: list[Tensor] = []
        # the regularizers' masks of the whole sequences (step t's slice at step t) and
        # one embedding row mask for the batch: as the teacher-forced loss draws them
        embed = self._one_mask_embedding()
        masks = self.encoder.draw_masks(B, T, self.embedding.weight)
        for t in range(T):
            token = inputs[:, t]
            if t > 0 and sampling_p > 0:
                # the greedy choice among the tokens generation may produce
                own = greedy_choice(steps[-1].detach(), NEVER_GENERATED)  # (B,)
                where = generator.device if generator is not None else inputs.device
                coins = torch.rand(B, generator=generator, device=where).to(inputs.device)
                token = torch.where((coins < sampling_p) & mask[:, t], own, token)
            x = self.drop(embed(token.view(B, 1)))  # (B, 1, E)
            step_masks = None if masks is None else steps_of(masks, t, t + 1)
            h, state = self._run(x, mask[:, t : t + 1], state, None, masks=step_masks)
            steps.append(self.head(self.drop(h[:, 0])))  # (B, V)
        logits = torch.stack(steps, dim=1)  # (B, T, V)
        loss, nats, tokens = training_loss(logits, targets, mask, self.loss_reduction)
        return LossOutput(loss, nats, tokens, state)

    def _one_mask_embedding(self) -> Callable[[Tensor], Tensor]:
        """The embedding as a lookup whose dropped rows (``DropoutEmbedding``) are drawn
        once, here, for every call of a step-by-step loop."""
        emb = self.embedding
        if isinstance(emb, DropoutEmbedding) and emb.training and emb.dropout:
            weight = emb.dropped_weight()
            return lambda ids: emb.lookup(ids, weight)
        return emb

    def _length_loss(self, inputs, targets, mask, state, window) -> LossOutput:
        assert self.length is not None
        lt = length_targets(targets, mask, self.length.eos_id)
        h, final = self.features(inputs, mask, state, None, window, lt.lengths)
        context = self._initial_top(state, inputs.shape[0], h)
        nats, tokens = self.length.loss(self.head(self.drop(h)), targets, h, context, lt)
        return LossOutput(nats / tokens, figure_of(nats), tokens, final)

    def _initial_top(self, state: State | None, batch_size: int, like: Tensor) -> Tensor:
        """``h_0`` of the top layer ``(B, H)``: what the length output reads."""
        if state is None:
            return like.new_zeros(batch_size, self.encoder.hidden_size)
        h = state.h if isinstance(state, LSTMState) else state
        return h[-1, 0]

    @property
    def state_batch_dim(self) -> int | LengthState:
        """Batch dimension(s) of the generation state (``generate(..., state_batch_dim=)``)."""
        # A LengthState of ints (``_make`` takes values of any type).
        return 2 if self.length is None else LengthState._make((2, 0))

    def step(
        self, token: Tensor, state: State | LengthState | None = None
    ) -> tuple[Tensor, State | LengthState]:
        """One generation step: ``token (B,)`` → ``(log-probabilities (B, V), state)``,
        without gradients.

        With a length mechanism the state is a :class:`~rnnkit.models.length.LengthState`
        (None at the first step: zero state, and ``T`` chosen greedily under ``"predict"``).
        """
        if torch.is_grad_enabled():  # the searches call it where gradients are off already
            with torch.no_grad():
                return self._step(token, state)
        return self._step(token, state)

    def _step(
        self, token: Tensor, state: State | LengthState | None
    ) -> tuple[Tensor, State | LengthState]:
        """:meth:`step` where gradients are off."""
        if self.length is None and (
            type(self).forward is not LanguageModel.forward or _hooked(self)
        ):
            # a subclass's own forward, or a hook that should see the call: through it
            out = self(token.view(-1, 1), state=state)
            return torch.log_softmax(out.logits[:, 0], dim=-1), out.state
        if self.length is None:
            # forward's function for one token, without its wrapping: the head reads the
            # (B, H) rows directly (the same product as on (B, 1, H))
            vocab = getattr(self.embedding, "num_embeddings", None)
            ids = check_token_ids(token.view(-1, 1), vocab)
            # a LengthState here is refused by the encoder, as the forward refuses it
            h, state = self._features(ids, None, cast("State | None", state))
            logits = self.head(self._dropped(h[:, 0]))
            return torch.log_softmax(logits, dim=-1), state
        if state is None:
            B, like = token.shape[0], self.embedding.weight
            extra = self.length.start(B, self._initial_top(None, B, like))
            state = LengthState(None, extra)
        elif not isinstance(state, LengthState):
            raise TypeError(
                "with a length mechanism the generation state is a LengthState "
                f"(None at the first step), got {type(state).__name__}"
            )
        x = self.drop(self.embedding(token.view(-1, 1)))  # (B, 1, E)
        extra_input = self.length.step_input(state.extra)
        if extra_input is not None:
            x = torch.cat([x, extra_input.unsqueeze(1)], dim=-1)  # (B, 1, E + R)
        h, hidden = self._run(x, None, state.hidden, None)
        logits = self.head(self.drop(h[:, 0]))
        log_probs, extra = self.length.step_output(logits, h[:, 0], state.extra)
        return log_probs, LengthState(hidden, extra)
