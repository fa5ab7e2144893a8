"""rnnkit: recurrent sequence models with explicit, inspectable backpropagation through time.

The layers here are batch-first with one bias per gate; ``rnnkit.nn`` has the same layers
behind ``torch.nn``'s interface (a drop-in). ``__version__`` is the package's one version
source (``pyproject.toml`` reads it).
"""

# Importing the library changes nothing outside it. The rnnkit command itself (and only
# it) tunes its own process, here, before torch loads its OpenMP runtime: rnnkit.tuning.
from rnnkit.tuning import interrupt_quietly_while_loading as _interrupt_quietly
from rnnkit.tuning import launched_as_command as _launched_as_command
from rnnkit.tuning import tune_process

if _launched_as_command():
    _interrupt_quietly()  # Ctrl-C while torch loads: one line, not a traceback
    tune_process()

from rnnkit import nn
from rnnkit.cells.gru import GRUCell
from rnnkit.cells.lstm import LSTMCell
from rnnkit.cells.rnn import RNNCell
from rnnkit.layers.cell_stacks import GRU, LSTM, RNN
from rnnkit.layers.interop import convert_gru_update, count_parameters, from_torch, to_torch
from rnnkit.layers.stacked import Bidirectional, StackedRecurrent
from rnnkit.metrics.losses import sequence_cross_entropy
from rnnkit.types import LSTMState, RecurrentOutput

__version__ = "0.1.0"

# Imported on first use: the task layer pulls in data readers, training and the report.
_LAZY = {"load": "rnnkit.app.tasks.trained", "TrainedRun": "rnnkit.app.tasks.trained"}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'rnnkit' has no attribute {name!r}")


__all__ = [
    "GRU",
    "LSTM",
    "RNN",
    "Bidirectional",
    "GRUCell",
    "LSTMCell",
    "LSTMState",
    "RNNCell",
    "RecurrentOutput",
    "StackedRecurrent",
    "TrainedRun",
    "__version__",
    "convert_gru_update",
    "count_parameters",
    "from_torch",
    "load",
    "nn",
    "sequence_cross_entropy",
    "to_torch",
    "tune_process",
]
