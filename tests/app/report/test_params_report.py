"""The report of a ``params`` run: its metrics and training sections are those of the keys'
runs (``keys/NNN``), checked against each key's own ``summary.json`` and ``metrics.csv``."""

from __future__ import annotations

import csv
import html
import json
import re
from pathlib import Path

import numpy as np
import pytest

from rnnkit.app.report import render_report
from rnnkit.app.report.html import fmt


@pytest.fixture(autouse=True, scope="module")
def _one_thread(single_thread):
    yield


@pytest.fixture(scope="module")
def params_run(task_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rnnkit.app.cli.main import main

    out = tmp_path_factory.mktemp("params") / "run"
    argv = ["train", "--task", "params", "--train", str(task_data / "params.jsonl")]
    argv += ["--valid", str(task_data / "params-valid.jsonl"), "--out", str(out)]
    assert main([*argv, "--hidden", "8", "--epochs", "3", "-q"]) == 0
    return out


def _section(page: str, anchor: str) -> str:
    return page.split(f'<section id="{anchor}">')[1].split("</section>")[0]


def _row(body: str, first: str) -> list[str]:
    """The cells of the table row whose first cell is ``first`` (HTML unescaped)."""
    for row in re.findall(r"<tr>(.*?)</tr>", body, re.S):
        cells = [html.unescape(c) for c in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", row, re.S)]
        if cells and cells[0] == first:
            return cells
    raise AssertionError(f"no row {first!r}")


def _keys(run: Path) -> list[dict]:
    keys = json.loads((run / "keys.json").read_text())["keys"]
    assert len(keys) >= 2  # the fixture's sessions have an open, a read and a close key
    return keys


def test_the_metrics_are_each_keys_validation_next_to_its_persistence(params_run: Path) -> None:
    page = render_report(params_run)
    body = _section(page, "metrics")
    assert "No validation metrics were recorded" not in body
    for k in _keys(params_run):
        summary = json.loads((params_run / k["dir"] / "summary.json").read_text())
        cells = _row(body, k["dir"])  # named as its directory, beside its log key
        assert cells[1] == k["key"]
        assert cells[2] == fmt(summary["valid"]["step"])
        assert cells[3] == fmt(summary["valid"]["mse"])
        persistence = summary["baselines"]["persistence"]["mse"]
        assert cells[4] == fmt(persistence)
        assert cells[5] == f"{summary['valid']['mse'] / persistence - 1:+.1%}"
        assert cells[-1] == fmt(summary["valid"]["elements"])


def test_the_training_is_each_keys_run_with_its_curves(params_run: Path) -> None:
    page = render_report(params_run)
    body = _section(page, "training")
    assert "No gradient norm was logged" not in body
    top = json.loads((params_run / "summary.json").read_text())
    assert _row(body, "parameters (all keys)")[1] == fmt(top["parameters"])
    keys = _keys(params_run)
    for k in keys:
        summary = json.loads((params_run / k["dir"] / "summary.json").read_text())
        with open(params_run / k["dir"] / "metrics.csv", newline="") as f:
            train = [r for r in csv.DictReader(f) if r["event"] == "train"]
        norms = [float(r["grad_norm"]) for r in train]
        cells = _row(body, k["dir"])
        assert cells[1:5] == [
            fmt(summary["steps"]),
            fmt(summary["epoch"]),
            summary["stopped"],
            fmt(summary["elapsed_s"]),
        ]
        assert cells[6] == fmt(summary["train_loss_nats"])
        assert cells[-1] == (f"{np.median(norms):.4g} / {max(norms):.4g} / {norms[-1]:.4g}")
    # the loss curves and gradient norms: one figure each, a line per key
    alts = re.findall(r'<img src="data:image/png;base64,[^"]+" alt="([^"]+)"', body)
    assert [html.unescape(a) for a in alts] == [
        "training and validation MSE of each key's model against the step",
        "gradient norm of each key's model during training",
    ]


def test_the_figures_draw_each_keys_logged_losses(params_run: Path, monkeypatch) -> None:
    """The figure's lines are the keys' metrics.csv records (a training and a validation
    line per key, and the persistence baseline)."""
    from matplotlib.figure import Figure

    from rnnkit.app.report import keys as keys_module

    drawn: list[Figure] = []
    real = keys_module.image

    def keep(fig: Figure, alt: str, caption: str = "") -> str:
        drawn.append(fig)
        return real(fig, alt, caption)

    monkeypatch.setattr(keys_module, "image", keep)
    render_report(params_run)
    losses = drawn[0].axes[0]
    keys = _keys(params_run)
    for i, k in enumerate(keys):
        with open(params_run / k["dir"] / "metrics.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        train, valid, baseline = losses.lines[3 * i : 3 * i + 3]
        records = [r for r in rows if r["event"] == "train"]
        assert list(train.get_ydata()) == pytest.approx([float(r["loss_nats"]) for r in records])
        evaluations = [r for r in rows if r["event"] == "valid"]
        assert list(valid.get_xdata()) == [int(r["step"]) for r in evaluations]
        assert list(valid.get_ydata()) == pytest.approx([float(r["mse"]) for r in evaluations])
        assert baseline.get_ydata()[0] == pytest.approx(float(evaluations[-1]["baseline_mse"]))


def test_an_unreadable_key_run_is_a_note(params_run: Path, tmp_path: Path) -> None:
    import shutil

    from rnnkit.training.manifest import skipping_checksums

    run = tmp_path / "run"
    shutil.copytree(params_run, run)
    first = _keys(run)[0]["dir"]
    (run / first / "config.json").unlink()
    with skipping_checksums():
        page = html.unescape(render_report(run))
    assert f"The run of {first} is not shown:" in page
    body = _section(page, "metrics")
    assert _keys(run)[1]["dir"] in body and f"<th>{first}</th>" not in body
