"""Builders: turn a configuration's numbers into models (the models receive their parts)."""

from __future__ import annotations

from torch import nn

from rnnkit.config import TrainConfig
from rnnkit.layers.stacked import GRU, LSTM, RNN, StackedRecurrent
from rnnkit.models.heads import TiedHead
from rnnkit.models.language_model import LanguageModel

__all__ = ["build_encoder", "build_language_model"]


def build_encoder(
    cfg: TrainConfig, input_size: int, bidirectional: bool | None = None
) -> StackedRecurrent:
    """The recurrent stack the config asks for (cell, width, depth, directions, dropout)."""
    bi = cfg.bidirectional if bidirectional is None else bidirectional
    common = dict(num_layers=cfg.layers, bidirectional=bi, dropout=cfg.dropout)
    if cfg.cell == "rnn":
        return RNN(input_size, cfg.hidden, nonlinearity=cfg.nonlinearity, **common)
    if cfg.cell == "lstm":
        return LSTM(input_size, cfg.hidden, **common)
    return GRU(input_size, cfg.hidden, update=cfg.update, reset=cfg.reset, **common)


def build_language_model(cfg: TrainConfig, vocab_size: int) -> LanguageModel:
    """Embedding → stack → (tied) output layer, sized by ``cfg``.

    >>> lm = build_language_model(TrainConfig(train="x", hidden=8, embedding=4), 10)
    >>> lm.vocab_size
    10
    """
    embedding = nn.Embedding(vocab_size, cfg.embedding)
    encoder = build_encoder(cfg, cfg.embedding, bidirectional=False)
    top = cfg.hidden
    head: nn.Module = TiedHead(embedding, top) if cfg.tie_weights else nn.Linear(top, vocab_size)
    return LanguageModel(embedding, encoder, head, dropout=cfg.dropout)
