"""What ``rnnkit train`` prints at the end names the device a run trained on."""

from __future__ import annotations

import json

import pytest
import torch

from rnnkit.app.cli.train_summary import print_summary
from rnnkit.app.tasks.settings import device_name

BASE = {"task": "lm", "steps": 3, "elapsed_s": 1.0, "parameters": 10}


def _lm_train(tmp_path) -> list[str]:
    """``train`` of a small lm into ``tmp_path / "r"`` (the corpus written there)."""
    (tmp_path / "t.txt").write_text("abc abd\n" * 20, encoding="utf-8")
    return [
        "train",
        "--task",
        "lm",
        "--train",
        str(tmp_path / "t.txt"),
        "--out",
        str(tmp_path / "r"),
    ]


def test_the_summary_names_a_gpu_and_stays_quiet_on_the_cpu(capsys):
    print_summary({**BASE, "device": "cuda (NVIDIA H200)", "threads": None})
    assert "device: cuda (NVIDIA H200)" in capsys.readouterr().out
    print_summary({**BASE, "device": "cpu", "threads": "threads: 1 of 2 CPUs"})
    out = capsys.readouterr().out
    assert "device:" not in out and "threads: 1 of 2 CPUs" in out


def test_device_name(monkeypatch):
    assert device_name("cpu") == "cpu"
    if not torch.cuda.is_available():
        assert device_name("auto") == "cpu"
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Fake GPU")
    assert device_name("cuda").startswith("cuda (")


def test_a_trained_run_records_its_device(run_cli, tmp_path):
    (tmp_path / "t.txt").write_text("abc abd\n" * 20, encoding="utf-8")
    out = tmp_path / "run"
    argv = ["train", "--task", "lm", "--train", str(tmp_path / "t.txt"), "--out", str(out)]
    code, _, err = run_cli(*argv, "--steps", "2", "--hidden", "8", "--no-report", "--quiet")
    assert code == 0, err
    assert json.loads((out / "summary.json").read_text())["device"] == "cpu"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_run_on_the_gpu_says_so(run_cli, tmp_path):
    argv = _lm_train(tmp_path)
    code, out, err = run_cli(
        *argv, "--steps", "2", "--hidden", "8", "--no-report", "--device", "cuda"
    )
    assert code == 0, err
    assert "device: cuda (" in out


def test_validation_labels_unseen_in_training_are_said(run_cli, capsys, tmp_path):
    """A validation label the model never saw is left out of the figures; only
    ``summary.json`` said so, and "validation accuracy 0.0000" read as the whole file's."""
    lines = [
        f"{'pos' if i % 2 else 'neg'}\t{'good fun' if i % 2 else 'bad sad'}" for i in range(20)
    ]
    (tmp_path / "train.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (tmp_path / "valid.tsv").write_text("zzz\tgood fun\nneg\tbad sad\nzzz\tbad\n", encoding="utf-8")
    argv = ["train", "--task", "classify", "--train", str(tmp_path / "train.tsv")]
    argv += ["--valid", str(tmp_path / "valid.tsv"), "--out", str(tmp_path / "run")]
    code, out, err = run_cli(*argv, "--steps", "2", "--hidden", "8", "--no-report", "--quiet")
    assert code == 0, err
    assert "validation: 2 label(s) not seen in training, left out of the figures: zzz (2)\n" in out
    valid = json.loads((tmp_path / "run" / "summary.json").read_text())["valid"]
    assert valid["unknown_labels"] == 2 and valid["examples"] == 1
    print_summary({**BASE, "valid": {"accuracy": 0.5, "unknown_labels": 0}})
    out = capsys.readouterr().out
    assert "validation accuracy 0.5000" in out and "not seen in training" not in out


def test_a_resumed_run_says_which_steps_the_time_is_for(capsys):
    """After ``--resume`` the time and rate are this invocation's while the steps are the
    run's: "trained 600 steps in 1 s" hid that 31 steps took that second."""
    summary = {**BASE, "steps": 600, "elapsed_s": 1.0, "tokens_per_s": 5000.0}
    print_summary(summary, resumed_at=569)
    first = capsys.readouterr().out.splitlines()[0]
    assert first == (
        "trained 600 steps (31 of them now, resumed at step 569) in 1 s (5000 tokens/s, "
        "validation apart), "
        "10 parameters"
    )
    print_summary(summary, resumed_at=600)  # nothing trained now: the run's own line
    assert capsys.readouterr().out.splitlines()[0].startswith("trained 600 steps in 1 s")
    print_summary(summary)
    assert capsys.readouterr().out.splitlines()[0].startswith("trained 600 steps in 1 s")
    # resumed after its last step (stopped before it ended): nothing trained, no rate
    print_summary({**summary, "tokens_per_s": None, "elapsed_s": 0.2}, resumed_at=600)
    assert capsys.readouterr().out.splitlines()[0] == (
        "trained 600 steps in 0 s (no step trained now), 10 parameters"
    )
    # no rate, not resumed: no training record was logged (stopped before the first)
    print_summary({**BASE, "steps": 11, "elapsed_s": 0.1})
    assert capsys.readouterr().out.splitlines()[0] == "trained 11 steps in 0 s, 10 parameters"


def test_train_resume_passes_the_snapshot_step(run_cli, tmp_path):
    argv = _lm_train(tmp_path)
    argv += ["--hidden", "8", "--no-report", "--batch-size", "4", "--bptt", "segment:8"]
    code, _, err = run_cli(*argv, "--steps", "3", "--quiet")
    assert code == 0, err
    assert "resumed_at" not in json.loads((tmp_path / "r" / "summary.json").read_text())
    code, out, err = run_cli(*argv, "--steps", "5", "--resume", "--quiet")
    assert code == 0, err
    assert out.startswith("trained 5 steps (2 of them now, resumed at step 3) in ")
    # summary.json and the report say whose the time and the rate are (the report said
    # "optimizer steps 600, training time 2.6 s, 74,993 tokens/s" of 171 steps' time)
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["resumed_at"] == 3
    from rnnkit.app.report import render_report

    assert "training time (s), the 2 steps since the resume at step 3" in render_report(
        tmp_path / "r"
    )


def test_a_classifiers_loss_is_said_per_example(capsys):
    """A classifier predicts once per sequence: its loss is nats per example (the summary
    said nats/token); a tagger's stays per token."""
    valid = {"perplexity": 5.0, "loss_nats": 1.609, "tokens": 500}
    print_summary({**BASE, "valid": {**valid, "examples": 500}})
    assert "validation perplexity: recurrent 5.000  (nats/example 1.609)" in capsys.readouterr().out
    print_summary({**BASE, "valid": valid})
    assert "validation perplexity: recurrent 5.000  (nats/token 1.609)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("task", "unit"), [("lm", "tokens"), ("classify", "examples"), ("regress", "values")]
)
def test_the_rate_is_named_by_what_the_loss_counts(capsys, task, unit):
    print_summary({**BASE, "task": task, "tokens_per_s": 4423.0})
    assert (
        capsys.readouterr().out.splitlines()[0]
        == f"trained 3 steps in 1 s (4423 {unit}/s, validation apart), 10 parameters"
    )


def test_a_classifier_trains_at_examples_per_second(run_cli, tmp_path):
    lines = [
        f"{'pos' if i % 2 else 'neg'}\t{'good fun' if i % 2 else 'bad sad'}" for i in range(20)
    ]
    (tmp_path / "train.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    argv = ["train", "--task", "classify", "--train", str(tmp_path / "train.tsv")]
    argv += ["--out", str(tmp_path / "run"), "--steps", "2", "--hidden", "8", "--batch-size", "4"]
    code, out, err = run_cli(*argv, "--no-report", "--quiet")
    assert code == 0, err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    rate = summary["tokens_per_s"]
    assert out.splitlines()[0].endswith(
        f"({rate:.0f} examples/s, validation apart), {summary['parameters']:,} parameters"
    )
    assert "tokens/s" not in out


def test_one_step_is_one_step(capsys):
    print_summary({**BASE, "steps": 1})
    assert capsys.readouterr().out.splitlines()[0] == "trained 1 step in 1 s, 10 parameters"


def _verdicts(tp: int, fp: int, fn: int, tn: int) -> dict:
    from rnnkit.metrics.detection import precision_recall_f1

    labels = [1] * (tp + fn) + [0] * (fp + tn)
    flagged = [True] * tp + [False] * fn + [True] * fp + [False] * tn
    return {"auc": 0.75, **precision_recall_f1(flagged, labels), "threshold": 1.0}


def test_an_undefined_detection_ratio_is_a_dash_not_a_traceback(capsys):
    """Nothing flagged among the labelled validation sessions: precision is 0/0, None in
    ``summary.json``; the table printed ``{None:.4f}`` (a TypeError)."""
    none_flagged, some = _verdicts(0, 0, 2, 5), _verdicts(1, 1, 1, 4)
    assert none_flagged["precision"] is None
    summary = {
        **BASE,
        "task": "events",
        "thresholds": {"score": "max", "rnn": {"max": 2.0}, "target_fpr": 0.05},
        "ngram": {"order": 3},
        "detection": {"rnn": {"max": none_flagged}, "ngram": {"max": some}},
    }
    print_summary(summary)
    out = capsys.readouterr().out.splitlines()
    head = out.index("  model      AUC     precision recall  F1      TP    FP    FN    TN")
    assert out[head + 1] == "  recurrent  0.7500  —         0.0000  0.0000  0     0     2     5    "
    assert out[head + 2] == "  3-gram     0.7500  0.5000    0.5000  0.5000  1     1     1     4    "


def test_a_params_run_says_why_a_ratio_is_undefined(capsys):
    summary = {
        "task": "params",
        "keys": {"modelled": 2, "vectors_modelled": 40, "skipped": 0, "vectors_skipped": 0},
        "elapsed_s": 1.0,
        "parameters": 10,
        "confidence": 0.99,
        "z": 2.5,
        "validation_fpr": {"false_positives": 0, "sessions": 5, "interval95": [0.0, 0.5]},
        "valid_detection": _verdicts(0, 0, 3, 5),
    }
    print_summary(summary)
    assert capsys.readouterr().out.splitlines()[-1] == (
        "labelled validation sessions: AUC 0.7500, precision n/a (no session flagged), "
        "recall 0.0000, F1 0.0000"
    )
