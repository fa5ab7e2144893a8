"""Layers: whole sequences through one cell (masks, directions), stacked and bidirectional
(``stacked``; ``RNN``, ``LSTM`` and ``GRU`` in ``cell_stacks``; a stack's single step and
its whole call on PyTorch's fused operators in ``fused_stack``), and the regularizers'
masks (``regularization``: variational, locked and embedding dropout, weight drop,
recurrent dropout, zoneout).

Beside them: ``attention`` (dot, general, additive; masked softmax), ``attention_loop``
(the teacher-forced attention decoder as one autograd node), ``attention_scores``
(additive scores as one autograd node on the compiled library), ``linear`` (``nn.Linear``
whose large float32 products run on the compiled library's), ``interop`` (weights to and
from ``torch.nn``'s layers), ``torch_nn`` and ``torch_nn_cells`` (the layers and cells
behind ``torch.nn``'s interface, public as :mod:`rnnkit.nn`).
"""

from rnnkit.layers.attention import ATTENTION_KINDS, Attention, AttentionOutput, masked_softmax
from rnnkit.layers.attention_loop import AttentionDecoderOutput, attention_decoder
from rnnkit.layers.attention_scores import compiled_scores_library, sigmoid_scores, torch_scores
from rnnkit.layers.cell_stacks import GRU, LSTM, RNN
from rnnkit.layers.interop import convert_gru_update, count_parameters, from_torch, to_torch
from rnnkit.layers.linear import Linear, linear
from rnnkit.layers.masking import flip_sequences, lengths_to_mask, resolve_mask
from rnnkit.layers.recurrent import Recurrent
from rnnkit.layers.regularization import (
    REGULARIZERS,
    CellMasks,
    DropoutEmbedding,
    StackMasks,
    check_masks,
    check_probability,
    dropout_mask,
    embedding_dropout,
    float32_masks,
    locked,
    masked_loop,
    regularizing,
    steps_of,
)
from rnnkit.layers.stacked import (
    Bidirectional,
    StackedRecurrent,
    between_layers,
    direction_widths,
    reset_rows,
)
from rnnkit.layers.windowed import run_windowed_stack

__all__ = [
    "ATTENTION_KINDS",
    "GRU",
    "LSTM",
    "REGULARIZERS",
    "RNN",
    "Attention",
    "AttentionDecoderOutput",
    "AttentionOutput",
    "Bidirectional",
    "CellMasks",
    "DropoutEmbedding",
    "Linear",
    "Recurrent",
    "StackMasks",
    "StackedRecurrent",
    "attention_decoder",
    "between_layers",
    "check_masks",
    "check_probability",
    "compiled_scores_library",
    "convert_gru_update",
    "count_parameters",
    "direction_widths",
    "dropout_mask",
    "embedding_dropout",
    "flip_sequences",
    "float32_masks",
    "from_torch",
    "lengths_to_mask",
    "linear",
    "locked",
    "masked_loop",
    "masked_softmax",
    "regularizing",
    "reset_rows",
    "resolve_mask",
    "run_windowed_stack",
    "sigmoid_scores",
    "steps_of",
    "to_torch",
    "torch_scores",
]
