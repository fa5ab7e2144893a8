"""The logs of a run directory (``rnnkit.training.run_files``): a tampered summary is one
line naming it; a bad line of ``metrics.jsonl`` is skipped and counted."""

from __future__ import annotations

import json
import os

import pytest

from rnnkit.errors import CheckpointError
from rnnkit.training.run_files import read_metrics, read_summary


def test_a_missing_summary_is_empty_and_a_good_one_is_read(tmp_path):
    assert read_summary(tmp_path) == {}
    doc = {"steps": 6, "elapsed_s": 1.5, "valid": {"loss_nats": 1.2, "step": 6}, "x": "y"}
    (tmp_path / "summary.json").write_text(json.dumps(doc))
    assert read_summary(tmp_path) == doc


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[" * 100_000, "nested too deeply"),
        ('{"steps": "six"}', "steps must be an integer"),
        ('{"elapsed_s": true}', "elapsed_s must be a number"),
        ('{"valid": [1]}', "valid must be an object"),
        ('{"valid": {"loss_nats": "low"}}', "valid: loss_nats must be a number"),
        ('{"ngram": {"order": -3}}', "ngram: order must be an integer ≥ 0"),
        ('{"baselines": [1]}', "baselines must be an object"),
        ('{"baselines": {"copy": 3}}', "baselines: copy: must be an object"),
        ('{"baselines": {"copy": {"kind": 1}}}', "baselines: copy: kind must be a string"),
        ('{"baselines": {"m": {"accuracy": "0.5"}}}', "baselines: m: accuracy must be a number"),
        ('{"behind_baseline": "yes"}', "behind_baseline must be null or an object"),
        ('{"behind_baseline": {"line": 5}}', "behind_baseline must be null or an object"),
        ('{"train_loss_nats": NaN}', "NaN is not a JSON number"),
        ("[]", "expected a JSON object"),
        (b"\xff\xfe{}", "invalid UTF-8"),
    ],
)
def test_a_tampered_summary_is_one_line_naming_it(tmp_path, text, message):
    path = tmp_path / "summary.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(CheckpointError) as info:
        read_summary(tmp_path)
    assert str(info.value).startswith(str(path)) and message in str(info.value)
    assert "\n" not in str(info.value)


def test_a_fifo_as_summary_is_refused_at_once(tmp_path):
    os.mkfifo(tmp_path / "summary.json")
    with pytest.raises(CheckpointError, match="is a FIFO, not a regular file"):
        read_summary(tmp_path)


def test_bad_metric_lines_are_skipped_and_counted(tmp_path):
    good = [{"event": "train", "step": 1, "loss_nats": 2.0}, {"event": "valid", "step": 2}]
    lines = [json.dumps(e).encode() for e in good]
    lines += [
        b'{"event": "train", "step": "1"}',  # a string step
        b'{"event": "train", "step": 3, "loss_nats": "x"}',
        b'{"event": 5}',
        b'{"event": "valid", "best": "yes"}',
        b'{"event": "train", "loss_nats": \xff}',  # invalid UTF-8
        b"[1, 2]",
        b'{"event": "train", "st',  # cut by a crash
    ]
    (tmp_path / "metrics.jsonl").write_bytes(b"\n".join(lines) + b"\n\n")
    assert read_metrics(tmp_path) == (good, 7)
    assert read_metrics(tmp_path / "nothing") == ([], 0)


# -- metrics.csv ---------------------------------------------------------------------------------
def csv_events(path) -> list[dict[str, object]]:
    """metrics.csv read back: each cell to the JSON value it stands for, empty cells left out
    (the oracle is json.loads of metrics.jsonl)."""
    import csv

    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))

    def value(cell: str) -> object:
        try:
            return json.loads(cell)
        except ValueError:
            return cell  # a string field

    return [{k: value(v) for k, v in row.items() if v != ""} for row in rows]


def test_metrics_csv_holds_exactly_the_events_of_metrics_jsonl(tmp_path):
    from rnnkit.training.run_files import write_metrics_csv

    events = [
        {"event": "train", "step": 1, "epoch": 0, "loss_nats": 2.0794415416798357, "lr": 1e-05,
         "grad_norm": 0.30000000000000004, "clipped_total": 0, "tokens_per_s": 12345.678},
        {"event": "skipped", "step": 2, "reason": 'the loss is nan at step 2, "batch" 3\nnext'},
        {"event": "valid", "step": 2, "epoch": 0, "loss_nats": 1.5, "accuracy": 0.25,
         "best": True, "lr": 1e-05, "per_class": {"a": 0.5, "b": 1.0}},
        {"event": "valid", "step": 4, "epoch": 1, "loss_nats": 1.75, "accuracy": None,
         "best": False},
        {"event": "early_stop", "step": 4},
    ]  # fmt: skip
    lines = [json.dumps(e) for e in events]
    lines.insert(2, '{"event": "train", "step": "x"}')  # a bad line: skipped, as readers do
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + '\n{"event": "tr')  # cut
    path = write_metrics_csv(tmp_path)
    assert path == tmp_path / "metrics.csv"
    header = path.read_text().splitlines()[0].split(",")
    assert header[:3] == ["event", "step", "epoch"] and len(header) == len(set(header))
    expected = [{k: v for k, v in e.items() if v is not None} for e in events]
    assert csv_events(path) == expected
    # Written again from a grown log: the whole table, atomically replaced.
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('\n{"event": "time_limit", "step": 5}\n')
    write_metrics_csv(tmp_path)
    assert csv_events(path) == [*expected, {"event": "time_limit", "step": 5}]


def test_metrics_csv_is_the_runs_course_across_a_killed_attempt(tmp_path):
    """A run killed at step 235 after its snapshot at 200 and resumed: metrics.jsonl holds
    steps 205-235 of both attempts; the table held them twice, the step going back from
    235 to 205 (a plotted curve doubled back). It holds the later attempt's, once."""
    from rnnkit.training.run_files import write_metrics_csv

    first = [{"event": "train", "step": s, "loss_nats": 1.0} for s in range(195, 240, 5)]
    first.insert(2, {"event": "valid", "step": 200, "loss_nats": 1.5, "best": True})
    again = [{"event": "train", "step": s, "loss_nats": 0.5} for s in range(205, 250, 5)]
    lines = [json.dumps(e) for e in first + again]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    steps = [
        (e["event"], e["step"], e["loss_nats"]) for e in csv_events(write_metrics_csv(tmp_path))
    ]
    assert steps == [
        ("train", 195, 1.0), ("train", 200, 1.0), ("valid", 200, 1.5),
        *[("train", s, 0.5) for s in range(205, 250, 5)],
    ]  # fmt: skip
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == len(lines)  # kept


def test_metrics_csv_drops_a_killed_attempts_steps_past_the_snapshot_it_resumed_from(
    tmp_path,
):
    """Logged every 10 steps, snapshot at 20, killed between 30 and 40: the resumed
    attempt logs step 30 again, which the falling-step rule could not see (30 is not
    below 30): the table held it twice. The resume's own mark says where it went on."""
    from rnnkit.training.run_files import write_metrics_csv

    first = [{"event": "train", "step": s, "loss_nats": 2.2} for s in (10, 20, 30)]
    first.insert(2, {"event": "valid", "step": 20, "loss_nats": 2.5, "best": True})
    again = [{"event": "resumed", "step": 20}]
    again += [{"event": "train", "step": s, "loss_nats": 2.21} for s in (30, 40)]
    lines = [json.dumps(e) for e in first + again]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    rows = [
        (e["event"], e["step"], e.get("loss_nats")) for e in csv_events(write_metrics_csv(tmp_path))
    ]
    assert rows == [
        ("train", 10, 2.2), ("train", 20, 2.2), ("valid", 20, 2.5), ("resumed", 20, None),
        ("train", 30, 2.21), ("train", 40, 2.21),
    ]  # fmt: skip


def test_metrics_csv_follows_the_write_rules(tmp_path):
    from rnnkit.errors import WriteError
    from rnnkit.training.run_files import write_metrics_csv

    (tmp_path / "metrics.jsonl").write_text('{"event": "train", "step": 1}\n')
    os.mkfifo(tmp_path / "metrics.csv")  # never replaced, never blocked on
    with pytest.raises(WriteError, match=r"metrics\.csv: is a FIFO"):
        write_metrics_csv(tmp_path)
    os.unlink(tmp_path / "metrics.csv")
    write_metrics_csv(tmp_path)
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]
    assert oct((tmp_path / "metrics.csv").stat().st_mode & 0o777) == oct(0o666 & ~_umask())


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
