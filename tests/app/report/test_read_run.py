"""What the report reads of a run directory (rnnkit.app.report.run: read_run)."""

from __future__ import annotations

import json

from rnnkit.app.config import TrainConfig
from rnnkit.app.report.run import read_run
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
