"""Recurrent language model: embedding → recurrent stack → output layer (SPEC §5).

``ŷ_t = softmax(V h_t + b)`` over the next token. Trained by teacher forcing (input at
step t is the true token t−1; the prediction at step t never sees token t or later);
generation calls ``step`` once per token, carrying the state, so ``n`` tokens cost ``n``
steps and the prefix is never re-run.
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

import torch
from torch import Tensor, nn

from rnnkit.layers.stacked import StackedRecurrent
from rnnkit.losses import sequence_cross_entropy
from rnnkit.types import LSTMState, State

__all__ = ["LMOutput", "LanguageModel", "LossOutput", "reset_rows"]


class LMOutput(NamedTuple):
    logits: Tensor  # (B, T, V)
    state: State  # (L, D, B, H) or LSTMState


class LossOutput(NamedTuple):
    """A training loss with what aggregation needs.

    ``loss`` is the masked token mean (what is backpropagated); ``nats`` the detached sum
    of per-token losses and ``tokens`` their number, so epoch means are exact.
    """

    loss: Tensor
    nats: float
    tokens: int
    state: State | None = None


def reset_rows(state: State | None, rows: Tensor) -> State | None:
    """Zero the state of the batch rows where ``rows (B,)`` is True (selection, no ×0)."""
    if state is None:
        return None
    keep = ~rows.view(1, 1, -1, 1)
    if isinstance(state, LSTMState):
        return LSTMState(*(torch.where(keep, s, 0.0) for s in state))
    return torch.where(keep, state, 0.0)


class LanguageModel(nn.Module):
    """``LanguageModel(embedding, encoder, head)``: parts are injected, builders hold sizes.

    Args:
        embedding: ``nn.Embedding(V, E)``.
        encoder: any rnnkit stack (``RNN``/``LSTM``/``GRU``) with ``input_size = E``;
            must be unidirectional (a bidirectional encoder would see the future).
        head: maps ``(B, T, D·H)`` to logits ``(B, T, V)`` (``nn.Linear`` or ``TiedHead``).
        dropout: dropout on the embeddings and before the head (between layers is the
            encoder's own ``dropout``).

    >>> from rnnkit import LSTM
    >>> emb = nn.Embedding(7, 4)
    >>> lm = LanguageModel(emb, LSTM(4, 5), nn.Linear(5, 7))
    >>> lm(torch.zeros(2, 3, dtype=torch.long)).logits.shape
    torch.Size([2, 3, 7])
    """

    def __init__(
        self,
        embedding: nn.Embedding,
        encoder: StackedRecurrent,
        head: nn.Module,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if encoder.bidirectional:
            raise ValueError("a language model needs a unidirectional encoder (causality)")
        if encoder.input_size != embedding.embedding_dim:
            raise ValueError(
                f"encoder input_size {encoder.input_size} != embedding_dim "
                f"{embedding.embedding_dim}"
            )
        self.embedding = embedding
        self.encoder = encoder
        self.head = head
        self.drop = nn.Dropout(dropout)

    @property
    def vocab_size(self) -> int:
        return self.embedding.num_embeddings

    def _run(self, x, mask, state, window):
        out = self.encoder(x, mask=mask, state=state, window=window)
        return out.outputs, out.state

    def forward(
        self,
        inputs: Tensor,
        mask: Tensor | None = None,
        state: State | None = None,
        starts: Tensor | None = None,
        window: int | None = None,
    ) -> LMOutput:
        """Logits of the next token at every step.

        Args:
            inputs: ``(B, T)`` token ids.
            mask: ``(B, T)`` bool, True at real steps, or None.
            state: the state carried in (e.g. from the previous stream segment).
            starts: ``(B, T)`` bool, True where a new document starts: the state entering
                that step is reset to zero (stream batching).
            window: BPTT(τ) window, or None for full backpropagation.
        """
        x = self.drop(self.embedding(inputs))  # (B, T, E)
        if starts is None or not bool(starts.any()):
            h, state = self._run(x, mask, state, window)
        else:
            # Documents start inside the segment: run between start columns, resetting
            # the rows that start. Boundaries are rare (per document), so this is a few
            # calls of the time loop, not one per step.
            T = inputs.shape[1]
            cols = torch.nonzero(starts.any(0)).view(-1).tolist()
            bounds = sorted(set([0, *cols, T]))
            pieces = []
            for a, b in itertools.pairwise(bounds):
                if state is None:
                    state = self._zero_state(inputs.shape[0], x)
                state = reset_rows(state, starts[:, a])
                piece_mask = None if mask is None else mask[:, a:b]
                h_piece, state = self._run(x[:, a:b], piece_mask, state, window)
                pieces.append(h_piece)
            h = torch.cat(pieces, dim=1)
        return LMOutput(self.head(self.drop(h)), state)

    def _zero_state(self, batch_size: int, like: Tensor) -> State:
        enc = self.encoder
        shape = (enc.num_layers, enc.num_directions, batch_size, enc.hidden_size)
        h = like.new_zeros(shape)
        return LSTMState(h, torch.zeros_like(h)) if enc.is_lstm else h

    def loss(
        self,
        inputs: Tensor,
        targets: Tensor,
        mask: Tensor | None = None,
        state: State | None = None,
        starts: Tensor | None = None,
        window: int | None = None,
    ) -> LossOutput:
        """Teacher-forced cross-entropy, masked token mean, in nats."""
        out = self(inputs, mask=mask, state=state, starts=starts, window=window)
        if mask is None:
            mask = torch.ones_like(inputs, dtype=torch.bool)
        loss = sequence_cross_entropy(out.logits, targets, mask, reduction="token")
        tokens = int(mask.sum())
        return LossOutput(loss, float(loss.detach()) * tokens, tokens, out.state)

    @torch.no_grad()
    def step(self, token: Tensor, state: State | None = None) -> tuple[Tensor, State]:
        """One generation step: ``token (B,)`` → ``(log-probabilities (B, V), state)``."""
        out = self(token.view(-1, 1), state=state)
        return torch.log_softmax(out.logits[:, 0], dim=-1), out.state
