"""Streaming scores: the line format, stream = batch, bounded memory, idle expiry, input."""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path

import pytest
import torch

from rnnkit.anomaly.streaming import (
    OVERLONG,
    StreamItem,
    StreamScorer,
    follow_lines,
    parse_stream_line,
    step_function,
)
from rnnkit.app.config import TrainConfig
from rnnkit.app.tasks.events import (
    EventsModel,
    EventVocabulary,
    score_sessions,
)
from rnnkit.app.tasks.run import model_spec
from rnnkit.data.events import MAX_LINE_BYTES, Session
from rnnkit.data.generated_sessions import generate_sessions
from rnnkit.errors import DataError
from rnnkit.models.builders import build_language_model
from rnnkit.models.spec import ModelSpec
from rnnkit.types import LSTMState

EVENTS = ["login:user", "login:admin", "open", "read", "close", "stat", "connect", "send"]
EVENTS += ["recv", "close_sock", "sudo", "write_cfg", "logout"]


@pytest.fixture(scope="module")
def run() -> EventsModel:
    """An untrained model: stream = batch holds for any weights."""
    torch.manual_seed(0)
    vocab = EventVocabulary(EVENTS)
    cfg = TrainConfig(task="events", train="x", hidden=12, embedding=6, layers=2)
    model = build_language_model(model_spec(cfg), len(vocab)).eval()
    thresholds = {
        "score": "max",
        "top_g": 3,
        "target_fpr": 0.01,
        "rnn": {"max": 3.0, "mean": 2.5, "count": 4.0},
        "ngram": {"max": 3.0, "mean": 2.5, "count": 4.0},
    }
    return EventsModel(cfg, vocab, model, thresholds, None)


def _scorer(run: EventsModel, **kw) -> StreamScorer:
    options = {"threshold": 3.0, "top_g": 3, "top_k": 4, **kw}
    return StreamScorer(run.model, run.vocab, **options)


def _interleave(sessions: list[Session], seed: int) -> list[StreamItem]:
    """One item per event, sessions interleaved at random, each ended by its last event."""
    rng = random.Random(seed)
    queues = {s.session: list(s.events) for s in sessions}
    items = []
    while queues:
        sid = rng.choice(sorted(queues))
        event = queues[sid].pop(0)
        items.append(StreamItem(sid, (event,), end=not queues[sid]))
        if not queues[sid]:
            del queues[sid]
    return items


# ---- the line format -------------------------------------------------------------------


def test_parse_forms() -> None:
    assert parse_stream_line(b'{"session": "a", "event": "x"}') == StreamItem("a", ("x",))
    assert parse_stream_line('{"session": 3, "events": ["x", "y"]}') == StreamItem("3", ("x", "y"))
    assert parse_stream_line('{"session": "a", "end": true}') == StreamItem("a", (), True)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "invalid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"session": "a", "event": "x", "lable": 1}', "unknown key 'lable'"),
        ('{"event": "x"}', "'session' must be"),
        ('{"session": true, "event": "x"}', "'session' must be"),
        ('{"session": "a", "event": ""}', "non-empty string"),
        ('{"session": "a", "event": 5}', "non-empty string"),
        ('{"session": "a", "events": "x"}', "must be a list"),
        ('{"session": "a", "event": "x", "events": ["y"]}', "both"),
        ('{"session": "a", "event": "x", "end": 1}', "'end' must be true or false"),
        ('{"session": "a", "events": []}', 'no "event"'),
    ],
)
def test_bad_lines_name_file_and_line(line: str, message: str) -> None:
    with pytest.raises(DataError, match=message) as info:
        parse_stream_line(line, "events.jsonl", 12)
    assert str(info.value).startswith("events.jsonl:12: ")


def test_bad_bytes_are_data_errors() -> None:
    with pytest.raises(DataError, match="UTF-8"):
        parse_stream_line(b'{"session": "\xff"}', "f", 1)
    with pytest.raises(DataError, match="line too long, over the limit"):
        parse_stream_line(OVERLONG, "f", 2)


# ---- stream = batch --------------------------------------------------------------------


@pytest.mark.parametrize("batch", [1, 7, 1000])
def test_stream_scores_equal_batch_scores(run: EventsModel, batch: int) -> None:
    sessions = generate_sessions(24, anomalies=6, seed=4)
    sessions[0].events.insert(2, "never-seen")  # an <unk> on both paths
    expected = {r["session"]: r for r in score_sessions(run, sessions, top_k=4)}
    scorer = _scorer(run)
    items = _interleave(sessions, seed=batch)
    verdicts = []
    for lo in range(0, len(items), batch):
        verdicts += scorer.feed(items[lo : lo + batch])
    closed = {v["session"]: v for v in verdicts if v["closed"]}
    assert set(closed) == set(expected) and scorer.open_sessions == 0
    for sid, want in expected.items():
        got = closed[sid]
        assert got["reason"] == "end"
        assert got["events"] == want["events"] and got["unknown"] == want["unknown"]
        for name in ("max", "mean"):
            assert got["scores"][name] == pytest.approx(want["scores"][name], abs=1e-5)
        assert got["scores"]["count"] == want["scores"]["count"]
        assert got["verdict"] == want["verdict"]
        assert [t["position"] for t in got["top"]] == [t["position"] for t in want["top"]]
        assert [t["event"] for t in got["top"]] == [t["event"] for t in want["top"]]
    assert closed[sessions[0].session]["unknown"] == 1
    assert scorer.stats["unknown"] == sum(r["unknown"] for r in expected.values())


@pytest.mark.parametrize(
    "options",
    [
        {"cell": "gru", "layers": 2},
        {"cell": "rnn", "tie_weights": True},
        {"cell": "lstm", "hidden": 6, "embedding": 6, "tie_weights": True},
    ],
)
def test_fast_step_is_the_models_step(options: dict) -> None:
    torch.manual_seed(1)
    spec = ModelSpec(**{"hidden": 5, "embedding": 3, **options})
    model = build_language_model(spec, 9).eval()
    step = step_function(model)
    tokens = torch.tensor([4, 5, 8])
    fast_state = slow_state = None
    for _ in range(3):
        fast, fast_state = step(tokens, fast_state)
        slow, slow_state = model.step(tokens, slow_state)
        torch.testing.assert_close(fast, slow, atol=1e-6, rtol=1e-5)
        if isinstance(slow_state, LSTMState):
            torch.testing.assert_close(tuple(fast_state), tuple(slow_state), atol=1e-6, rtol=1e-5)
        else:
            torch.testing.assert_close(fast_state, slow_state, atol=1e-6, rtol=1e-5)
        tokens = fast.argmax(-1)


def test_anomalous_line_comes_once_before_the_close(run: EventsModel) -> None:
    scorer = _scorer(run, threshold=-1.0)  # every event is above: flagged at the first
    out = scorer.feed([StreamItem("a", ("open", "read"))])
    assert [(v["reason"], v["closed"], v["position"]) for v in out] == [("anomalous", False, 0)]
    out = scorer.feed([StreamItem("a", ("close",), end=True)])
    assert [(v["reason"], v["closed"], v["verdict"]) for v in out] == [("end", True, "anomalous")]
    assert scorer.stats["anomalous"] == 1


def test_mean_score_is_judged_only_at_the_close(run: EventsModel) -> None:
    scorer = _scorer(run, threshold=-1.0, score="mean")
    assert scorer.feed([StreamItem("a", ("open", "read"))]) == []
    (verdict,) = scorer.feed([StreamItem("a", (), end=True)])
    assert verdict["verdict"] == "anomalous" and verdict["closed"]


def test_end_of_an_unknown_session_is_counted_not_fatal(run: EventsModel) -> None:
    scorer = _scorer(run)
    assert scorer.feed([StreamItem("ghost", (), end=True)]) == []
    assert scorer.stats["ends_without_session"] == 1


def test_a_session_id_reused_after_its_end_is_a_new_session(run: EventsModel) -> None:
    scorer = _scorer(run)
    out = scorer.feed([StreamItem("a", ("open",), end=True), StreamItem("a", ("open",), end=True)])
    assert [v["events"] for v in out] == [1, 1]
    assert out[0]["scores"] == pytest.approx(out[1]["scores"])


# ---- bounded memory --------------------------------------------------------------------


def test_eviction_bounds_open_sessions_and_state_memory(run: EventsModel) -> None:
    scorer = _scorer(run, max_sessions=5, idle_timeout=None)
    evicted = []
    for i in range(200):
        out = scorer.feed([StreamItem(f"s{i}", ("open", "read"))])
        evicted += [v for v in out if v["reason"] == "evicted"]
        assert scorer.open_sessions <= 5
    assert len(evicted) == 195 and scorer.stats["evicted"] == 195
    # Least recently active first, and the pool never grew past max_sessions rows.
    assert [v["session"] for v in evicted[:3]] == ["s0", "s1", "s2"]
    assert all(v["closed"] and v["events"] == 2 for v in evicted)
    assert scorer._pool.parts[0].shape[2] == 5
    per_session = scorer.state_bytes_per_session()
    assert per_session == 2 * 2 * 12 * 4  # LSTM h and c, 2 layers, H = 12, float32


def test_eviction_within_one_batch_keeps_every_session_in_order(run: EventsModel) -> None:
    scorer = _scorer(run, max_sessions=2, idle_timeout=None)
    items = [StreamItem(f"s{i}", ("open",)) for i in range(6)]
    out = scorer.feed(items)
    assert [v["session"] for v in out] == ["s0", "s1", "s2", "s3"]
    assert scorer.open_sessions == 2


def test_idle_sessions_are_closed(run: EventsModel) -> None:
    now = [0.0]
    scorer = _scorer(run, idle_timeout=10.0, clock=lambda: now[0])
    scorer.feed([StreamItem("old", ("open",))])
    now[0] = 8.0
    scorer.feed([StreamItem("new", ("open",))])
    now[0] = 15.0
    out = scorer.expire()
    assert [(v["session"], v["reason"]) for v in out] == [("old", "idle")]
    assert scorer.open_sessions == 1
    out = scorer.close_all()
    assert [(v["session"], v["reason"]) for v in out] == [("new", "input ended")]


# ---- reading a growing input -----------------------------------------------------------


def test_follow_a_growing_file(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_bytes(b'{"n": 1}\n{"n": 2')  # the second line is still being written

    def writer() -> None:
        time.sleep(0.15)
        with open(path, "ab") as f:
            f.write(b'}\n\n{"n": 3}\n')

    thread = threading.Thread(target=writer)
    thread.start()
    lines = [line for batch in follow_lines(str(path), poll=0.02, until_idle=0.5) for line in batch]
    thread.join()
    assert lines == [(1, b'{"n": 1}'), (2, b'{"n": 2}'), (4, b'{"n": 3}')]


def test_follow_a_pipe_until_its_writer_closes(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)

    def writer() -> None:
        with open(fifo, "wb") as f:
            f.write(b'{"a": 1}\n')
            f.flush()
            time.sleep(0.1)
            f.write(b'{"b": 2}')  # the last line has no newline

    thread = threading.Thread(target=writer)
    thread.start()
    batches = list(follow_lines(str(fifo), poll=0.02))
    thread.join()
    assert [line for batch in batches for line in batch] == [(1, b'{"a": 1}'), (2, b'{"b": 2}')]
    assert [] in batches  # the wait between the writes was reported (idle checks)


def test_overlong_line_is_reported_and_skipped(tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    with open(path, "wb") as f:
        f.write(b"x" * (MAX_LINE_BYTES + 10) + b"\n" + b'{"ok": 1}\n')
    lines = [line for batch in follow_lines(str(path), follow=False) for line in batch]
    assert lines[0] == (1, OVERLONG) and lines[1] == (2, b'{"ok": 1}')


def _lines_until(gen, count: int, limit: int = 200) -> list[tuple[int, bytes]]:
    """Drive a follow_lines generator (no threads: file operations happen between calls)
    until ``count`` lines have come, or ``limit`` idle polls have passed."""
    got: list[tuple[int, bytes]] = []
    for _ in range(limit):
        got += next(gen)
        if len(got) >= count:
            break
    return got


def test_follow_by_name_across_a_rename_rotation(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_bytes(b'{"n": 1}\n{"n": 2}\n')
    gen = follow_lines(str(path), poll=0.001)
    assert _lines_until(gen, 2) == [(1, b'{"n": 1}'), (2, b'{"n": 2}')]
    # logrotate without copytruncate: the writer still has the old file open and ends
    # its last line there after the rename; then a new file takes the name.
    os.rename(path, tmp_path / "events.jsonl.1")
    with open(tmp_path / "events.jsonl.1", "ab") as f:
        f.write(b'{"n": 3}\n{"n": 4')
    path.write_bytes(b'{"m": 1}\n{"m": 2}\n')
    got = _lines_until(gen, 4)
    # Nothing lost, nothing spliced: the old file to its end, then the new from its start.
    assert got == [(3, b'{"n": 3}'), (4, b'{"n": 4'), (1, b'{"m": 1}'), (2, b'{"m": 2}')]
    with open(path, "ab") as f:
        f.write(b'{"m": 3}\n')
    assert _lines_until(gen, 1) == [(3, b'{"m": 3}')]
    gen.close()


def test_follow_a_file_truncated_and_regrown_within_one_poll(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_bytes(b'{"n": 1}\n{"n": 2}\n')
    gen = follow_lines(str(path), poll=0.001)
    assert len(_lines_until(gen, 2)) == 2
    # copytruncate, then the writer logs more than before before we look again: the
    # file is longer than our offset, and reading on from it would splice mid-line.
    new = [f'{{"session": "s", "events": ["e{i}"]}}'.encode() for i in range(6)]
    with open(path, "r+b") as f:
        f.truncate(0)
        f.write(b"\n".join(new) + b"\n")
    got = _lines_until(gen, 6)
    assert got == list(enumerate(new, start=1))
    gen.close()
