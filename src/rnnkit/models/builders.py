"""Builders: turn a :class:`~rnnkit.models.spec.ModelSpec` into models (the models receive
their parts)."""

from __future__ import annotations

import numbers
from typing import TypedDict

from torch import nn

from rnnkit.errors import ConfigError
from rnnkit.layers.cell_stacks import GRU, LSTM, RNN
from rnnkit.layers.linear import Linear
from rnnkit.layers.regularization import DropoutEmbedding
from rnnkit.layers.stacked import StackedRecurrent, between_layers
from rnnkit.models.conditional import ConditionalLM
from rnnkit.models.heads import TiedHead
from rnnkit.models.jordan import JordanLM
from rnnkit.models.language_model import LanguageModel
from rnnkit.models.length import SequenceLength
from rnnkit.models.spec import ModelSpec

__all__ = [
    "build_embedding",
    "build_encoder",
    "build_language_model",
    "build_length",
    "build_lm",
    "check_vocab_size",
]


class _StackOptions(TypedDict):
    """What every kind of stack takes from the spec besides its sizes."""

    num_layers: int
    bidirectional: bool
    dropout: float
    recompute: int | None


class _Regularizers(TypedDict):
    """The stack's regularizers (docs/regularization.md)."""

    input_dropout: float
    locked_dropout: float
    output_dropout: float
    recurrent_dropout: float
    weight_drop: float
    zoneout: float


def build_encoder(
    spec: ModelSpec, input_size: int, bidirectional: bool | None = None, regularize: bool = True
) -> StackedRecurrent:
    """The recurrent stack the spec asks for (cell, width, depth, directions, dropout);
    ``regularize``: with the spec's regularizers (False: a stack stepped through its
    cells, where they would not act)."""
    bi = spec.bidirectional if bidirectional is None else bidirectional
    common = _StackOptions(
        num_layers=spec.layers,
        bidirectional=bi,
        dropout=between_layers(spec.dropout, spec.layers),  # the model's own dropout acts too
        recompute=spec.recompute,
    )
    reg = _Regularizers(
        input_dropout=spec.input_dropout,
        locked_dropout=spec.locked_dropout,
        output_dropout=spec.output_dropout,
        recurrent_dropout=spec.recurrent_dropout,
        weight_drop=spec.weight_drop,
        zoneout=spec.zoneout,
    )
    if not regularize:
        reg = _Regularizers(**dict.fromkeys(reg, 0.0))  # type: ignore[typeddict-item]
    if spec.cell == "rnn":
        return RNN(input_size, spec.hidden, nonlinearity=spec.nonlinearities(), **common, **reg)
    if spec.cell == "lstm":
        return LSTM(input_size, spec.hidden, layer_norm=spec.layer_norm, **common, **reg)
    return GRU(
        input_size,
        spec.hidden,
        update=spec.update,
        reset=spec.reset,
        layer_norm=spec.layer_norm,
        **common,
        **reg,
    )


def check_vocab_size(value: object, name: str = "vocab_size") -> None:
    """A ``ConfigError`` naming ``name`` unless ``value`` is an integer ≥ 1 (torch's
    embedding built 0 rows in silence, and -1 was "Trying to create tensor with negative
    dimension")."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) < 1:
        raise ConfigError(f"{name} must be an integer ≥ 1 (the vocabulary's size), got {value!r}")


def build_embedding(
    spec: ModelSpec, num_embeddings: int, width: int, name: str = "vocab_size"
) -> nn.Embedding:
    """The word embedding, with the spec's ``embedding_dropout``; ``name``: the builder's
    argument that ``num_embeddings`` is, for the message of a size below 1."""
    check_vocab_size(num_embeddings, name)
    return DropoutEmbedding(num_embeddings, width, dropout=spec.embedding_dropout)


def build_length(spec: ModelSpec, features_size: int, context_size: int) -> SequenceLength | None:
    """``spec.length`` stop|predict as a module (None for ``eos``); ``max_len`` caps ``T``."""
    if spec.length == "eos":
        return None
    return SequenceLength(
        spec.length, features_size, context_size=context_size, max_length=spec.max_len
    )


def build_language_model(spec: ModelSpec, vocab_size: int) -> LanguageModel:
    """Embedding → stack → (tied) output layer, sized by ``spec`` (with its ``length``).

    >>> lm = build_language_model(ModelSpec(hidden=8, embedding=4), 10)
    >>> lm.vocab_size
    10
    """
    embedding = build_embedding(spec, vocab_size, spec.embedding)
    top = spec.hidden
    # The length output reads the initial top state (context_size = H).
    length = build_length(spec, top, top)
    extra = 0 if length is None else length.input_size
    encoder = build_encoder(spec, spec.embedding + extra, bidirectional=False)
    head: nn.Module = TiedHead(embedding, top) if spec.tie_weights else Linear(top, vocab_size)
    return LanguageModel(embedding, encoder, head, dropout=spec.dropout, length=length)


def build_lm(
    spec: ModelSpec, vocab_size: int, num_labels: int | None = None
) -> LanguageModel | JordanLM | ConditionalLM:
    """The language model of ``--task lm``: ``spec.wiring`` and ``spec.condition`` choose
    the kind.

    ``hidden``: :class:`LanguageModel`; ``jordan``: :class:`JordanLM` (width ``hidden``,
    ``φ`` from ``nonlinearity``; ``cell`` and ``embedding`` do not apply);
    ``condition`` init|input|both: :class:`ConditionalLM` over ``num_labels`` classes,
    the class embedding ``c`` of width ``embedding``.

    >>> spec = ModelSpec(hidden=8, wiring="jordan")
    >>> type(build_lm(spec, 10)).__name__
    'JordanLM'
    """
    check_vocab_size(vocab_size)
    if spec.wiring == "jordan":
        return JordanLM(
            nn.Embedding(vocab_size, spec.hidden),
            nn.Linear(spec.hidden, vocab_size),
            nonlinearity=spec.nonlinearity,
            dropout=spec.dropout,
        )
    if spec.condition == "none":
        return build_language_model(spec, vocab_size)
    if num_labels is None or num_labels < 1:
        raise ValueError(f"condition={spec.condition!r} needs num_labels ≥ 1, got {num_labels}")
    E = C = spec.embedding
    embedding = build_embedding(spec, vocab_size, E)
    width = E + (C if spec.condition != "init" else 0)
    encoder = build_encoder(spec, width, bidirectional=False)
    head: nn.Module = (
        TiedHead(embedding, spec.hidden) if spec.tie_weights else Linear(spec.hidden, vocab_size)
    )
    return ConditionalLM(
        embedding,
        encoder,
        head,
        nn.Embedding(num_labels, C),
        C,
        context=spec.condition,
        dropout=spec.dropout,
    )
