"""Cells: one time step of the simple RNN, the LSTM and the GRU (hand-written backward steps).

``amp``: a cell steps in its weights' dtype under autocast (mixed precision); float16 and
bfloat16 layers compute in float32 on the CPU.
``layer_norm``: the layer-normalised LSTM and GRU (their steps and hand-written backward);
``normalization``: their normalisation ν, its backward and their input part.
"""

from rnnkit.cells.amp import (
    autocast_devices_on,
    autocast_off,
    autocast_reconciles,
    cell_step_in_weights_dtype,
    computes_in_float32,
    float32,
    low_precision_to,
    without_autocast,
)
from rnnkit.cells.base import CellBase, check_cell_input
from rnnkit.cells.gru import GRUCache, GRUCell, GRUKernel, gru_step, gru_step_backward
from rnnkit.cells.kernel import (
    Kernel,
    StepKernel,
    Weights,
    batched_gradients,
    input_product,
    scratch,
)
from rnnkit.cells.layer_norm import (
    LayerNormGRUCell,
    LayerNormGRUKernel,
    LayerNormLSTMCell,
    LayerNormLSTMKernel,
    layer_norm_gru_step,
    layer_norm_lstm_step,
)
from rnnkit.cells.lstm import (
    LSTMCache,
    LSTMCell,
    LSTMKernel,
    NativeLSTMStep,
    fused_lstm_cell,
    lstm_step,
    lstm_step_backward,
)
from rnnkit.cells.normalization import EPS, normalize, normalize_backward, normalized_input
from rnnkit.cells.rnn import (
    NONLINEARITIES,
    RNNCell,
    RNNKernel,
    activate,
    rnn_step,
    rnn_step_backward,
)

__all__ = [
    "EPS",
    "NONLINEARITIES",
    "CellBase",
    "GRUCache",
    "GRUCell",
    "GRUKernel",
    "Kernel",
    "LSTMCache",
    "LSTMCell",
    "LSTMKernel",
    "LayerNormGRUCell",
    "LayerNormGRUKernel",
    "LayerNormLSTMCell",
    "LayerNormLSTMKernel",
    "NativeLSTMStep",
    "RNNCell",
    "RNNKernel",
    "StepKernel",
    "Weights",
    "activate",
    "autocast_devices_on",
    "autocast_off",
    "autocast_reconciles",
    "batched_gradients",
    "cell_step_in_weights_dtype",
    "check_cell_input",
    "computes_in_float32",
    "float32",
    "fused_lstm_cell",
    "gru_step",
    "gru_step_backward",
    "input_product",
    "layer_norm_gru_step",
    "layer_norm_lstm_step",
    "low_precision_to",
    "lstm_step",
    "lstm_step_backward",
    "normalize",
    "normalize_backward",
    "normalized_input",
    "rnn_step",
    "rnn_step_backward",
    "scratch",
    "without_autocast",
]
