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
