"""The course of a run, read from its events: the figures that tell overfitting from
underfitting once validation stopped improving (:mod:`rnnkit.training.baseline_check`).

One training record (an event ``train`` of ``metrics.jsonl``) is the mean loss of the
steps since the record before; one figure of it is noisy (a few batches, and with
``--dropout`` the loss of a thinned network). The smoothed training loss at a step is the
mean of the :data:`SMOOTH_RECORDS` training records nearest that step (at the end of the
run: the last ones), so that two such means compare like with like — dropout inflates
both alike.

:func:`trajectory` returns ``summary["trajectory"]``::

    best_step             the step of the best validation (the weights kept)
    last_valid_step       the step of the last validation
    train_loss_at_best    the smoothed training loss at the best step
    train_loss_end        the smoothed training loss at the end of the run
    train_loss_change_se  the standard error of ``train_loss_end - train_loss_at_best``
                          from the spread of the records of each mean (None with
                          fewer than two records): how far noise alone moves it
    valid_loss_best       the validation loss at the best step
    valid_loss_last       the validation loss at the last validation
    valids_after_best     how many validations came after the best one
    valids                how many validations there were
    valid_every           the usual number of steps between two validations: the median
                          gap between those before the last (the run's last may come at
                          any step: a budget ends it); None with fewer than three
    train_records         how many training records the figures were read from

A resumed run's course is read from the whole run's events (:func:`run_events`): those
``metrics.jsonl`` logged before the resume, then those of the resumed training; so is a
run's that logged more events than the memory keeps (``HISTORY_EVENTS``): then its own
are read from ``metrics.jsonl`` too (``rnnkit.app.tasks.run_outputs``).

Losses are in the unit of the task's training loss: nats a token (``loss_nats``), or for
``regress`` the loss per predicted value (``loss``: the mean squared error, or the
Gaussian negative log-likelihood in nats).
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Iterable
from typing import Any

__all__ = ["SMOOTH_RECORDS", "run_events", "smoothed_loss", "trajectory"]

#: Training records averaged into one smoothed training loss.
SMOOTH_RECORDS = 5


def _figure(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _nearest(records: list[tuple[int, float]], step: int | None) -> list[float]:
    """The losses of the :data:`SMOOTH_RECORDS` records nearest ``step`` (None: the last)."""
    if step is None:
        return [loss for _, loss in records[-SMOOTH_RECORDS:]]
    # nearest first; between two as near, the earlier (sorted() is stable)
    return [loss for _, loss in sorted(records, key=lambda r: abs(r[0] - step))][:SMOOTH_RECORDS]


def smoothed_loss(records: list[tuple[int, float]], step: int | None = None) -> float | None:
    """The mean of the :data:`SMOOTH_RECORDS` records ``(step, loss)`` (in step order)
    nearest ``step`` (None: the last ones); None without records.

    >>> r = [(10, 4.0), (20, 3.0), (30, 2.0), (40, 1.0), (50, 1.0), (60, 1.0), (70, 1.0)]
    >>> smoothed_loss(r, 30), smoothed_loss(r)
    (2.2, 1.2)
    """
    chosen = _nearest(records, step)
    return sum(chosen) / len(chosen) if chosen else None


def _change_se(a: list[float], b: list[float]) -> float | None:
    """The standard error of ``mean(b) - mean(a)`` from the spread of each window's
    records (None with fewer than two in either)."""
    if len(a) < 2 or len(b) < 2:
        return None
    return math.sqrt(statistics.variance(a) / len(a) + statistics.variance(b) / len(b))


def _step(event: dict[str, Any]) -> int | None:
    step = event.get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def run_events(
    logged: Iterable[dict[str, Any]],
    history: Iterable[dict[str, Any]],
    resumed_at: int | None = None,
) -> list[dict[str, Any]]:
    """The events of a whole run resumed from its snapshot at step ``resumed_at``: the
    events ``logged`` (``metrics.jsonl``, every attempt) up to that step, then ``history``
    (the events since the resume).

    An attempt cut by a crash may have logged steps past its last snapshot, which the
    next attempt trained again: a ``resumed`` event (written by ``Trainer.resume``) at
    the snapshot's step drops the events of the attempt before past that step; in a log
    from before that event, an event at an earlier step than the event before it starts
    a new attempt, and the events of the attempt before from that step on are dropped.
    So are logged events past ``resumed_at`` (this attempt's are ``history``; None: every
    attempt's events to the last, the whole log read as the run's course).

    >>> logged = [{"event": "train", "step": s} for s in (2, 4, 6, 4, 6, 8)]
    >>> [e["step"] for e in run_events(logged, [{"event": "train", "step": 8}], 6)]
    [2, 4, 6, 8]
    >>> logged = [{"event": "train", "step": s} for s in (2, 3, 4, 6)]
    >>> logged += [{"event": "resumed", "step": 2}, {"event": "train", "step": 4}]
    >>> [(e["event"], e["step"]) for e in run_events(logged, [], 10)]
    [('train', 2), ('resumed', 2), ('train', 4)]
    """
    kept: list[dict[str, Any]] = []
    for event in logged:
        step = _step(event)
        if step is None or (resumed_at is not None and step > resumed_at):
            continue
        if event.get("event") == "resumed":  # the attempt before is kept to its snapshot
            while kept and kept[-1]["step"] > step:
                kept.pop()
        elif kept and step < kept[-1]["step"]:  # a resumed attempt begins here
            while kept and kept[-1]["step"] >= step:
                kept.pop()
        kept.append(event)
    return kept + list(history)


def trajectory(
    history: Iterable[dict[str, Any]], best_step: Any, loss_key: str = "loss_nats"
) -> dict[str, Any] | None:
    """The figures of the run's course (the fields in the module's docstring) from its
    events (``TrainResult.history``: ``train`` records with ``loss_nats``, ``valid``
    events with ``loss_key``); ``best_step`` is the step of the best validation.

    None when the events cannot tell: no best step, no training record, or the best
    validation not among the events (a resumed run whose best came before the resume:
    the events in memory are those since: :func:`run_events` gives the whole run's).

    >>> events = [{"event": "train", "step": s, "loss_nats": 2.0 - s / 10} for s in (1, 2, 3)]
    >>> events += [{"event": "valid", "step": 2, "loss_nats": 1.9},
    ...            {"event": "valid", "step": 3, "loss_nats": 2.1}]
    >>> t = trajectory(events, 2)
    >>> t["valid_loss_best"], t["valid_loss_last"], t["train_records"]
    (1.9, 2.1, 3)
    """
    if not isinstance(best_step, int) or isinstance(best_step, bool):
        return None
    records: list[tuple[int, float]] = []
    valid: list[tuple[int, float]] = []
    for event in history:
        step = event.get("step")
        if not isinstance(step, int):
            continue
        if event.get("event") == "train":
            loss = _figure(event.get("loss_nats"))
            if loss is not None:
                records.append((step, loss))
        elif event.get("event") == "valid":
            loss = _figure(event.get(loss_key))
            if loss is not None:
                valid.append((step, loss))
    at_best = [loss for step, loss in valid if step == best_step]
    if not records or not at_best:
        return None
    before_last = [step for step, _ in valid[:-1]]
    gaps = [b - a for a, b in itertools.pairwise(before_last)]
    return {
        "best_step": best_step,
        "last_valid_step": valid[-1][0],
        "train_loss_at_best": smoothed_loss(records, best_step),
        "train_loss_end": smoothed_loss(records),
        "train_loss_change_se": _change_se(_nearest(records, best_step), _nearest(records, None)),
        "valid_loss_best": at_best[-1],
        "valid_loss_last": valid[-1][1],
        "valids_after_best": sum(step > best_step for step, _ in valid),
        "valids": len(valid),
        "valid_every": int(statistics.median_low(gaps)) if gaps else None,
        "train_records": len(records),
    }
