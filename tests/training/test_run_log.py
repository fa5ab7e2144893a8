"""The run's log: every event in metrics.jsonl, a bounded history, metrics.csv at the end."""

from __future__ import annotations

import json

from rnnkit.training.run_log import RunLog


def test_events_go_to_the_file_the_callbacks_and_a_bounded_history(tmp_path, monkeypatch):
    monkeypatch.setattr("rnnkit.training.run_log.HISTORY_EVENTS", 3)
    seen: list[dict] = []
    log = RunLog(tmp_path, True, [seen.append])
    events = [{"event": "train", "step": i, "loss_nats": 1.0 / i} for i in range(1, 6)]
    for event in events:
        log.write(event, total_steps=5)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == events == seen
    assert list(log.history) == events[-3:] and log.written == 5  # the log's last 5 lines
    log.csv_on_exit(None, None, None)
    rows = (tmp_path / "metrics.csv").read_text().splitlines()
    assert len(rows) == 1 + len(events) and "loss_nats" in rows[0]


def test_other_processes_keep_the_history_only(tmp_path):
    seen: list[dict] = []
    log = RunLog(tmp_path, False, [seen.append])
    log.write({"event": "valid", "step": 1, "loss_nats": 0.5})
    log.write_csv()
    assert list(tmp_path.iterdir()) == [] and seen == [] and len(log.history) == 1


def test_verbose_lines_name_what_the_rate_counts(tmp_path, caplog):
    from rnnkit import messages
    from rnnkit.training.run_log import counted

    assert [counted(t) for t in ("lm", "tag", "seq2seq", "events", "classify", "regress")] == [
        "tokens", "tokens", "tokens", "tokens", "examples", "values",
    ]  # fmt: skip
    event = {"event": "train", "step": 2, "epoch": 0, "loss_nats": 0.7, "tokens_per_s": 96.0}
    messages.set_verbosity(1)
    try:
        with caplog.at_level("DEBUG", logger="rnnkit"):
            RunLog(tmp_path, True, [], counts="examples").write(event, total_steps=4)
            RunLog(None, True, []).write(event, total_steps=4)
    finally:
        messages.set_verbosity(0)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "step 2/4 (epoch 0): loss 0.7000 nats, 96 examples/s",
        "step 2/4 (epoch 0): loss 0.7000 nats, 96 tokens/s",
    ]
