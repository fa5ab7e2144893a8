"""The whole-task benchmark (benchmarks/bench_tasks.py) records every task it finishes:
one task that fails is a row saying so, the others still run, and ``--out`` holds the
rows so far after each task (the GPU suite stops it at a time limit)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_tasks
import gpu_tables


def _tiny_task(gen):
    """Two contenders that cost nothing, 10 units of work."""
    return {"rnnkit": lambda: None, "torch.nn": lambda: None}, 10


def test_a_failing_task_is_a_row_and_the_others_run(tmp_path, monkeypatch, capsys) -> None:
    def broken(gen):
        raise RuntimeError("Expected all tensors to be on the same device")

    monkeypatch.setattr(bench_tasks, "task_lm", _tiny_task)
    monkeypatch.setattr(bench_tasks, "task_tag", broken)
    monkeypatch.setattr(bench_tasks, "task_events", _tiny_task)
    times = {"rnnkit": [1e-3, 1e-3, 1e-3], "torch.nn": [2e-3, 2e-3, 2e-3]}
    monkeypatch.setattr(bench_tasks, "interleaved", lambda fns, **kw: times)
    out = tmp_path / "tasks.json"
    status = bench_tasks.main(["--tasks", "lm,tag,events", "--json", "--out", str(out)])
    assert status == 1  # a task failed
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(out.read_text())
    rows = printed["rows"]
    assert [r["task"] for r in rows] == ["lm", "tag", "events"]
    assert rows[1]["error"] == "RuntimeError: Expected all tensors to be on the same device"
    assert rows[0]["ratio"] == pytest.approx(2.0) and rows[2]["rnnkit_per_s"] == 10 / 1e-3
    table = gpu_tables.tasks_table(printed)
    assert table[3] == "| tag | failed | – | – |"
    assert table[2] == "| lm | 10,000 tokens | 5,000 | 2.00 |"


def test_the_file_holds_the_tasks_finished_before_a_stop(tmp_path, monkeypatch) -> None:
    def stopped(gen):
        raise KeyboardInterrupt  # as the suite's `timeout` stops the process

    monkeypatch.setattr(bench_tasks, "task_lm", _tiny_task)
    monkeypatch.setattr(bench_tasks, "task_tag", stopped)
    monkeypatch.setattr(bench_tasks, "interleaved", lambda fns, **kw: {k: [1e-3] for k in fns})
    out = tmp_path / "tasks.json"
    with pytest.raises(KeyboardInterrupt):
        bench_tasks.main(["--tasks", "lm,tag", "--json", "--out", str(out)])
    assert [r["task"] for r in json.loads(out.read_text())["rows"]] == ["lm"]


def test_every_contender_keeps_its_tensors_on_the_device(monkeypatch, capsys) -> None:
    """``--device cuda`` runs where no test can: on a stand-in device
    (``tests/device_placement.py``) every task's contenders, the hand-written torch.nn
    decoders included, run once with nothing made on the host meeting the device (their
    greedy and beam searches made their tensors on the host, which failed on a GPU)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from device_placement import DEVICE, DevicePlacement

    def once(fns, **kw):
        for fn in fns.values():
            fn()
        return {k: [1e-3] for k in fns}

    monkeypatch.setattr(bench_tasks, "interleaved", once)
    monkeypatch.setattr(bench_tasks, "DECODE_TRAIN", {**bench_tasks.DECODE_TRAIN})
    with DevicePlacement() as placed:
        assert bench_tasks.main(["--device", str(DEVICE), "--json", "--decode-train", "1"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["task"] for r in rows] == list(bench_tasks.TASKS)
    assert not placed.violations, dict(placed.violations)
