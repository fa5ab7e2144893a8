"""Layers: whole sequences through one cell (masks, directions), stacked and bidirectional."""

from rnnkit.layers.masking import flip_sequences, lengths_to_mask, resolve_mask
from rnnkit.layers.recurrent import Recurrent
from rnnkit.layers.stacked import GRU, LSTM, RNN, Bidirectional, StackedRecurrent

__all__ = [
    "GRU",
    "LSTM",
    "RNN",
    "Bidirectional",
    "Recurrent",
    "StackedRecurrent",
    "flip_sequences",
    "lengths_to_mask",
    "resolve_mask",
]
