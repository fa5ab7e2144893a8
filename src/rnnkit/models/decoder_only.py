"""Decoder-only translation: one language model over ``source <sep> target``.

``p(y | x) = Π_t p(y_t | y_{<t}, x)`` with a single recurrent LM reading the concatenation

    inputs   <s> x_1 … x_n <sep> y_1 … y_m
    targets  x_1 … x_n <sep> y_1 … y_m </s>      loss only on  y_1 … y_m </s>

Source and target keep their own vocabularies (and units): the LM's input ids are the
source ids ``0 … V_s − 1`` followed by the target ids shifted by ``V_s``, and ``<sep>`` is
the target vocabulary's ``<s>`` (id ``V_s + 2``), so from the decoder's point of view the
target starts with ``<s>`` exactly as in the encoder–decoder. The output layer predicts
target ids only: the loss and decoding are over the target vocabulary, so ``loss_nats``
is comparable with the encoder–decoder's. Generation primes the LM with ``<s> x`` in one
masked call (each row's state is held after its own last source token), then steps.
The LM is :class:`~rnnkit.models.language_model.LanguageModel`, reused as it is.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rnnkit.bptt.mask_facts import host_mask, move_mask
from rnnkit.data.pairs import PairBatch
from rnnkit.data.vocab import BOS_ID, EOS_ID, NEVER_GENERATED, PAD_ID
from rnnkit.generation.search import GenerationResult, generate_batch
from rnnkit.generation.seq2seq_search import decode_batch
from rnnkit.layers.linear import Linear
from rnnkit.metrics.losses import training_loss
from rnnkit.models.builders import build_embedding, build_encoder, check_vocab_size
from rnnkit.models.language_model import LanguageModel, LossOutput
from rnnkit.models.spec import ModelSpec
from rnnkit.types import State

__all__ = ["DecoderOnlyTranslator", "build_decoder_only", "joint_sequences"]


class _TargetTiedHead(nn.Module):
    """Weight tying for the decoder-only model: logits over the TARGET rows of the joint
    embedding, ``z = E_t (P h) + b``."""

    def __init__(self, embedding: nn.Embedding, in_features: int, offset: int) -> None:
        super().__init__()
        self.embedding = embedding
        self.offset = offset
        E = embedding.embedding_dim
        self.projection = nn.Linear(in_features, E, bias=False) if in_features != E else None
        self.bias = nn.Parameter(embedding.weight.new_zeros(embedding.num_embeddings - offset))

    def forward(self, h: Tensor) -> Tensor:
        if self.projection is not None:
            h = self.projection(h)
        return F.linear(h, self.embedding.weight[self.offset :], self.bias)


def joint_sequences(
    source: Tensor,
    source_mask: Tensor,
    target_in: Tensor,
    target_mask: Tensor,
    source_vocab_size: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """Build ``<s> x <sep> y`` rows (vectorised, no Python loop over the batch).

    Args:
        source: ``(B, S)`` source ids, left-aligned, ``source_mask`` True at real ones.
        target_in: ``(B, T)`` ``<s> y_1 … y_m`` in target ids; ``target_mask`` likewise.
        source_vocab_size: ``V_s``, the shift of the target ids.

    Returns:
        ``(inputs (B, N), mask (B, N), positions (B, T))``: joint input ids, their mask,
        and for every target step the joint position whose output predicts it (where
        ``target_mask`` is False the position is 0 and must be ignored).

    >>> src, sm = torch.tensor([[4, 5], [6, 0]]), torch.tensor([[True, True], [True, False]])
    >>> tin, tm = torch.tensor([[2, 7], [2, 0]]), torch.tensor([[True, True], [True, False]])
    >>> x, m, pos = joint_sequences(src, sm, tin, tm, source_vocab_size=10)
    >>> x.tolist(), pos.tolist()
    ([[2, 4, 5, 12, 17], [2, 6, 12, 0, 0]], [[3, 4], [2, 0]])
    """
    B, S = source.shape
    T = target_in.shape[1]
    n_src = source_mask.sum(1)  # (B,)
    # Each row's joint length from the masks' host copies (rnnkit.bptt.mask_facts: a
    # batch's masks moved with move_mask are read without waiting for the device); the
    # joint mask is made there too and moved with its host copy, for the layers to ask.
    joint = 1 + host_mask(source_mask).sum(1) + host_mask(target_mask).sum(1)  # (B,) host
    # the longest row (an empty batch, B = 0, has none: one column, the <s> of no row)
    N = int(joint.max()) if B else 1
    inputs = source.new_full((B, N + 1), PAD_ID)  # one spare column catches padding writes
    inputs[:, 0] = BOS_ID
    width = min(S, N)  # a source padded wider than any row needs is cut to fit
    inputs[:, 1 : 1 + width] = torch.where(source_mask, source, PAD_ID)[:, :width]
    steps = torch.arange(T, device=source.device)
    positions = (1 + n_src).unsqueeze(1) + steps  # (B, T): where y-inputs go
    write_at = torch.where(target_mask, positions, N)
    inputs.scatter_(1, write_at, torch.where(target_mask, target_in + source_vocab_size, PAD_ID))
    inputs = inputs[:, :N]
    mask = move_mask(torch.arange(N) < joint.unsqueeze(1), source.device)
    return inputs, mask, torch.where(target_mask, positions, 0)


class DecoderOnlyTranslator(nn.Module):
    """A ``LanguageModel`` over joint ids that predicts target ids (see module docstring).

    Args:
        lm: ``LanguageModel`` with an embedding of ``V_s + V_t`` rows and a head of
            ``V_t`` outputs.
        source_vocab_size: ``V_s``.

    >>> from rnnkit import LSTM
    >>> lm = LanguageModel(nn.Embedding(5 + 6, 4), LSTM(4, 8), nn.Linear(8, 6))
    >>> model = DecoderOnlyTranslator(lm, source_vocab_size=5).eval()
    >>> src = torch.tensor([[4, 4]])
    >>> hyps = model.decode(src, src != 0, beam=2, max_length=3)
    >>> len(hyps), all(0 <= t < 6 for t in hyps[0][0].ids)
    (1, True)
    """

    #: How the training loss averages token losses: "token" (every target token weighs
    #: the same) or "sequence" (the mean within each sequence, then over sequences).
    loss_reduction: str = "token"

    def __init__(self, lm: LanguageModel, source_vocab_size: int) -> None:
        super().__init__()
        if source_vocab_size >= lm.vocab_size:
            raise ValueError(
                f"the LM's {lm.vocab_size} input ids leave no room for a target vocabulary "
                f"after {source_vocab_size} source ids"
            )
        self.lm = lm
        self.source_vocab_size = source_vocab_size

    @property
    def vocab_size(self) -> int:
        """``V_t``, the target vocabulary size."""
        return self.lm.vocab_size - self.source_vocab_size

    def target_logits(self, batch: PairBatch) -> Tensor:
        """Logits ``(B, T, V_t)`` of every target step under teacher forcing."""
        inputs, mask, positions = joint_sequences(
            batch.source, batch.source_mask, batch.target_in, batch.target_mask,
            self.source_vocab_size,
        )  # fmt: skip
        logits = self.lm(inputs, mask=mask).logits  # (B, N, V_t)
        index = positions.unsqueeze(-1).expand(-1, -1, logits.shape[-1])
        return logits.gather(1, index)  # (B, T, V_t)

    def loss(
        self,
        batch: PairBatch,
        sampling_p: float | None = None,
        generator: torch.Generator | None = None,
    ) -> LossOutput:
        """Cross-entropy on the target part only (masked token mean, nats)."""
        if sampling_p is not None:
            raise ValueError("scheduled sampling applies to the encoder–decoder only")
        logits = self.target_logits(batch)
        loss, nats, tokens = training_loss(
            logits, batch.target_out, batch.target_mask, self.loss_reduction
        )
        return LossOutput(loss, nats, tokens, None)

    def encode_source(self, source: Tensor, source_mask: Tensor) -> State:
        """The LM state after ``<s> x`` for every row (held at each row's last token).

        Not called ``prime``: that name is generation's hook for prompt ids.
        """
        B = source.shape[0]
        bos = source.new_full((B, 1), BOS_ID)
        inputs = torch.cat([bos, torch.where(source_mask, source, PAD_ID)], dim=1)
        mask = torch.cat([source_mask.new_ones(B, 1), source_mask], dim=1)
        return self.lm(inputs, mask=mask).state

    def step(self, token: Tensor, state: State) -> tuple[Tensor, State]:
        """``token (B,)`` in target ids (``<s>`` = ``<sep>``) → target log-probs, state."""
        out = self.lm(token.view(-1, 1) + self.source_vocab_size, state=state)
        return torch.log_softmax(out.logits[:, 0], dim=-1), out.state

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
        """Greedy or beam search, batched (arguments as ``Seq2Seq.decode``)."""
        return decode_batch(
            self,
            self.encode_source(source, source_mask),
            2,
            beam=beam,
            max_length=max_length,
            bos_id=BOS_ID,
            eos_id=EOS_ID,
            forbid=NEVER_GENERATED,
            length_penalty=length_penalty,
            num=num,
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
        """``num`` samples per source (arguments as ``Seq2Seq.sample``)."""
        return generate_batch(
            self,
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
            state=self.encode_source(source, source_mask),
            state_batch_dim=2,
        )


def build_decoder_only(
    spec: ModelSpec, source_vocab_size: int, target_vocab_size: int
) -> DecoderOnlyTranslator:
    """Embedding of ``V_s + V_t`` joint ids → unidirectional stack → ``V_t`` outputs.

    >>> m = build_decoder_only(ModelSpec(hidden=8, embedding=4), 6, 7)
    >>> m.vocab_size, m.lm.vocab_size
    (7, 13)
    """
    check_vocab_size(source_vocab_size, "source_vocab_size")
    check_vocab_size(target_vocab_size, "target_vocab_size")
    embedding = build_embedding(spec, source_vocab_size + target_vocab_size, spec.embedding)
    encoder = build_encoder(spec, spec.embedding, bidirectional=False)
    head: nn.Module = (
        _TargetTiedHead(embedding, spec.hidden, source_vocab_size)
        if spec.tie_weights
        else Linear(spec.hidden, target_vocab_size)
    )
    lm = LanguageModel(embedding, encoder, head, dropout=spec.dropout)
    return DecoderOnlyTranslator(lm, source_vocab_size)
