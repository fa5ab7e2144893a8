"""Streaming scores: stream = batch, verdicts, bounded memory, idle expiry."""

from __future__ import annotations

import random

import pytest
import torch

from rnnkit.anomaly.stream_format import StreamItem
from rnnkit.anomaly.streaming import StreamScorer
from rnnkit.app.config import TrainConfig
from rnnkit.app.tasks.events import (
    EventsModel,
    EventVocabulary,
    score_sessions,
)
from rnnkit.app.tasks.settings import model_spec
from rnnkit.data.events import Session
from rnnkit.data.generated_sessions import generate_sessions
from rnnkit.models.builders import build_language_model

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


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_sessions": 0}, "^max_sessions must be ≥ 1, got 0$"),
        ({"idle_timeout": 0.0}, "^idle_timeout must be > 0 seconds or None, got 0.0$"),
    ],
)
def test_arguments_out_of_range_are_named_as_in_python(run: EventsModel, options, message):
    # They were named --max-sessions and --idle-timeout, the options of `rnnkit score`
    # (which checks its own before it makes a scorer: tests/app/cli/test_score_cli.py).
    from rnnkit.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        _scorer(run, **options)


def test_one_batched_step_reads_the_device_once(run: EventsModel, monkeypatch) -> None:
    """On a GPU (reads counted on the CPU, as the device would see them) a batched step
    of ``feed`` moves its ids in one copy and reads its surprises and ranks once, with
    the model's checks (before: three waits a step), with the same verdicts."""
    import sys
    from pathlib import Path

    from rnnkit import deferred as deferred_module
    from rnnkit.bptt.fused import use_fused

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))
    from host_reads import HostReads

    sessions = generate_sessions(6, anomalies=2, seed=5)
    items = _interleave(sessions, seed=1)
    with use_fused("fused"):
        want = _scorer(run).feed(items)
    monkeypatch.setattr(deferred_module, "waits", lambda tensor: True)  # as on a GPU
    scorer = _scorer(run)
    with use_fused("fused"), HostReads(run.model) as counted:
        got = [v for item in items for v in scorer.feed([item])]  # one step per item
    # a step per item, and one more for each session's end (its own step after the last
    # event's: one step per session per batch)
    assert sum(counted.sites.values()) == len(items) + len(sessions), dict(counted.sites)
    assert all(site.startswith("deferred.py:") for site in counted.sites), dict(counted.sites)

    def closed(verdicts):
        return {v["session"]: (v["verdict"], v["events"]) for v in verdicts if v["closed"]}

    assert closed(got) == closed(want) and len(closed(got)) == len(sessions)
