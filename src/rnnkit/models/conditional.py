"""A fixed context vector ``c`` conditioning a language model.

The wiring of Goodfellow et al., *Deep Learning*, Fig. 10.9.

``c = conditioner(condition)`` (e.g. the embedding of a class label, ``(B, C)``) reaches
the recurrence in one of three ways, named as the encoder–decoder's ``--context``:

* ``"input"``: ``c`` enters every step. The first layer reads ``[E y_{t−1}; c]``, so its
  pre-activation is ``W_x [e; c] = W_e e + R c``: concatenating ``c`` to each step's input
  is exactly the ``+ R c`` of Fig. 10.9 (``R`` the last ``C`` columns of ``W_x``). The
  state starts at zero.
* ``"init"``: ``c`` sets only the initial state, ``h^l_0 = tanh(W^l_c c + b^l_c)`` for every
  layer ``l`` (an LSTM's memory cell starts at ``c_0 = 0``: the bounded ``h_0`` is what the
  gates read, and a zero memory keeps the first step's ``tanh(c_1)`` as in the textbook).
* ``"both"``.

Training is teacher forcing over ``<s> y_1 … y_m`` → ``y_1 … y_m </s>`` with the whole
sequence in one call of the stack (the library's explicit BPTT); generation carries a
:class:`ConditionalState` (the recurrent state and ``c``) and costs one step per token.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from rnnkit.data.vocab import BOS_ID, EOS_ID, NEVER_GENERATED
from rnnkit.errors import ConfigError
from rnnkit.generation.search import GenerationResult, generate_batch
from rnnkit.layers.cell_stacks import GRU, LSTM, RNN
from rnnkit.layers.stacked import StackedRecurrent
from rnnkit.metrics.losses import training_loss
from rnnkit.models.language_model import LMOutput, LossOutput, check_token_ids
from rnnkit.types import LSTMState, State

__all__ = [
    "CONDITIONAL_STATE_DIM",
    "CONTEXT_MODES",
    "ConditionalLM",
    "ConditionalState",
    "class_conditional_lm",
]

CONTEXT_MODES = ("init", "input", "both")


class ConditionalState(NamedTuple):
    """Generation state: ``hidden (L, 1, B, H)`` (or ``LSTMState``) and ``context (B, C)``."""

    hidden: State
    context: Tensor


# The batch dimension of every part of a ConditionalState (generation's row selection).
# (a ConditionalState of ints: ``_make`` takes values of any type).
CONDITIONAL_STATE_DIM = ConditionalState._make((2, 0))


class ConditionalLM(nn.Module):
    """Language model conditioned on a fixed context vector; parts injected.

    Args:
        embedding: ``nn.Embedding(V, E)``.
        encoder: a unidirectional stack; ``input_size = E`` (``"init"``) or ``E + C``.
        head: ``(…, H)`` → logits ``(…, V)``.
        conditioner: maps a condition (e.g. class ids ``(B,)``) to ``c (B, C)``.
        context_size: ``C``.
        context: ``"init"``, ``"input"`` or ``"both"`` (module docstring).
        dropout: on the embeddings and before the head.

    >>> lm = class_conditional_lm(vocab_size=8, num_classes=2, embedding_dim=4,
    ...                           hidden_size=5, context="both")
    >>> lm(torch.tensor([0, 1]), torch.tensor([[2, 4], [2, 5]])).logits.shape
    torch.Size([2, 2, 8])
    """

    #: How the training loss averages token losses: "token" (every target token weighs
    #: the same) or "sequence" (the mean within each sequence, then over sequences).
    loss_reduction: str = "token"

    def __init__(
        self,
        embedding: nn.Embedding,
        encoder: StackedRecurrent,
        head: nn.Module,
        conditioner: nn.Module,
        context_size: int,
        context: str = "both",
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if context not in CONTEXT_MODES:
            raise ConfigError(f"context must be one of {', '.join(CONTEXT_MODES)}, got {context!r}")
        if encoder.bidirectional:
            raise ValueError("a language model needs a unidirectional encoder (causality)")
        E, C = embedding.embedding_dim, context_size
        expected = E + (C if context != "init" else 0)
        if encoder.input_size != expected:
            what = "embedding_dim" if context == "init" else "embedding_dim + context_size"
            raise ValueError(
                f"encoder input_size must be {what} = {expected}, got {encoder.input_size}"
            )
        self.embedding = embedding
        self.encoder = encoder
        self.head = head
        self.conditioner = conditioner
        self.context_size = C
        self.context_mode = context
        self.drop = nn.Dropout(dropout)
        L, H = encoder.num_layers, encoder.hidden_size
        # W_c, b_c of every layer at once: one (C → L·H) product, split per layer.
        self.bridge = nn.Linear(C, L * H) if context != "input" else None

    @property
    def vocab_size(self) -> int:
        return self.embedding.num_embeddings

    def context_vector(self, condition: Any) -> Tensor:
        """``c = conditioner(condition)``, checked to be ``(B, C)``."""
        c = self.conditioner(condition)
        if c.dim() != 2 or c.shape[1] != self.context_size:
            raise ValueError(
                f"the conditioner must give (B, C = {self.context_size}), got {tuple(c.shape)}"
            )
        return c

    def initial_state(self, c: Tensor) -> State:
        """``h^l_0 = tanh(W^l_c c + b^l_c)`` (``"init"``/``"both"``) or zeros (``"input"``).

        Returns ``(L, 1, B, H)``, or ``LSTMState(h_0, c_0 = 0)`` for an LSTM stack.
        """
        L, H, B = self.encoder.num_layers, self.encoder.hidden_size, c.shape[0]
        if self.bridge is None:
            h0 = c.new_zeros(L, 1, B, H)
        else:
            h0 = torch.tanh(self.bridge(c)).view(B, L, H).transpose(0, 1).unsqueeze(1)
        return LSTMState(h0, torch.zeros_like(h0)) if self.encoder.is_lstm else h0

    def encoder_inputs(self, tokens: Tensor, c: Tensor) -> Tensor:
        """What the stack reads: ``tokens (B, T)`` embedded (with dropout in training),
        and ``c (B, C)`` beside every step unless the context is ``"init"``. Ids out of
        the vocabulary are one error naming them, as :class:`LanguageModel`'s (on a GPU the
        lookup itself would stop the process with a device-side assert)."""
        tokens = check_token_ids(tokens, getattr(self.embedding, "num_embeddings", None))
        x = self.drop(self.embedding(tokens))  # (B, T, E)
        if self.context_mode == "init":
            return x
        B, T = tokens.shape
        return torch.cat([x, c.unsqueeze(1).expand(B, T, -1)], dim=-1)  # (B, T, E + C)

    def forward(self, condition: Any, inputs: Tensor, mask: Tensor | None = None) -> LMOutput:
        """Teacher-forced logits ``(B, T, V)`` given the condition of every row.

        Args:
            condition: what ``conditioner`` reads, one per row (class ids ``(B,)``).
            inputs: ``(B, T)`` ``<s> y_1 … y_{T−1}``.  mask: ``(B, T)`` bool or None.
        """
        c = self.context_vector(condition)  # (B, C)
        out = self.encoder(self.encoder_inputs(inputs, c), mask=mask, state=self.initial_state(c))
        return LMOutput(self.head(self.drop(out.outputs)), out.state)

    def loss(
        self, condition: Any, inputs: Tensor, targets: Tensor, mask: Tensor | None = None
    ) -> LossOutput:
        """Teacher-forced cross-entropy, masked token mean (nats)."""
        out = self(condition, inputs, mask)
        loss, nats, tokens = training_loss(out.logits, targets, mask, self.loss_reduction)
        return LossOutput(loss, nats, tokens, None)

    def start(self, condition: Any) -> ConditionalState:
        """The generation state of every row before its first token."""
        c = self.context_vector(condition)
        return ConditionalState(self.initial_state(c), c)

    @torch.no_grad()
    def step(self, token: Tensor, state: ConditionalState) -> tuple[Tensor, ConditionalState]:
        """One generation step: ``token (B,)`` → ``(log-probabilities (B, V), state)``."""
        x = self.encoder_inputs(token.view(-1, 1), state.context)  # (B, 1, ·)
        out = self.encoder(x, state=state.hidden)
        log_probs = torch.log_softmax(self.head(self.drop(out.outputs[:, 0])), dim=-1)
        return log_probs, state._replace(hidden=out.state)

    @torch.no_grad()
    def generate(
        self, condition: Any, *, max_length: int, **options: Any
    ) -> list[list[GenerationResult]]:
        """Generate for each condition from ``<s>`` until ``</s>`` or ``max_length``.

        ``options`` are :func:`rnnkit.generation.search.generate_batch`'s (``strategy``,
        ``temperature``, ``num``, ``generator``, …); greedy by default. ``<pad>``,
        ``<unk>`` and ``<s>`` are never generated unless ``forbid=`` says otherwise.
        """
        options.setdefault("forbid", NEVER_GENERATED)
        return generate_batch(
            self,
            None,
            max_length=max_length,
            eos_id=EOS_ID,
            bos_id=BOS_ID,
            state=self.start(condition),
            state_batch_dim=CONDITIONAL_STATE_DIM,
            **options,
        )


def class_conditional_lm(
    vocab_size: int,
    num_classes: int,
    embedding_dim: int,
    hidden_size: int,
    context: str = "both",
    context_size: int | None = None,
    cell: str = "gru",
    num_layers: int = 1,
) -> ConditionalLM:
    """A class-conditional text LM: ``c`` is a learned embedding of the class label.

    Args:
        context_size: ``C`` (default: ``embedding_dim``).  cell: ``"rnn"``, ``"lstm"``
            or ``"gru"``.
    """
    stacks = {"rnn": RNN, "lstm": LSTM, "gru": GRU}
    if cell not in stacks:
        raise ConfigError(f"cell must be one of rnn, lstm, gru, got {cell!r}")
    if context not in CONTEXT_MODES:
        raise ConfigError(f"context must be one of {', '.join(CONTEXT_MODES)}, got {context!r}")
    C = embedding_dim if context_size is None else context_size
    width = embedding_dim + (C if context != "init" else 0)
    return ConditionalLM(
        nn.Embedding(vocab_size, embedding_dim),
        stacks[cell](width, hidden_size, num_layers=num_layers),
        nn.Linear(hidden_size, vocab_size),
        nn.Embedding(num_classes, C),
        C,
        context=context,
    )
