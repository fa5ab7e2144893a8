"""Builders: turn a configuration's numbers into models (the models receive their parts)."""

from __future__ import annotations

from torch import nn

from rnnkit.config import TrainConfig
from rnnkit.layers.stacked import GRU, LSTM, RNN, StackedRecurrent
from rnnkit.models.conditional import ConditionalLM
from rnnkit.models.heads import TiedHead
from rnnkit.models.jordan import JordanLM
from rnnkit.models.language_model import LanguageModel
from rnnkit.models.length import SequenceLength

__all__ = ["build_encoder", "build_language_model", "build_length", "build_lm"]


def build_encoder(
    cfg: TrainConfig, input_size: int, bidirectional: bool | None = None
) -> StackedRecurrent:
    """The recurrent stack the config asks for (cell, width, depth, directions, dropout)."""
    bi = cfg.bidirectional if bidirectional is None else bidirectional
    common = dict(
        num_layers=cfg.layers, bidirectional=bi, dropout=cfg.dropout, recompute=cfg.recompute
    )
    if cfg.cell == "rnn":
        return RNN(input_size, cfg.hidden, nonlinearity=cfg.nonlinearities(), **common)
    if cfg.cell == "lstm":
        return LSTM(input_size, cfg.hidden, **common)
    return GRU(input_size, cfg.hidden, update=cfg.update, reset=cfg.reset, **common)


def build_length(cfg: TrainConfig, features_size: int, context_size: int) -> SequenceLength | None:
    """``--length stop|predict`` as a module (None for ``eos``); ``--max-len`` caps ``T``."""
    if cfg.length == "eos":
        return None
    return SequenceLength(
        cfg.length, features_size, context_size=context_size, max_length=cfg.max_len
    )


def build_language_model(cfg: TrainConfig, vocab_size: int) -> LanguageModel:
    """Embedding → stack → (tied) output layer, sized by ``cfg`` (with ``--length``).

    >>> lm = build_language_model(TrainConfig(train="x", hidden=8, embedding=4), 10)
    >>> lm.vocab_size
    10
    """
    embedding = nn.Embedding(vocab_size, cfg.embedding)
    top = cfg.hidden
    # The length output reads the initial top state (context_size = H).
    length = build_length(cfg, top, top)
    extra = 0 if length is None else length.input_size
    encoder = build_encoder(cfg, cfg.embedding + extra, bidirectional=False)
    head: nn.Module = TiedHead(embedding, top) if cfg.tie_weights else nn.Linear(top, vocab_size)
    return LanguageModel(embedding, encoder, head, dropout=cfg.dropout, length=length)


def build_lm(cfg: TrainConfig, vocab_size: int, num_labels: int | None = None) -> nn.Module:
    """The language model of ``--task lm``: ``--wiring`` and ``--condition`` choose the kind.

    ``hidden``: :class:`LanguageModel`; ``jordan``: :class:`JordanLM` (width ``--hidden``,
    ``φ`` from ``--nonlinearity``; ``--cell`` and ``--embedding`` do not apply);
    ``--condition init|input|both``: :class:`ConditionalLM` over ``num_labels`` classes,
    the class embedding ``c`` of width ``--embedding``.

    >>> cfg = TrainConfig(train="x", hidden=8, wiring="jordan")
    >>> type(build_lm(cfg, 10)).__name__
    'JordanLM'
    """
    if cfg.wiring == "jordan":
        return JordanLM(
            nn.Embedding(vocab_size, cfg.hidden),
            nn.Linear(cfg.hidden, vocab_size),
            nonlinearity=cfg.nonlinearity,
            dropout=cfg.dropout,
        )
    if cfg.condition == "none":
        return build_language_model(cfg, vocab_size)
    if num_labels is None or num_labels < 1:
        raise ValueError(f"--condition {cfg.condition} needs num_labels >= 1, got {num_labels}")
    E = C = cfg.embedding
    embedding = nn.Embedding(vocab_size, E)
    width = E + (C if cfg.condition != "init" else 0)
    encoder = build_encoder(cfg, width, bidirectional=False)
    head: nn.Module = (
        TiedHead(embedding, cfg.hidden) if cfg.tie_weights else nn.Linear(cfg.hidden, vocab_size)
    )
    return ConditionalLM(
        embedding,
        encoder,
        head,
        nn.Embedding(num_labels, C),
        C,
        context=cfg.condition,
        dropout=cfg.dropout,
    )
