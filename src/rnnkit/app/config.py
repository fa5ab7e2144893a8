"""Training configuration: one dataclass for every task, validated with the option's name.

The command line parses into ``TrainConfig``; ``validate()`` turns out-of-range values
into a ``ConfigError`` naming the option (``--hidden must be ≥ 1, got 0``). The config is
saved as ``config.json`` in the run directory and read back for evaluation, generation
and ``--resume``; unknown keys and wrong types there are errors, not silently dropped.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from rnnkit.errors import ConfigError

__all__ = [
    "CELL_OPTIONS",
    "DOC_BOUNDARIES",
    "RESUME_CHANGEABLE",
    "TASKS",
    "TASK_DEFAULTS",
    "TASK_OPTIONS",
    "TrainConfig",
    "parse_bptt",
]

TASKS = ("lm", "tag", "classify", "seq2seq", "events", "regress", "params")
TOKEN_TASKS = ("lm", "tag", "classify", "seq2seq", "events")
CELLS = ("rnn", "lstm", "gru")
PRECISIONS = ("fp32", "bf16", "fp16")
LENGTHS = ("eos", "stop", "predict")
WIRINGS = ("hidden", "jordan")
CONDITIONS = ("none", "init", "input", "both")
# lm streams: how line ends are read (none: as whitespace; eos: </s> ends every line, the
# state carries on; line: </s> ends every line and the state is reset at each line start)
DOC_BOUNDARIES = ("none", "eos", "line")

NONLINEARITIES = ("tanh", "relu", "sigmoid")

#: The options that only some tasks read: field name → the tasks that use it. An option
#: not listed here applies to every task. Giving a listed option to another task is a
#: ConfigError (``TrainConfig.check_applies``), and ``rnnkit train --help`` shows the tasks
#: beside the option. A new task-specific option MUST be added here.
TASK_OPTIONS: dict[str, tuple[str, ...]] = {
    "bidirectional": ("tag", "classify", "seq2seq", "regress"),  # lm/events: causal
    "embedding": TOKEN_TASKS,  # regress reads vectors, not tokens
    "min_freq": TOKEN_TASKS,
    "tie_weights": ("lm", "seq2seq", "events"),
    "unit": ("lm", "classify"),
    "doc_boundary": ("lm",),
    "bptt": ("lm", "events"),
    "ngram_order": ("lm", "events"),
    "pooling": ("classify",),
    "tag_column": ("tag",),
    "char_rnn": ("tag",),
    "source_unit": ("seq2seq",),
    "target_unit": ("seq2seq",),
    "attention": ("seq2seq",),
    "attention_wiring": ("seq2seq",),
    "context": ("seq2seq",),
    "scheduled_sampling": ("lm", "seq2seq"),
    "decoder_only": ("seq2seq",),
    "beam": ("seq2seq",),
    "length": ("lm", "seq2seq"),
    "wiring": ("lm",),
    "condition": ("lm",),
    "loss_reduction": ("lm", "tag", "seq2seq", "events"),
    "pretrained_vectors": ("lm", "tag", "classify"),
    "target": ("regress",),
    "loss": ("regress",),
}

#: The options ``--resume`` may change: how long, where and how verbosely to train, never
#: what is trained. Every task checks its saved config against this one set.
RESUME_CHANGEABLE: frozenset[str] = frozenset(
    {
        "epochs",
        "steps",
        "max_time",
        "eval_every",
        "patience",
        "device",
        "threads",
        "log_every",
        "tensorboard",
    }
)

#: Defaults that differ by task, each chosen by measurement (docs/defaults.md: the data,
#: the commands and the figures): task → {field: value}. The command line applies them to
#: the options not given; in Python, :meth:`TrainConfig.for_task` does. Every other
#: default is :class:`TrainConfig`'s own.
TASK_DEFAULTS: dict[str, dict[str, Any]] = {
    "regress": {"lr": 5e-3},
}

#: Options of one recurrent cell: field name → the cells that read it (``--nonlinearity``
#: also applies to ``--wiring jordan``, which has no cell).
CELL_OPTIONS: dict[str, tuple[str, ...]] = {
    "nonlinearity": ("rnn",),
    "update": ("gru",),
    "reset": ("gru",),
}


def parse_bptt(spec: str) -> tuple[str, int | None]:
    """``"full"`` → ("full", None); ``"segment:K"`` / ``"window:K"`` → (mode, K ≥ 1).

    >>> parse_bptt("segment:64")
    ('segment', 64)
    """
    if spec == "full":
        return "full", None
    mode, _, k = spec.partition(":")
    if mode not in ("segment", "window") or not k:
        raise ConfigError(f"--bptt must be full, segment:K or window:K, got {spec!r}")
    try:
        value = int(k)
    except ValueError:
        raise ConfigError(f"--bptt {mode}:K needs an integer K, got {k!r}") from None
    if value < 1:
        raise ConfigError(f"--bptt {mode}:K needs K ≥ 1, got {value}")
    return mode, value


@dataclass
class TrainConfig:
    """Everything ``rnnkit train`` needs; field names are the options without ``--``."""

    task: str = "lm"
    train: str = ""
    valid: str | None = None
    out: str = "runs/default"
    # model
    cell: str = "lstm"
    hidden: int = 256
    layers: int = 1
    bidirectional: bool = False
    embedding: int = 64
    tie_weights: bool = False
    dropout: float = 0.0
    nonlinearity: str = "tanh"  # or one per layer: "tanh,sigmoid"
    update: str = "candidate"
    reset: str = "before"
    recompute: int | None = None  # store the state every K steps, recompute the rest
    # data
    unit: str = "char"
    min_freq: int = 1
    max_len: int = 256
    doc_boundary: str = "none"
    valid_fraction: float = 0.05
    # optimisation. No budget (epochs, steps and max_time all None: the command line's
    # default): train until validation stops improving (rnnkit.training.loop).
    epochs: int | None = 1
    steps: int | None = None
    max_time: float | None = None
    batch_size: int = 32
    optimizer: str = "adam"
    lr: float = 2e-3
    lr_decay: float = 0.5
    lr_schedule: str | None = None  # constant | plateau | step:E:F | cosine; None: by optimizer
    warmup: int = 0  # steps of linear learning-rate warm-up
    init_range: float | None = None  # uniform initialisation of every parameter in [-R, R]
    clip_norm: float | None = 5.0
    clip_value: float | None = None
    bptt: str = "segment:64"
    eval_every: int | None = None
    patience: int | None = None
    seed: int = 0
    device: str = "cpu"
    threads: int | None = None  # CPU threads; None: from RNNKIT_THREADS, else chosen by load
    precision: str = "fp32"  # fp32 | bf16 | fp16: autocast dtype of training
    on_nonfinite: str = "stop"  # stop | skip: a NaN/inf loss or gradient (named either way)
    log_every: int | None = None  # steps between training records; None: from the budget
    tensorboard: str | None = None  # directory for TensorBoard scalars of the records
    ngram_order: int = 5
    # task-specific: classify / tag / seq2seq
    pooling: str = "max"  # last | mean | max (classify; max measured best, docs/defaults.md)
    tag_column: str = "upos"
    char_rnn: bool = False
    source_unit: str = "char"
    target_unit: str = "char"
    attention: str = "dot"
    attention_wiring: str = "before"  # before | after the decoder step (seq2seq)
    context: str = "init"
    scheduled_sampling: str = "none"
    decoder_only: bool = False
    beam: int = 1
    # the other wirings: lm / seq2seq
    length: str = "eos"  # eos | stop | predict: how a sequence's end is modelled
    wiring: str = "hidden"  # hidden | jordan (lm): hidden-to-hidden or output-to-hidden
    condition: str = "none"  # none | init | input | both (lm): class-conditional context
    loss_reduction: str = "token"  # token | sequence: how the training loss averages
    pretrained_vectors: str | None = None  # word2vec/GloVe text file into the embedding
    # regress: real-valued sequences
    target: str = "next"  # next (x_{t+1} from x_1..x_t) | value (y from the whole sequence)
    loss: str = "mse"  # mse | gaussian (mean and variance: the Gaussian NLL)
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def for_task(cls, task: str, **options: Any) -> TrainConfig:
        """A config of ``task`` with the task's own defaults (:data:`TASK_DEFAULTS`, what
        ``rnnkit train --task TASK`` uses) under the ``options`` given.

        >>> TrainConfig.for_task("regress", train="x").lr, TrainConfig(task="regress").lr
        (0.005, 0.002)
        """
        return cls(task=task, **{**TASK_DEFAULTS.get(task, {}), **options})

    def validate(self) -> TrainConfig:
        """Check every value; raise ``ConfigError`` naming the option."""

        def positive(name: str, value: Any) -> None:
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ConfigError(f"--{name.replace('_', '-')} must be an integer, got {value!r}")
            if value is not None and value < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be ≥ 1, got {value}")
            if value is not None and value >= 2**63:  # torch sizes are 64-bit: OverflowError
                raise ConfigError(f"--{name.replace('_', '-')} is absurdly large: {value}")

        def choice(name: str, value: Any, options: tuple[str, ...]) -> None:
            if value not in options:
                raise ConfigError(
                    f"--{name.replace('_', '-')} must be one of {', '.join(options)}, got {value!r}"
                )

        choice("task", self.task, TASKS)
        choice("cell", self.cell, CELLS)
        choice("unit", self.unit, ("char", "word"))
        choice("optimizer", self.optimizer, ("adam", "sgd"))
        choice("device", self.device, ("cpu", "cuda", "auto"))
        choice("precision", self.precision, PRECISIONS)
        choice("on_nonfinite", self.on_nonfinite, ("stop", "skip"))
        self._check_nonlinearity()
        choice("update", self.update, ("candidate", "keep"))
        choice("reset", self.reset, ("before", "after"))
        choice("doc_boundary", self.doc_boundary, DOC_BOUNDARIES)
        choice("pooling", self.pooling, ("last", "mean", "max"))
        choice("source_unit", self.source_unit, ("char", "word"))
        choice("target_unit", self.target_unit, ("char", "word"))
        choice("attention", self.attention, ("none", "dot", "bilinear", "additive"))
        choice("attention_wiring", self.attention_wiring, ("before", "after"))
        if self.attention_wiring != "before" and (self.attention == "none" or self.decoder_only):
            raise ConfigError(
                f"--attention-wiring {self.attention_wiring} needs an encoder–decoder with "
                "attention (--attention dot|bilinear|additive, no --decoder-only)"
            )
        choice("context", self.context, ("init", "input", "both"))
        choice("loss_reduction", self.loss_reduction, ("token", "sequence"))
        if self.loss_reduction == "sequence":
            if self.length != "eos":
                raise ConfigError(
                    f"--loss-reduction sequence cannot be combined with --length {self.length} "
                    "(the length mechanism's loss is per token step)"
                )
            if self.task == "lm" and parse_bptt(self.bptt)[0] == "segment":
                raise ConfigError(
                    "--loss-reduction sequence needs whole sequences: --bptt full or window:K, "
                    f"not {self.bptt}"
                )
        choice("target", self.target, ("next", "value"))
        choice("loss", self.loss, ("mse", "gaussian"))
        if self.task == "regress" and self.target == "next" and self.bidirectional:
            raise ConfigError("--bidirectional does not apply to --target next (it is causal)")
        positive("beam", self.beam)
        positive("recompute", self.recompute)
        for name in (
            "hidden",
            "layers",
            "embedding",
            "epochs",
            "steps",
            "batch_size",
            "min_freq",
            "max_len",
            "eval_every",
            "patience",
            "ngram_order",
            "log_every",
        ):
            positive(name, getattr(self, name))
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"--dropout must be in [0, 1), got {self.dropout}")
        if not 0.0 < self.valid_fraction < 0.5:
            raise ConfigError(f"--valid-fraction must be in (0, 0.5), got {self.valid_fraction}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or abs(self.seed) >= 2**63:
            # torch.manual_seed takes 64 bits; a larger seed was a ValueError traceback.
            raise ConfigError(f"--seed must be an integer below 2^63 in size, got {self.seed!r}")
        if not self.lr > 0:
            raise ConfigError(f"--lr must be > 0, got {self.lr}")
        if not 0.0 < self.lr_decay <= 1.0:
            raise ConfigError(f"--lr-decay must be in (0, 1], got {self.lr_decay}")
        self._check_schedule()
        if self.max_time is not None and not self.max_time > 0:
            raise ConfigError(f"--max-time must be > 0 seconds, got {self.max_time}")
        if self.threads is not None and (isinstance(self.threads, bool) or self.threads < 1):
            raise ConfigError(f"--threads must be >= 1, got {self.threads}")
        for name in ("clip_norm", "clip_value"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be > 0, got {value}")
        if not self.train:
            raise ConfigError("--train is required")
        if self.tensorboard is not None and (
            not isinstance(self.tensorboard, str) or not self.tensorboard
        ):
            raise ConfigError(f"--tensorboard must name a directory, got {self.tensorboard!r}")
        if parse_bptt(self.bptt)[0] == "window" and self.recompute is not None:
            raise ConfigError(
                f"--recompute cannot be combined with --bptt {self.bptt}: the windowed "
                "backward keeps every step"
            )
        self._check_wirings()
        return self

    def effective_lr_schedule(self) -> str:
        """``--lr-schedule``, or its default: ``plateau`` with SGD, ``constant`` with Adam."""
        if self.lr_schedule is not None:
            return self.lr_schedule
        return "plateau" if self.optimizer == "sgd" else "constant"

    def _check_schedule(self) -> None:
        """``--lr-schedule``, ``--warmup``, ``--init-range``."""
        from rnnkit.training.schedules import parse_lr_schedule  # torch: only when training

        schedule = parse_lr_schedule(self.effective_lr_schedule())
        if (
            schedule.kind == "step"
            and self.steps is None
            and self.epochs is not None
            and schedule.after_epoch is not None
            and schedule.after_epoch >= self.epochs
        ):
            raise ConfigError(
                f"--lr-schedule {self.lr_schedule} never decays: --epochs {self.epochs} ends "
                f"before epoch {schedule.after_epoch + 1}"
            )
        if schedule.kind == "cosine" and self.steps is None and self.epochs is None:
            raise ConfigError(
                "--lr-schedule cosine needs the run's length: give --steps or --epochs"
            )
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 0:
            raise ConfigError(f"--warmup must be an integer ≥ 0 (steps), got {self.warmup!r}")
        if self.init_range is not None and not (
            self.init_range > 0 and math.isfinite(self.init_range)
        ):
            raise ConfigError(f"--init-range must be > 0, got {self.init_range}")

    def nonlinearities(self) -> tuple[str, ...]:
        """``--nonlinearity`` as one entry per layer (``"tanh,sigmoid"`` on two layers →
        ``("tanh", "sigmoid")``; one name applies to every layer)."""
        parts = tuple(self.nonlinearity.split(","))
        return parts * self.layers if len(parts) == 1 else parts

    def _check_nonlinearity(self) -> None:
        parts = self.nonlinearity.split(",") if isinstance(self.nonlinearity, str) else [None]
        for part in parts:
            if part not in NONLINEARITIES:
                raise ConfigError(
                    f"--nonlinearity must be one of {', '.join(NONLINEARITIES)}, or one per "
                    f"layer separated by commas, got {self.nonlinearity!r}"
                )
        if len(parts) > 1:
            if self.cell != "rnn" or self.wiring == "jordan":
                raise ConfigError(
                    f"--nonlinearity {self.nonlinearity}: one per layer applies to --cell rnn"
                )
            if len(parts) != self.layers:
                raise ConfigError(
                    f"--nonlinearity {self.nonlinearity} names {len(parts)} layers, "
                    f"--layers is {self.layers}: give one, or one per layer"
                )

    def _check_wirings(self) -> None:
        """``--length``, ``--wiring``, ``--condition``: values and the options they exclude."""
        for name, options in (
            ("length", LENGTHS),
            ("wiring", WIRINGS),
            ("condition", CONDITIONS),
        ):
            if getattr(self, name) not in options:
                raise ConfigError(
                    f"--{name} must be one of {', '.join(options)}, got {getattr(self, name)!r}"
                )
        if self.length != "eos" and self.task not in ("lm", "seq2seq"):
            raise ConfigError(f"--length {self.length} applies to --task lm and seq2seq")
        for name in ("wiring", "condition"):
            if getattr(self, name) != getattr(TrainConfig, name) and self.task != "lm":
                raise ConfigError(f"--{name} {getattr(self, name)} applies to --task lm only")
        sequences = parse_bptt(self.bptt)[0] != "segment"
        if self.length != "eos":
            if self.task == "seq2seq" and self.decoder_only:
                raise ConfigError(
                    f"--length {self.length} applies to the encoder–decoder, not --decoder-only"
                )
            if self.task == "seq2seq" and self.scheduled_sampling != "none":
                raise ConfigError(
                    f"--length {self.length} cannot be combined with --scheduled-sampling"
                )
            # A mechanism models whole sequences: stream segments have no end to predict.
            if self.task == "lm" and not sequences:
                raise ConfigError(
                    f"--length {self.length} needs whole lines as sequences: "
                    "--bptt full or window:K, not segment:K"
                )
        if self.task == "lm" and self.scheduled_sampling != "none":
            # The model's own choices are fed one step at a time through the plain LM.
            for bad, given in (
                (f"--bptt {self.bptt}", parse_bptt(self.bptt)[0] != "full"),
                (f"--wiring {self.wiring}", self.wiring != "hidden"),
                (f"--condition {self.condition}", self.condition != "none"),
                (f"--length {self.length}", self.length != "eos"),
            ):
                if given:
                    raise ConfigError(
                        f"--scheduled-sampling on --task lm needs --bptt full, the hidden "
                        f"wiring, no --condition and --length eos; got {bad}"
                    )
        if self.wiring == "jordan":
            # Fig. 10.4 has one layer and only the fed-back output as memory.
            for bad, given in (
                (f"--layers {self.layers}", self.layers != 1),
                ("--bidirectional", self.bidirectional),
                ("--tie-weights", self.tie_weights),
                (f"--length {self.length}", self.length != "eos"),
                (f"--condition {self.condition}", self.condition != "none"),
                (f"--recompute {self.recompute}", self.recompute is not None),
                ("--pretrained-vectors", self.pretrained_vectors is not None),
            ):
                if given:
                    raise ConfigError(f"{bad} does not apply to --wiring jordan")
        if self.condition != "none":
            if self.length != "eos":
                raise ConfigError(
                    f"--length {self.length} cannot be combined with --condition {self.condition}"
                )
            if parse_bptt(self.bptt)[0] != "full":
                raise ConfigError(
                    f"--condition {self.condition} needs --bptt full "
                    "(each label<TAB>text line is one sequence)"
                )

    def given_options(self) -> set[str]:
        """The fields whose value differs from the default (what a caller that does not
        know which options were typed can take as "given")."""
        default = TrainConfig()
        return {
            f.name
            for f in dataclasses.fields(self)
            if f.name != "extra" and getattr(self, f.name) != getattr(default, f.name)
        }

    def check_applies(self, given: typing.Iterable[str] | None = None) -> TrainConfig:
        """Refuse options that this task (or cell) does not read: stored and ignored would
        be a silent lie. ``given``: the options the user set (field names; the command
        line passes what argv set, so an option given at its default value counts too);
        None: those differing from the default.

        >>> TrainConfig(train="x", task="tag").check_applies({"pooling"})
        Traceback (most recent call last):
        ...
        rnnkit.errors.ConfigError: --pooling does not apply to --task tag (only to: classify)
        """
        names = self.given_options() if given is None else set(given)
        for name in sorted(names):
            reason = self.not_applying(name)
            if reason is not None:
                raise ConfigError(reason)
        return self

    def applies(self, name: str) -> bool:
        """Whether this task (and cell, and wiring) reads the option ``name`` (a field).

        >>> TrainConfig(task="tag").applies("pooling"), TrainConfig(cell="gru").applies("reset")
        (False, True)
        """
        return self.not_applying(name) is None

    def not_applying(self, name: str) -> str | None:
        """Why the option ``name`` does not apply here (the refusal line), or None."""
        flag = "--" + name.replace("_", "-")
        tasks = TASK_OPTIONS.get(name)
        if tasks is not None and self.task not in tasks:
            return f"{flag} does not apply to --task {self.task} (only to: {', '.join(tasks)})"
        cells = CELL_OPTIONS.get(name)
        if self.wiring == "jordan" and name in (*CELL_OPTIONS, "cell"):
            if name == "nonlinearity":  # φ of the Jordan update
                return None
            return f"{flag} does not apply to --wiring jordan (it has no cell)"
        if cells is None or self.cell in cells:
            return None
        return f"{flag} does not apply to --cell {self.cell} (only to: {', '.join(cells)})"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any, where: str = "config.json") -> TrainConfig:
        """Rebuild from ``to_dict()``; unknown keys or wrong types are a ``ConfigError``."""
        if not isinstance(data, dict):
            raise ConfigError(f"{where}: expected a JSON object")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - set(fields))
        if unknown:
            raise ConfigError(f"{where}: unknown keys {unknown}")
        hints = typing.get_type_hints(cls)
        for name, value in data.items():
            # From the annotation, so that options unset by default (``steps: int | None``)
            # are checked too when set.
            hint = hints[name]
            union = typing.get_origin(hint) in (typing.Union, types.UnionType)
            args = typing.get_args(hint) if union else (hint,)
            kinds = tuple(typing.get_origin(a) or a for a in args if a is not type(None))
            if value is None:
                ok = type(None) in args
            else:
                ok = isinstance(value, kinds) and not (
                    bool not in kinds and isinstance(value, bool)
                )
                if float in kinds and isinstance(value, int) and not isinstance(value, bool):
                    ok = True
            if not ok:
                expected = " or ".join(k.__name__ for k in kinds)
                raise ConfigError(f"{where}: {name} must be {expected}, got {type(value).__name__}")
        return cls(**data)
