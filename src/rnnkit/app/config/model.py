"""The model's options: the recurrent cell, its sizes and the layers around it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rnnkit.app.config.fields import TOKEN_TASKS, option
from rnnkit.layers.regularization import REGULARIZERS as STACK_REGULARIZERS

__all__ = ["CELLS", "NONLINEARITIES", "REGULARIZERS", "ModelOptions"]

CELLS = ("rnn", "lstm", "gru")
#: The tasks whose models run a recurrent stack built from the model options.
_STACK_TASKS = ("lm", "tag", "classify", "seq2seq", "events", "regress")
_APPLY = "seq2seq: the encoder only; docs/regularization.md"
#: The regularizers of the recurrent stack and the embedding (docs/regularization.md).
REGULARIZERS = (*STACK_REGULARIZERS, "embedding_dropout")
NONLINEARITIES = ("tanh", "relu", "sigmoid")


@dataclass(kw_only=True)
class ModelOptions:
    """What is trained: the cell, its width and depth, the embedding and dropout."""

    title: ClassVar[str] = "model"

    cell: str = option("lstm", choices=CELLS, help="recurrent cell (default %(default)s)")
    hidden: int = option(256, positive=True, help="hidden width H (default %(default)s)")
    layers: int = option(1, positive=True, help="stacked layers (default %(default)s)")
    bidirectional: bool = option(
        False,
        # lm/events: causal; tag: the tagger's encoder is always bidirectional, so the
        # option would change nothing (accepted, it was stored and ignored)
        tasks=("classify", "seq2seq", "regress"),
        help="two directions per layer (the tagger's encoder always has both)",
    )
    embedding: int = option(
        64,
        positive=True,
        tasks=TOKEN_TASKS,  # regress reads vectors, not tokens
        help="embedding width (default %(default)s)",
    )
    tie_weights: bool = option(
        False,
        tasks=("lm", "seq2seq", "events"),
        help="share the embedding with the output layer (a projection is added "
        "when --hidden differs from --embedding)",
    )
    pretrained_vectors: str | None = option(
        None,
        metavar="FILE",
        tasks=("lm", "tag", "classify"),
        help="initialise the word embedding from vectors in word2vec/GloVe text format "
        "(one 'word v1 … vd' per line, d = --embedding); says how many words were found",
    )
    dropout: float = option(0.0, help="dropout on embeddings, between layers and before the head")
    input_dropout: float = option(
        0.0,
        metavar="P",
        tasks=_STACK_TASKS,
        help=f"dropout on the recurrent stack's input, one mask per sequence ({_APPLY})",
    )
    locked_dropout: float = option(
        0.0,
        metavar="P",
        tasks=_STACK_TASKS,
        help=f"dropout between layers with one mask per sequence ({_APPLY})",
    )
    output_dropout: float = option(
        0.0,
        metavar="P",
        tasks=_STACK_TASKS,
        help=f"dropout on the last layer's outputs, one mask per sequence ({_APPLY})",
    )
    recurrent_dropout: float = option(
        0.0,
        metavar="P",
        tasks=_STACK_TASKS,
        help=f"dropout on h_{{t-1}} in the recurrent product, one mask per sequence ({_APPLY})",
    )
    weight_drop: float = option(
        0.0,
        metavar="P",
        tasks=_STACK_TASKS,
        help=f"DropConnect on the recurrent weights W_hh, one mask per batch ({_APPLY})",
    )
    zoneout: float = option(
        0.0,
        metavar="P",
        tasks=_STACK_TASKS,
        help="each unit keeps its previous state with probability P at each step (the "
        f"expectation at evaluation; {_APPLY})",
    )
    embedding_dropout: float = option(
        0.0,
        metavar="P",
        tasks=TOKEN_TASKS,
        help=f"drop whole rows of the word embedding for the batch, the rest rescaled ({_APPLY})",
    )
    # One name, or one per layer ("tanh,sigmoid"): not a choice list, TrainConfig checks it.
    nonlinearity: str = option(
        "tanh",
        metavar="{tanh,relu,sigmoid}[,...]",
        cells=("rnn",),
        help="simple RNN activation φ: tanh, relu or sigmoid (the logistic), or one per "
        "layer bottom first, e.g. tanh,sigmoid (default %(default)s)",
    )
    update: str = option(
        "candidate",
        choices=("candidate", "keep"),
        cells=("gru",),
        help="GRU update convention: z weighs the candidate or the kept state "
        "(default %(default)s)",
    )
    reset: str = option(
        "before",
        choices=("before", "after"),
        cells=("gru",),
        help="GRU reset gate before or after the recurrent matrix (default %(default)s)",
    )
    layer_norm: bool = option(
        False,
        cells=("lstm", "gru"),
        tasks=("lm", "tag", "classify", "events", "regress"),  # seq2seq steps its cells
        help="layer-normalised cells: the input and recurrent products (and the LSTM's "
        "cell state) normalised; a GRU needs --reset after (the PyTorch time loop; "
        "docs/regularization.md)",
    )
    recompute: int | None = option(
        None,
        metavar="K",
        positive=True,
        help="keep only the state every K steps for the backward and recompute the rest: "
        "the same gradients in O(T/K + K) memory for long sequences, ~1/3 more time",
    )

    def nonlinearities(self) -> tuple[str, ...]:
        """``--nonlinearity`` as one entry per layer (``"tanh,sigmoid"`` on two layers →
        ``("tanh", "sigmoid")``; one name applies to every layer)."""
        parts = tuple(self.nonlinearity.split(","))
        return parts * self.layers if len(parts) == 1 else parts
