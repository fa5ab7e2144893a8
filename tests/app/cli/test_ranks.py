"""Error lines under torchrun: rank 0 says them at once, the others after a wait that
torchrun's SIGTERM usually cuts short; torchrun's error file gets the same line."""

from __future__ import annotations

import json

import pytest

from rnnkit.app.cli import ranks


@pytest.fixture
def waits(monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr(ranks.time, "sleep", slept.append)
    for name in ("RANK", "WORLD_SIZE", "TORCHELASTIC_ERROR_FILE"):
        monkeypatch.delenv(name, raising=False)
    return slept


def test_one_process_says_it_at_once_and_writes_no_error_file(waits, capsys):
    ranks.say_error("rnnkit train: error: x")
    assert capsys.readouterr().err == "rnnkit train: error: x\n"
    assert waits == [] and not ranks.is_other_rank()


@pytest.mark.parametrize(
    ("rank", "world", "other"), [("0", "2", False), ("1", "2", True), ("1", "1", False)]
)
def test_only_a_rank_other_than_0_of_several_waits(
    waits, monkeypatch, capsys, tmp_path, rank, world, other
):
    monkeypatch.setenv("RANK", rank)
    monkeypatch.setenv("WORLD_SIZE", world)
    error_file = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    ranks.say_error("rnnkit train: error: --steps: must be at least 1")
    assert ranks.is_other_rank() is other
    assert waits == ([ranks.OTHER_RANK_WAIT_S] if other else [])
    assert capsys.readouterr().err == "rnnkit train: error: --steps: must be at least 1\n"
    # torchrun's own reader of the file: its report shows the line as the "traceback"
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    failure = ProcessFailure(local_rank=0, pid=1, exitcode=2, error_file=str(error_file))
    assert failure.message["extraInfo"]["py_callstack"] == (
        "rnnkit train: error: --steps: must be at least 1"
    )
    assert failure.timestamp > 0
    assert json.loads(error_file.read_text())["message"]["message"] == failure.message["message"]


def test_an_unwritable_error_file_does_not_hide_the_error(waits, monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(tmp_path / "no" / "such" / "error.json"))
    ranks.say_error("rnnkit train: error: y")
    assert capsys.readouterr().err == "rnnkit train: error: y\n"


def test_the_error_file_has_the_time_of_the_failure_not_of_the_end_of_the_wait(
    monkeypatch, capsys, tmp_path
):
    """torchrun's root cause is the failure of the earliest time: a process that waited
    5 s before writing would lose to a process stopped by its failure meanwhile."""
    clock = [1000.0]
    monkeypatch.setattr(ranks.time, "time", lambda: clock[0])
    monkeypatch.setattr(ranks.time, "sleep", lambda s: clock.__setitem__(0, clock[0] + s))
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(tmp_path / "e1.json"))
    ranks.say_error("rnnkit train: error: bad.txt:2: invalid UTF-8")
    stamp = json.loads((tmp_path / "e1.json").read_text())["message"]["extraInfo"]["timestamp"]
    assert stamp == "1000" and clock[0] == 1000 + ranks.OTHER_RANK_WAIT_S


def test_a_process_stopped_by_another_says_it_at_once_and_leaves_the_root_cause(
    monkeypatch, capsys, tmp_path
):
    """A PeerLost: the line at once; the error file (with the time it is written) only
    after a wait longer than the failing process's, which torchrun usually cuts short."""
    clock = [1000.0]
    said_before_wait: list[str] = []

    def sleep(seconds: float) -> None:
        said_before_wait.append(capsys.readouterr().err)
        clock[0] += seconds

    monkeypatch.setattr(ranks.time, "time", lambda: clock[0])
    monkeypatch.setattr(ranks.time, "sleep", sleep)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(tmp_path / "e0.json"))
    ranks.say_error("rnnkit train: stopped: process 0 of 2: another process ...", True)
    assert said_before_wait == ["rnnkit train: stopped: process 0 of 2: another process ...\n"]
    assert ranks.AFTER_PEER_WAIT_S > ranks.OTHER_RANK_WAIT_S
    stamp = json.loads((tmp_path / "e0.json").read_text())["message"]["extraInfo"]["timestamp"]
    assert int(stamp) == 1000 + ranks.AFTER_PEER_WAIT_S


@pytest.mark.parametrize(
    ("rank", "after_peer", "order"),
    [
        ("0", False, ["said", "error file", "release"]),
        ("0", True, ["said", "release", "wait", "error file"]),
        ("1", True, ["said", "release", "wait", "error file"]),
        # rank 0 says it: torchrun's SIGTERM must be able to end this one in its wait
        ("1", False, ["release", "wait", "said", "error file"]),
    ],
)
def test_a_sigterm_held_since_training_failed_is_released_once_the_line_is_said(
    monkeypatch, capsys, tmp_path, rank, after_peer, order
):
    """Not before the line (it would end the process unsaid, the race of a process
    stopped by another's death), nor after a wait torchrun's SIGTERM should cut short."""
    events: list[str] = []

    def note(event: str) -> None:
        if capsys.readouterr().err:
            events.append("said")
        events.append(event)

    error_file = tmp_path / "e.json"
    monkeypatch.setattr(ranks.time, "sleep", lambda s: note("wait"))
    monkeypatch.setattr(ranks, "release_sigterm", lambda: note("release"))
    monkeypatch.setattr(ranks, "_error_file", lambda line, stamp: note("error file"))
    monkeypatch.setenv("RANK", rank)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    ranks.say_error("rnnkit train: stopped: ...", after_peer)
    assert events == order


@pytest.mark.parametrize(("rank", "said"), [("0", True), ("1", False)])
def test_a_stop_every_process_takes_is_said_by_rank_0_alone(waits, monkeypatch, capsys, rank, said):
    """Ctrl-C to ``torchrun``: every process stops after the same step, and the line
    ``stopped by SIGINT after step 405 …`` was printed twice (rank 1's after its wait)."""
    import argparse

    from rnnkit.app.cli.main import _said
    from rnnkit.training.interrupt import TrainingInterrupted

    monkeypatch.setenv("RANK", rank)
    monkeypatch.setenv("WORLD_SIZE", "2")

    def stopped(args):
        raise TrainingInterrupted("SIGINT after step 405; the checkpoint is saved")

    args = argparse.Namespace(command="train", func=stopped, device=None)
    assert _said(args) == 130
    line = "rnnkit train: stopped: SIGINT after step 405; the checkpoint is saved\n"
    assert capsys.readouterr().err == (line if said else "") and waits == []
