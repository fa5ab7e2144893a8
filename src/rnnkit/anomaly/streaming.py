"""Streaming anomaly scores: events arrive one by one, one recurrent state per open session.

The input is JSON lines, one per event (or a few events, or a session's end), in the
format of :mod:`rnnkit.anomaly.stream_format`, read by
:func:`~rnnkit.anomaly.follow.follow_lines`.

:class:`StreamScorer` keeps, per open session, the recurrent state after all its events
but the last, the last event's id, and running scores
(:class:`~rnnkit.anomaly.scores.RunningScore`).
When event ``e_t`` arrives, ONE step of the model on ``e_{t-1}``
(:func:`~rnnkit.anomaly.session_state.step_function`) gives ``p(· | e_<t)``, so the work
per event is O(1) whatever the session's length, and the scores equal batch scores
(:func:`rnnkit.app.tasks.events.score_sessions`) of the same sessions up to float rounding.
Events that arrive together (one read of the input) are stepped as one batch, one row per
session. States live in one pool tensor, a row per open session, so memory is bounded:
at most ``max_sessions`` are open (the least recently active is closed first, verdict
``reason: "evicted"``), and sessions idle for ``idle_timeout`` seconds are closed
(``reason: "idle"``); neither is scored on an end it never saw.

A verdict line is emitted when a session *becomes* anomalous (``closed: false``; only for
the ``max`` and ``count`` scores, which never decrease, so the verdict cannot be taken
back) and when it closes (``closed: true``, ``reason`` ``end``, ``idle``, ``evicted`` or
``input ended``).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import numpy as np
import torch

from rnnkit.anomaly.scores import RUNNING_SCORES, RunningScore, surprise_and_rank
from rnnkit.anomaly.session_state import StatePool, step_function
from rnnkit.anomaly.stream_format import StreamItem
from rnnkit.data.batching import to_device
from rnnkit.data.vocab import BOS_ID, EOS_ID, SPECIALS, UNK_ID
from rnnkit.deferred import deferring
from rnnkit.errors import ConfigError

__all__ = ["StreamScorer", "scores_array"]

_END = object()  # a queued session end


class EventEncoder(Protocol):
    """What the scorer needs of a vocabulary (:class:`~rnnkit.app.tasks.events.EventVocabulary`)."""

    def encode_event(self, event: str) -> int: ...


class _Open:
    """One open session."""

    __slots__ = ("flagged", "last", "position", "row", "running", "seen", "unknown")

    def __init__(self, row: int, top_k: int, now: float) -> None:
        self.row = row
        self.last = BOS_ID  # the input of the next step: <s>, then the latest event
        self.position = 0
        self.running = RunningScore(top_k)
        self.unknown = 0
        self.flagged = False
        self.seen = now


class StreamScorer:
    """Score events as they arrive; see the module docstring.

    Args:
        model: the next-event LM (``LanguageModel``: ``step``, ``encoder``).
        vocab: anything with ``encode_event(str) -> int`` (``<unk>`` = 1 when unseen).
        threshold: a session is anomalous when its ``score`` is strictly above this.
        score: ``"max"``, ``"mean"`` or ``"count"`` (see :mod:`rnnkit.anomaly.scores`).
        top_g: an event whose rank is ``≥ top_g`` is a miss (for ``count``).
        top_k: how many of the most surprising events a verdict lists.
        max_sessions: most sessions open at once (the least recently active is evicted).
        idle_timeout: seconds without an event after which a session is closed (None:
            never).
        clock: time source (seconds), for tests.

    >>> from rnnkit.models import ModelSpec, build_language_model
    >>> class Vocab:
    ...     def encode_event(self, e): return {"a": 4, "b": 5}.get(e, 1)
    >>> _ = torch.manual_seed(0)
    >>> lm = build_language_model(ModelSpec(hidden=4, embedding=3), 6)
    >>> scorer = StreamScorer(lm, Vocab(), threshold=100.0)
    >>> scorer.feed([StreamItem("s1", ("a", "b")), StreamItem("s2", ("a",), end=True)])[0]["reason"]
    'end'
    >>> scorer.open_sessions
    1
    """

    def __init__(
        self,
        model: torch.nn.Module,
        vocab: EventEncoder,
        *,
        threshold: float,
        score: str = "max",
        top_g: int = 9,
        top_k: int = 5,
        max_sessions: int = 10_000,
        idle_timeout: float | None = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if score not in RUNNING_SCORES:
            raise ConfigError(
                f"streaming scores are {', '.join(RUNNING_SCORES)} (the others need the "
                f"whole session), got {score!r}"
            )
        if max_sessions < 1:
            # the arguments' names: `rnnkit score --follow` checks its options before
            raise ConfigError(f"max_sessions must be ≥ 1, got {max_sessions}")
        if idle_timeout is not None and not idle_timeout > 0:
            raise ConfigError(f"idle_timeout must be > 0 seconds or None, got {idle_timeout}")
        model.eval()
        self.model = model
        self.vocab = vocab
        self.threshold = float(threshold)
        self.score = score
        self.top_g = top_g
        self.top_k = top_k
        self.max_sessions = max_sessions
        self.idle_timeout = idle_timeout
        self.clock = clock
        self._device = next(model.parameters()).device
        self._step = step_function(model)
        self._pool = StatePool(model, max_sessions)
        self._open: OrderedDict[str, _Open] = OrderedDict()  # least recently active first
        self._round: list[tuple[str, _Open, Any]] = []
        self._in_round: set[str] = set()
        self._out: list[dict[str, Any]] = []
        self.stats = {
            "events": 0,
            "unknown": 0,
            "sessions": 0,
            "anomalous": 0,
            "evicted": 0,
            "idle": 0,
            "ends_without_session": 0,
        }

    @property
    def open_sessions(self) -> int:
        """How many sessions are open now."""
        return len(self._open)

    def state_bytes_per_session(self) -> int:
        """Bytes of recurrent state each open session holds (its row of the pool)."""
        return self._pool.bytes_per_session()

    # ---- input -------------------------------------------------------------------------

    def feed(self, items: Iterable[StreamItem], now: float | None = None) -> list[dict[str, Any]]:
        """Consume items; return the verdicts they caused (then idle expiry).

        Each session's events are taken in order; the k-th event of every session in
        ``items`` goes into the k-th batched step (sessions are independent, so only the
        order within a session matters), so a read holding several events per session
        costs one step per *round*, not one per event.
        """
        now = self.clock() if now is None else now
        rounds: list[list[tuple[str, Any]]] = []
        depth: dict[str, int] = {}
        for item in items:
            for event in (*item.events, _END) if item.end else item.events:
                k = depth.get(item.session, 0)
                depth[item.session] = k + 1
                if k == len(rounds):
                    rounds.append([])
                rounds[k].append((item.session, event))
        for ops in rounds:
            for sid, event in ops:
                self._queue(sid, event, now)
            self._flush()
        self._out.extend(self.expire(now))
        out, self._out = self._out, []
        return out

    def expire(self, now: float | None = None) -> list[dict[str, Any]]:
        """Close the sessions idle for longer than ``idle_timeout``; their verdicts."""
        if self.idle_timeout is None:
            return []
        now = self.clock() if now is None else now
        out = []
        while self._open:
            sid, rec = next(iter(self._open.items()))
            if now - rec.seen <= self.idle_timeout:
                break
            self.stats["idle"] += 1
            out.append(self._close(sid, "idle"))
        return out

    def close_all(self, reason: str = "input ended") -> list[dict[str, Any]]:
        """Close every open session (the input is over); their verdicts."""
        self._flush()
        out, self._out = self._out, []
        while self._open:
            out.append(self._close(next(iter(self._open)), reason))
        return out

    def _queue(self, sid: str, event: Any, now: float) -> None:
        if sid in self._in_round:
            self._flush()  # one step per session per batch: its events stay in order
        rec = self._open.get(sid)
        if rec is None:
            if event is _END:
                self.stats["ends_without_session"] += 1
                return
            if len(self._open) >= self.max_sessions and next(iter(self._open)) in self._in_round:
                self._flush()  # every open session is in this batch: step it first
            if len(self._open) >= self.max_sessions:
                self.stats["evicted"] += 1
                self._out.append(self._close(next(iter(self._open)), "evicted"))
            rec = _Open(self._pool.alloc(), self.top_k, now)
            self._open[sid] = rec
            self.stats["sessions"] += 1
        else:
            self._open.move_to_end(sid)
            rec.seen = now
        self._round.append((sid, rec, event))
        self._in_round.add(sid)

    # ---- one batched step ------------------------------------------------------------

    @torch.no_grad()
    def _flush(self) -> None:
        if not self._round:
            return
        ops, self._round = self._round, []
        self._in_round.clear()
        targets = [EOS_ID if e is _END else self.vocab.encode_event(e) for _, _, e in ops]
        # The rows, inputs and targets in one move before the step, the figures in one
        # read after it, with the model's checks (on a GPU each move from pageable
        # memory after a queued kernel, and each read, waits for the device).
        ids = torch.tensor(
            [[rec.row for _, rec, _ in ops], [rec.last for _, rec, _ in ops], targets],
            dtype=torch.long,
        )
        rows, tokens, target_t = to_device(ids, self._device)
        with deferring() as deferred:
            log_probs, state = self._step(tokens, self._pool.gather(rows))
            self._pool.scatter(rows, state)
            surprise, rank = surprise_and_rank(log_probs.float(), target_t)
            (host,) = deferred.fetch(torch.stack([surprise.double(), rank.double()]))
        surprise_np, miss_np = host[0].numpy(), host[1].numpy() >= self.top_g
        for (sid, rec, event), target, s, miss in zip(
            ops, targets, surprise_np, miss_np, strict=True
        ):
            end = event is _END
            rec.running.add(float(s), bool(miss), rec.position, SPECIALS[EOS_ID] if end else event)
            if end:
                self._out.append(self._close(sid, "end"))
                continue
            self.stats["events"] += 1
            rec.last = target
            rec.position += 1
            if target == UNK_ID:
                rec.unknown += 1
                self.stats["unknown"] += 1
            if (
                not rec.flagged
                and self.score != "mean"
                and rec.running.score(self.score) > self.threshold
            ):
                rec.flagged = True
                self.stats["anomalous"] += 1
                verdict = self._verdict(sid, rec, closed=False, reason="anomalous")
                verdict["position"] = rec.position - 1
                self._out.append(verdict)

    # ---- verdicts --------------------------------------------------------------------

    def _close(self, sid: str, reason: str) -> dict[str, Any]:
        rec = self._open.pop(sid)
        self._pool.release(rec.row)
        verdict = self._verdict(sid, rec, closed=True, reason=reason)
        if verdict["verdict"] == "anomalous" and not rec.flagged:
            self.stats["anomalous"] += 1
        return verdict

    def _verdict(self, sid: str, rec: _Open, *, closed: bool, reason: str) -> dict[str, Any]:
        scores = rec.running.scores()
        value = float(scores[self.score])
        top = []
        for position, s, event in rec.running.top():
            item: dict[str, Any] = {"position": position, "event": event, "surprise": round(s, 4)}
            if position < rec.position and self.vocab.encode_event(event) == UNK_ID:
                item["unknown"] = True
            top.append(item)
        return {
            "session": sid,
            "score": value,
            "verdict": "anomalous" if value > self.threshold else "normal",
            "threshold": self.threshold,
            "scores": scores,
            "events": rec.position,
            "unknown": rec.unknown,
            "top": top,
            "closed": closed,
            "reason": reason,
        }


def scores_array(verdicts: Iterable[dict[str, Any]], name: str = "max") -> np.ndarray:
    """The ``scores[name]`` of closing verdicts, in order (for comparisons and tests).

    >>> scores_array([{"closed": True, "scores": {"max": 1.5}}, {"closed": False}])
    array([1.5])
    """
    return np.array([v["scores"][name] for v in verdicts if v.get("closed")], dtype=np.float64)
