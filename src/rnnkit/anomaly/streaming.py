"""Streaming anomaly scores: events arrive one by one, one recurrent state per open session.

The input is JSON lines, one per event (or a few events, or a session's end)::

    {"session": "web-17", "event": "openat:ok"}
    {"session": "web-17", "events": ["read:ok", "close:ok"]}
    {"session": "web-17", "end": true}
    {"session": "web-18", "event": "exit_group:noreturn", "end": true}

Keys: ``session`` (a string, or an integer read as its decimal string), ``event`` (one
non-empty string) or ``events`` (a list of them), ``end`` (``true``: the session is over;
its end ``</s>`` is scored, as in batch scoring). Nothing else; a bad line is reported
(``file:line: problem``) and skipped, never fatal. An event after a session's end opens a
new session with the same id.

:class:`StreamScorer` keeps, per open session, the recurrent state after all its events
but the last, the last event's id, and running scores
(:class:`~rnnkit.anomaly.scores.RunningScore`).
When event ``e_t`` arrives, ONE step of the model on ``e_{t-1}`` (:func:`step_function`)
gives ``p(· | e_<t)``, so the work per event is O(1) whatever the session's length, and
the scores equal batch scores (:func:`rnnkit.app.tasks.events.score_sessions`) of the same
sessions up to float rounding.
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

import os
import select
import stat
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple, Protocol, cast

import numpy as np
import torch

from rnnkit.anomaly.scores import RUNNING_SCORES, RunningScore, surprise_and_rank
from rnnkit.data.events import MAX_LINE_BYTES
from rnnkit.data.limits import MAX_JSON_LINE_BYTES, loads_json
from rnnkit.data.vocab import BOS_ID, EOS_ID, SPECIALS, UNK_ID
from rnnkit.errors import ConfigError, DataError
from rnnkit.types import LSTMState

__all__ = [
    "OVERLONG",
    "StreamItem",
    "StreamScorer",
    "follow_lines",
    "parse_stream_line",
    "scores_array",
    "step_function",
]

_KEYS = ("session", "event", "events", "end")
_END = object()  # a queued session end
#: Stands for a line longer than MAX_LINE_BYTES in what :func:`follow_lines` yields.
OVERLONG = b"\0overlong"


class StreamItem(NamedTuple):
    """One input line: events of a session, and whether the session ends after them."""

    session: str
    events: tuple[str, ...]
    end: bool = False


def parse_stream_line(
    text: str | bytes, path: str | None = None, line: int | None = None
) -> StreamItem:
    """Parse one line of the streaming format (see the module docstring).

    Raises:
        DataError: naming ``path:line`` and the problem.

    >>> parse_stream_line('{"session": 7, "event": "open", "end": true}')
    StreamItem(session='7', events=('open',), end=True)
    >>> parse_stream_line('{"session": "a"}', "in.jsonl", 3)
    Traceback (most recent call last):
    ...
    rnnkit.errors.DataError: in.jsonl:3: session 'a': no "event", "events" or "end": true
    """

    def fail(message: str) -> DataError:
        return DataError(message, path=path, line=line)

    if isinstance(text, bytes):
        if text is OVERLONG:
            limit = MAX_JSON_LINE_BYTES.value(default=MAX_LINE_BYTES)
            raise fail(MAX_JSON_LINE_BYTES.exceeded("line too long", limit))
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise fail(f"not valid UTF-8 (byte {exc.start + 1} of the line)") from None
    # Deep nesting and 5,000-digit integers are DataErrors naming path:line here too.
    record = loads_json(text, path, line)
    if not isinstance(record, dict):
        raise fail("expected a JSON object")
    unknown = [k for k in record if k not in _KEYS]
    if unknown:
        raise fail(f"unknown key {unknown[0]!r} (expected session, event or events, end)")
    sid = record.get("session")
    if isinstance(sid, bool) or not isinstance(sid, (str, int)) or sid == "":
        raise fail("'session' must be a non-empty string or an integer")
    sid = str(sid)
    if "event" in record and "events" in record:
        raise fail(f"session {sid!r}: both 'event' and 'events'")
    events = [record["event"]] if "event" in record else record.get("events", [])
    if not isinstance(events, list):
        raise fail(f"session {sid!r}: 'events' must be a list")
    for e in events:
        if not isinstance(e, str) or not e:
            raise fail(f"session {sid!r}: an event must be a non-empty string, got {e!r}")
    end = record.get("end", False)
    if not isinstance(end, bool):
        raise fail(f"session {sid!r}: 'end' must be true or false")
    if not events and not end:
        raise fail(f'session {sid!r}: no "event", "events" or "end": true')
    return StreamItem(sid, tuple(events), end)


class EventEncoder(Protocol):
    """What the scorer needs of a vocabulary (:class:`~rnnkit.app.tasks.events.EventVocabulary`)."""

    def encode_event(self, event: str) -> int: ...


class _StatePool:
    """Recurrent states of open sessions, one row each, in one tensor per state part.

    Rows are recycled through a free list; the pool doubles up to ``capacity`` rows.
    """

    def __init__(self, model: torch.nn.Module, capacity: int) -> None:
        enc: Any = model.encoder  # the model's recurrent stack (duck-typed)
        param = next(model.parameters())
        self.is_lstm = bool(enc.is_lstm)
        self.shape = (int(enc.num_layers), int(enc.num_directions), int(enc.hidden_size))
        self.capacity = capacity
        self._dtype, self._device = param.dtype, param.device
        self.parts: list[torch.Tensor] = []
        self.free: list[int] = []
        self._grow(min(capacity, 64))

    def _grow(self, rows: int) -> None:
        L, D, H = self.shape
        old = self.parts[0].shape[2] if self.parts else 0
        new = [
            torch.zeros(L, D, rows, H, dtype=self._dtype, device=self._device)
            for _ in range(2 if self.is_lstm else 1)
        ]
        for part, prev in zip(new, self.parts, strict=False):
            part[:, :, :old] = prev
        self.parts = new
        self.free.extend(range(rows - 1, old - 1, -1))

    def alloc(self) -> int:
        if not self.free:
            self._grow(min(self.capacity, 2 * self.parts[0].shape[2]))
        row = self.free.pop()
        for part in self.parts:
            part[:, :, row] = 0.0
        return row

    def release(self, row: int) -> None:
        self.free.append(row)

    def gather(self, rows: torch.Tensor) -> Any:
        taken = [part.index_select(2, rows) for part in self.parts]
        return LSTMState(*taken) if self.is_lstm else taken[0]

    def scatter(self, rows: torch.Tensor, state: Any) -> None:
        for part, new in zip(self.parts, state if self.is_lstm else (state,), strict=True):
            part.index_copy_(2, rows, new)

    def bytes_per_session(self) -> int:
        L, D, H = self.shape
        return len(self.parts) * L * D * H * self.parts[0].element_size()


def step_function(model: torch.nn.Module) -> Callable[[torch.Tensor, Any], tuple[Any, Any]]:
    """``(tokens (B,), state) -> (log-probabilities (B, V), state)`` for one event.

    For a :class:`~rnnkit.models.language_model.LanguageModel` in eval mode this calls the
    cells of its unidirectional stack directly (embedding → cell of each layer → head):
    the same function as ``model.step`` without the whole-sequence machinery around a
    one-step sequence, about 4× less overhead per event on CPU. Anything else falls back
    to ``model.step``.

    >>> from rnnkit.models import ModelSpec, build_language_model
    >>> lm = build_language_model(ModelSpec(hidden=5, embedding=3, layers=2), 7)
    >>> lm = lm.eval()
    >>> tokens = torch.tensor([4, 5])
    >>> fast, state = step_function(lm)(tokens, None)
    >>> slow, _ = lm.step(tokens)
    >>> bool(torch.allclose(fast, slow, atol=1e-6)), tuple(state.h.shape)
    (True, (2, 1, 2, 5))
    """
    encoder = getattr(model, "encoder", None)
    parts = ("embedding", "head", "step")
    if (
        encoder is None
        or not all(hasattr(model, name) for name in parts)
        or not hasattr(encoder, "cells")
        or encoder.num_directions != 1
    ):
        return model.step  # type: ignore[return-value]
    cells = encoder.cells()
    is_lstm = bool(encoder.is_lstm)
    embedding = cast(torch.nn.Module, model.embedding)
    head = cast(torch.nn.Module, model.head)
    slow_step = cast(Callable[..., tuple[torch.Tensor, Any]], model.step)

    @torch.no_grad()
    def step(tokens: torch.Tensor, state: Any) -> tuple[torch.Tensor, Any]:
        if model.training:  # dropout would make the fast path differ from model.step
            return slow_step(tokens, state)
        x = embedding(tokens)  # (B, E)
        new = []
        for layer, cell in enumerate(cells):
            if state is None:
                prev = None
            elif is_lstm:
                prev = LSTMState(state.h[layer, 0], state.c[layer, 0])
            else:
                prev = state[layer, 0]
            s = cell(x, prev)
            new.append(s)
            x = s.h if is_lstm else s  # (B, H)
        log_probs = torch.log_softmax(head(x), dim=-1)  # (B, V)
        if is_lstm:
            h = torch.stack([s.h for s in new])[:, None]  # (L, 1, B, H)
            c = torch.stack([s.c for s in new])[:, None]
            return log_probs, LSTMState(h, c)
        return log_probs, torch.stack(new)[:, None]

    return step


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
            raise ConfigError(f"--max-sessions must be ≥ 1, got {max_sessions}")
        if idle_timeout is not None and not idle_timeout > 0:
            raise ConfigError(f"--idle-timeout must be > 0 seconds, got {idle_timeout}")
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
        self._pool = _StatePool(model, max_sessions)
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
        device = self._device
        rows = torch.tensor([rec.row for _, rec, _ in ops], dtype=torch.long, device=device)
        tokens = torch.tensor([rec.last for _, rec, _ in ops], dtype=torch.long, device=device)
        targets = [EOS_ID if e is _END else self.vocab.encode_event(e) for _, _, e in ops]
        log_probs, state = self._step(tokens, self._pool.gather(rows))
        self._pool.scatter(rows, state)
        target_t = torch.tensor(targets, dtype=torch.long, device=log_probs.device)
        surprise, rank = surprise_and_rank(log_probs.float(), target_t)
        surprise_np = surprise.double().cpu().numpy()
        miss_np = (rank >= self.top_g).cpu().numpy()
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


def follow_lines(
    source: str,
    *,
    follow: bool = True,
    poll: float = 0.2,
    until_idle: float | None = None,
    read_size: int = 1 << 16,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[list[tuple[int, bytes]]]:
    """Complete lines of a growing file or a pipe, in batches as they arrive.

    Yields a list of ``(line number, line bytes without newline)`` per read; an empty list
    when ``poll`` seconds passed without a complete line (so the caller can close idle
    sessions). A line longer than :data:`~rnnkit.data.events.MAX_LINE_BYTES` is yielded
    as :data:`OVERLONG`. Blank lines are skipped (their numbers still count).

    Args:
        source: a path, or ``"-"`` for standard input.
        follow: at the end of a regular file, wait for more (``tail -f``); a pipe ends
            when its writer closes it.
        poll: seconds between checks for new data.
        until_idle: stop after this many seconds without new data (None: never).

    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "e.jsonl")
    >>> with open(path, "w") as f:
    ...     _ = f.write('{"a": 1}\\n\\n{"b": 2}\\n{"c": 3}')
    >>> [batch for batch in follow_lines(path, follow=False) if batch]
    [[(1, b'{"a": 1}'), (3, b'{"b": 2}')], [(4, b'{"c": 3}')]]
    """
    if source == "-":
        fd, owned = 0, False
    else:
        fd, owned = os.open(source, os.O_RDONLY), True
    try:
        limit = MAX_JSON_LINE_BYTES.value(default=MAX_LINE_BYTES)
        regular = stat.S_ISREG(os.fstat(fd).st_mode)
        buffer = b""
        number = 0
        skipping = False  # inside an overlong line, until its newline
        last_data = clock()
        offset = 0
        tail = b""  # the last bytes read, up to offset: to notice a file rewritten under us
        while True:
            if regular:
                size = os.fstat(fd).st_size
                if size < offset or (tail and os.pread(fd, len(tail), offset - len(tail)) != tail):
                    # Truncated (log rotation by copytruncate), even if it has grown back
                    # past our offset since: start over at 0. A partial line of the old
                    # content is dropped, never joined to the new content.
                    os.lseek(fd, 0, os.SEEK_SET)
                    offset, buffer, tail, number, skipping = 0, b"", b"", 0, False
                chunk = os.read(fd, read_size)
                if not chunk and owned and follow and _renamed(fd, source):
                    # The name now points to a new file (rotation by rename, as `tail -F`
                    # follows): one last read of the old file, then its last line ends
                    # there and the new file is read from its start.
                    chunk = os.read(fd, read_size)
                    if not chunk:
                        if buffer.strip() and not skipping:
                            yield [(number + 1, buffer.rstrip(b"\r"))]
                        os.close(fd)
                        fd = os.open(source, os.O_RDONLY)
                        regular = stat.S_ISREG(os.fstat(fd).st_mode)
                        offset, buffer, tail, number, skipping = 0, b"", b"", 0, False
                        continue
                if not chunk:
                    if not follow:
                        break
                    if until_idle is not None and clock() - last_data >= until_idle:
                        break
                    time.sleep(poll)
                    yield []
                    continue
            else:
                ready, _, _ = select.select([fd], [], [], poll)
                if not ready:
                    if until_idle is not None and clock() - last_data >= until_idle:
                        break
                    yield []
                    continue
                chunk = os.read(fd, read_size)
                if not chunk:
                    break  # the writer closed the pipe
            offset += len(chunk)
            tail = (tail + chunk)[-64:]
            last_data = clock()
            buffer += chunk
            lines = buffer.split(b"\n")
            buffer = lines.pop()
            batch = []
            for raw in lines:
                number += 1
                if skipping:
                    skipping = False
                    continue
                if len(raw) > limit:
                    batch.append((number, OVERLONG))
                elif raw.strip():
                    batch.append((number, raw.rstrip(b"\r")))
            if len(buffer) > limit:
                number += 1
                batch.append((number, OVERLONG))
                buffer, skipping = b"", True
            if batch:
                yield batch
        if buffer.strip() and not skipping:
            yield [(number + 1, buffer.rstrip(b"\r"))]  # a last line without newline
    finally:
        if owned:
            os.close(fd)


def _renamed(fd: int, path: str) -> bool:
    """Whether ``path`` names another file than the open ``fd`` now (a rotation). While
    the name is missing (between the rename and the new file), keep the old one."""
    try:
        now = os.stat(path)
    except FileNotFoundError:
        return False
    old = os.fstat(fd)
    return (now.st_ino, now.st_dev) != (old.st_ino, old.st_dev)


def scores_array(verdicts: Iterable[dict[str, Any]], name: str = "max") -> np.ndarray:
    """The ``scores[name]`` of closing verdicts, in order (for comparisons and tests).

    >>> scores_array([{"closed": True, "scores": {"max": 1.5}}, {"closed": False}])
    array([1.5])
    """
    return np.array([v["scores"][name] for v in verdicts if v.get("closed")], dtype=np.float64)
