"""The record of a training run as it goes: every event (a training record, a
validation, a skipped step, the end) into ``metrics.jsonl``, the table ``metrics.csv``
rebuilt from it, TensorBoard scalars if asked, a line on stderr with ``-v``, the
callbacks, and the most recent events in memory (``TrainResult.history``).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rnnkit import messages
from rnnkit.errors import CheckpointError
from rnnkit.training.checkpoint import append_jsonl
from rnnkit.training.run_files import write_metrics_csv

__all__ = ["COUNTED", "counted", "describe_event"]

HISTORY_EVENTS = 10_000  # logged events kept in memory (TrainResult.history)
# metrics.csv is rewritten from metrics.jsonl at a snapshot at most this often (and when
# fit() ends): a table of every event without rewriting it at every validation of a run
# that validates every step.
CSV_EVERY_S = 30.0


#: What a task's training loss counts (``LossOutput.tokens``, so ``tokens_per_s``) where
#: that is not tokens: a classifier scores one prediction per example, a regressor one
#: per predicted value (each of the ``K`` outputs, at every step for ``--target next``).
COUNTED = {"classify": "examples", "regress": "values"}


def counted(task: Any) -> str:
    """What the training loss of ``task`` counts: the unit of its rate (``tokens_per_s``).

    >>> counted("lm"), counted("classify"), counted("regress"), counted(None)
    ('tokens', 'examples', 'values', 'tokens')
    """
    return COUNTED.get(task, "tokens") if isinstance(task, str) else "tokens"


def describe_event(
    event: dict[str, Any], total_steps: int | None = None, counts: str = "tokens"
) -> str:
    """One event of ``metrics.jsonl`` as a line for people (what ``-v`` prints); ``counts``
    is what the rate ``tokens_per_s`` counts (:func:`counted`).

    >>> describe_event({"event": "train", "step": 50, "epoch": 1, "loss_nats": 1.23456,
    ...                 "lr": 0.002, "grad_norm": 0.5, "tokens_per_s": 40960.0}, 200)
    'step 50/200 (epoch 1): loss 1.2346 nats, lr 0.002, grad norm 0.5, 40,960 tokens/s'
    >>> describe_event({"event": "train", "step": 5, "epoch": 1, "loss_nats": 0.5,
    ...                 "tokens_per_s": 812.4}, counts="examples")
    'step 5 (epoch 1): loss 0.5000 nats, 812 examples/s'
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
            parts.append(f"{event['tokens_per_s']:,.0f} {counts}/s")
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


class RunLog:
    """Where the events of one ``Trainer`` go.

    Args:
        out_dir: the run directory (None: no files).
        is_main: this process writes the files (rank 0 of a distributed run).
        callbacks: called as ``cb(event)`` for every event (on rank 0).
        counts: what the rate of a training record counts (:func:`counted`), for ``-v``.

    >>> log = RunLog(None, True, [print])
    >>> log.write({"event": "early_stop", "step": 7})
    {'event': 'early_stop', 'step': 7}
    >>> list(log.history)
    [{'event': 'early_stop', 'step': 7}]
    """

    def __init__(
        self,
        out_dir: Path | None,
        is_main: bool,
        callbacks: list[Callable[[dict[str, Any]], None]],
        counts: str = "tokens",
    ) -> None:
        self.out_dir = out_dir
        self.counts = counts
        self.is_main = is_main
        self.callbacks = callbacks
        # The most recent events only: a run of millions of steps must not grow memory
        # per step (the soak test); metrics.jsonl keeps every event.
        self.history: deque[dict[str, Any]] = deque(maxlen=HISTORY_EVENTS)
        # every event recorded, those the history dropped too: with a run directory, the
        # last ``written`` lines of metrics.jsonl are this log's
        self.written = 0
        self._csv_written = time.perf_counter()  # metrics.csv: at most every CSV_EVERY_S
        self._tensorboard: Any = None  # a TensorBoardWriter while fit() runs, if asked

    def write(self, event: dict[str, Any], total_steps: int | None = None) -> None:
        """Record ``event`` (``total_steps``: the budget the ``-v`` line shows)."""
        self.history.append(event)
        self.written += 1
        if not self.is_main:
            return  # only rank 0 writes logs
        if self.out_dir is not None:
            append_jsonl(self.out_dir / "metrics.jsonl", event)
        if messages.LOGGER.isEnabledFor(logging.DEBUG):  # -v: the record as one line
            messages.debug(describe_event(event, total_steps, self.counts))
        if self._tensorboard is not None:
            self._tensorboard(event)
        for cb in self.callbacks:
            cb(event)

    def open_tensorboard(self, log_dir: str, name: str = "tensorboard") -> None:
        """Also write the events as TensorBoard scalars into ``log_dir`` (rank 0); ``name``
        is how an error names the setting (``tensorboard`` or ``--tensorboard``)."""
        if not self.is_main:
            return
        from rnnkit.training.tensorboard import TensorBoardWriter

        self._tensorboard = TensorBoardWriter(log_dir, name)

    def close_tensorboard(self) -> None:
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None

    def csv_due(self) -> bool:
        """Whether ``metrics.csv`` is older than ``CSV_EVERY_S``."""
        return time.perf_counter() - self._csv_written >= CSV_EVERY_S

    def write_csv(self) -> None:
        """``metrics.csv`` from ``metrics.jsonl`` (rank 0, with a run directory)."""
        if self.out_dir is None or not self.is_main:
            return
        try:
            write_metrics_csv(self.out_dir)
        except CheckpointError as exc:  # an oversized log: the table is a convenience
            messages.warning(f"metrics.csv not written: {exc}")
        self._csv_written = time.perf_counter()

    def csv_on_exit(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        """An ``ExitStack`` callback: ``metrics.csv`` holds every event however training
        ends; an error while writing it never hides the error that ended training."""
        if exc_type is None:
            self.write_csv()
        else:  # the error that ends training is the one to report, not a failed table
            with contextlib.suppress(Exception):
                self.write_csv()
        return False
