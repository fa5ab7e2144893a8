"""What ``rnnkit score`` does once its options are checked: read the sessions (JSON
lines or strace output, a file or standard input), score them in one of three ways and
print one JSON line per record and a summary line on stderr.

:func:`run_batch` scores whole sessions with an ``events`` run (and, given ``--params``,
a parameter-value run beside it), :func:`run_params` with a ``params`` run alone, and
:func:`run_follow` event lines as they arrive (``--follow``).
"""

from __future__ import annotations

import re
import sys
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

from rnnkit import messages
from rnnkit.app.cli.score_config import ScoreConfig
from rnnkit.app.cli.stdout import stdin_as_log
from rnnkit.errors import ConfigError, DataError

__all__ = ["run_batch", "run_follow", "run_params"]

_STRACE_LINE = re.compile(r"^\s*(?:\[pid\s+\d+\]\s+|\d+\s+)?(?:[\d:.]+\s+)?[a-z_0-9]+\(")


def _print(record: dict[str, Any]) -> None:
    from rnnkit.training.checkpoint import dumps_strict

    sys.stdout.write(dumps_strict(record, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def _note(message: str) -> None:
    messages.info(message, who="rnnkit score")


def _hint_strace(path: str) -> str:
    if path == "-":
        return ""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            first = f.readline(4096)
    except OSError:
        return ""
    return (
        " (this looks like strace output: add --from strace)" if _STRACE_LINE.match(first) else ""
    )


def _items(config: ScoreConfig) -> Iterator[tuple[Any, str, int]]:
    """``(session, file, line)`` of every input session (strace sessions: line 0)."""
    if config.source == "strace":
        from rnnkit.data.strace import parse_strace

        if config.data == "-":
            try:
                with stdin_as_log() as stream:  # lines as `rnnkit sessions -` reads them
                    sessions, stats = parse_strace(
                        stream,
                        with_result=config.with_result,
                        per=config.per,  # type: ignore[arg-type]
                    )
            except DataError as exc:  # lines given, no file: name the input as others do
                raise DataError(exc.message, exc.path or "<stdin>", exc.line) from None
        else:
            sessions, stats = parse_strace(
                config.data,
                with_result=config.with_result,
                per=config.per,  # type: ignore[arg-type]
            )
        if stats.skipped and not config.quiet:
            source, line = stats.first_skipped[0]
            source = _named(config.data) if config.data == "-" else source  # lines: "strace"
            _note(f"skipped {stats.skipped} non-strace line(s) (first at {source}:{line})")
        for session in sessions:
            yield session, _named(config.data), 0
        return
    from rnnkit.data.events import iter_sessions

    def read(fileobj: Any, path: str) -> Iterator[tuple[Any, str, int]]:
        try:
            for line, session in iter_sessions(fileobj, path):
                yield session, path, line
        except DataError as exc:
            if exc.line == 1 and exc.message.startswith("invalid JSON"):
                raise DataError(exc.message + _hint_strace(config.data), exc.path, 1) from None
            raise

    if config.data == "-":
        yield from read(sys.stdin.buffer, "<stdin>")
    else:
        with open(config.data, "rb") as fileobj:
            yield from read(fileobj, config.data)


def _thresholds(config: ScoreConfig, run: Any) -> tuple[dict[str, dict[str, float]], str]:
    """The thresholds the verdicts use, and how the verdict score's was set (the summary
    line says it: ``gpd`` may have fallen back to the empirical quantile)."""
    from rnnkit.app.tasks.events.thresholds import repick_thresholds_explained

    name = config.score or run.thresholds["score"]
    if config.target_fpr is not None:
        limits, hows = repick_thresholds_explained(
            config.checkpoint, config.target_fpr, config.threshold_method or "quantile"
        )
        how = f"target FPR {config.target_fpr:g}: {hows['rnn'][name]}"
    else:
        limits = {m: dict(run.thresholds[m]) for m in ("rnn", "ngram")}
        recorded = run.thresholds.get("how")
        saved = recorded.get("rnn") if isinstance(recorded, dict) else None
        saved = saved.get(name) if isinstance(saved, dict) else None
        if not isinstance(saved, str):  # an older run's file: its method, without the why
            method = run.thresholds.get("method")
            saved = f"--threshold-method {method}" if isinstance(method, str) else "quantile"
        fpr = run.thresholds.get("target_fpr")
        at = f"target FPR {fpr:g}: " if isinstance(fpr, (int, float)) else ""
        how = f"the run's threshold, {at}{saved}"
    if config.threshold is not None:
        from rnnkit.anomaly.scores import NONNEGATIVE_SCORES

        if config.threshold < 0 and name in NONNEGATIVE_SCORES:
            raise ConfigError(
                f"--threshold {config.threshold:g}: the {name} score is never negative, so "
                "every session would be anomalous; give a threshold ≥ 0"
            )
        limits["rnn"][name] = config.threshold
        how = "--threshold"
    return limits, how


def run_batch(config: ScoreConfig, run: Any, params_run: Any = None) -> int:
    """Whole sessions with an ``events`` run (and ``params_run`` beside it, if given):
    one record per session, in input order."""
    from rnnkit.app.tasks.events import score_sessions

    if config.score is not None:  # named as the option here (score_sessions: score=)
        run.check_score(config.score, "--score")
    limits, how = _thresholds(config, run)
    count = anomalous = unknown = by_params = 0
    empty = True
    pending: deque[tuple[Any, str, int]] = deque()
    failed: list[DataError] = []

    def tap() -> Iterator[Any]:
        # The sessions pass to the key model one by one; the params model gets each
        # again, with its file and line, when its verdict comes out (in order).
        try:
            for item in _items(config):
                pending.append(item)
                yield item[0]
        except DataError as exc:  # the sessions before the bad line are scored first
            failed.append(exc)

    records = score_sessions(
        run,
        tap(),
        batch_size=config.batch_size,
        top_k=config.top,
        score=config.score,
        thresholds=limits,
        ngram=config.ngram,
    )
    if params_run is not None:
        records = _with_params(records, pending, params_run, config)
    for record in records:
        empty = False
        count += 1
        if params_run is not None:
            by_params += record["params"]["verdict"] == "anomalous"
        anomalous += record["verdict"] == "anomalous"
        unknown += record["unknown"]
        _print(record)
    if failed:
        raise failed[0]
    if empty:
        raise DataError("no sessions (the input is empty)", _named(config.data))
    if not config.quiet:
        name = config.score or run.thresholds["score"]
        either = f" (parameter values: {by_params})" if params_run is not None else ""
        _note(
            f"{count} session(s), {anomalous} anomalous{either} ({name} score above "
            f"{limits['rnn'][name]:.4g}; {how}); {unknown} event(s) never seen in training "
            "(<unk>)"
        )
    return 0


def _with_params(
    records: Iterable[dict[str, Any]],
    pending: deque[tuple[Any, str, int]],
    params_run: Any,
    config: ScoreConfig,
) -> Iterator[dict[str, Any]]:
    """The key model's ``records`` with the parameter model's verdict of each session
    beside it (``combine``), in order: the sessions of ``pending`` (the key model's, as
    it read them) judged ``--batch-size`` at a time, not one by one — each key's
    regressor then runs once a batch (on a GPU one tiny forward and one read per session
    and key, before)."""
    from rnnkit.app.tasks.params import combine
    from rnnkit.app.tasks.params import score_sessions as score_params

    def judged(chunk: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        items = [pending.popleft() for _ in chunk]
        verdicts = score_params(
            params_run,
            items,
            batch_size=config.batch_size,
            top_k=config.top,
            confidence=config.confidence,
        )
        yield from map(combine, chunk, verdicts)

    chunk: list[dict[str, Any]] = []
    for record in records:
        chunk.append(record)
        if len(chunk) >= config.batch_size:
            yield from judged(chunk)
            chunk = []
    if chunk:
        yield from judged(chunk)


def run_params(config: ScoreConfig, device: str = "cpu") -> int:
    """A params run alone: one record per session."""
    from rnnkit.app.tasks.params import load_params, repick_session_score, score_sessions

    for flag, value in (
        ("--ngram", config.ngram),
        ("--score", config.score),
        ("--threshold", config.threshold),
        ("--params", config.params),
    ):
        if value:
            raise ConfigError(f"{flag} applies to an events checkpoint, not a params run")
    if config.follow or config.source != "sessions":
        raise ConfigError("a params run scores JSON-lines sessions in batch (no --follow, strace)")
    run = load_params(config.checkpoint, device)
    session_score = None
    if config.target_fpr is not None:
        session_score = repick_session_score(
            config.checkpoint, config.target_fpr, config.threshold_method or "quantile"
        )
    limit = run.limit(config.confidence, session_score)
    count = anomalous = 0
    for record in score_sessions(
        run,
        _items(config),
        batch_size=config.batch_size,
        top_k=config.top,
        confidence=config.confidence,
        session_score=session_score,
    ):
        count += 1
        anomalous += record["verdict"] == "anomalous"
        _print(record)
    if not count:
        raise DataError("no sessions (the input is empty)", _named(config.data))
    if not config.quiet:
        _note(
            f"{count} session(s), {anomalous} anomalous (largest error z above {limit:.4g}: "
            f"the validated session threshold, at least the "
            f"{config.confidence or run.confidence:g} interval's {run.z(config.confidence):.4g})"
        )
    return 0


def run_follow(config: ScoreConfig, run: Any) -> int:
    """``--follow``: event lines as they arrive, a verdict when a session turns anomalous
    or closes."""
    from rnnkit.anomaly.follow import follow_lines
    from rnnkit.anomaly.scores import RUNNING_SCORES
    from rnnkit.anomaly.stream_format import parse_stream_line
    from rnnkit.anomaly.streaming import StreamScorer

    name = config.score or run.thresholds["score"]
    if config.score is None and name not in RUNNING_SCORES:
        # the run's own score needs whole sessions: stream by max, said once, not silently
        _note(
            f"the run gives verdicts by the {name} score, which needs whole sessions; "
            f"--follow gives them by max (its threshold from the same run; --score "
            f"{'/'.join(RUNNING_SCORES)} to choose)"
        )
        name = "max"
    if run.thresholds.get("window"):
        # Streaming carries one state per session over all its events: it cannot score
        # with the run's history window, and different scores would be silent.
        raise ConfigError(
            f"--follow carries each session's whole history; this run predicts from a "
            f"window of {run.thresholds['window']} events: score it in batch"
        )
    scorer = StreamScorer(
        run.model,
        run.vocab,
        threshold=_thresholds(config, run)[0]["rnn"][name],
        score=name,
        top_g=int(run.thresholds["top_g"]),
        top_k=config.top,
        max_sessions=config.max_sessions,
        idle_timeout=config.idle_timeout,
    )
    path = _named(config.data)
    bad = 0
    for lines in follow_lines(config.data, poll=config.poll, until_idle=config.until_idle):
        items = []
        for number, raw in lines:
            try:
                items.append(parse_stream_line(raw, path, number))
            except DataError as exc:
                bad += 1
                messages.warning(f"{exc} (line skipped)", who="rnnkit score")
        for verdict in scorer.feed(items):
            _print(verdict)
    for verdict in scorer.close_all("input ended"):
        _print(verdict)
    if not config.quiet:
        st = scorer.stats
        _note(
            f"{st['events']} event(s) in {st['sessions']} session(s), {st['anomalous']} "
            f"anomalous; {st['unknown']} event(s) never seen in training (<unk>); "
            f"{st['evicted']} evicted, {st['idle']} idle; {bad} bad line(s)"
            + (
                f"; {st['ends_without_session']} end(s) of no open session"
                if st["ends_without_session"]
                else ""
            )
        )
    return 0


def _named(data: str) -> str:
    """The input as the readers name it in their messages (``-`` is ``<stdin>``)."""
    return "<stdin>" if data == "-" else data
