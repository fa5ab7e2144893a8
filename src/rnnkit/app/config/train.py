"""``TrainConfig``: every option of ``rnnkit train``, composed of one dataclass per concern.

The concerns (:data:`CONCERNS`) are dataclasses of their own modules — the model, the
data, the optimisation, the run, and each task's options — and ``TrainConfig`` inherits
them all, so its fields stay flat: ``cfg.hidden``, ``cfg.target_fpr``, and ``config.json``
one object of every option the run reads, by name. (Nesting ``cfg.model.hidden`` would have changed
every reader of a config and the shape of every run directory's ``config.json``.)

``validate()`` checks what each field declares (its choices, a positive count) and the
rules between options, and turns a bad value into a ``ConfigError`` naming the option
(``--hidden must be ≥ 1, got 0``). ``check_applies()`` refuses an option the task or cell
does not read (the fields' ``tasks=`` and ``cells=``). The config is saved as
``config.json`` in the run directory and read back for evaluation, generation and
``--resume`` (``from_dict``); unknown keys and wrong types there are errors, not silently
dropped.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass
from typing import Any, ClassVar

from rnnkit.app.config.anomaly import EventsOptions, ParamsOptions
from rnnkit.app.config.data import DataOptions
from rnnkit.app.config.fields import (
    TASKS,
    check_option,
    flag,
    option,
    option_of,
    value_kinds,
)
from rnnkit.app.config.model import (
    NONLINEARITIES,
    REGULARIZERS,
    ModelOptions,
)
from rnnkit.app.config.optim import OptimOptions, parse_bptt
from rnnkit.app.config.run import RunOptions
from rnnkit.app.config.tasks import (
    ClassifyOptions,
    LmOptions,
    RegressOptions,
    Seq2seqOptions,
    TagOptions,
)
from rnnkit.errors import ConfigError
from rnnkit.models.spec import TASK_MODEL_DEFAULTS, task_model_defaults
from rnnkit.training.scheduled_sampling import parse_schedule

__all__ = [
    "CELL_OPTIONS",
    "CONCERNS",
    "TASK_DEFAULTS",
    "TASK_OPTIONS",
    "TrainConfig",
    "task_defaults",
]

# The training defaults that differ by task; the model's are the models' own
# (rnnkit.models.spec.TASK_MODEL_DEFAULTS, so that ModelSpec.for_task builds what train does).
_TRAINING_TASK_DEFAULTS: dict[str, dict[str, Any]] = {
    "regress": {"lr": 5e-3},
    # whole sessions: full BPTT runs the time loop at full speed (window:K costs K times);
    # random batches: a session's length tells its workflow, so length-sorted batches are
    # each one workflow, and the model trains worse (docs/defaults.md)
    "events": {"bptt": "full", "batch_order": "random"},
}

#: Defaults that differ by task, each chosen by measurement (docs/defaults.md: the data,
#: the commands and the figures): task → {field: value}, the model's
#: (:data:`rnnkit.models.spec.TASK_MODEL_DEFAULTS`) and the training's. The command line
#: applies them to the options not given; in Python, :meth:`TrainConfig.for_task` does.
#: Every other default is :class:`TrainConfig`'s own.
TASK_DEFAULTS: dict[str, dict[str, Any]] = {
    task: {**TASK_MODEL_DEFAULTS.get(task, {}), **_TRAINING_TASK_DEFAULTS.get(task, {})}
    for task in TASKS
    if task in TASK_MODEL_DEFAULTS or task in _TRAINING_TASK_DEFAULTS
}


def task_defaults(task: str, options: dict[str, Any]) -> dict[str, Any]:
    """The defaults of :data:`TASK_DEFAULTS` for ``task`` that apply with these
    ``options``: the Jordan wiring has one layer by definition, so an ``lm`` with
    ``wiring="jordan"`` keeps ``layers=1``.

    >>> task_defaults("lm", {"wiring": "jordan"})
    {'dropout': 0.3}
    """
    return {**task_model_defaults(task, options), **_TRAINING_TASK_DEFAULTS.get(task, {})}


@dataclass(kw_only=True)
class TaskChoice:
    """The task, which decides which of the other options apply."""

    title: ClassVar[str] = ""  # the command's own options, before the groups

    task: str = option("lm", choices=TASKS, help="what to learn (default lm)")


#: The concerns, in the order of ``rnnkit train --help`` and of ``config.json``.
CONCERNS: tuple[type, ...] = (
    TaskChoice,
    ModelOptions,
    DataOptions,
    OptimOptions,
    RunOptions,
    LmOptions,
    ClassifyOptions,
    TagOptions,
    Seq2seqOptions,
    RegressOptions,
    EventsOptions,
    ParamsOptions,
)


# The bases in reverse: a dataclass lists the fields of its last base first.
@dataclass(kw_only=True)
class TrainConfig(
    ParamsOptions,
    EventsOptions,
    RegressOptions,
    Seq2seqOptions,
    TagOptions,
    ClassifyOptions,
    LmOptions,
    RunOptions,
    OptimOptions,
    DataOptions,
    ModelOptions,
    TaskChoice,
):
    """Everything ``rnnkit train`` needs; field names are the options without ``--``."""

    @classmethod
    def for_task(cls, task: str, **options: Any) -> TrainConfig:
        """A config of ``task`` with the task's own defaults (:data:`TASK_DEFAULTS`, what
        ``rnnkit train --task TASK`` uses) under the ``options`` given.

        >>> TrainConfig.for_task("regress", train="x").lr, TrainConfig(task="regress").lr
        (0.005, 0.002)
        """
        return cls(task=task, **{**task_defaults(task, options), **options})

    def check_fields(self, *concerns: type) -> TrainConfig:
        """Check what each field of the ``concerns`` (none: of all) declares — its choices,
        a positive count, a rate — and raise ``ConfigError`` naming the option.

        >>> TrainConfig(top_g=0).check_fields(EventsOptions)
        Traceback (most recent call last):
        ...
        rnnkit.errors.ConfigError: --top-g must be ≥ 1, got 0
        """
        for concern in concerns or (type(self),):
            for f in dataclasses.fields(concern):
                if f.name == "nonlinearity":  # one name, or one per layer
                    self._check_nonlinearity()
                check_option(f, getattr(self, f.name))
        return self

    def validate(self) -> TrainConfig:
        """Check every value; raise ``ConfigError`` naming the option."""
        self.check_fields()
        if self.attention_wiring != "before" and (self.attention == "none" or self.decoder_only):
            raise ConfigError(
                f"--attention-wiring {self.attention_wiring} needs an encoder–decoder with "
                "attention (--attention dot|bilinear|additive, no --decoder-only)"
            )
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
        if self.task == "regress" and self.target == "next" and self.bidirectional:
            raise ConfigError("--bidirectional does not apply to --target next (it is causal)")
        for name in ("dropout", "word_dropout", *REGULARIZERS):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ConfigError(f"{flag(name)} must be in [0, 1), got {value}")
        self._check_regularizers()
        if not 0.0 < self.valid_fraction < 0.5:
            raise ConfigError(f"--valid-fraction must be in (0, 0.5), got {self.valid_fraction}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or abs(self.seed) >= 2**63:
            # torch.manual_seed takes 64 bits; a larger seed was a ValueError traceback.
            raise ConfigError(f"--seed must be an integer below 2^63 in size, got {self.seed!r}")
        _check_float32("lr", self.lr)
        if not 0.0 < self.lr_decay <= 1.0:
            raise ConfigError(f"--lr-decay must be in (0, 1], got {self.lr_decay}")
        self._check_schedule()
        if not 0 <= self.min_gain < 1:  # NaN fails too
            raise ConfigError(
                f"--min-gain must be in [0, 1) (a fraction of the validation loss), "
                f"got {self.min_gain}"
            )
        if self.max_time is not None and not self.max_time > 0:
            raise ConfigError(f"--max-time must be > 0 seconds, got {self.max_time}")
        if not 0 <= self.snapshot_every < math.inf:  # NaN fails too; config.json holds no inf
            raise ConfigError(
                f"--snapshot-every must be a number of seconds ≥ 0, got {self.snapshot_every}"
            )
        if self.threads is not None and (isinstance(self.threads, bool) or self.threads < 1):
            raise ConfigError(f"--threads must be >= 1, got {self.threads}")
        self._check_bounds()
        for name in ("clip_norm", "clip_value"):
            if getattr(self, name) is not None:
                _check_float32(name, getattr(self, name))
        if not self.train:
            raise ConfigError("--train is required")
        for name in ("valid", "pretrained_vectors"):  # "" was read as not given, or as a file
            if getattr(self, name) == "":
                raise ConfigError(f"{flag(name)} is empty: name a file, or leave the option out")
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

    def _check_regularizers(self) -> None:
        """The regularizers that have no form in a layer-normalised GRU."""
        if self.layer_norm and self.cell == "gru":
            if self.reset != "after":
                raise ConfigError("--layer-norm with --cell gru needs --reset after")
            if self.recurrent_dropout:
                raise ConfigError(
                    "--recurrent-dropout has no layer-normalised GRU form: use --zoneout or "
                    "--weight-drop"
                )

    def _check_bounds(self) -> None:
        """Upper bounds of the options whose cost grows without a limit."""
        from rnnkit.generation.options import MAX_BEAM  # torch: only when validating
        from rnnkit.models.ngram import MAX_ORDER
        from rnnkit.threads import MAX_THREADS_MESSAGE, max_threads

        if self.threads is not None and self.threads > max_threads():
            raise ConfigError(MAX_THREADS_MESSAGE.format(source="--threads", value=self.threads,
                                                         cpus=max_threads()))  # fmt: skip
        if self.ngram_order > MAX_ORDER:
            raise ConfigError(f"--ngram-order must be at most {MAX_ORDER}, got {self.ngram_order}")
        if self.beam > MAX_BEAM:
            raise ConfigError(f"--beam must be at most {MAX_BEAM}, got {self.beam}")

    def _check_schedule(self) -> None:
        """``--lr-schedule``, ``--warmup``, ``--init-range``."""
        from rnnkit.training.schedules import parse_lr_schedule  # torch: only when training

        schedule = parse_lr_schedule(self.effective_lr_schedule(), "--lr-schedule")
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
        if self.init_range is not None:
            _check_float32("init_range", self.init_range)

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
        """``--length``, ``--wiring``, ``--condition``: the options they exclude."""
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
        parse_schedule(self.scheduled_sampling)  # its K and MAX, as training reads them
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
            if getattr(self, f.name) != getattr(default, f.name)
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
        tasks = TASK_OPTIONS.get(name)
        if tasks is not None and self.task not in tasks:
            only = ", ".join(tasks)
            return f"{flag(name)} does not apply to --task {self.task} (only to: {only})"
        if name == "batch_order" and self.task == "lm" and self.bptt.startswith("segment"):
            return (
                f"--batch-order does not apply to --bptt {self.bptt}: a language model's "
                "segments are cut from parallel streams of the text, not batched by line"
            )
        cells = CELL_OPTIONS.get(name)
        if self.wiring == "jordan" and name in (*CELL_OPTIONS, "cell", *REGULARIZERS):
            if name == "nonlinearity":  # φ of the Jordan update
                return None
            return f"{flag(name)} does not apply to --wiring jordan (it has no cell)"
        if cells is None or self.cell in cells:
            return None
        return f"{flag(name)} does not apply to --cell {self.cell} (only to: {', '.join(cells)})"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any, where: str = "config.json") -> TrainConfig:
        """Rebuild from ``to_dict()``; unknown keys or wrong types are a ``ConfigError``.

        >>> TrainConfig.from_dict({"train": "x", "threshold_method": "gpd"}).threshold_method
        'gpd'
        """
        if not isinstance(data, dict):
            raise ConfigError(f"{where}: expected a JSON object")
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - fields)
        if unknown:
            raise ConfigError(f"{where}: unknown keys {unknown}")
        kinds = value_kinds(cls)
        for name, value in data.items():
            # From the annotation, so that options unset by default (``steps: int | None``)
            # are checked too when set.
            kind, optional = kinds[name]
            if value is None:
                ok = optional
            elif kind is float:
                ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            else:
                ok = isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
            if not ok:
                got = type(value).__name__
                raise ConfigError(f"{where}: {name} must be {kind.__name__}, got {got}")
        return cls(**data)


def _table(key: str) -> dict[str, tuple[str, ...]]:
    table: dict[str, tuple[str, ...]] = {}
    for f in dataclasses.fields(TrainConfig):
        value = getattr(option_of(f), key)
        if value is not None:
            table[f.name] = value
    return table


#: The options that only some tasks read: field name → the tasks that use it (each
#: field's ``tasks=``). An option not listed here applies to every task. Giving a listed
#: option to another task is a ConfigError (``TrainConfig.check_applies``), and
#: ``rnnkit train --help`` shows the tasks beside the option.
TASK_OPTIONS: dict[str, tuple[str, ...]] = _table("tasks")

#: Options of one recurrent cell: field name → the cells that read it (each field's
#: ``cells=``; ``--nonlinearity`` also applies to ``--wiring jordan``, which has no cell).
CELL_OPTIONS: dict[str, tuple[str, ...]] = _table("cells")


#: The largest float32: the weights, their gradients and the optimizer's state are float32.
FLOAT32_MAX = 3.4028234663852886e38


def _check_float32(name: str, value: float) -> None:
    """``value`` must be a number in (0, FLOAT32_MAX]: a learning rate, clip or init range
    beyond float32's range cannot be applied to float32 weights (``--lr 1e300`` was a
    torch ``RuntimeError`` at the first step).

    >>> _check_float32("lr", 1e300)
    Traceback (most recent call last):
    ...
    rnnkit.errors.ConfigError: --lr must be > 0 and at most 3.4e+38 (float32's \
largest: the weights are float32), got 1e+300
    """
    if not 0 < value <= FLOAT32_MAX:  # NaN fails too
        raise ConfigError(
            f"{flag(name)} must be > 0 and at most {FLOAT32_MAX:.2g} (float32's "
            f"largest: the weights are float32), got {value:g}"
        )
