"""The report's anomaly-detection section: its figures and tables are there, with the
numbers of the run's own stored scores."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from rnnkit.anomaly.scores import SCORES
from rnnkit.app.config import TrainConfig
from rnnkit.app.report import render_report, write_report
from rnnkit.app.tasks.events import train
from rnnkit.data.events import write_sessions
from rnnkit.data.generated_sessions import generate_sessions
from rnnkit.metrics.detection import detection_metrics


def _train(tmp: Path, valid_anomalies: int) -> Path:
    write_sessions(tmp / "train.jsonl", generate_sessions(60, seed=1))
    write_sessions(tmp / "valid.jsonl", generate_sessions(50, anomalies=valid_anomalies, seed=2))
    cfg = TrainConfig(
        task="events",
        train=str(tmp / "train.jsonl"),
        valid=str(tmp / "valid.jsonl"),
        out=str(tmp / "run"),
        hidden=12,
        embedding=6,
        epochs=2,
        batch_size=16,
        lr=1e-2,
        bptt="full",
        ngram_order=3,
        target_fpr=0.05,
        top_g=3,
    ).validate()
    torch.set_num_threads(1)
    train(cfg, quiet=True)
    return tmp / "run"


@pytest.fixture(scope="module")
def labelled_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _train(tmp_path_factory.mktemp("detection"), valid_anomalies=10)


def _section(html: str) -> str:
    start = html.index('<section id="detection">')
    return html[start : html.index("</section>", start)]


def test_detection_section_shows_curves_histograms_and_verdicts(labelled_run: Path) -> None:
    html = render_report(labelled_run)
    assert '<a href="#detection">Anomaly detection</a>' in html
    body = _section(html)
    alts = re.findall(r'<img src="data:image/png;base64,[^"]+" alt="([^"]+)"', body)
    assert alts == ["ROC and precision-recall curves", "score histograms, normal against anomalous"]
    assert "Labelled validation sessions: 40 normal, 10 anomalous" in body
    assert "Clopper–Pearson" in body
    assert "The highest-scoring validation sessions" in body and " nats" in body
    # One row per detector and score, with the verdicts at the stored thresholds.
    doc = json.loads((labelled_run / "thresholds.json").read_text())
    summary = json.loads((labelled_run / "summary.json").read_text())
    for model, label in (("rnn", "LSTM 1×12"), ("ngram", "3-gram")):
        rows = re.findall(rf"<tr><td>{re.escape(label)}</td>.*?</tr>", body)
        assert len(rows) == len(SCORES)
        name = doc["score"]  # the run's verdict score, in bold (the default: combined)
        m = summary["detection"][model][name]
        row = next(r for r in rows if f"<b>{name}</b>" in r)
        cells = re.findall(r'<td class="num">([^<]*)</td>', row)
        assert cells[5:9] == [str(m[k]) for k in ("tp", "fp", "fn", "tn")]
        assert float(cells[-1]) == pytest.approx(doc[model][name], rel=1e-3)


def test_stored_scores_reproduce_the_summary(labelled_run: Path) -> None:
    from safetensors.numpy import load_file

    arrays = load_file(str(labelled_run / "valid_scores.safetensors"))
    doc = json.loads((labelled_run / "thresholds.json").read_text())
    summary = json.loads((labelled_run / "summary.json").read_text())
    for score in SCORES:
        normal, anomalous = arrays[f"rnn/{score}"], arrays[f"anomalous/rnn/{score}"]
        labels = np.r_[np.zeros(normal.size), np.ones(anomalous.size)]
        m = detection_metrics(np.r_[normal, anomalous], labels, doc["rnn"][score])
        assert m == pytest.approx(summary["detection"]["rnn"][score])


def test_without_labelled_anomalies_only_the_normal_histogram(tmp_path: Path) -> None:
    run = _train(tmp_path, valid_anomalies=0)
    body = _section(write_report(run).read_text(encoding="utf-8"))
    assert body.count("<img ") == 1
    assert "No labelled anomalous validation sessions" in body


def _set(model: str, score: str, value: object):
    def change(data: bytes) -> bytes:
        doc = json.loads(data)
        doc[model][score] = value
        return json.dumps(doc).encode()

    return change


@pytest.mark.parametrize(
    ("file", "change", "words"),
    [
        ("valid_scores.safetensors", lambda b: b[: len(b) // 2], "not a valid safetensors file"),
        ("thresholds.json", _set("rnn", "max", "x"), "not an rnnkit thresholds file"),
        ("thresholds.json", _set("rnn", "count", -1), "below 0"),
    ],
)
def test_a_damaged_detection_file_is_a_note_not_a_traceback(
    labelled_run: Path, tmp_path: Path, file, change, words
) -> None:
    # A truncated valid_scores.safetensors raised SafetensorError, a string threshold
    # numpy's _UFuncNoLoopError: the report stopped with a traceback.
    import shutil

    run = tmp_path / "run"
    shutil.copytree(labelled_run, run)
    path = run / file
    path.write_bytes(change(path.read_bytes()))
    from rnnkit.errors import CheckpointError
    from rnnkit.training.manifest import skipping_checksums

    with pytest.raises(CheckpointError, match=f"{file}: does not match its SHA-256"):
        render_report(run)  # the run's manifest notices first
    with skipping_checksums():  # then the readers' own checks
        html = render_report(run)
    assert '<section id="detection">' not in html
    assert "The detection section is missing" in html and words in html


def _params_curves(monkeypatch) -> dict:
    """What the params section draws as its detection curves (the drawing left out)."""
    from rnnkit.app.report import detection

    drawn: dict = {}

    def capture(curves):
        drawn.update(curves["parameter values"])
        return b""

    monkeypatch.setattr(detection.plots, "plot_detection_curves", capture)
    monkeypatch.setattr(detection.plots, "plot_score_histograms", lambda *a, **k: b"")
    monkeypatch.setattr(detection, "image", lambda *a: "")
    return drawn


def test_the_params_curves_count_an_unreadable_value_as_the_highest_score(monkeypatch):
    """A parameter-value session scoring +∞ (a value the model cannot read) is anomalous
    for the summary and `rnnkit evaluate`; the report's curves count it so too (they
    read it as the lowest score), and its histogram says it is off the scale."""
    from rnnkit.app.report import detection

    drawn = _params_curves(monkeypatch)
    normal = np.array([0.5, 1.0, 1.5, 2.0, 4.5, -np.inf])
    anomalous = np.array([np.inf, 5.0, 0.7])
    html = detection._params_detection(normal, anomalous, limit=3.0)
    labels = np.r_[np.zeros(6), np.ones(3)]
    expected = detection_metrics(np.r_[normal, anomalous], labels, 3.0)
    assert drawn["auc"] == expected["auc"] == pytest.approx(14 / 18)
    assert drawn["point"] == (expected["fpr"], expected["recall"], expected["precision"])
    assert expected["tp"] == 2  # the +∞ session is caught
    assert "1 anomalous and 0 normal session(s) scoring +∞" in html


def test_a_threshold_that_flags_nothing_has_no_precision_on_the_page(monkeypatch):
    """Above every session's score nothing is flagged: precision is 0/0, None. The table
    shows ``—`` (it showed ``None``, earlier ``0``) and the curves' operating point has no
    precision coordinate (NaN, left out of the plot) rather than a ``None`` matplotlib
    cannot place."""
    from rnnkit.app.report import detection

    drawn = _params_curves(monkeypatch)
    normal, anomalous = np.array([0.5, 1.0, 1.5]), np.array([2.0, 2.5])
    detection._params_detection(normal, anomalous, limit=9.0)
    fpr, recall, precision = drawn["point"]
    assert (fpr, recall) == (0.0, 0.0) and np.isnan(precision)
    at = detection_metrics(np.r_[normal, anomalous], np.r_[np.zeros(3), np.ones(2)], 9.0)
    html = detection._raw_table([["m", *(at[k] for k in ("precision", "recall", "f1"))]], [])
    assert re.findall(r"<td[^>]*>([^<]*)</td>", html) == ["m", "—", "0", "0"]
