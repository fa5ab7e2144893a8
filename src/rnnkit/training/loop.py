"""The model-agnostic training loop: one step after another, validation, stopping.

A task supplies a ``step_fn(model, batch, carry) -> LossOutput`` (loss to backpropagate,
summed nats, token count, and the recurrent state to carry into the next batch — for
stream batching) and an ``evaluate_fn(model) -> dict`` with at least ``loss_nats``. The
loop owns everything else, so every task trains the same way (minGPT's trainer):

* segment truncation: the carried state's VALUE crosses into the next batch, its gradient
  does not (detached here);
* clipping by global norm (``torch.nn.utils.clip_grad_norm_``) or by value;
* a non-finite loss or gradient stops training (or skips the step, if asked) naming the
  step, as does a finite cross-entropy (``counts`` not ``"values"``) risen
  ``DIVERGED_RISE`` times, and no snapshot is ever written after a bad step
  (:mod:`rnnkit.training.nonfinite`);
* validation every epoch or every N steps, best-on-validation weights in
  ``model.safetensors`` (and, at the end, in the model itself), early stopping (after
  ``patience`` validations without a gain of ``min_gain``:
  :func:`~rnnkit.training.budget.gained`), learning-rate schedules
  (``rnnkit.training.schedules``), ``init_range`` initialisation;
* with no budget (``epochs`` and ``steps`` and ``max_time`` all None), training runs until
  validation stops improving, up to a cap (:mod:`rnnkit.training.budget`);
* resumable snapshots (optimizer, scheduler, RNG, data position, carried state) at the
  first validation, each new best, the end, and otherwise at most every
  ``snapshot_every`` seconds, so N steps + resume + M steps equals N + M steps, whichever
  snapshot the resume starts from (:mod:`rnnkit.training.snapshots`);
* every event into ``metrics.jsonl`` and ``metrics.csv`` (:mod:`rnnkit.training.run_log`);
* SIGINT or SIGTERM finish the step in flight and save it
  (:mod:`rnnkit.training.interrupt`);
* mixed precision (``precision="bf16"`` / ``"fp16"``, :mod:`rnnkit.training.precision`):
  forward and loss under ``torch.autocast``; with float16 a ``torch.amp.GradScaler``: the
  loss is scaled before the backward, the gradients unscaled before clipping, and a step
  whose gradients overflowed is skipped by the scaler (its scale halves) — that is not a
  divergence, unless it happens ``MAX_SCALER_SKIPS`` times in a row. Validation runs in
  float32. The scaler's state is part of the snapshot.
"""

from __future__ import annotations

import contextlib
import math
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, NamedTuple, TypeVar

import torch
from torch import Tensor, nn

from rnnkit.data.batch_resume import IterableBatches, resumable_batches
from rnnkit.deferred import Deferred, deferring
from rnnkit.errors import ConfigError, RunFinished
from rnnkit.models.language_model import LossOutput
from rnnkit.threads import ThreadGovernor
from rnnkit.training.budget import cap_text, gained, resolve_budget
from rnnkit.training.checkpoint import load_model_weights, save_model_weights
from rnnkit.training.distributed import (
    DistContext,
    ShardedBatches,
    StepModule,
    launched_processes,
)
from rnnkit.training.interrupt import TrainingInterrupted, stop_on_signals
from rnnkit.training.nonfinite import NonFiniteGuard, TrainingDiverged, update_overflow
from rnnkit.training.options import TrainOptions, TrainResult, given
from rnnkit.training.precision import autocast, autocast_setup
from rnnkit.training.progress import Progress, postfix
from rnnkit.training.run_log import RunLog
from rnnkit.training.schedules import build_lr_schedulers, parse_lr_schedule
from rnnkit.training.snapshots import resume_trainer, save_trainer
from rnnkit.types import LSTMState

__all__ = ["TrainOptions", "TrainResult", "Trainer"]


def _detach(state: Any) -> Any:
    if state is None:
        return None
    if isinstance(state, LSTMState):
        return LSTMState(state.h.detach(), state.c.detach())
    if isinstance(state, Tensor):
        return state.detach()
    return type(state)(*(_detach(s) for s in state))


class _Taken(NamedTuple):
    """One optimizer step that was taken: its global figures (sums over processes)."""

    nats: float
    tokens: int
    grad_norm: float
    lr: float  # the learning rate of this step
    stopping: bool  # a signal reached some process: all stop after this step
    # Some process's time budget ran out (agreed in the step's own reduction, so that all
    # stop after the same step); None: one process, which reads its clock after the step.
    time_up: bool | None = None


@dataclass
class _Pace:
    """The clock and the token counts of one ``fit()`` call."""

    started: float = field(default_factory=time.perf_counter)
    window_start: float = 0.0  # since the last training record: the rate shown
    window_tokens_start: int = 0
    window_eval_start: float = 0.0  # eval_seconds at the window's start
    tokens_seen: int = 0
    eval_seconds: float = 0.0  # validations and snapshots: not training time
    last_train_loss: float | None = None

    def __post_init__(self) -> None:
        self.window_start = self.started

    def rate(self, now: float) -> float:
        """Tokens per second of training since the last training record: the time of the
        validations and snapshots in between left out, as the run's own rate leaves it
        (a small data set validated every few steps showed a third of its speed)."""
        seconds = now - self.window_start - (self.eval_seconds - self.window_eval_start)
        return (self.tokens_seen - self.window_tokens_start) / max(seconds, 1e-9)

    def new_window(self, now: float) -> None:
        """Start the next training record's window at ``now``."""
        self.window_start, self.window_tokens_start = now, self.tokens_seen
        self.window_eval_start = self.eval_seconds


# The model being trained: what step_fn and evaluate_fn receive.
_M = TypeVar("_M", bound=nn.Module)


class Trainer(Generic[_M]):
    """Train ``model`` on ``batches`` with ``step_fn``; see the module docstring.

    Args:
        model: the ``nn.Module`` (its ``train()``/``eval()`` mode is managed here).
        optimizer: a torch optimizer over the model's parameters.
        batches: the batches of an epoch: a resumable batcher (``__iter__`` yields one
            epoch, ``__len__``, ``epoch``, ``position`` (the batches of this epoch handed
            out), ``state_dict``/``load_state_dict``), e.g. ``StreamBatcher``; or any
            re-iterable with a length (a ``DataLoader``, a list of batches), which is
            wrapped in :class:`~rnnkit.data.batch_resume.IterableBatches`.
        step_fn: ``(model, batch, carry) -> LossOutput``.
        evaluate_fn: ``model -> {"loss_nats": …, …}`` on validation data, or None.
        scheduler: a per-step LR scheduler (``step()`` after each optimizer step).
        plateau: a ``ReduceLROnPlateau`` stepped with each validation loss.
        out_dir: run directory for snapshots, best weights and ``metrics.jsonl``.
        callbacks: called as ``cb(event: dict)`` for every logged event.
        dist_ctx: the process group this process trains in
            (:func:`~rnnkit.training.distributed.init_distributed`); required under
            ``torchrun`` with several processes (``DistContext()``: this process alone).
    """

    def __init__(
        self,
        model: _M,
        optimizer: torch.optim.Optimizer,
        batches: Any,
        step_fn: Callable[[_M, Any, Any], LossOutput],
        options: TrainOptions,
        evaluate_fn: Callable[[_M], dict[str, Any]] | None = None,
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
        if dist_ctx is None and launched_processes() > 1:
            # every process would train alone, each writing the same run directory
            raise ConfigError(
                f"this process is one of {launched_processes()} that torchrun started, and "
                "the Trainer was given no dist_ctx: pass dist_ctx=init_distributed() "
                "(rnnkit.training; init_distributed('cuda') on GPUs) to train one model "
                "over them, or dist_ctx=DistContext() for a process that trains alone"
            )
        self.dist = dist_ctx or DistContext()
        batches = resumable_batches(batches)  # a DataLoader, a list of batches: wrapped
        # rnnkit's batchers give the global batch, split here; a DataLoader gives each
        # process its own rows already (its DistributedSampler), as in any DDP program
        if self.dist.enabled and not isinstance(batches, IterableBatches):
            # rnnkit train's batches have --batch-size rows
            rows = options.argument("batch_size") if options.command_line else None
            batches = ShardedBatches(batches, self.dist, rows)
        self.batches = batches
        self.step_fn = step_fn
        self.ddp: nn.Module | None = None
        if self.dist.enabled:
            from torch.nn.parallel import DistributedDataParallel

            self.ddp = DistributedDataParallel(StepModule(model, step_fn))
        self.options = options
        self.evaluate_fn = evaluate_fn
        budget = resolve_budget(options, len(self.batches), validates=evaluate_fn is not None)
        self.total_steps = budget.total_steps  # None: unbounded (a time budget only)
        self.max_time = budget.max_time
        self.eval_every = budget.eval_every
        self.patience = budget.patience
        self.log_every = budget.log_every
        self.until_converged = budget.until_converged
        if options.init_range is not None:
            if not options.init_range > 0:
                name = options.argument("init_range")
                raise ConfigError(f"{name} must be > 0, got {options.init_range}")
            for p in model.parameters():
                nn.init.uniform_(p, -options.init_range, options.init_range)
        # a warm-up without a schedule warms up to the constant rate (it was ignored)
        spec = options.lr_schedule or ("constant" if options.warmup else None)
        if spec is not None:
            if scheduler is not None or plateau is not None:
                what = "lr_schedule" if options.lr_schedule is not None else "warmup"
                raise ValueError(f"pass either options.{what} or scheduler/plateau, not both")
            known = options.steps is not None or options.epochs is not None
            per_epoch = math.ceil(len(self.batches) / self.eval_every) if self.eval_every else 1
            scheduler, plateau = build_lr_schedulers(
                optimizer,
                parse_lr_schedule(spec, options.argument("lr_schedule")),
                steps_per_epoch=len(self.batches),
                total_steps=self.total_steps if known else None,
                warmup=options.warmup,
                decay=options.lr_decay,
                # decay when a whole epoch's validations bring no improvement
                plateau_patience=per_epoch - 1,
                names={
                    "schedule": options.argument("lr_schedule"),
                    "warmup": options.argument("warmup"),
                    "total_steps": f"{options.argument('steps')} or {options.argument('epochs')}",
                },
            )
        self.scheduler = scheduler
        self.plateau = plateau
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.run_log = RunLog(self.out_dir, self.dist.is_main, callbacks or [], options.counts)
        self.history = self.run_log.history  # the most recent events (metrics.jsonl: all)
        self.grad_hook = grad_hook
        self.step = 0
        self.carry: Any = None
        self.best: dict[str, Any] | None = None
        self._best_weights: dict[str, Tensor] | None = None  # in memory, since this fit()
        # The validation loss of the last gain (None: none yet), which the patience counts
        # from; it moves only at a gain, the best (the lowest loss) at any fall.
        self.gain_loss: float | None = None
        self.bad_evals = 0  # validations since that gain
        self._saved_at: float | None = None  # when the last snapshot was written
        self.clipped = 0
        self._window_nats = 0.0  # since the last training record
        self._window_tokens = 0
        self._device = next(model.parameters()).device
        self._amp_dtype, self.scaler = autocast_setup(
            options.precision, self._device, options.argument("precision")
        )
        self.guard = NonFiniteGuard(
            options.on_nonfinite, self._log, options.argument, options.clip_norm
        )

    @property
    def epochs_done(self) -> int:
        """Whole passes over the batches: the epoch's index, plus the one whose last batch
        was the last trained on (the batcher moves on only when asked for the next)."""
        b = self.batches
        return b.epoch + (1 if b.position == len(b) else 0)

    @property
    def scaler_skips(self) -> int:
        """Steps the GradScaler skipped (float16 overflow)."""
        return self.guard.scaler_skips

    def _log(self, event: dict[str, Any]) -> None:
        self.run_log.write(event, self.total_steps)

    # -- snapshots ---------------------------------------------------------------------
    def save(self) -> None:
        """Write a resumable snapshot of the current step (rank 0 writes; with several
        processes every rank must call this: the carried state is gathered first)."""
        save_trainer(self)
        self._saved_at = time.perf_counter()
        self.guard.saved = self.guard.saved or self.out_dir is not None

    def _snapshot_wanted(self, anyway: bool) -> bool:
        """Whether this validation takes a snapshot: ``anyway`` (the run ends or stops, a
        new best), the first, or ``snapshot_every`` seconds since the last. With several
        processes, where any one wants it: saving is collective (the carried state is
        gathered), so all must decide alike, and their clocks and validation losses
        may differ in the last bit."""
        wanted = (
            anyway
            or self._saved_at is None
            or time.perf_counter() - self._saved_at >= self.options.snapshot_every
        )
        if self.dist.enabled:
            wanted = self.dist.all_sum(float(wanted))[0] > 0
        return wanted

    def resume(self) -> None:
        """Restore model, optimizer, scheduler, RNG, data position and carried state; log
        a ``resumed`` event at the snapshot's step.

        Raises:
            RunFinished: the step budget is already spent and the run finished (its
                ``summary.json`` and ``model.safetensors`` are there): nothing is changed.
        """
        resume_trainer(self)
        self.guard.saved = True  # the snapshot it resumed from
        out = self.out_dir
        if (
            self.total_steps is not None
            and self.step >= self.total_steps
            and out is not None
            and (out / "summary.json").is_file()
            and (out / "model.safetensors").is_file()
        ):
            at = (
                f"finished at step {self.step} of {self.total_steps}"
                if self.step == self.total_steps
                else f"is at step {self.step}, past a budget of {self.total_steps} steps"
            )
            raise RunFinished(
                f"{out} {at}: nothing to resume; "
                "summary.json and model.safetensors are unchanged (raise "
                f"{self.options.argument('steps')} or {self.options.argument('epochs')} "
                "to train further)"
            )
        # the log's mark of the attempt: readers drop what the attempt before logged past
        # this step, which this one trains again (trajectory.run_events)
        self._log({"event": "resumed", "step": self.step})

    # -- the loop ----------------------------------------------------------------------
    def fit(self) -> TrainResult:
        """Train until ``steps`` (or ``epochs``) are done or early stopping triggers."""
        if not torch.is_grad_enabled() or torch.is_inference_mode_enabled():
            # torch's own error came from inside the first backward, after the step had
            # drawn its dropout masks
            raise ConfigError(
                "Trainer.fit() runs with gradients off (inside torch.no_grad() or "
                "torch.inference_mode()): training needs them; call it outside that block"
            )
        opts = self.options
        self.model.train()
        bar = Progress(
            total_steps=None if self.until_converged else self.total_steps,
            max_time=None if self.until_converged else self.max_time,
            initial=self.step,
            disable=opts.quiet or not self.dist.is_main,
        )
        pace = _Pace()
        first_step = self.step
        stopped, stopped_early = "", False
        stop_signal: list[int] = []
        governor = self._thread_governor()
        deadline = pace.started + self.max_time if self.max_time is not None else None
        with contextlib.ExitStack() as stack:
            # Last out: metrics.csv holds every event, however fit() ends.
            stack.push(self.run_log.csv_on_exit)
            stack.enter_context(stop_on_signals(stop_signal))
            stack.callback(bar.close)
            if opts.tensorboard is not None and self.dist.is_main:
                self.run_log.open_tensorboard(opts.tensorboard, opts.argument("tensorboard"))
                stack.callback(self.run_log.close_tensorboard)
            if governor is not None:
                governor.start()
                stack.callback(governor.stop)
            batches = self._batches()
            while self.total_steps is None or self.step < self.total_steps:
                batch = next(batches)
                batch_index = self.batches.position
                if governor is not None:
                    governor.tick()
                taken = self._train_step(batch, batch_index, bool(stop_signal), deadline)
                if taken is None:
                    continue
                self._count(taken, pace)
                if not opts.quiet:
                    self._show(bar, taken, pace)
                if self.step % self.log_every == 0 or self.step == self.total_steps:
                    self._record(taken, pace)
                stopped, stopped_early = self._after_step(pace, taken, stop_signal)
                if stopped:
                    break
        if not stopped:
            stopped = self._budget_done()
        if opts.restore_best:
            self._restore_best()
        return TrainResult(
            steps=self.step,
            epochs_done=self.epochs_done,
            train_loss_nats=pace.last_train_loss,
            best_valid=self.best,
            history=list(self.history),
            stopped_early=stopped_early,
            clipped_steps=self.clipped,
            tokens=pace.tokens_seen,
            train_seconds=time.perf_counter() - pace.started - pace.eval_seconds,
            threads=governor.note if governor is not None else "",
            stopped=stopped,
            first_step=first_step,
            events_logged=self.run_log.written,
        )

    def _batches(self) -> Iterator[Any]:
        while True:
            yield from self.batches

    def _thread_governor(self) -> ThreadGovernor | None:
        """The CPU thread count for the run (None on other devices)."""
        if self._device.type != "cpu":
            return None
        try:
            return ThreadGovernor(
                self.options.threads, rows=self.options.rows, name=self.options.argument("threads")
            )
        except ValueError as exc:  # a bad RNNKIT_THREADS / --threads: one line
            raise ConfigError(str(exc)) from None

    def _train_step(
        self, batch: Any, batch_index: int, signalled: bool, deadline: float | None = None
    ) -> _Taken | None:
        """One optimizer step on ``batch``: forward and loss under autocast, backward
        (scaled for float16), clipping, the finiteness checks, the update. None when the
        step was skipped (a non-finite value with ``on_nonfinite="skip"``, or a float16
        overflow the GradScaler handles).

        The step's figures (loss, token count, the models' input checks, the gradient
        norm) are read from the device once, after the backward
        (:mod:`rnnkit.deferred`); a multi-process or float16 step reads the
        loss's figures before the backward too (the global token count weighs the loss;
        the scaler's overflow check must not see a non-finite loss). ``deadline``: the
        ``time.perf_counter()`` at which the time budget runs out (None: no budget)."""
        where = (self.step + 1, batch_index, self.batches.epoch)
        self.optimizer.zero_grad(set_to_none=True)
        with deferring() as deferred:
            with autocast(self._device, self._amp_dtype):  # forward and loss only (torch's AMP)
                if self.ddp is not None:
                    out = self.ddp(batch, self.carry)
                else:
                    out = self.step_fn(self.model, batch, self.carry)
            if self.dist.enabled or self.scaler is not None:
                return self._careful_step(out, deferred, signalled, deadline, where)
            out.loss.backward()
            params = [p for p in self.model.parameters() if p.grad is not None]
            norm = self._clip(params)
            loss_sum, nats, tokens, grad_norm = deferred.read(
                out.loss.detach(), out.nats, out.tokens, norm
            )
        if not self._finite(loss_sum + nats, "the training loss", where):
            return None
        if not self._finite(grad_norm, "the gradient norm", where):
            return None
        self._clipped(grad_norm)
        return self._update(out, _Taken(nats, int(tokens), grad_norm, 0.0, signalled), where)

    def _careful_step(
        self,
        out: LossOutput,
        deferred: Deferred,
        signalled: bool,
        deadline: float | None,
        where: tuple[int, int, int],
    ) -> _Taken | None:
        """:meth:`_train_step` across processes or with the float16 GradScaler: the loss's
        figures read before the backward."""
        local = deferred.read(out.loss.detach(), out.nats, out.tokens)
        # Each process reads its own clock: one past the budget alone would stop (and wait
        # in the snapshot's collective) while another waited in the next step's, a hang.
        late = deadline is not None and time.perf_counter() >= deadline
        # Global figures (sums over processes): every rank sees the same values, so every
        # rank takes the same decision (stop, skip, out of time) and none deadlocks. One
        # reduction a step carries them all.
        nats, tokens, stopping, time_up, loss_sum = self.dist.all_sum(
            local[1], local[2], float(signalled), float(late), local[0]
        )
        if not self._finite(loss_sum + nats, "the training loss", where):
            return None
        loss = out.loss
        if self.dist.enabled:
            # DDP averages gradients over W processes: weigh each process's token mean by
            # its share of the global tokens -> gradient of the global mean.
            loss = loss * (local[2] * self.dist.world_size / max(tokens, 1))
        params = [p for p in self.model.parameters() if p.requires_grad]
        # The scaler's overflow (inf/NaN in the unscaled gradients) is asked of their
        # peak only where the norm cannot say it: clipping by value turns an inf finite.
        # Elsewhere an inf gradient makes the norm inf, so a finite norm (the common
        # step) answers both questions in one read of the device.
        peak_first = self.scaler is not None and self.options.clip_value is not None
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            # Clipping, the finite check and the hook see the true gradients.
            self.scaler.unscale_(self.optimizer)
            if peak_first and self.guard.scaler_skipped(self.scaler, self.optimizer, params, where):
                self.carry = _detach(out.state)  # the forward was fine: carry on
                return None
        else:
            loss.backward()
        grad_norm = float(self._clip([p for p in params if p.grad is not None]))
        if self.scaler is not None and not math.isfinite(grad_norm):
            if not peak_first and self.guard.scaler_skipped(
                self.scaler, self.optimizer, params, where
            ):
                self.carry = _detach(out.state)
                return None
            # finite gradients whose norm overflows float32: the scaler unscaled them and
            # saw no inf; end its iteration (scale kept) so that the next unscale_ runs
            self.scaler.update(self.scaler.get_scale())
        elif self.scaler is not None:
            self.guard.scaler_streak = 0  # no overflow: the scaler's streak starts over
        if not self._finite(grad_norm, "the gradient norm", where):
            return None
        self._clipped(grad_norm)
        agreed = bool(time_up) if self.dist.enabled else None
        taken = _Taken(nats, int(tokens), grad_norm, 0.0, bool(stopping), agreed)
        return self._update(out, taken, where)

    def _update(self, out: LossOutput, taken: _Taken, where: tuple[int, int, int]) -> _Taken:
        """The optimizer's (and scheduler's) step after the checks passed."""
        # a finite loss risen beyond any learning's: cross-entropies only (a regressor's
        # squared error has the data's own scale: one batch of values in the thousands)
        if taken.tokens > 0 and self.options.counts != "values":
            self.guard.check_rise(float(taken.nats) / taken.tokens, where)
        lr = self.optimizer.param_groups[0]["lr"]  # the rate of this step
        with update_overflow(where, lr, self.options.argument, self.guard.saved):
            if self.scaler is not None:
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        self.step += 1
        self.guard.good_step()
        self.carry = _detach(out.state)
        return taken._replace(lr=lr)

    def _finite(self, value: float, what: str, where: tuple[int, int, int]) -> bool:
        """The guard's check; a skipped step drops its gradients and the carried state."""
        if self.guard.check(value, what, where):
            return True
        self.optimizer.zero_grad(set_to_none=True)
        self.carry = None
        return False

    def _clip(self, params: Sequence[Tensor]) -> Tensor:
        """Clip by value and by global norm (as asked); the norm before clipping, on the
        device (reading it would wait for the backward)."""
        opts = self.options
        if opts.clip_value is not None:
            torch.nn.utils.clip_grad_value_(params, opts.clip_value)
        max_norm = opts.clip_norm if opts.clip_norm is not None else float("inf")
        return torch.nn.utils.clip_grad_norm_(params, max_norm)

    def _clipped(self, grad_norm: float) -> None:
        """Count a clipped step and tell the gradient hook (a finite norm)."""
        clipped = self.options.clip_norm is not None and grad_norm > self.options.clip_norm
        self.clipped += int(clipped)
        if self.grad_hook is not None:
            self.grad_hook(self.model, grad_norm, clipped)

    def _count(self, taken: _Taken, pace: _Pace) -> None:
        self._window_nats += taken.nats
        self._window_tokens += taken.tokens
        pace.tokens_seen += taken.tokens
        pace.last_train_loss = self._window_nats / max(self._window_tokens, 1)

    def _show(self, bar: Progress, taken: _Taken, pace: _Pace) -> None:
        """The progress bar after a step (:func:`~rnnkit.training.progress.postfix`)."""
        loss = pace.last_train_loss
        assert loss is not None
        waiting = self.until_converged and self.patience is not None
        shown = postfix(
            loss,
            taken.lr,
            pace.rate(time.perf_counter()),
            self.options.counts,
            self.options.units,
            no_gain=f"{self.bad_evals}/{self.patience}" if waiting else None,
        )
        bar.update(self.step, **shown)

    def _record(self, taken: _Taken, pace: _Pace) -> None:
        """A training record: the loss since the last one, the gradient norm, the rate."""
        now = time.perf_counter()
        self._log(
            {
                "event": "train",
                "step": self.step,
                "epoch": self.batches.epoch,
                "loss_nats": pace.last_train_loss,
                "grad_norm": taken.grad_norm,
                "clipped_total": self.clipped,
                "lr": taken.lr,
                **({"loss_scale": self.scaler.get_scale()} if self.scaler is not None else {}),
                "tokens_per_s": pace.rate(now),
            }
        )
        self._window_nats, self._window_tokens = 0.0, 0
        pace.new_window(now)

    def _after_step(self, pace: _Pace, taken: _Taken, stop_signal: list[int]) -> tuple[str, bool]:
        """Validation, snapshot and the stopping rules after a step: ``(why training
        stops now, or "" to go on; whether that is early stopping)``."""
        end_of_epoch = self.batches.position == len(self.batches)
        out_of_time = taken.time_up
        if out_of_time is None:  # one process: its own clock, after the step
            out_of_time = (
                self.max_time is not None and time.perf_counter() - pace.started >= self.max_time
            )
        scheduled = self.step % self.eval_every == 0 if self.eval_every else end_of_epoch
        final = self.step == self.total_steps or out_of_time
        if end_of_epoch:
            self.carry = None  # streams restart at the beginning
        saved = False
        if scheduled or final:
            eval_started = time.perf_counter()
            if scheduled:
                stop = self._evaluate()
                # A snapshot where the run ends or stops, where the best weights changed
                # (model.safetensors and the snapshot then agree on the best), and else
                # at most every snapshot_every seconds: on small data a validation comes
                # every step, and a snapshot at each cost a third of the run. A resume
                # from an earlier snapshot repeats the same steps, so it ends the same.
                # (a new best: the validation just made has the best's step)
                improved = self.best is not None and self.best["step"] == self.step
                if self._snapshot_wanted(stop or final or taken.stopping or improved):
                    self.save()
                    saved = True
            else:
                # A validation only because this call of fit() ends here must not change
                # what a resumed run continues from (plateau, patience), so the snapshot
                # is taken first: N + resume + M steps = N + M steps.
                self.save()
                saved = True
                stop = self._evaluate()
            pace.eval_seconds += time.perf_counter() - eval_started
            if stop:
                self._log({"event": "early_stop", "step": self.step})
                return self._early_stop_text(), True
        if out_of_time:
            self._log({"event": "time_limit", "step": self.step})
            if self.until_converged:
                return f"cap reached: {self.max_time:.0f} s of training", False
            return f"time budget of {self.max_time:g} s reached", False
        # A signal reached some process: all save and stop together (agreed in the step's
        # reduction). One process alone stops after the step the signal came in (its flag
        # read before the step saw nothing, and another step ran), unless that step ended
        # the run anyway: it then ends as it would have, and the signal goes on to the
        # program's own handler once fit() gives it back (stop_on_signals).
        if taken.stopping or (not self.dist.enabled and stop_signal and not final):
            if not saved:
                self.save()
            self._log({"event": "interrupted", "step": self.step})
            name = signal.Signals(stop_signal[0]).name if stop_signal else "a signal"
            resume = "--resume" if self.options.command_line else "Trainer.resume()"
            kept = (
                f"the checkpoint is saved (continue with {resume})"
                if self.out_dir is not None
                else "nothing is saved (the Trainer has no out_dir)"
            )
            # the command line says "stopped: " before it (not "stopped: stopped by")
            raise TrainingInterrupted(f"{name} after step {self.step}; {kept}")
        return "", False

    def _early_stop_text(self) -> str:
        """Why early stopping ended the run: ``no improvement for 3 validations (best at
        step 4)``; when a smaller fall made a later best, the threshold it missed."""
        assert self.best is not None
        what = "no improvement"
        if float(self.best["loss_nats"]) != self.gain_loss:  # smaller falls since the gain
            opts = self.options
            what = f"no gain above {given(opts.argument('min_gain'), opts.min_gain)}"
        return f"{what} for {self.bad_evals} validations (best at step {self.best['step']})"

    def _budget_done(self) -> str:
        """Why training ended when it ran its whole budget."""
        if self.until_converged:
            assert self.total_steps is not None
            return f"cap reached: {cap_text(self.total_steps, len(self.batches))}"
        steps = f"{self.step:,} step{'' if self.step == 1 else 's'}"
        if self.options.steps is not None:
            return f"{steps} done"
        epochs = self.options.epochs
        return f"{epochs} epoch{'' if epochs == 1 else 's'} done ({steps})"

    # -- validation --------------------------------------------------------------------
    def _evaluate(self) -> bool:
        """Validate, keep the best weights (the lowest loss); return True when training
        should stop: ``patience`` validations in a row without a gain (a loss below the
        last gain's by more than ``min_gain`` of it, :func:`~rnnkit.training.budget.gained`)."""
        if self.evaluate_fn is None:
            return False
        self.model.eval()
        metrics = self.evaluate_fn(self.model)
        self.model.train()
        loss = float(metrics["loss_nats"])
        if not math.isfinite(loss) and metrics.get("tokens", 1) != 0:
            # finite training losses can still leave weights that overflow (a rate far too
            # large): the run must not go on, nor pick such weights as its best
            raise TrainingDiverged(
                f"the validation loss is {loss} after step {self.step}: training diverged "
                f"({self.guard.advice()})"
            )
        event = {"event": "valid", "step": self.step, "epoch": self.batches.epoch, **metrics}
        improved = self.best is None or loss < float(self.best["loss_nats"])
        if improved:
            self.best = {"step": self.step, **metrics}
            if self.options.restore_best:
                self._best_weights = {
                    k: v.detach().clone() for k, v in self.model.state_dict().items()
                }
            if self.out_dir is not None and self.dist.is_main:
                save_model_weights(self.model, self.out_dir / "model.safetensors")
        if gained(loss, self.gain_loss, self.options.min_gain):  # a gain is an improvement
            self.gain_loss = loss
            self.bad_evals = 0
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
