"""The HTML report of a run: one self-contained file (every picture a PNG ``data:`` URI,
nothing fetched), with the run's metrics, baseline, samples, gradient flow and config.

Real run directories come from ``train_lm`` on a tiny generated corpus (a few seconds).
"""

from __future__ import annotations

import base64
import html
import io
import json
import random
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch
from PIL import Image

from rnnkit.app.config import TrainConfig
from rnnkit.app.report import REPORT_NAME, render_report, write_report
from rnnkit.app.report.html import fmt
from rnnkit.app.tasks.lm import train_lm
from rnnkit.errors import CheckpointError
from rnnkit.training.manifest import skipping_checksums, write_manifest

WORDS = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "to", "big", "red", "hat"]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(autouse=True, scope="module")
def _one_thread(single_thread):
    yield


def corpus(lines: int, seed: int) -> str:
    rng = random.Random(seed)
    return "".join(
        " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 7))) + "\n" for _ in range(lines)
    )


def tiny_run(root: Path, name: str, **options) -> Path:
    """Train a tiny language model into ``root/name``; returns the run directory."""
    data = root / f"{name}-data"
    data.mkdir()
    (data / "train.txt").write_text(corpus(120, 0), encoding="utf-8")
    (data / "valid.txt").write_text(corpus(20, 1), encoding="utf-8")
    settings = {
        "task": "lm",
        "train": str(data / "train.txt"),
        "valid": str(data / "valid.txt"),
        "out": str(root / name),
        "cell": "rnn",
        "hidden": 12,
        "embedding": 8,
        "batch_size": 4,
        "bptt": "segment:16",
        "steps": 60,
        "eval_every": 20,
        "clip_norm": 1.0,
        "ngram_order": 3,
        "seed": 0,
        **options,
    }
    train_lm(TrainConfig(**settings).validate(), quiet=True)
    return root / name


def assert_bars_add_up_to_the_backward_pass(body: str) -> None:
    """The gradient section's table: the sum of the per-step bars is the norm of the
    model's own ∂L/∂W_hh (to the table's 4 digits)."""

    def figure(label: str) -> float:
        found = re.search(re.escape(label) + r"</t[hd]>\s*<td[^>]*>([^<]*)</td>", body)
        assert found is not None, label
        return float(found.group(1))

    total = figure("‖∂L/∂W_hh‖: sum of the bars")
    assert total == pytest.approx(figure("‖∂L/∂W_hh‖: backward pass of the model"), rel=1e-3)


class Page(HTMLParser):
    """Every tag with its attributes, and the text of ``<style>`` and ``<script>``."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.open: list[str] = []
        self.styles: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self.open.append(tag)

    def handle_endtag(self, tag):
        if self.open and self.open[-1] == tag:
            self.open.pop()

    def handle_data(self, data):
        if self.open and self.open[-1] == "style":
            self.styles.append(data)
        self.text.append(data)

    def of(self, tag: str) -> list[dict[str, str | None]]:
        return [attrs for t, attrs in self.tags if t == tag]


def parse(text: str) -> Page:
    page = Page()
    page.feed(text)
    page.close()
    return page


def check_self_contained(text: str) -> Page:
    """The checks every report passes; returns the parsed page."""
    assert text.startswith("<!DOCTYPE html>")
    page = parse(text)
    assert not page.of("script") and not page.of("link") and not page.of("iframe")
    assert "http://" not in text and "https://" not in text
    csp = [m for m in page.of("meta") if m.get("http-equiv") == "Content-Security-Policy"]
    assert csp and "default-src 'none'" in csp[0]["content"]
    for tag, attrs in page.tags:  # no attribute points anywhere but into the page
        for key in ("src", "href", "srcset", "action", "poster", "data"):
            value = attrs.get(key)
            if value is not None and tag != "img":
                assert value.startswith("#"), (tag, key, value)
    assert not any("url(" in s or "@import" in s for s in page.styles)
    images = page.of("img")
    assert images
    for attrs in images:
        src = attrs["src"]
        prefix = "data:image/png;base64,"
        assert src.startswith(prefix)
        png = base64.b64decode(src[len(prefix) :], validate=True)
        assert png[:8] == PNG_SIGNATURE
        with Image.open(io.BytesIO(png)) as im:
            im.load()  # decodes the whole image
            assert im.size == (int(attrs["width"]), int(attrs["height"]))
        assert attrs.get("alt")
    return page


@pytest.fixture(scope="module")
def rnn_run(tmp_path_factory) -> Path:
    return tiny_run(tmp_path_factory.mktemp("runs"), "rnn")


@pytest.fixture(scope="module")
def rnn_report(rnn_run) -> tuple[Path, str]:
    path = write_report(rnn_run)
    return path, path.read_text(encoding="utf-8")


def test_default_path_and_one_self_contained_file(rnn_run, rnn_report):
    path, text = rnn_report
    assert path == rnn_run / REPORT_NAME
    page = check_self_contained(text)
    # loss, gradient norm, gradient flow, step and lag contributions, next symbol, hidden
    assert len(page.of("img")) == 7
    assert not [p for p in rnn_run.iterdir() if p.name.endswith(".tmp")]  # atomic write


def test_report_holds_metrics_baseline_samples_and_config(rnn_run, rnn_report):
    _, text = rnn_report
    summary = json.loads((rnn_run / "summary.json").read_text())
    valid, ngram = summary["valid"], summary["ngram"]
    for value in (valid["loss_nats"], valid["bits_per_char"], valid["perplexity"]):
        assert f"{value:.4g}" in text
    for value in (ngram["loss_nats"], ngram["bits_per_char"]):
        assert f"{value:.4g}" in text
    assert "3-gram Kneser–Ney baseline" in text
    assert re.search(r"bits per character (better|worse)</b> than the n-gram", text)
    ids = [m.group(1) for m in re.finditer(r'<section id="([a-z]+)"', text)]
    assert ids == ["metrics", "training", "samples", "gradients", "predictions", "config"]
    samples = text.split('<section id="samples">')[1].split("</section>")[0]
    assert samples.count("<pre>") == 3
    assert "steps clipped" in text and f"of {summary['steps']:,}" in text
    assert "<th>hidden</th><td>12</td>" in text  # the configuration table
    assert "<th>γλ</th>" in text  # the simple cell's bound numbers


def test_contribution_bars_match_the_models_backward_pass(rnn_report):
    _, text = rnn_report

    def row(label: str) -> float:
        m = re.search(re.escape(f"<th>{label}</th><td class=num>") + r"([-0-9.e+,]+)</td>", text)
        assert m, label
        return float(m.group(1).replace(",", ""))

    bars = row("‖∂L/∂W_hh‖: sum of the bars")
    reference = row("‖∂L/∂W_hh‖: backward pass of the model")
    assert bars == pytest.approx(reference, rel=1e-3)
    assert bars > 0


def test_out_path_directory_and_rewrite(rnn_run, tmp_path, monkeypatch):
    import rnnkit.app.report.page as page

    monkeypatch.setattr(page, "render_report", lambda run_dir, device: "<!DOCTYPE html>")
    out = write_report(rnn_run, tmp_path / "sub" / "r.html")
    assert out == tmp_path / "sub" / "r.html" and out.is_file()
    into = write_report(rnn_run, tmp_path)  # a directory gets report.html inside
    assert into == tmp_path / REPORT_NAME
    assert sorted(p.name for p in tmp_path.iterdir()) == [REPORT_NAME, "sub"]


def test_report_of_a_run_without_summary_or_corpus(rnn_run, tmp_path):
    """A run cut short (no summary, a half-written log line) whose corpus has gone:
    the report still renders, from the log and from text the model generates."""
    run = tmp_path / "run"
    shutil.copytree(rnn_run, run, ignore=shutil.ignore_patterns("snapshots", REPORT_NAME))
    (run / "summary.json").unlink()
    with open(run / "metrics.jsonl", "a", encoding="utf-8") as f:
        f.write('{"event": "train", "st')
    config = json.loads((run / "config.json").read_text())
    config["config"]["train"] = str(tmp_path / "gone.txt")
    config["config"]["valid"] = None
    config["data"] = {"train": {**config["data"]["train"], "path": str(tmp_path / "gone.txt")}}
    (run / "config.json").write_text(json.dumps(config))
    (run / "manifest.json").unlink()  # cut short: no manifest was written
    with pytest.raises(CheckpointError, match=r"manifest\.json: missing"):
        render_report(run)
    with skipping_checksums():  # --skip-checksums
        text = render_report(run)
    check_self_contained(text)
    assert "1 unreadable line(s) of metrics.jsonl" in text
    assert "text generated by the model" in text
    assert "model (best, step " in text  # from the logged evaluations
    # it said "stopped by: all steps done"
    logged = (run / "metrics.jsonl").read_text().splitlines()[:-1]  # the cut line left out
    last = max(json.loads(x)["step"] for x in logged)
    assert f"not finished: no summary.json (still training, or killed after step {last})" in text


def test_the_report_of_a_run_stopped_by_ctrl_c_says_so(rnn_run, tmp_path):
    """A run stopped by SIGINT after step 454 (its last training record at 444, no
    summary until it is resumed to its end) was reported "optimizer steps 444" and
    "stopped by all steps done"."""
    run = tmp_path / "run"
    shutil.copytree(rnn_run, run, ignore=shutil.ignore_patterns(REPORT_NAME))
    (run / "summary.json").unlink()
    events = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    stop = max(e["step"] for e in events) + 3
    with open(run / "metrics.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps({"event": "interrupted", "step": stop}) + "\n")
    write_manifest(run)  # as the interrupted run wrote it: no summary
    text = render_report(run)
    assert re.search(rf"optimizer steps</t[hd]>\s*<td[^>]*>{stop}<", text), text[:3000]
    assert f"a signal (Ctrl-C or SIGTERM) after step {stop}; --resume goes on" in text
    # a --resume that failed before its first step logged only its mark: still the signal
    with open(run / "metrics.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps({"event": "resumed", "step": stop}) + "\n")
    write_manifest(run)
    assert f"a signal (Ctrl-C or SIGTERM) after step {stop}; --resume goes on" in render_report(run)
    # a finished run: the summary's own words
    stopped = json.loads((rnn_run / "summary.json").read_text())["stopped"]
    assert html.escape(stopped) in write_report(rnn_run, tmp_path / "r.html").read_text()


def test_a_run_resumed_past_its_summary_then_stopped_is_read_from_its_log(rnn_run, tmp_path):
    """Trained to 400 steps (summary.json written), resumed to 700 and stopped by Ctrl-C
    at 485: the report said "stopped by: 400 steps done" beside a step count of 700."""
    run = tmp_path / "run"
    shutil.copytree(rnn_run, run, ignore=shutil.ignore_patterns(REPORT_NAME))
    steps = json.loads((run / "summary.json").read_text())["steps"]
    with open(run / "metrics.jsonl", "a", encoding="utf-8") as f:
        for event in ({"event": "resumed", "step": steps},
                      {"event": "train", "step": steps + 2, "loss_nats": 1.0},
                      {"event": "interrupted", "step": steps + 3}):  # fmt: skip
            f.write(json.dumps(event) + "\n")
    write_manifest(run)
    text = html.unescape(render_report(run))
    assert f"a signal (Ctrl-C or SIGTERM) after step {steps + 3}; --resume goes on" in text
    assert f"summary.json is that of an earlier attempt, which ended at step {steps}" in text


def test_missing_or_foreign_directory_is_a_checkpoint_error(tmp_path):
    with pytest.raises(CheckpointError, match="no such checkpoint directory"):
        write_report(tmp_path / "nope")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match=r"manifest\.json: missing"):
        write_report(tmp_path)
    with pytest.raises(CheckpointError, match=r"config\.json"), skipping_checksums():
        write_report(tmp_path)
    assert not (tmp_path / REPORT_NAME).exists()


def test_two_layer_word_lstm(tmp_path):
    run = tiny_run(tmp_path, "lstm", cell="lstm", layers=2, unit="word", steps=60, bptt="segment:8")
    text = write_report(run).read_text(encoding="utf-8")
    page = check_self_contained(text)
    assert len(page.of("img")) == 7
    assert "<th>layer0</th>" in text and "<th>layer1</th>" in text  # gate saturation rows
    assert "<th>γλ</th>" not in text  # the bound is for the simple cell
    assert "bits per character" not in text.split('<section id="training">')[0]
    assert "f saturated" in text


def test_seq2seq_run_gets_attention_heatmaps(tmp_path, monkeypatch):
    """A seq2seq run directory (untrained weights, nothing logged yet): the report draws
    one attention map per validation pair and says that no metrics were recorded. The
    data were named relative to where training ran, and the report is made from another
    directory: the files are found at the absolute paths config.json recorded (the
    attention and gradient sections said "No readable source<TAB>target pairs")."""
    seq2seq = pytest.importorskip("rnnkit.app.tasks.seq2seq")
    from rnnkit.app.tasks.run_config import save_config
    from rnnkit.data.vocab import Vocabulary
    from rnnkit.training.checkpoint import save_model_weights

    pairs = ["ab cd\tdc ba", "cd\tdc", "ab ab cd\tdc ba ba", "cd ab\tba dc"]
    (tmp_path / "pairs.tsv").write_text("\n".join(pairs) + "\n", encoding="utf-8")
    run = tmp_path / "run"
    monkeypatch.chdir(tmp_path)
    cfg = TrainConfig(
        task="seq2seq",
        train="pairs.tsv",
        valid="pairs.tsv",
        out=str(run),
        attention="dot",
        hidden=8,
        embedding=8,
    ).validate()
    source = Vocabulary.from_text("".join(p.split("\t")[0] for p in pairs))
    target = Vocabulary.from_text("".join(p.split("\t")[1] for p in pairs))
    run.mkdir()
    source.save(run / "source_vocab.json")
    target.save(run / "vocab.json")
    save_config(run, cfg, source_vocab_size=len(source), target_vocab_size=len(target))
    torch.manual_seed(0)
    model = seq2seq.build_model(cfg, len(source), len(target))
    save_model_weights(model, run / "model.safetensors")
    write_manifest(run)  # assembled by hand, then vouched for
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    text = write_report(run).read_text(encoding="utf-8")
    page = check_self_contained(text)
    attention = text.split('<section id="attention">')[1].split("</section>")[0]
    assert attention.count("<img ") == 3
    assert "ab cd → dc ba" in attention
    assert "No validation metrics were recorded." in text
    # the (empty) loss curve, three maps and the encoder's gradient flow (three figures)
    assert len(page.of("img")) == 7
    gradients = text.split('<section id="gradients">')[1].split("</section>")[0]
    assert gradients.count("<img ") == 3 and "On 4 pairs from" in gradients


def test_a_zoneout_models_flow_figures_are_its_steps_at_evaluation(tmp_path):
    """A model with zoneout steps as p I + (1 − p) J at evaluation: the section says so
    (and only then), and its figures are of those steps — the contributions' sum equals
    the model's own backward pass (two layers: the one above runs with its zoneout)."""
    run = tiny_run(tmp_path, "zoned", cell="lstm", zoneout=0.3, layers=2, steps=6, eval_every=3)
    body = write_report(run).read_text(encoding="utf-8").split('<section id="gradients">')[1]
    body = body.split("</section>")[0]
    assert "trained with zoneout (p = 0.3)" in body
    assert "as the model runs at evaluation" in body
    assert_bars_add_up_to_the_backward_pass(body)
    plain = tiny_run(tmp_path, "plain", cell="lstm", steps=6, eval_every=3)
    assert "zoneout (p =" not in write_report(plain).read_text(encoding="utf-8")


def test_a_layer_normalised_models_report_draws_the_flow_pictures(tmp_path):
    """A `--layer-norm` model's report has its gradient-flow section (its report failed
    inside the compiled loop, then said the pictures did not apply): the per-step bars add
    up to the model's own backward pass, as for any cell, and the saturation table has
    the gates."""
    run = tiny_run(tmp_path, "normed", cell="lstm", layer_norm=True, steps=4, eval_every=2)
    page = html.unescape(write_report(run).read_text(encoding="utf-8"))
    body = page.split('<section id="gradients">')[1].split("</section>")[0]
    assert "layer normalisation" not in body
    assert "<img" in body or "<svg" in body
    assert_bars_add_up_to_the_backward_pass(body)
    assert "Gate saturation" in body
    assert '<section id="metrics">' in page


def test_the_training_rate_is_named_by_what_the_loss_counts(rnn_report, run_cli, tmp_path):
    """A classifier's loss counts examples (one prediction per line): its rate and loss are
    per example; a language model's per token."""
    _, text = rnn_report
    assert "training tokens per second" in text and "(nats per token)" in text
    lines = [
        f"{'pos' if i % 2 else 'neg'}\t{'good fun' if i % 2 else 'bad sad'}" for i in range(20)
    ]
    (tmp_path / "train.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    argv = ["train", "--task", "classify", "--train", str(tmp_path / "train.tsv"), "--out"]
    code, _, err = run_cli(*argv, str(tmp_path / "run"), "--steps", "2", "--hidden", "8", "-q")
    assert code == 0, err
    code, _, err = run_cli("report", "--checkpoint", str(tmp_path / "run"))
    assert code == 0, err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    page = (tmp_path / "run" / REPORT_NAME).read_text(encoding="utf-8")
    rate = fmt(summary["tokens_per_s"])
    assert f"<th>training examples per second</th><td class=num>{rate}</td>" in page
    assert re.search(r"<th>final training loss[^<]*\(nats per example\)</th>", page)
    assert "tokens per second" not in page
    # the metrics are per example too, each count once
    assert "<th>loss (nats per example)</th>" in page and "nats per token" not in page
    assert "<th>examples</th>" in page and "scored" not in page
    # the configuration holds what a classifier reads, not the other tasks' options
    config = page.split('<section id="config">')[1]
    assert "<th>pooling</th>" in config and "<th>hidden</th>" in config
    for other in ("attention", "beam", "bptt", "tie_weights", "target_fpr", "reset"):
        assert f"<th>{other}</th>" not in config, other


def test_gradient_signals_read_a_trend_not_one_batchs_norm():
    from rnnkit.app.report.page import _gradient_signals

    # a healthy classifier's logged norms: a tenfold move from batch to batch, no trend
    noisy = [2.15, 0.095, 1.2, 0.3, 0.11, 1.19, 0.6, 0.097, 0.97, 0.5] * 6
    steps = list(range(12, 12 * len(noisy) + 1, 12))
    assert "No vanishing or exploding signal" in _gradient_signals(5.0, steps, noisy)
    # norms that decay a hundredfold, and norms that grow so: signals, named
    fading = [1.0 * 0.85**i for i in range(60)]
    assert "vanishing gradients" in _gradient_signals(5.0, steps, fading)
    growing = [0.01 * 1.15**i for i in range(60)]
    assert "exploding gradients" in _gradient_signals(5.0, steps, growing)


def test_gradient_signals_of_a_converging_model_are_not_alarms():
    from rnnkit.app.report.page import _gradient_signals

    steps = list(range(10, 10 * 60 + 1, 10))
    fading = [1.0 * 0.85**i for i in range(60)]  # the norm falls ~17,000-fold
    # ... while the loss falls as much: a cross-entropy near its minimum (convergence)
    converging = [2.0 * 0.85**i for i in range(60)]
    page = _gradient_signals(None, steps, fading, converging)
    assert "vanishing gradients" not in page and "No vanishing or exploding signal" in page
    assert "fall(s) that the training loss matched (convergence)" in page
    # ... while the loss stays where it was: the gradient vanished, said
    stuck = [2.0 - 0.001 * i for i in range(60)]
    assert "vanishing gradients" in _gradient_signals(None, steps, fading, stuck)
    # a loss at or below zero (a Gaussian likelihood's) says nothing of the gradient's scale
    negative = [-0.5 - 0.01 * i for i in range(60)]
    assert "vanishing gradients" in _gradient_signals(None, steps, fading, negative)

    # converged, then norms tenfold up from a small floor, below the first steps' scale
    floor = [1.0] * 20 + [0.01] * 20 + [0.2] * 20
    losses = [2.0] * 20 + [0.005] * 20 + [0.02] * 20
    page = _gradient_signals(None, steps, floor, losses)
    assert "exploding gradients" not in page
    assert "1 rise(s) that stayed below the norms of the first 20 logged points (1)" in page
    # ... and up past it: exploding, said (the fall before it matched by the loss)
    surge = [1.0] * 20 + [0.01] * 20 + [50.0] * 20
    page = html.unescape(_gradient_signals(None, steps, surge, losses))
    assert "step 430: the median gradient norm rose to 50 from 0.01 within 20 logged points" in page
    assert "Not counted, a converging model's moves: 1 fall(s)" in page


def test_the_metrics_are_named_by_what_the_loss_counts():
    from rnnkit.app.report.page import _metric_names

    assert _metric_names("tokens")["loss_nats"] == "loss (nats per token)"
    assert _metric_names("examples")["loss_nats"] == "loss (nats per example)"
    # a regressor's nats are a Gaussian's negative log-likelihood, beside its own loss
    assert _metric_names("values")["loss_nats"] == "Gaussian NLL (nats per value)"
    assert _metric_names("values")["tokens"] == "values scored"


def test_a_regressors_report_shows_its_baseline_once(task_data, run_cli, tmp_path):
    argv = ["train", "--task", "regress", "--train", str(task_data / "seq.jsonl"), "--valid"]
    argv += [str(task_data / "seq-valid.jsonl"), "--out", str(tmp_path / "run"), "--steps", "4"]
    code, _, err = run_cli(*argv, "--hidden", "8", "-q")
    assert code == 0, err
    page = write_report(tmp_path / "run").read_text(encoding="utf-8")
    metrics = page.split('<section id="metrics">')[1].split("</section>")[0]
    assert "<th>mse</th>" in metrics and "persistence" in metrics
    assert "baseline_mse" not in metrics  # the persistence column holds it
    assert "<th>Gaussian NLL (nats per value)</th>" in metrics


def test_gradient_signals_read_whole_windows_only():
    """A relu network's logged norms 7.71, 0.53, 4.03, 0.56, 0.60, then ~0.5: the first
    point alone was a "median" of 7.71, and the fall from it read as vanishing gradients
    ("within 20 steps", for 20 logged points)."""
    from rnnkit.app.report.page import _gradient_signals

    norms = [7.707, 0.532, 4.032, 0.559, 0.597] + [0.5 + 0.05 * (i % 3) for i in range(60)]
    steps = list(range(2, 2 * len(norms) + 1, 2))
    page = _gradient_signals(None, steps, norms)
    assert "vanishing gradients" not in page and "No vanishing or exploding signal" in page
    # a short run: five norms or fewer are one whole window at most, no trend to read
    for n in (2, 5):
        assert _gradient_signals(None, steps[:n], [7.71] + [0.5] * (n - 1)) == ""


def test_gradient_signals_of_a_model_that_fits_its_training_data_are_not_alarms():
    """A tagger at 1e-4 nats: its logged norms move tenfold from one window to the next
    with the few tokens left to fit, and a fall from one high window (0.0108 to 0.00039
    while the loss only halved) read as vanishing gradients. Since the start its norm fell
    less than its loss: the model fits the training data."""
    import numpy as np

    from rnnkit.app.report.page import _gradient_signals

    rng = np.random.default_rng(0)
    steps = list(range(3, 3 * 300 + 1, 3))
    loss = (1.3 * np.exp(-np.arange(300) / 15) + 1e-4) * np.exp(rng.normal(0, 0.5, 300))
    # the norm per nat of loss grows as the fit nears perfect (as the tagger's did)
    norm = 0.5 * loss**0.7 * np.exp(rng.normal(0, 1.0, 300))
    page = html.unescape(_gradient_signals(5.0, steps, list(norm), list(loss)))
    assert "vanishing gradients" not in page and "No vanishing or exploding signal" in page
    said = re.search(
        r"(\d+) fall\(s\) of a model that fits the training data: gradients shrink with the "
        r"loss \(at step (\d+) the median training loss was ([\d.e+-]+), [\d,.]+ times below "
        r"its ([\d.e+-]+) at step 15",
        page,
    )
    assert said is not None, page
    # the figures are the running medians of the logged values it names
    i = steps.index(int(said.group(2)))
    assert float(said.group(3)) == pytest.approx(np.median(loss[i - 4 : i + 1]), rel=1e-2)
    assert float(said.group(4)) == pytest.approx(np.median(loss[:5]), rel=1e-2)

    # a loss only tenfold down (not near zero), then flat while the norm falls: vanishing
    fading = [1.0] * 40 + [0.85**i for i in range(50)]
    tenfold = [2.0] * 5 + [0.2] * 85
    page = _gradient_signals(None, steps[:90], fading, tenfold)
    assert "vanishing gradients" in page and "fits the training data" not in page
    # ... as the same course a hundredfold down is a model that fits its data
    page = _gradient_signals(None, steps[:90], fading, [2.0] * 5 + [0.02] * 85)
    assert "vanishing gradients" not in page and "fits the training data" in page


def test_the_final_training_losses_are_named_by_where_they_are_read(tmp_path):
    """An early stop one step after the log's last training record: summary.json's loss
    is of steps metrics.csv does not hold, the log's last record another figure and the
    smoothed loss a third (three "final training losses" on one page, unnamed)."""
    import csv

    run = tiny_run(
        tmp_path, "stop", steps=None, epochs=40, eval_every=3, log_every=2, patience=2, lr=0.05
    )
    summary = json.loads((run / "summary.json").read_text())
    with open(run / "metrics.csv", newline="") as f:
        train = [r for r in csv.DictReader(f) if r["event"] == "train"]
    steps, last = summary["steps"], int(train[-1]["step"])
    assert steps > last  # the run this test is about: it stopped past its last record
    page = html.unescape(render_report(run))
    body = page.split('<section id="training">')[1].split("</section>")[0]
    assert "final training loss (nats per token)" not in body
    after = (
        f"step {steps} alone" if steps == last + 1 else f"the mean over steps {last + 1}–{steps}"
    )
    rows = dict(re.findall(r"<tr><th>([^<]*)</th><td[^>]*>([^<]*)</td></tr>", body))
    label = (
        f"final training loss, {after} (summary.json; after the log's last training record, "
        f"step {last}) (nats per token)"
    )
    assert rows[label] == fmt(summary["train_loss_nats"])
    label = (
        f"training loss of the log's last record (metrics.csv, step {last}: the mean since "
        "the record before) (nats per token)"
    )
    assert rows[label] == fmt(float(train[-1]["loss_nats"]))
    label = (
        "smoothed training loss at the end: the mean of the log's last 5 training records "
        f"(steps {train[-5]['step']}–{last}) (nats per token)"
    )
    smoothed = sum(float(r["loss_nats"]) for r in train[-5:]) / 5
    assert rows[label] == fmt(smoothed) == fmt(summary["trajectory"]["train_loss_end"])


def test_the_behind_baseline_line_says_its_training_losses_are_smoothed(rnn_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(rnn_run, run)
    summary = json.loads((run / "summary.json").read_text())
    # the line of an events run that stopped behind its n-gram (its own summary's words)
    cause = "the training loss stayed near 0.255 after the best step (0.266 at the end)"
    summary["behind_baseline"] = {
        "line": f"behind baseline: …; likely cause: {cause}",
        "cause": cause,
    }
    (run / "summary.json").write_text(json.dumps(summary))
    with skipping_checksums():
        page = html.unescape(render_report(run))
    metrics = page.split('<section id="metrics">')[1].split("</section>")[0]
    assert cause in metrics
    assert (
        "The training losses in this line are smoothed: each is the mean of the 5 logged" in metrics
    )


def test_a_regressors_loss_curves_are_the_same_loss(task_data, run_cli, tmp_path, monkeypatch):
    """A regressor's training records hold its MSE under "loss_nats", its evaluations the
    MSE under "loss" and a Gaussian NLL under "loss_nats": the validation curve was the
    NLL, drawn against the training MSE."""
    import csv

    from rnnkit.diagnostics import plots

    argv = ["train", "--task", "regress", "--train", str(task_data / "seq.jsonl"), "--valid"]
    argv += [str(task_data / "seq-valid.jsonl"), "--out", str(tmp_path / "run"), "--steps", "6"]
    code, _, err = run_cli(*argv, "--hidden", "8", "--eval-every", "2", "-q")
    assert code == 0, err
    drawn = []
    real = plots.plot_losses
    monkeypatch.setattr(plots, "plot_losses", lambda *a, **k: drawn.append((a, k)) or real(*a, **k))
    render_report(tmp_path / "run")
    with open(tmp_path / "run" / "metrics.csv", newline="") as f:
        valid = [r for r in csv.DictReader(f) if r["event"] == "valid"]
    (_, _, steps, losses), options = drawn[0]
    assert list(steps) == [int(r["step"]) for r in valid]
    assert list(losses) == pytest.approx([float(r["mse"]) for r in valid])
    assert options["ylabel"] == "loss (per value)"  # it said "nats per token"
