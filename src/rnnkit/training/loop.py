"""The model-agnostic training loop: steps, clipping, validation, checkpoints, resume.

A task supplies a ``step_fn(model, batch, carry) -> LossOutput`` (loss to backpropagate,
summed nats, token count, and the recurrent state to carry into the next batch — for
stream batching) and an ``evaluate_fn(model) -> dict`` with at least ``loss_nats``. The
loop owns everything else, so every task trains the same way (minGPT's trainer):

* segment truncation: the carried state's VALUE crosses into the next batch, its gradient
  does not (detached here);
* clipping by global norm (``torch.nn.utils.clip_grad_norm_``) or by value;
* a non-finite loss or gradient stops training (or skips the step, if asked) naming the
  step, and no snapshot is ever written after a bad step;
* validation every epoch or every N steps, best-on-validation weights in
  ``model.safetensors`` (and, at the end, in the model itself), early stopping,
  learning-rate schedules (``rnnkit.training.schedules``), ``init_range`` initialisation;
* with no budget (``epochs`` and ``steps`` and ``max_time`` all None), training runs until
  validation stops improving: validation about ``VALIDATIONS_PER_EPOCH`` times per epoch,
  early stopping after :func:`default_patience` validations without improvement, and a
  cap of ``CAP_EPOCHS`` epochs (at least ``CAP_MIN_STEPS`` steps) or ``CAP_SECONDS``;
* resumable snapshots (optimizer, scheduler, RNG, data position, carried state), so N
  steps + resume + M steps equals N + M steps;
* mixed precision (``precision="bf16"`` / ``"fp16"``): forward and loss under
  ``torch.autocast``; with float16 a ``torch.amp.GradScaler`` (on every device — the
  underflow of float16 gradients is a property of the format, not of CUDA): the loss is
  scaled before the backward, the gradients unscaled before clipping, and a step whose
  gradients overflowed is skipped by the scaler (its scale halves) — that is not a
  divergence, unless it happens ``MAX_SCALER_SKIPS`` times in a row. Validation runs in
  float32. The scaler's state is part of the snapshot.
"""

from __future__ import annotations

import contextlib
import logging
import math
import signal
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from rnnkit import messages
from rnnkit.errors import CheckpointError, ConfigError, RnnkitError
from rnnkit.models.language_model import LossOutput
from rnnkit.threads import ThreadGovernor
from rnnkit.training.checkpoint import (
    append_jsonl,
    load_model_weights,
    load_snapshot,
    save_model_weights,
    save_snapshot,
)
from rnnkit.training.distributed import DistContext, ShardedBatches, StepModule
from rnnkit.training.progress import Progress
from rnnkit.training.run_files import write_metrics_csv
from rnnkit.training.schedules import build_lr_schedulers, parse_lr_schedule
from rnnkit.types import LSTMState

__all__ = [
    "CAP_EPOCHS",
    "CAP_MIN_STEPS",
    "CAP_SECONDS",
    "MAX_SCALER_SKIPS",
    "TrainOptions",
    "TrainResult",
    "Trainer",
    "TrainingDiverged",
    "TrainingInterrupted",
    "autocast_setup",
    "default_eval_every",
    "default_log_every",
    "default_patience",
    "describe_event",
]

# float16 overflow skips in a row before training counts as diverged: each halves the loss
# scale, so 20 take the default 2^16 down to 2^-4 — gradients that overflow float16 even
# then (|g| > 2^20) are not a scale problem.
MAX_SCALER_SKIPS = 20
# on_nonfinite="skip": non-finite steps in a row before training counts as diverged. One bad
# batch is what skipping is for; 20 in a row mean the weights themselves went bad (every
# later batch would be skipped too — without this bound, forever).
MAX_SKIPPED_STEPS = 20
HISTORY_EVENTS = 10_000  # logged events kept in memory (TrainResult.history)
# metrics.csv is rewritten from metrics.jsonl at a snapshot at most this often (and when
# fit() ends): a table of every event without rewriting it at every validation of a run
# that validates every step.
CSV_EVERY_S = 30.0
_AMP_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}

# Training with no budget: validate about this often per epoch (early stopping needs
# several points per epoch on small data, where one epoch is a handful of steps) ...
VALIDATIONS_PER_EPOCH = 10
MAX_EVAL_EVERY = 1000  # ... but at least every 1,000 steps on large data
# ... and stop at the latest after CAP_EPOCHS epochs (but not before CAP_MIN_STEPS steps:
# a few hundred sessions make an epoch of 4 steps) or CAP_SECONDS of training.
CAP_EPOCHS = 100
CAP_MIN_STEPS = 5000
CAP_SECONDS = 3600.0


def default_eval_every(steps_per_epoch: int) -> int:
    """Steps between validations when training until validation stops improving:
    ``clamp(⌈S / VALIDATIONS_PER_EPOCH⌉, 1, MAX_EVAL_EVERY)`` for ``S`` steps per epoch.

    >>> default_eval_every(978), default_eval_every(4)
    (98, 1)
    """
    return max(1, min(math.ceil(steps_per_epoch / VALIDATIONS_PER_EPOCH), MAX_EVAL_EVERY))


# Training records (metrics.jsonl, -v lines) every at most this many steps; a run whose
# length is known gets at least RECORDS_PER_RUN records (a 200-step run: every 4 steps),
# one of unknown length at least RECORDS_PER_EPOCH per epoch.
MAX_LOG_EVERY = 50
RECORDS_PER_RUN = 50
RECORDS_PER_EPOCH = 20


def default_log_every(total_steps: int | None, steps_per_epoch: int) -> int:
    """Steps between training records when ``log_every`` is not given: for a run of known
    length ``N`` (a step or epoch budget) ``clamp(⌊N / 50⌋, 1, 50)`` — every step up to 99
    steps, at least 50 records up to 2,500 steps, every 50 steps beyond; for a run of
    unknown length (a time budget, or until validation stops improving) ``clamp(⌈S / 20⌉,
    1, 50)`` for ``S`` steps per epoch — at least 20 records per epoch (such a run lasts at
    least its patience, of an epoch or more, so it too gets ~20 points or more).

    >>> default_log_every(6, 10), default_log_every(200, 10), default_log_every(5000, 10)
    (1, 4, 50)
    >>> default_log_every(None, 978), default_log_every(None, 4)
    (49, 1)
    """
    if total_steps is not None:
        return max(1, min(total_steps // RECORDS_PER_RUN, MAX_LOG_EVERY))
    return max(1, min(math.ceil(steps_per_epoch / RECORDS_PER_EPOCH), MAX_LOG_EVERY))


def default_patience(steps_per_epoch: int, eval_every: int) -> int:
    """Validations without improvement before training with no budget stops: those of
    two epochs, at least 10 validations and at least 100 steps — generous, because an
    LSTM's validation loss can stall for a while (on a plateau) before it falls again.

    >>> default_patience(978, 98), default_patience(4, 1)
    (20, 100)
    """
    per_epoch = math.ceil(steps_per_epoch / eval_every)
    return max(2 * per_epoch, 10, math.ceil(100 / eval_every))


def describe_event(event: dict[str, Any], total_steps: int | None = None) -> str:
    """One event of ``metrics.jsonl`` as a line for people (what ``-v`` prints).

    >>> describe_event({"event": "train", "step": 50, "epoch": 1, "loss_nats": 1.23456,
    ...                 "lr": 0.002, "grad_norm": 0.5, "tokens_per_s": 40960.0}, 200)
    'step 50/200 (epoch 1): loss 1.2346 nats, lr 0.002, grad norm 0.5, 40,960 tokens/s'
    >>> describe_event({"event": "valid", "step": 50, "epoch": 1, "loss_nats": 1.1,
    ...                 "accuracy": 0.75, "best": True, "lr": 0.002})
    'validation at step 50: loss_nats 1.1, accuracy 0.75 (best so far)'
    """
    kind, step = event.get("event"), event.get("step")
    if kind == "train":
        of = f"/{total_steps}" if total_steps is not None else ""
        parts = [f"loss {event['loss_nats']:.4f} nats"]
        for key, label, form in (
            ("lr", "lr", ".3g"),
            ("grad_norm", "grad norm", ".3g"),
            ("loss_scale", "loss scale", "g"),
        ):
            if isinstance(event.get(key), (int, float)):
                parts.append(f"{label} {event[key]:{form}}")
        if isinstance(event.get("tokens_per_s"), (int, float)):
            parts.append(f"{event['tokens_per_s']:,.0f} tokens/s")
        return f"step {step}{of} (epoch {event.get('epoch')}): " + ", ".join(parts)
    if kind == "valid":
        shown = [
            f"{key} {value:.4g}"
            for key, value in event.items()
            if key not in ("event", "step", "epoch", "best", "lr", "tokens")
            and isinstance(value, (int, float))
            and not isinstance(value, bool)
        ]
        best = " (best so far)" if event.get("best") else ""
        return f"validation at step {step}: " + ", ".join(shown) + best
    detail = f": {event['reason']}" if isinstance(event.get("reason"), str) else ""
    return f"{kind} at step {step}{detail}"


def autocast_setup(
    precision: str, device: torch.device
) -> tuple[torch.dtype | None, torch.amp.GradScaler | None]:
    """``(autocast dtype or None, GradScaler or None)`` for ``precision`` on ``device``.

    fp32: no autocast. bf16: autocast, no scaler (bfloat16 has float32's exponent range).
    fp16: autocast and a ``GradScaler`` for the device. A precision the device's autocast
    does not support is a ``ConfigError`` naming ``--precision``.

    >>> autocast_setup("bf16", torch.device("cpu"))
    (torch.bfloat16, None)
    """
    if precision not in _AMP_DTYPES:
        raise ConfigError(f"--precision must be one of {', '.join(_AMP_DTYPES)}, got {precision!r}")
    dtype = _AMP_DTYPES[precision]
    if dtype is None:
        return None, None
    kind = device.type
    unsupported = ConfigError(
        f"--precision {precision}: torch {torch.__version__} has no {precision} autocast on "
        f"{kind} (use --precision fp32)"
    )
    if not torch.amp.is_autocast_available(kind):
        raise unsupported
    if kind == "cuda" and dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        raise ConfigError("--precision bf16: this GPU has no bfloat16 (use --precision fp16)")
    # torch says "not supported" by a warning and runs without autocast: make that an error.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.autocast(kind, dtype=dtype):
            enabled = torch.is_autocast_enabled(kind)
    if caught or not enabled:
        raise unsupported
    scaler = torch.amp.GradScaler(kind) if dtype == torch.float16 else None
    return dtype, scaler


class TrainingDiverged(RnnkitError):
    """A NaN or infinite loss/gradient; the last good checkpoint is left intact."""


class TrainingInterrupted(RnnkitError):
    """SIGINT or SIGTERM arrived: the step in flight was finished and saved."""

    exit_code = 130


@contextlib.contextmanager
def _stop_on_signals(flag: list[int]):
    """Turn SIGINT/SIGTERM into a request to stop after the current step (``flag``).

    A second signal while the first is pending stops at once (KeyboardInterrupt). Only
    the main thread can own signal handlers; elsewhere nothing is installed.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        if flag:
            raise KeyboardInterrupt
        flag.append(signum)

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@dataclass
class TrainOptions:
    """How long and how to train.

    Attributes:
        epochs: passes over the training data (ignored when ``steps`` is set). None with
            ``steps`` and ``max_time`` None too: train until validation stops improving
            (see the module docstring); None with ``max_time``: until the time is up.
        steps: total optimizer steps, or None to run ``epochs``.
        max_time: stop after this many seconds of training (validate and save first).
        clip_norm: global gradient-norm threshold κ (``g ← κ g / ‖g‖`` if ``‖g‖ > κ``).
        clip_value: clip each gradient entry to ``[−v, v]`` (a separate, named option).
        eval_every: validate every N steps (None: at the end of every epoch, or
            :func:`default_eval_every` when training until validation stops improving).
        patience: stop after this many validations without improvement (None: never, or
            :func:`default_patience` when training until validation stops improving).
        log_every: write a training record to the metrics log (and, with ``-v``, a line to
            stderr) every N steps, and at the last step (None: :func:`default_log_every`).
        tensorboard: also write the records as TensorBoard scalars into this directory
            (``rnnkit.training.tensorboard``; needs the ``tensorboard`` package).
        on_nonfinite: ``"stop"`` (default) or ``"skip"`` the step.
        precision: ``"fp32"`` (default), ``"bf16"`` or ``"fp16"``: forward and loss under
            ``torch.autocast`` in that dtype (fp16 with a ``GradScaler``); see the module
            docstring.
        threads: CPU threads for the run (None: ``RNNKIT_THREADS``, else chosen from the
            CPUs free now and re-checked every few seconds: ``rnnkit.threads``); torch's
            previous count is restored when ``fit`` returns.
        rows: batch rows, which bound the thread count (each thread gets >= 8 rows).
        quiet: no progress bar.
        units: what the progress bar shows besides nats: ``"bits"`` or ``"ppl"``.
        lr_schedule: ``"constant"``, ``"plateau"``, ``"step:E:F"`` or ``"cosine"``
            (``rnnkit.training.schedules``), built here; None: the ``scheduler`` and
            ``plateau`` given to the ``Trainer``, if any.
        warmup: steps of linear learning-rate warm-up (with ``lr_schedule``).
        lr_decay: the ``plateau`` schedule's factor.
        init_range: re-initialise every parameter uniformly in ``[−R, R]`` (None: keep
            the model's own initialisation).
        restore_best: at the end of ``fit()``, load the best-on-validation weights into
            the model (those of ``model.safetensors``).
    """

    epochs: int | None = 1
    steps: int | None = None
    max_time: float | None = None
    clip_norm: float | None = None
    clip_value: float | None = None
    eval_every: int | None = None
    patience: int | None = None
    log_every: int | None = None
    tensorboard: str | None = None
    on_nonfinite: str = "stop"
    precision: str = "fp32"
    threads: int | None = None
    rows: int | None = None
    quiet: bool = False
    units: str = "ppl"
    lr_schedule: str | None = None
    warmup: int = 0
    lr_decay: float = 0.5
    init_range: float | None = None
    restore_best: bool = True


@dataclass
class TrainResult:
    steps: int
    epochs_done: int
    train_loss_nats: float | None
    best_valid: dict[str, Any] | None
    history: list[dict[str, Any]] = field(default_factory=list)  # last HISTORY_EVENTS
    stopped_early: bool = False
    clipped_steps: int = 0
    tokens: int = 0  # target tokens trained on in this call of fit()
    train_seconds: float = 0.0  # wall time of those steps, validation excluded
    threads: str = ""  # one line: the CPU threads used and why (rnnkit.threads)
    stopped: str = ""  # why training ended, one line ("no improvement for 20 validations")


def _detach(state: Any) -> Any:
    if state is None:
        return None
    if isinstance(state, LSTMState):
        return LSTMState(state.h.detach(), state.c.detach())
    if isinstance(state, Tensor):
        return state.detach()
    return type(state)(*(_detach(s) for s in state))


def _carry_tensors(carry: Any) -> dict[str, Tensor]:
    if carry is None:
        return {}
    if isinstance(carry, LSTMState):
        return {"carry/h": carry.h, "carry/c": carry.c}
    return {"carry/state": carry}


def _carry_from(tensors: dict[str, Tensor], device: torch.device) -> Any:
    if "carry/h" in tensors:
        return LSTMState(tensors["carry/h"].to(device), tensors["carry/c"].to(device))
    if "carry/state" in tensors:
        return tensors["carry/state"].to(device)
    return None


class Trainer:
    """Train ``model`` on ``batches`` with ``step_fn``; see the module docstring.

    Args:
        model: the ``nn.Module`` (its ``train()``/``eval()`` mode is managed here).
        optimizer: a torch optimizer over the model's parameters.
        batches: a resumable batcher (``__iter__`` yields one epoch, ``__len__``,
            ``state_dict``/``load_state_dict``, ``epoch``), e.g. ``StreamBatcher``.
        step_fn: ``(model, batch, carry) -> LossOutput``.
        evaluate_fn: ``model -> {"loss_nats": …, …}`` on validation data, or None.
        scheduler: a per-step LR scheduler (``step()`` after each optimizer step).
        plateau: a ``ReduceLROnPlateau`` stepped with each validation loss.
        out_dir: run directory for snapshots, best weights and ``metrics.jsonl``.
        callbacks: called as ``cb(event: dict)`` for every logged event.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        batches: Any,
        step_fn: Callable[[nn.Module, Any, Any], LossOutput],
        options: TrainOptions,
        evaluate_fn: Callable[[nn.Module], dict[str, Any]] | None = None,
        scheduler: Any = None,
        plateau: torch.optim.lr_scheduler.ReduceLROnPlateau | None = None,
        out_dir: str | Path | None = None,
        callbacks: list[Callable[[dict[str, Any]], None]] | None = None,
        grad_hook: Callable[[nn.Module, float, bool], None] | None = None,
        dist_ctx: DistContext | None = None,
    ) -> None:
        if options.on_nonfinite not in ("stop", "skip"):
            raise ValueError(f"on_nonfinite must be 'stop' or 'skip', got {options.on_nonfinite!r}")
        self.model = model
        self.optimizer = optimizer
        self.dist = dist_ctx or DistContext()
        self.batches = ShardedBatches(batches, self.dist) if self.dist.enabled else batches
        self.step_fn = step_fn
        self.ddp: nn.Module | None = None
        if self.dist.enabled:
            from torch.nn.parallel import DistributedDataParallel

            self.ddp = DistributedDataParallel(StepModule(model, step_fn))
        self.options = options
        self.evaluate_fn = evaluate_fn
        self._resolve_budget(len(self.batches))
        if options.init_range is not None:
            if not options.init_range > 0:
                raise ConfigError(f"--init-range must be > 0, got {options.init_range}")
            for p in model.parameters():
                nn.init.uniform_(p, -options.init_range, options.init_range)
        if options.lr_schedule is not None:
            if scheduler is not None or plateau is not None:
                raise ValueError("pass either options.lr_schedule or scheduler/plateau, not both")
            known = options.steps is not None or options.epochs is not None
            per_epoch = math.ceil(len(self.batches) / self.eval_every) if self.eval_every else 1
            scheduler, plateau = build_lr_schedulers(
                optimizer,
                parse_lr_schedule(options.lr_schedule),
                steps_per_epoch=len(self.batches),
                total_steps=self.total_steps if known else None,
                warmup=options.warmup,
                decay=options.lr_decay,
                # decay when a whole epoch's validations bring no improvement
                plateau_patience=per_epoch - 1,
            )
        self.scheduler = scheduler
        self.plateau = plateau
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.callbacks = callbacks or []
        self.grad_hook = grad_hook
        self.step = 0
        self.carry: Any = None
        self.best: dict[str, Any] | None = None
        self._best_weights: dict[str, Tensor] | None = None  # in memory, since this fit()
        self.bad_evals = 0
        # The most recent events only: a run of millions of steps must not grow memory
        # per step (the soak test); metrics.jsonl keeps every event.
        self.history: deque[dict[str, Any]] = deque(maxlen=HISTORY_EVENTS)
        self.clipped = 0
        self._window_nats = 0.0
        self._window_tokens = 0
        self._device = next(model.parameters()).device
        self._amp_dtype, self.scaler = autocast_setup(options.precision, self._device)
        self.scaler_skips = 0  # steps the GradScaler skipped (float16 overflow)
        self._scaler_streak = 0  # ... of them in a row, up to now
        self._skip_streak = 0  # non-finite steps skipped in a row (on_nonfinite="skip")
        self._csv_written = time.perf_counter()  # metrics.csv: at most every CSV_EVERY_S
        self._tensorboard: Any = None  # a TensorBoardWriter while fit() runs, if asked

    def _resolve_budget(self, steps_per_epoch: int) -> None:
        """``total_steps`` (None: unbounded), ``max_time``, ``eval_every``, ``patience``
        and ``until_converged`` from the options and the data's size."""
        opts = self.options
        self.until_converged = opts.steps is None and opts.epochs is None and opts.max_time is None
        self.eval_every = opts.eval_every
        self.patience = opts.patience
        self.max_time = opts.max_time
        if opts.steps is not None:
            self.total_steps: int | None = opts.steps
        elif opts.epochs is not None:
            self.total_steps = opts.epochs * steps_per_epoch
        elif self.until_converged:
            self.total_steps = max(CAP_EPOCHS * steps_per_epoch, CAP_MIN_STEPS)
            self.max_time = CAP_SECONDS
            if self.eval_every is None:
                self.eval_every = default_eval_every(steps_per_epoch)
            if self.patience is None and self.evaluate_fn is not None:
                self.patience = default_patience(steps_per_epoch, self.eval_every)
        else:
            self.total_steps = None  # a time budget only
        known = opts.steps is not None or opts.epochs is not None
        log_every = opts.log_every
        if log_every is None:
            log_every = default_log_every(self.total_steps if known else None, steps_per_epoch)
        elif isinstance(log_every, bool) or log_every < 1:
            raise ConfigError(f"--log-every must be an integer ≥ 1, got {log_every!r}")
        self.log_every: int = log_every

    def _cap_text(self) -> str:
        assert self.total_steps is not None
        epochs = self.total_steps / max(len(self.batches), 1)
        return f"{epochs:g} epochs ({self.total_steps:,} steps) or {CAP_SECONDS:.0f} s"

    # -- bookkeeping -------------------------------------------------------------------
    def _log(self, event: dict[str, Any]) -> None:
        self.history.append(event)
        if not self.dist.is_main:
            return  # only rank 0 writes logs
        if self.out_dir is not None:
            append_jsonl(self.out_dir / "metrics.jsonl", event)
        if messages.LOGGER.isEnabledFor(logging.DEBUG):  # -v: the record as one line
            messages.debug(describe_event(event, self.total_steps))
        if self._tensorboard is not None:
            self._tensorboard(event)
        for cb in self.callbacks:
            cb(event)

    def _state(self) -> dict[str, Any]:
        return {
            "batches": self.batches.state_dict(),
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "plateau": self.plateau.state_dict() if self.plateau is not None else None,
            "best": self.best,
            "bad_evals": self.bad_evals,
            "clipped": self.clipped,
            "precision": self.options.precision,
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "scaler_skips": self.scaler_skips,
            "scaler_streak": self._scaler_streak,
        }

    def save(self) -> None:
        """Write a resumable snapshot of the current step (rank 0 writes; with several
        processes every rank must call this: the carried state is gathered first)."""
        if self.out_dir is None:
            return
        carry = _carry_tensors(self.carry)
        if self.dist.enabled:  # the snapshot holds the GLOBAL batch's carried state
            carry = {k: self.dist.gather_rows(v, dim=2) for k, v in carry.items()}
        if not self.dist.is_main:
            return
        extra = {"rng/torch": torch.get_rng_state(), **carry}
        save_snapshot(self.out_dir, self.step, self.model, self.optimizer, self._state(), extra)
        if self.evaluate_fn is None:  # no validation: the latest weights are the ones to use
            save_model_weights(self.model, self.out_dir / "model.safetensors")
        if time.perf_counter() - self._csv_written >= CSV_EVERY_S:
            self._write_csv()

    def _write_csv(self) -> None:
        """``metrics.csv`` from ``metrics.jsonl`` (rank 0, with a run directory)."""
        if self.out_dir is None or not self.dist.is_main:
            return
        try:
            write_metrics_csv(self.out_dir)
        except CheckpointError as exc:  # an oversized log: the table is a convenience
            messages.warning(f"metrics.csv not written: {exc}")
        self._csv_written = time.perf_counter()

    def _close_tensorboard(self) -> None:
        self._tensorboard.close()
        self._tensorboard = None

    def _csv_on_exit(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        if exc_type is None:
            self._write_csv()
        else:  # the error that ends training is the one to report, not a failed table
            with contextlib.suppress(Exception):
                self._write_csv()
        return False

    def resume(self) -> None:
        """Restore model, optimizer, scheduler, RNG, data position and carried state."""
        if self.out_dir is None:
            raise RnnkitError("resume needs an output directory")
        state, extra = load_snapshot(self.out_dir, self.model, self.optimizer)
        try:
            self._restore(state, extra)
        except RnnkitError as exc:
            if str(self.out_dir) in str(exc):
                raise
            raise CheckpointError(f"{self.out_dir}: the snapshot's state: {exc}") from None
        except (KeyError, TypeError, ValueError, IndexError, AttributeError, RuntimeError) as exc:
            # A state.json whose checksums match but whose content was forged: one line.
            detail = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ""
            raise CheckpointError(
                f"{self.out_dir}: the snapshot's state.json does not fit this run "
                f"({type(exc).__name__}: {detail})"
            ) from None

    def _restore(self, state: dict[str, Any], extra: dict[str, Tensor]) -> None:
        saved_precision = state.get("precision", "fp32")  # snapshots before --precision
        if saved_precision != self.options.precision:
            raise CheckpointError(
                f"{self.out_dir}: the snapshot was trained with --precision {saved_precision}, "
                f"not {self.options.precision}"
            )
        self.step = int(state["step"])
        self.batches.load_state_dict(state["batches"])
        if self.scheduler is not None and state.get("scheduler") is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        if self.plateau is not None and state.get("plateau") is not None:
            self.plateau.load_state_dict(state["plateau"])
        self.best = state.get("best")
        self.bad_evals = int(state.get("bad_evals", 0))
        self.clipped = int(state.get("clipped", 0))
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.scaler_skips = int(state.get("scaler_skips", 0))
        self._scaler_streak = int(state.get("scaler_streak", 0))
        if "rng/torch" in extra:
            torch.set_rng_state(extra["rng/torch"])
        if self.dist.enabled:  # this process's rows of the global carried state
            extra = {
                k: v if not k.startswith("carry/") else self.dist.rows(v, dim=2)
                for k, v in extra.items()
            }
        self.carry = _carry_from(extra, self._device)

    # -- the loop ----------------------------------------------------------------------
    def _batches(self) -> Iterator[Any]:
        while True:
            yield from self.batches

    def _evaluate(self) -> bool:
        """Validate, keep the best weights; return True when training should stop."""
        if self.evaluate_fn is None:
            return False
        self.model.eval()
        metrics = self.evaluate_fn(self.model)
        self.model.train()
        loss = float(metrics["loss_nats"])
        event = {"event": "valid", "step": self.step, "epoch": self.batches.epoch, **metrics}
        improved = self.best is None or loss < float(self.best["loss_nats"])
        if improved:
            self.best = {"step": self.step, **metrics}
            self.bad_evals = 0
            if self.options.restore_best:
                self._best_weights = {
                    k: v.detach().clone() for k, v in self.model.state_dict().items()
                }
            if self.out_dir is not None and self.dist.is_main:
                save_model_weights(self.model, self.out_dir / "model.safetensors")
        else:
            self.bad_evals += 1
        event["best"] = improved
        event["lr"] = self.optimizer.param_groups[0]["lr"]
        self._log(event)
        if self.plateau is not None:
            self.plateau.step(loss)
        return self.patience is not None and self.bad_evals >= self.patience

    def _restore_best(self) -> None:
        """Load the best-on-validation weights into the model (if not the current ones):
        from memory when found during this ``fit()``, else from ``model.safetensors``."""
        if self.best is None or int(self.best["step"]) == self.step:
            return
        if self._best_weights is not None:
            self.model.load_state_dict(self._best_weights)
        elif self.out_dir is not None and (self.out_dir / "model.safetensors").is_file():
            load_model_weights(self.model, self.out_dir / "model.safetensors")

    def _check_finite(self, value: float, what: str, batch_index: int) -> bool:
        if math.isfinite(value):
            return True
        message = (
            f"{what} is {value} at step {self.step + 1} (batch {batch_index} of epoch "
            f"{self.batches.epoch}); the last good checkpoint is kept"
        )
        if self.options.on_nonfinite == "skip":
            self._log({"event": "skipped", "step": self.step + 1, "reason": message})
            self.optimizer.zero_grad(set_to_none=True)
            self._skip_streak += 1
            if self._skip_streak < MAX_SKIPPED_STEPS:
                return False
            message = f"{self._skip_streak} steps in a row were skipped; the last: {message}"
        raise TrainingDiverged(message + " (lower --lr or set --clip-norm)")

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self._amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self._device.type, dtype=self._amp_dtype)

    def _scaler_skipped(self, params: Sequence[Tensor], batch_index: int) -> bool:
        """fp16 only: if the unscaled gradients hold inf/NaN, let the GradScaler skip the
        step and lower its scale (its own overflow handling, not a divergence) and return
        True; ``MAX_SCALER_SKIPS`` such steps in a row are a ``TrainingDiverged``."""
        assert self.scaler is not None
        grads = [p.grad for p in params if p.grad is not None]
        peak = torch.nn.utils.get_total_norm(grads, norm_type=math.inf) if grads else None
        if peak is None or bool(torch.isfinite(peak)):
            self._scaler_streak = 0
            return False
        self.scaler.step(self.optimizer)  # sees the recorded inf: no optimizer step
        self.scaler.update()  # scale ← scale · backoff
        self.scaler_skips += 1
        self._scaler_streak += 1
        scale = self.scaler.get_scale()
        self._log(
            {"event": "scaler_skip", "step": self.step + 1, "batch": batch_index, "scale": scale}
        )
        if self._scaler_streak >= MAX_SCALER_SKIPS:
            raise TrainingDiverged(
                f"the gradients overflowed float16 {self._scaler_streak} steps in a row, up to "
                f"step {self.step + 1} (batch {batch_index} of epoch {self.batches.epoch}; "
                f"loss scale now {scale:g}); the last good checkpoint is kept (lower --lr, "
                "set --clip-norm or use --precision bf16)"
            )
        return True

    def fit(self) -> TrainResult:
        """Train until ``steps`` (or ``epochs``) are done or early stopping triggers."""
        opts = self.options
        total = self.total_steps
        self.model.train()
        bar = Progress(
            total_steps=None if self.until_converged else total,
            max_time=None if self.until_converged else self.max_time,
            initial=self.step,
            disable=opts.quiet or not self.dist.is_main,
        )
        steps_per_epoch = len(self.batches)
        stopped_early = False
        stopped = ""
        started = time.perf_counter()
        window_start, window_tokens_start = started, 0
        tokens_seen = 0
        eval_seconds = 0.0
        last_train_loss = None
        stop_signal: list[int] = []
        governor = None
        if self._device.type == "cpu":
            try:
                governor = ThreadGovernor(opts.threads, rows=opts.rows)
            except ValueError as exc:  # a bad RNNKIT_THREADS / --threads: one line
                raise ConfigError(str(exc)) from None
        with contextlib.ExitStack() as stack:
            # Last out: metrics.csv holds every event, however fit() ends.
            stack.push(self._csv_on_exit)
            stack.enter_context(_stop_on_signals(stop_signal))
            stack.callback(bar.close)
            if opts.tensorboard is not None and self.dist.is_main:
                from rnnkit.training.tensorboard import TensorBoardWriter

                self._tensorboard = TensorBoardWriter(opts.tensorboard)
                stack.callback(self._close_tensorboard)
            if governor is not None:
                governor.start()
                stack.callback(governor.stop)
            it = self._batches()
            while total is None or self.step < total:
                batch = next(it)
                batch_index = self.batches.position
                if governor is not None:
                    governor.tick()
                self.optimizer.zero_grad(set_to_none=True)
                with self._autocast():  # forward and loss only (torch's AMP recipe)
                    if self.ddp is not None:
                        out = self.ddp(batch, self.carry)
                    else:
                        out = self.step_fn(self.model, batch, self.carry)
                loss = out.loss
                # Global figures (sums over processes): every rank sees the same values,
                # so every rank takes the same decision (stop, skip) and none deadlocks.
                nats, tokens, stopping, loss_sum = self.dist.all_sum(
                    out.nats, out.tokens, float(bool(stop_signal)), float(loss.detach())
                )
                if not self._check_finite(loss_sum + nats, "the training loss", batch_index):
                    self.carry = None
                    continue
                if self.dist.enabled:
                    # DDP averages gradients over W processes: weigh each process's token
                    # mean by its share of the global tokens -> gradient of the global mean.
                    loss = loss * (out.tokens * self.dist.world_size / max(tokens, 1))
                params = [p for p in self.model.parameters() if p.requires_grad]
                if self.scaler is not None:
                    self.scaler.scale(loss).backward()
                    # Clipping, the finite check and the hook see the true gradients.
                    self.scaler.unscale_(self.optimizer)
                    if self._scaler_skipped(params, batch_index):
                        self.carry = _detach(out.state)  # the forward was fine: carry on
                        continue
                else:
                    loss.backward()
                params = [p for p in params if p.grad is not None]
                if opts.clip_value is not None:
                    torch.nn.utils.clip_grad_value_(params, opts.clip_value)
                max_norm = opts.clip_norm if opts.clip_norm is not None else float("inf")
                grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
                if not self._check_finite(grad_norm, "the gradient norm", batch_index):
                    self.carry = None
                    continue
                clipped = opts.clip_norm is not None and grad_norm > opts.clip_norm
                self.clipped += int(clipped)
                if self.grad_hook is not None:
                    self.grad_hook(self.model, grad_norm, clipped)
                lr = self.optimizer.param_groups[0]["lr"]  # the rate of this step
                if self.scaler is not None:
                    self.scaler.step(self.optimizer)
                    self.scaler.update()
                else:
                    self.optimizer.step()
                if self.scheduler is not None:
                    self.scheduler.step()
                self.step += 1
                self._skip_streak = 0
                self.carry = _detach(out.state)
                self._window_nats += nats
                self._window_tokens += int(tokens)
                tokens_seen += int(tokens)
                last_train_loss = self._window_nats / max(self._window_tokens, 1)
                if not opts.quiet:
                    now = time.perf_counter()
                    rate = (tokens_seen - window_tokens_start) / max(now - window_start, 1e-9)
                    shown = (
                        {"bits": f"{last_train_loss / math.log(2):.3f}"}
                        if opts.units == "bits"
                        else {"ppl": f"{math.exp(min(last_train_loss, 50)):.2f}"}
                    )
                    waiting = (
                        {"no_gain": f"{self.bad_evals}/{self.patience}"}
                        if self.until_converged and self.patience is not None
                        else {}
                    )
                    bar.update(
                        self.step,
                        loss=f"{last_train_loss:.3f}",
                        **shown,
                        lr=f"{lr:.3g}",
                        tok_s=f"{rate:.0f}",
                        **waiting,
                    )
                if self.step % self.log_every == 0 or self.step == total:
                    now = time.perf_counter()
                    self._log(
                        {
                            "event": "train",
                            "step": self.step,
                            "epoch": self.batches.epoch,
                            "loss_nats": last_train_loss,
                            "grad_norm": grad_norm,
                            "clipped_total": self.clipped,
                            "lr": lr,
                            **(
                                {"loss_scale": self.scaler.get_scale()}
                                if self.scaler is not None
                                else {}
                            ),
                            "tokens_per_s": (tokens_seen - window_tokens_start)
                            / max(now - window_start, 1e-9),
                        }
                    )
                    self._window_nats, self._window_tokens = 0.0, 0
                    window_start, window_tokens_start = now, tokens_seen
                end_of_epoch = self.batches.position == steps_per_epoch
                out_of_time = (
                    self.max_time is not None and time.perf_counter() - started >= self.max_time
                )
                scheduled = self.step % self.eval_every == 0 if self.eval_every else end_of_epoch
                final = self.step == total or out_of_time
                if end_of_epoch:
                    self.carry = None  # streams restart at the beginning
                if scheduled or final:
                    eval_started = time.perf_counter()
                    if scheduled:
                        stop = self._evaluate()
                        self.save()
                    else:
                        # A validation only because this call of fit() ends here must not
                        # change what a resumed run continues from (plateau, patience), so
                        # the snapshot is taken first: N + resume + M steps = N + M steps.
                        self.save()
                        stop = self._evaluate()
                    eval_seconds += time.perf_counter() - eval_started
                    if stop:
                        stopped_early = True
                        assert self.best is not None
                        stopped = (
                            f"no improvement for {self.bad_evals} validations "
                            f"(best at step {self.best['step']})"
                        )
                        self._log({"event": "early_stop", "step": self.step})
                        break
                if out_of_time:
                    stopped = (
                        f"cap reached: {self.max_time:.0f} s of training"
                        if self.until_converged
                        else f"time budget of {self.max_time:g} s reached"
                    )
                    self._log({"event": "time_limit", "step": self.step})
                    break
                if stopping:  # a signal reached some process: all save and stop together
                    if not (scheduled or final):
                        self.save()
                    self._log({"event": "interrupted", "step": self.step})
                    name = signal.Signals(stop_signal[0]).name if stop_signal else "a signal"
                    raise TrainingInterrupted(
                        f"stopped by {name} after step {self.step}; the checkpoint is saved "
                        "(continue with --resume)"
                    )
        if not stopped:
            if self.until_converged:
                stopped = f"cap reached: {self._cap_text()}"
            elif opts.steps is not None:
                stopped = f"{self.step:,} steps done"
            else:
                stopped = f"{opts.epochs} epochs done ({self.step:,} steps)"
        if opts.restore_best:
            self._restore_best()
        return TrainResult(
            steps=self.step,
            epochs_done=self.batches.epoch,
            train_loss_nats=last_train_loss,
            best_valid=self.best,
            history=list(self.history),
            stopped_early=stopped_early,
            clipped_steps=self.clipped,
            tokens=tokens_seen,
            train_seconds=time.perf_counter() - started - eval_seconds,
            threads=governor.note if governor is not None else "",
            stopped=stopped,
        )
