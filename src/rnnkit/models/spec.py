"""What a model builder needs to know: widths, depth, cell and the structural options.

The builders (:mod:`rnnkit.models.builders` and the ``build_*`` of each model module)
take a :class:`ModelSpec`, never the command line's configuration: models sit below the
application, which translates its options into a spec (``rnnkit.app.tasks.settings.model_spec``).
The field names and defaults are those of the ``rnnkit train`` options of the same name;
a task may default some of them otherwise (:data:`TASK_MODEL_DEFAULTS`: ``lm`` trains
two layers with dropout 0.3, locked dropout 0.3 between them and output dropout 0.4,
``tag`` reads each word's characters, with dropout 0.5), so
the model ``rnnkit train --task TASK`` builds with no model option given is
``ModelSpec.for_task(TASK)``, while ``ModelSpec()`` holds the options' own defaults.

>>> spec = ModelSpec(cell="rnn", hidden=8, layers=2, nonlinearity="tanh,relu")
>>> spec.nonlinearities()
('tanh', 'relu')
>>> ModelSpec(hidden=8, layers=3).nonlinearities()
('tanh', 'tanh', 'tanh')
>>> ModelSpec().layers, ModelSpec.for_task("lm").layers, ModelSpec.for_task("tag").layers
(1, 2, 1)
>>> ModelSpec().char_rnn, ModelSpec.for_task("tag").char_rnn
(False, True)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rnnkit.cells.gru import RESETS, UPDATES
from rnnkit.cells.rnn import NONLINEARITIES
from rnnkit.errors import ConfigError
from rnnkit.layers.attention import ATTENTION_KINDS
from rnnkit.layers.regularization import REGULARIZERS, check_probability
from rnnkit.models.length import LENGTH_MODES
from rnnkit.models.pooling import POOLINGS

__all__ = ["TASKS", "TASK_MODEL_DEFAULTS", "ModelSpec", "task_model_defaults"]

#: Every task of ``rnnkit train --task`` (the command line's choices are these).
TASKS = ("lm", "tag", "classify", "seq2seq", "events", "regress", "params")

#: The model defaults that differ by task, each chosen by measurement (docs/defaults.md):
#: task → {field: value}. ``rnnkit train --task TASK`` applies them to the options not
#: given (``rnnkit.app.config.TASK_DEFAULTS`` holds them beside the training ones);
#: :meth:`ModelSpec.for_task` does the same.
#: The fields that name one of a few choices, and those choices (``nonlinearity``: one,
#: or one per layer separated by commas).
_CHOICES: dict[str, tuple[str, ...]] = {
    "cell": ("rnn", "lstm", "gru"),
    "nonlinearity": NONLINEARITIES,
    "update": UPDATES,
    "reset": RESETS,
    "length": LENGTH_MODES,
    "wiring": ("hidden", "jordan"),
    "condition": ("none", "init", "input", "both"),
    "pooling": POOLINGS,
    "attention": ("none", *ATTENTION_KINDS),
    "context": ("init", "input", "both"),
    "attention_wiring": ("before", "after"),
}
#: The sizes (integers ≥ 1), the probabilities (in [0, 1)) and the switches (bools).
_SIZES = ("hidden", "layers", "embedding", "max_len")
_PROBABILITIES = ("dropout", *REGULARIZERS, "embedding_dropout")
_SWITCHES = ("bidirectional", "tie_weights", "char_rnn", "layer_norm")

TASK_MODEL_DEFAULTS: dict[str, dict[str, Any]] = {
    "lm": {"layers": 2, "dropout": 0.3, "locked_dropout": 0.3, "output_dropout": 0.4},
    "tag": {"char_rnn": True, "dropout": 0.5},
}


def task_model_defaults(task: str, fields: dict[str, Any]) -> dict[str, Any]:
    """The defaults of :data:`TASK_MODEL_DEFAULTS` for ``task`` that apply with these
    ``fields``: the Jordan wiring has one layer by definition and no recurrent stack to
    regularize, so an ``lm`` with ``wiring="jordan"`` keeps ``layers=1`` and no locked or
    output dropout.

    >>> task_model_defaults("lm", {"wiring": "jordan"})
    {'dropout': 0.3}
    """
    defaults = dict(TASK_MODEL_DEFAULTS.get(task, {}))
    if fields.get("wiring") == "jordan":
        for name in ("layers", "locked_dropout", "output_dropout"):
            defaults.pop(name, None)
    return defaults


@dataclass(frozen=True)
class ModelSpec:
    """The shape and structure of a model; each field is the train option of its name.

    Recurrent stack: ``cell`` (rnn | lstm | gru), ``hidden`` units per direction,
    ``layers``, ``bidirectional`` (where the model allows a choice), ``dropout`` between
    layers and before the output, ``nonlinearity`` (φ of ``cell="rnn"`` and of the Jordan
    network; one name, or one per layer separated by commas), GRU variant ``update`` and
    ``reset``, ``recompute`` (store the state every K steps, recompute the rest).
    Embedding: ``embedding`` width, ``tie_weights`` (output layer = embedding matrix).
    Model-specific: ``length`` (eos | stop | predict) and its cap ``max_len``; language
    models: ``wiring`` (hidden | jordan) and ``condition`` (none | init | input | both);
    classifiers: ``pooling``; taggers: ``char_rnn``; encoder–decoders: ``attention``,
    ``context`` and ``attention_wiring`` (before | after the decoder step).
    Regularizers (docs/regularization.md): ``input_dropout``, ``locked_dropout``,
    ``output_dropout``, ``recurrent_dropout``, ``weight_drop``, ``zoneout`` of the
    recurrent stack and ``embedding_dropout`` of the word embedding (an encoder–decoder's
    encoder side only: its decoder steps through its cells); ``layer_norm``: layer-
    normalised LSTM cells.
    """

    cell: str = "lstm"
    hidden: int = 256
    layers: int = 1
    bidirectional: bool = False
    embedding: int = 64
    tie_weights: bool = False
    dropout: float = 0.0
    nonlinearity: str = "tanh"
    update: str = "candidate"
    reset: str = "before"
    recompute: int | None = None
    length: str = "eos"
    max_len: int = 256
    wiring: str = "hidden"
    condition: str = "none"
    pooling: str = "max"
    char_rnn: bool = False
    attention: str = "dot"
    context: str = "init"
    attention_wiring: str = "before"
    input_dropout: float = 0.0
    locked_dropout: float = 0.0
    output_dropout: float = 0.0
    recurrent_dropout: float = 0.0
    weight_drop: float = 0.0
    zoneout: float = 0.0
    embedding_dropout: float = 0.0
    layer_norm: bool = False

    def __post_init__(self) -> None:
        # A builder reads a choice by comparing it with its names: another value was
        # taken silently as one of them (cell="bogus" built a GRU, wiring and condition
        # fell back to "hidden" and "none"), so every choice is checked here, once.
        for name, allowed in _CHOICES.items():
            value = getattr(self, name)
            parts = (
                value.split(",") if name == "nonlinearity" and isinstance(value, str) else [value]
            )
            if not all(isinstance(p, str) and p in allowed for p in parts):
                raise ConfigError(
                    f"ModelSpec: {name} must be one of {', '.join(allowed)}, got {value!r}"
                )
        # The numbers too: hidden=0 failed at build time naming the layer's hidden_size,
        # and bidirectional="no" (truthy) built a bidirectional model.
        for name in _SIZES:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"ModelSpec: {name} must be an integer ≥ 1, got {value!r}")
        recompute = self.recompute
        if recompute is not None and (
            isinstance(recompute, bool) or not isinstance(recompute, int) or recompute < 1
        ):
            raise ConfigError(
                f"ModelSpec: recompute must be an integer ≥ 1 or None, got {recompute!r}"
            )
        for name in _PROBABILITIES:
            check_probability(f"ModelSpec: {name}", getattr(self, name))
        for name in _SWITCHES:
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(
                    f"ModelSpec: {name} must be True or False, got {getattr(self, name)!r}"
                )

    @classmethod
    def for_task(cls, task: str, **fields: Any) -> ModelSpec:
        """The spec ``rnnkit train --task TASK`` builds: ``fields`` over the task's own
        defaults (:data:`TASK_MODEL_DEFAULTS`) over the options' defaults.

        >>> spec = ModelSpec.for_task("lm", hidden=128)
        >>> spec.hidden, spec.layers, spec.dropout
        (128, 2, 0.3)
        >>> ModelSpec.for_task("lm", dropout=0.0).dropout  # a field given wins
        0.0
        >>> ModelSpec.for_task("language")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        rnnkit.errors.ConfigError: ModelSpec.for_task: task must be one of lm, ..., got 'language'
        """
        # An unknown task has no defaults of its own: without this check a misspelt task
        # ("language", "classifier") gave the options' defaults, silently.
        if task not in TASKS:
            raise ConfigError(
                f"ModelSpec.for_task: task must be one of {', '.join(TASKS)}, got {task!r}"
            )
        return cls(**{**task_model_defaults(task, fields), **fields})

    def nonlinearities(self) -> tuple[str, ...]:
        """``nonlinearity`` as one entry per layer (``"tanh,sigmoid"`` on two layers →
        ``("tanh", "sigmoid")``; one name applies to every layer)."""
        parts = tuple(self.nonlinearity.split(","))
        return parts * self.layers if len(parts) == 1 else parts
