"""``rnnkit evaluate``: its own options, checked before the run is read (the end-to-end
evaluations of each task are in ``test_train_cli.py`` and ``tests/app/tasks/``)."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("value", ["0", "-1", "-5"])
def test_a_batch_size_below_one_is_one_line_naming_the_option(run_cli, tmp_path, value):
    """``--batch-size 0`` silently meant the run's batch size, ``-5`` one row, and ``-1`` on
    an events run was a ``TypeError`` traceback; each is now refused before anything is
    read (the run directory here does not even exist)."""
    data = tmp_path / "data.txt"
    data.write_text("some text\n")
    argv = ["evaluate", "--checkpoint", str(tmp_path / "run"), "--data", str(data)]
    code, out, err = run_cli(*argv, "--batch-size", value)
    assert (code, out) == (2, "")
    assert err == f"rnnkit evaluate: error: --batch-size must be ≥ 1, got {value}\n"


def test_an_empty_data_or_checkpoint_is_named(run_cli, tmp_path):
    """``--data ''`` was ``: file not found``; ``--checkpoint ''`` read the working
    directory as the run (``config.json: missing``)."""
    code, out, err = run_cli("evaluate", "--checkpoint", str(tmp_path), "--data", "")
    assert (code, out, err) == (
        2,
        "",
        "rnnkit evaluate: error: --data is empty: name a data file\n",
    )
    code, out, err = run_cli("evaluate", "--checkpoint", "", "--data", "x.txt")
    assert err == "rnnkit evaluate: error: --checkpoint is an empty path: name a run directory\n"


def test_the_plain_text_says_none_for_an_empty_table():
    """An empty table (no unknown labels) printed ``unknown_label_counts:`` and nothing."""
    from rnnkit.app.cli.evaluate import plain_text

    metrics = {
        "accuracy": 0.75,
        "unknown_label_counts": {},
        "per_class": {"a": 1, "b": 0.5},
        "baselines": {"majority": {"kind": "majority class", "accuracy": 0.5}},
    }
    assert plain_text(metrics).splitlines() == [
        "accuracy: 0.75",
        "unknown_label_counts: none",
        "per_class: a 1, b 0.5",
        "baseline majority (majority class): accuracy 0.5",
    ]
