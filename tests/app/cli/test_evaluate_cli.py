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


def test_the_plain_text_says_a_dash_for_an_empty_table():
    """An empty table (no unknown labels) printed ``unknown_label_counts:`` and nothing,
    then ``none``, where an undefined figure printed ``None``: both are ``—`` now."""
    from rnnkit.app.cli.evaluate import plain_text

    metrics = {
        "accuracy": 0.75,
        "unknown_label_counts": {},
        "per_class": {"a": 1, "b": 0.5},
        "baselines": {"majority": {"kind": "majority class", "accuracy": 0.5}},
    }
    assert plain_text(metrics).splitlines() == [
        "accuracy: 0.75",
        "unknown_label_counts: —",
        "per_class: a 1, b 0.5",
        "baseline majority (majority class): accuracy 0.5",
    ]


def test_the_plain_text_prints_no_python_reprs():
    """``None``, ``['a', 'b']`` and ``[[1, 0], [0, 2]]`` were printed as Python wrote them;
    an undefined figure whose name says why is said so (a file of no anomalous session
    has no recall: it printed ``recall: 0``, then ``None``)."""
    from rnnkit.app.cli.evaluate import plain_text

    metrics = {
        "oov_accuracy": None,
        "loss_nats": None,
        "auc": None,
        "precision": 0.0,
        "recall": None,
        "f1": 0.0,
        "per_tag_f1": {"B-LOC": None, "O": 1.0},
        "labels": ["asyncio", "email"],
        "confusion_matrix": [[1, 0], [0, 2]],
        "rnn_max": {"precision": None, "recall": None, "tp": 0},
        "baselines": {"mft": {"kind": "most frequent", "oov_accuracy": None}},
    }
    assert plain_text(metrics).splitlines() == [
        "oov_accuracy: n/a (no out-of-vocabulary token)",
        "loss_nats: —",
        "auc: n/a (needs normal and anomalous sessions)",
        "precision: 0",
        "recall: n/a (no anomalous sessions)",
        "f1: 0",
        "per_tag_f1: B-LOC —, O 1",
        "labels: asyncio, email",
        "confusion_matrix: 1 0; 0 2",
        "rnn_max: precision —, recall —, tp 0",
        "baseline mft (most frequent): oov_accuracy —",
    ]
