"""Sequence labelling: one softmax over the tag set at every step.

``x_t = [E w_t; c(w_t)]`` — the word embedding, optionally beside a character-level
encoding ``c(w)`` of the word's spelling (a bidirectional RNN over its characters, its two
final states side by side), which gives words unseen in training (``<unk>`` for the word
embedding) a representation of their own. A bidirectional stack reads the sentence, and
``ŷ_t = softmax(W h_t + b)`` with ``h_t = [h^f_t; h^b_t]``; trained with the masked
token-mean cross-entropy, so padding is never a target.

Word dropout (``word_dropout``): while training, each real word is replaced by ``<unk>``
with that probability, so the ``<unk>`` embedding — all an unknown word gets at test time
— is trained in realistic contexts, and the character encoder has to carry the spelling.
"""

from __future__ import annotations

from dataclasses import replace
from typing import cast

import torch
from torch import Tensor, nn

from rnnkit.bptt.mask_facts import derive, host_mask
from rnnkit.data.batching import to_device
from rnnkit.data.vocab import UNK_ID
from rnnkit.layers.linear import Linear
from rnnkit.layers.stacked import StackedRecurrent
from rnnkit.metrics.losses import training_loss
from rnnkit.models.builders import build_embedding, build_encoder
from rnnkit.models.language_model import LossOutput, check_token_ids
from rnnkit.models.pooling import state_pool
from rnnkit.models.spec import ModelSpec

__all__ = ["CHAR_EMBEDDING", "CHAR_HIDDEN", "CharEncoder", "Tagger", "build_tagger"]

CHAR_EMBEDDING = 16
CHAR_HIDDEN = 32


class CharEncoder(nn.Module):
    """Each word's characters → one vector, the final states of a char RNN (both directions).

    Args:
        embedding: ``nn.Embedding(C, E_c)`` over character ids (id 0 is padding).
        encoder: a stack with ``input_size = E_c`` (bidirectional recommended).

    >>> from rnnkit import GRU
    >>> enc = CharEncoder(nn.Embedding(10, 4), GRU(4, 3, bidirectional=True))
    >>> chars = torch.tensor([[5, 6, 0], [7, 0, 0]])   # two words: 2 and 1 characters
    >>> enc(chars).shape, enc.output_size
    (torch.Size([2, 6]), 6)
    """

    def __init__(self, embedding: nn.Embedding, encoder: StackedRecurrent) -> None:
        super().__init__()
        if encoder.input_size != embedding.embedding_dim:
            raise ValueError(
                f"char encoder input_size {encoder.input_size} != char embedding_dim "
                f"{embedding.embedding_dim}"
            )
        self.embedding = embedding
        self.encoder = encoder

    @property
    def output_size(self) -> int:
        return self.encoder.hidden_size * self.encoder.num_directions

    def forward(self, chars: Tensor, pad_id: int = 0) -> Tensor:
        """``chars (N, C)`` character ids of ``N`` words, padded with ``pad_id`` → ``(N, D·H_c)``.

        Every word needs at least one character.
        """
        char_mask = chars != pad_id  # (N, C)
        derive(char_mask, chars, lambda host: host != pad_id)  # asked on the host copy
        out = self.encoder(self.embedding(chars), mask=char_mask)
        return state_pool(out.state)  # (N, D·H_c)


class Tagger(nn.Module):
    """``Tagger(embedding, encoder, head, char_encoder=None)``: parts injected, see module doc.

    Args:
        embedding: ``nn.Embedding(V, E)`` over word ids.
        encoder: a stack with ``input_size = E (+ char_encoder.output_size)``.
        head: maps ``(B, T, D·H)`` to tag logits ``(B, T, K)`` (an ``nn.Linear``).
        char_encoder: optional :class:`CharEncoder`; then ``chars`` must be passed.
        dropout: dropout on the step inputs and before the head.
        word_dropout: training-time probability of replacing a word by ``<unk>``.

    >>> from rnnkit import LSTM
    >>> tagger = Tagger(nn.Embedding(9, 4), LSTM(4, 5, bidirectional=True), nn.Linear(10, 3))
    >>> words, mask = torch.tensor([[4, 5, 6], [7, 8, 0]]), torch.tensor([[1, 1, 1], [1, 1, 0]])
    >>> tagger(words, mask.bool()).shape
    torch.Size([2, 3, 3])
    """

    #: How the training loss averages token losses: "token" (every target token weighs
    #: the same) or "sequence" (the mean within each sequence, then over sequences).
    loss_reduction: str = "token"

    def __init__(
        self,
        embedding: nn.Embedding,
        encoder: StackedRecurrent,
        head: nn.Module,
        char_encoder: CharEncoder | None = None,
        dropout: float = 0.0,
        word_dropout: float = 0.0,
    ) -> None:
        super().__init__()
        width = embedding.embedding_dim + (char_encoder.output_size if char_encoder else 0)
        if encoder.input_size != width:
            raise ValueError(
                f"encoder input_size {encoder.input_size} != word embedding + char features {width}"
            )
        if not 0.0 <= word_dropout < 1.0:
            raise ValueError(f"word_dropout must be in [0, 1), got {word_dropout}")
        self.embedding = embedding
        self.char_encoder = char_encoder
        self.encoder = encoder
        self.head = head
        self.drop = nn.Dropout(dropout)
        self.word_dropout = word_dropout

    @property
    def num_tags(self) -> int:
        return cast(int, self.head.out_features)  # the head is a Linear (its output width)

    def features(self, words: Tensor, mask: Tensor, chars: Tensor | None = None) -> Tensor:
        """Step inputs ``(B, T, E [+ D·H_c])``: word embeddings and character features.

        Args:
            words: ``(B, T)`` word ids.
            mask: ``(B, T)`` bool, True at real words.
            chars: ``(B, T, C)`` character ids of every word (0 = padding), needed when
                the tagger has a character encoder.
        """
        if self.training and self.word_dropout > 0:
            drop = (torch.rand(words.shape, device=words.device) < self.word_dropout) & mask
            words = torch.where(drop, UNK_ID, words)
        x = self.embedding(words)  # (B, T, E)
        if self.char_encoder is None:
            return x
        if chars is None:
            raise ValueError("this tagger has a character encoder: pass chars (B, T, C)")
        if chars.shape[:2] != words.shape:
            raise ValueError(
                f"chars must have shape (B, T, C) with (B, T) = {tuple(words.shape)}, "
                f"got {tuple(chars.shape)}"
            )
        # Encode the real words only (padding positions get zeros, never read). Which
        # they are is read from the mask's host copy, the one the word encoder's layers
        # use too (rnnkit.bptt.mask_facts): selecting them waits for nothing more.
        B, T, C = chars.shape
        real = torch.nonzero(host_mask(mask).reshape(B * T)).view(-1)  # (N,) on the host
        rows = to_device(real, chars.device)
        word_chars = chars.reshape(B * T, C).index_select(0, rows)  # (N, C)
        derive(word_chars, chars, lambda host: host.reshape(B * T, C).index_select(0, real))
        encoded = self.char_encoder(word_chars)  # (N, D·H_c); trailing padding is held
        c = x.new_zeros(B * T, encoded.shape[-1]).index_copy(0, rows, encoded.to(x.dtype))
        return torch.cat([x, c.view(B, T, encoded.shape[-1])], dim=-1)

    def forward(
        self, words: Tensor, mask: Tensor | None = None, chars: Tensor | None = None
    ) -> Tensor:
        """Tag logits ``(B, T, K)`` for ``words (B, T)`` (see :meth:`features`)."""
        words = check_token_ids(words, getattr(self.embedding, "num_embeddings", None), "words")
        if mask is None:
            mask = torch.ones_like(words, dtype=torch.bool)
        x = self.drop(self.features(words, mask, chars))
        h = self.encoder(x, mask=mask).outputs  # (B, T, D·H)
        return self.head(self.drop(h))

    def loss(
        self,
        words: Tensor,
        tags: Tensor,
        mask: Tensor | None = None,
        chars: Tensor | None = None,
        loss_mask: Tensor | None = None,
    ) -> LossOutput:
        """Masked token-mean cross-entropy in nats.

        Args:
            words, mask, chars: as in :meth:`features`.
            tags: ``(B, T)`` tag ids (anything at padding).
            loss_mask: ``(B, T)`` bool, the positions that count (default ``mask``); e.g.
                ``mask`` without the words whose gold tag the model does not know.
        """
        if tuple(tags.shape) != tuple(words.shape):
            raise ValueError(
                f"tag sequence of the wrong length: tags {tuple(tags.shape)} for words "
                f"{tuple(words.shape)}"
            )
        if mask is None:
            mask = torch.ones_like(words, dtype=torch.bool)
        logits = self(words, mask, chars)
        counted = mask if loss_mask is None else loss_mask & mask
        loss, nats, tokens = training_loss(logits, tags, counted, self.loss_reduction)
        return LossOutput(loss, nats, tokens)

    @torch.no_grad()
    def predict(
        self, words: Tensor, mask: Tensor | None = None, chars: Tensor | None = None
    ) -> Tensor:
        """Most probable tag ids ``(B, T)`` (meaningless at padding)."""
        return self(words, mask, chars).argmax(-1)


def build_tagger(
    spec: ModelSpec,
    vocab_size: int,
    num_tags: int,
    num_chars: int | None = None,
    word_dropout: float = 0.0,
) -> Tagger:
    """Word embedding (+ char encoder when ``spec.char_rnn``) → bidirectional stack → linear.

    The sentence encoder is always bidirectional (a tag may depend on the words after
    it). The character encoder is one bidirectional layer of ``spec.cell`` with
    ``CHAR_EMBEDDING``-wide character embeddings and ``CHAR_HIDDEN`` units per direction.

    >>> spec = ModelSpec(hidden=8, embedding=6, char_rnn=True)
    >>> t = build_tagger(spec, vocab_size=20, num_tags=5, num_chars=30)
    >>> t.encoder.input_size, t.encoder.bidirectional, t.num_tags
    (70, True, 5)
    """
    char_encoder = None
    width = spec.embedding
    if spec.char_rnn:
        if num_chars is None:
            raise ValueError("char_rnn needs num_chars, the size of the character vocabulary")
        char_spec = replace(
            spec,
            hidden=CHAR_HIDDEN,
            layers=1,
            dropout=0.0,
            nonlinearity=spec.nonlinearities()[0],  # the first layer's φ
        )
        char_encoder = CharEncoder(
            nn.Embedding(num_chars, CHAR_EMBEDDING, padding_idx=0),
            build_encoder(char_spec, CHAR_EMBEDDING, bidirectional=True, regularize=False),
        )
        width += char_encoder.output_size
    encoder = build_encoder(spec, width, bidirectional=True)
    head = Linear(encoder.hidden_size * encoder.num_directions, num_tags)
    return Tagger(
        build_embedding(spec, vocab_size, spec.embedding),
        encoder,
        head,
        char_encoder=char_encoder,
        dropout=spec.dropout,
        word_dropout=word_dropout,
    )
