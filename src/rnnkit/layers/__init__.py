"""Layers: whole sequences through one cell (masks, directions), stacked and bidirectional."""

from rnnkit.layers.masking import flip_sequences, lengths_to_mask, resolve_mask
from rnnkit.layers.recurrent import Recurrent
from rnnkit.layers.stacked import GRU, LSTM, RNN, Bidirectional, StackedRecurrent, reset_rows
from rnnkit.layers.windowed import run_windowed_stack

__all__ = [
    "GRU",
    "LSTM",
    "RNN",
    "Bidirectional",
    "Recurrent",
    "StackedRecurrent",
    "flip_sequences",
    "lengths_to_mask",
    "reset_rows",
    "resolve_mask",
    "run_windowed_stack",
]
