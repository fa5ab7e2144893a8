"""What the report reads of a run directory (rnnkit.app.report.run: read_run)."""

from __future__ import annotations

import json

from rnnkit.app.config import TrainConfig
from rnnkit.app.report.run import data_files, read_run
from rnnkit.app.tasks.run_config import save_config
from rnnkit.training.manifest import skipping_checksums


def test_a_killed_attempts_steps_past_its_snapshot_are_not_drawn_twice(tmp_path):
    """An attempt killed at step 8 with its last snapshot at step 4, resumed there: the
    run's course is steps 2, 4 of the first attempt, then 6, 8, 10 of the second (the
    first attempt's 6 and 8 were trained again)."""
    save_config(tmp_path, TrainConfig(train="t.txt", task="lm"), data={})
    first = [("train", 2), ("valid", 2), ("train", 4), ("valid", 4), ("train", 6),
             ("valid", 6), ("train", 8)]  # fmt: skip
    second = [("train", 6), ("valid", 6), ("train", 8), ("train", 10), ("valid", 10)]
    lines = [
        json.dumps({"event": kind, "step": step, "loss_nats": float(10 * attempt + step)})
        for attempt, events in enumerate([first, second])
        for kind, step in events
    ]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    with skipping_checksums():  # a run still training has no manifest yet
        run = read_run(tmp_path)
    assert [(e["event"], e["step"]) for e in run.events] == [*first[:4], *second]
    assert [e["loss_nats"] for e in run.of("valid")] == [2.0, 4.0, 16.0, 20.0]


def test_a_data_file_changed_since_training_is_left_out_with_a_note(tmp_path):
    train, valid = tmp_path / "train.txt", tmp_path / "valid.txt"
    train.write_text("abc\n", encoding="utf-8")
    valid.write_text("abd\n", encoding="utf-8")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    save_config(run_dir, TrainConfig(train=str(train), valid=str(valid), task="lm"))
    with skipping_checksums():
        run = read_run(run_dir)
    assert data_files(run) == [valid, train] and not run.notes
    valid.write_text("xyz\n", encoding="utf-8")  # the same size, other content
    assert data_files(run) == [train]
    data_files(run)  # asked again (each section asks): one note
    assert run.notes == [
        f"The valid file ({valid}) has changed since training (its size or SHA-256 differs "
        "from the run's record); the sections that read it are left out."
    ]
