"""What every task writes at the end of a run: ``summary.json`` with the run's course
(``trajectory``) that the "behind baseline" diagnosis reads, checked against the run's
own ``metrics.jsonl`` for each task."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rnnkit.app.tasks.run_outputs import _whole_run
from rnnkit.training.options import TrainResult
from rnnkit.training.trajectory import trajectory

TINY = ["--hidden", "8", "--batch-size", "8", "--steps", "6", "--eval-every", "2"]
TINY += ["--seed", "0", "--quiet", "--no-report", "--threads", "1"]


@pytest.fixture(autouse=True, scope="module")
def _one_thread(single_thread):
    yield


def _cases(d: Path) -> dict[str, list[str]]:
    return {
        "lm": ["--task", "lm", "--train", str(d / "text.txt")],
        "tag": ["--task", "tag", "--train", str(d / "tags.tsv")],
        "classify": ["--task", "classify", "--train", str(d / "labels.tsv")],
        "seq2seq": ["--task", "seq2seq", "--train", str(d / "pairs.tsv")],
        "events": ["--task", "events", "--train", str(d / "sessions.jsonl"), "--valid",
                   str(d / "valid.jsonl")],
        "regress": ["--task", "regress", "--train", str(d / "seq.jsonl"), "--valid",
                    str(d / "seq-valid.jsonl")],
        "classify-vectors": ["--task", "classify", "--inputs", "vectors", "--train",
                             str(d / "labelled.jsonl")],
    }  # fmt: skip


@pytest.mark.parametrize("name", list(_cases(Path("."))))
def test_every_task_writes_the_course_of_its_run(task_data, run_cli, tmp_path, name):
    out = tmp_path / "run"
    code, _, err = run_cli("train", *_cases(task_data)[name], "--out", str(out), *TINY)
    assert code == 0, err[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    events = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [e["loss_nats"] for e in events if e["event"] == "train"]
    key = "loss" if name == "regress" else "loss_nats"
    valid = {e["step"]: e[key] for e in events if e["event"] == "valid"}
    best = summary["valid"]["step"]
    assert len(train) == 6 and sorted(valid) == [2, 4, 6]
    course = summary["trajectory"]
    # six records, one a step: the five nearest the best step, and the last five
    at_best, end = np.array(train[:5] if best < 4 else train[1:]), np.array(train[1:])
    assert course == {
        "best_step": best,
        "last_valid_step": 6,
        "train_loss_at_best": pytest.approx(at_best.mean()),
        "train_loss_end": pytest.approx(end.mean()),
        "train_loss_change_se": pytest.approx(
            np.sqrt(at_best.var(ddof=1) / 5 + end.var(ddof=1) / 5)
        ),
        "valid_loss_best": pytest.approx(valid[best]),
        "valid_loss_last": pytest.approx(valid[6]),
        "valids_after_best": sum(step > best for step in valid),
        "valids": len(valid),
        "valid_every": 2,  # validations at steps 2 and 4 before the last
        "train_records": 6,
    }


def test_a_resumed_run_reads_its_course_from_the_whole_run(task_data, run_cli, tmp_path):
    """The best validation came before the resume: the events in memory since then do
    not hold it, metrics.jsonl does (a line cut by a crash and the steps a crashed attempt
    logged past its snapshot are left out)."""
    out = tmp_path / "run"
    args = [*_cases(task_data)["lm"], "--out", str(out), *TINY, "--lr", "1.0"]
    assert run_cli("train", *args, "--steps", "4")[0] == 0
    log = out / "metrics.jsonl"
    before = [json.loads(line) for line in log.read_text().splitlines()]
    with log.open("a") as f:  # a crashed attempt: steps past the snapshot, a cut line
        f.write(json.dumps({"event": "train", "step": 5, "loss_nats": 99.0}) + "\n")
        f.write(json.dumps({"event": "valid", "step": 6, "loss_nats": 0.5}) + '\n{"event":')
    stale = len(log.read_text().splitlines())
    code, _, err = run_cli("train", *args, "--steps", "6", "--resume")
    assert code == 0, err[-2000:]
    after = [json.loads(line) for line in log.read_text().splitlines()[stale:]]
    summary = json.loads((out / "summary.json").read_text())
    best = summary["valid"]["step"]
    assert best == 4 and [e["step"] for e in after if e["event"] == "valid"] == [6]
    course = summary["trajectory"]
    assert course == trajectory(before + after, best)
    assert course["train_records"] == 6 and course["last_valid_step"] == 6
    assert after[0] == {"event": "resumed", "step": 4}  # the attempt's mark in the log


def test_the_resumed_attempts_own_events_are_not_read_twice(tmp_path):
    """The log holds this attempt's mark (and whatever it logs at its first step) as the
    memory does: read from both, the mark was counted twice."""
    first = [_event("train", s) for s in range(1, 5)] + [_event("valid", 4)]
    mark = {"event": "resumed", "step": 4}
    resumed = [mark, *(_event("train", s, 0.5) for s in range(5, 7))]
    _write_log(tmp_path, [*first, _event("train", 5, 9.9), *resumed])
    result = TrainResult(steps=6, epochs_done=1, train_loss_nats=0.5, best_valid=None)
    result.history, result.first_step, result.events_logged = resumed, 4, len(resumed)
    assert _whole_run(tmp_path, result) == first + resumed


def test_an_unreadable_log_leaves_the_events_in_memory(tmp_path, capsys):
    history = [{"event": "train", "step": 5, "loss_nats": 1.0}]
    result = TrainResult(steps=5, epochs_done=1, train_loss_nats=1.0, best_valid=None)
    result.history, result.first_step = history, 4
    (tmp_path / "metrics.jsonl").mkdir()  # not a regular file: read_metrics refuses it
    assert _whole_run(tmp_path, result) == history
    assert "metrics.jsonl" in capsys.readouterr().err
    (tmp_path / "metrics.jsonl").rmdir()  # no log at all: nothing before the resume
    assert _whole_run(tmp_path, result) == history


def test_a_run_longer_than_the_memory_reads_its_course_from_the_log(
    task_data, run_cli, tmp_path, monkeypatch
):
    """The memory keeps the last HISTORY_EVENTS events only (patched to 3 of the run's 9:
    the validation at step 6, and the last two records): the course is read from
    metrics.jsonl, and equals the one computed from every event."""
    monkeypatch.setattr("rnnkit.training.run_log.HISTORY_EVENTS", 3)
    out = tmp_path / "run"
    code, _, err = run_cli("train", *_cases(task_data)["lm"], "--out", str(out), *TINY)
    assert code == 0, err[-2000:]
    assert "left out" not in err
    events = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(events) == 9  # 6 training records, 3 validations
    summary = json.loads((out / "summary.json").read_text())
    course = summary["trajectory"]
    assert course == trajectory(events, summary["valid"]["step"])
    assert course["train_records"] == 6 and course["last_valid_step"] == 6


def _event(kind: str, step: int, loss: float = 1.0) -> dict:
    return {"event": kind, "step": step, "loss_nats": loss}


def _write_log(run: Path, events: list[dict]) -> None:
    (run / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))


def test_a_resumed_run_longer_than_the_memory_reads_both_attempts_from_the_log(tmp_path):
    # First attempt: steps 1-4 and a snapshot at 4, then a crash after logging step 5.
    # The resumed attempt (from step 4) logged steps 5-8; the memory kept its last 2.
    first = [_event("train", s, 3.0 - s / 10) for s in range(1, 5)]
    first += [_event("valid", 4, 2.9), _event("train", 5, 9.9)]
    resumed = [_event("train", s, 2.0 - s / 10) for s in range(5, 9)] + [_event("valid", 8)]
    _write_log(tmp_path, first + resumed)
    result = TrainResult(steps=8, epochs_done=1, train_loss_nats=1.2, best_valid=None)
    result.history, result.first_step, result.events_logged = resumed[-2:], 4, len(resumed)
    # the first attempt up to its snapshot (its step 5 was trained again), then the second
    assert _whole_run(tmp_path, result) == first[:5] + resumed
    assert trajectory(_whole_run(tmp_path, result), 4)["train_records"] == 8


def test_a_log_that_does_not_end_with_the_events_in_memory_leaves_them(tmp_path, capsys):
    events = [_event("train", s) for s in range(1, 5)]
    result = TrainResult(steps=4, epochs_done=1, train_loss_nats=1.0, best_valid=None)
    result.history, result.events_logged = events[-2:], 4
    _write_log(tmp_path, [*events[:2], _event("train", 9)])  # 3 lines, not 4
    assert _whole_run(tmp_path, result) == events[-2:]
    assert "does not end with this run's events" in capsys.readouterr().err
    _write_log(tmp_path, [*events[:3], _event("train", 9)])  # 4, not ending as the memory
    assert _whole_run(tmp_path, result) == events[-2:]
    assert "course of the run before its last 2 events is left out" in capsys.readouterr().err
