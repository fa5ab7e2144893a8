"""What a model builder needs to know: widths, depth, cell and the structural options.

The builders (:mod:`rnnkit.models.builders` and the ``build_*`` of each model module)
take a :class:`ModelSpec`, never the command line's configuration: models sit below the
application, which translates its options into a spec (``rnnkit.app.tasks.run.model_spec``).
The field names and defaults are those of the ``rnnkit train`` options of the same name,
so ``ModelSpec()`` builds the model of ``rnnkit train`` with no option given.

>>> spec = ModelSpec(cell="rnn", hidden=8, layers=2, nonlinearity="tanh,relu")
>>> spec.nonlinearities()
('tanh', 'relu')
>>> ModelSpec(hidden=8, layers=3).nonlinearities()
('tanh', 'tanh', 'tanh')
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ModelSpec"]


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

    def nonlinearities(self) -> tuple[str, ...]:
        """``nonlinearity`` as one entry per layer (``"tanh,sigmoid"`` on two layers →
        ``("tanh", "sigmoid")``; one name applies to every layer)."""
        parts = tuple(self.nonlinearity.split(","))
        return parts * self.layers if len(parts) == 1 else parts
