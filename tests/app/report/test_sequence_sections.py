"""The gradient-flow section of classifiers, taggers, regressors, event models, translators
and parameter-value models: drawn on the run's own sequences, its bars adding up to the
model's own backward pass."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest
import torch

from rnnkit.app.report.page import render_report

TINY = ["--steps", "3", "--hidden", "8", "--no-report", "-q", "--seed", "1"]


def _value_sequences(path: Path, n: int) -> Path:
    """Sequences of 3–7 two-value frames with a two-value target ``y`` (their mean)."""
    gen = torch.Generator().manual_seed(n)
    rows = []
    for i in range(n):
        seq = torch.randn(3 + i % 5, 2, generator=gen)
        rows.append(json.dumps({"seq": seq.tolist(), "y": seq.mean(0).tolist()}))
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


CASES = {
    # two bidirectional layers with zoneout: the backward half and the upper layer's masks
    "classify": lambda d: ["--task", "classify", "--train", str(d / "labels.tsv"),
                           "--bidirectional", "--layers", "2", "--pooling", "last",
                           "--cell", "gru", "--zoneout", "0.2"],
    "classify-vectors": lambda d: ["--task", "classify", "--inputs", "vectors", "--train",
                                   str(d / "labelled.jsonl"), "--pooling", "mean"],
    "tag": lambda d: ["--task", "tag", "--train", str(d / "tags.tsv"), "--char-rnn"],
    "regress-next": lambda d: ["--task", "regress", "--train", str(d / "seq.jsonl"),
                               "--valid", str(d / "seq-valid.jsonl"), "--cell", "rnn"],
    "regress-value": lambda d: ["--task", "regress", "--target", "value", "--train",
                                str(_value_sequences(d / "value.jsonl", 30)), "--bidirectional",
                                "--layer-norm"],
    "events": lambda d: ["--task", "events", "--train", str(d / "sessions.jsonl"), "--valid",
                         str(d / "valid.jsonl"), "--layers", "2"],
    # the decoder starts from every encoder layer's final (h, c) and attends to the top
    "seq2seq": lambda d: ["--task", "seq2seq", "--train", str(d / "pairs.tsv"), "--attention",
                          "additive", "--bidirectional", "--layers", "2"],
    # no attention: the final state is all that reaches the decoder
    "seq2seq-no-attention": lambda d: ["--task", "seq2seq", "--train", str(d / "pairs.tsv"),
                                       "--attention", "none", "--cell", "gru"],
    # one regressor per key: the key with the most vectors in the validation file
    "params": lambda d: ["--task", "params", "--train", str(d / "params.jsonl"), "--valid",
                         str(d / "params-valid.jsonl")],
}  # fmt: skip


def _figure(body: str, label: str) -> float:
    found = re.search(re.escape(label) + r"</t[hd]>\s*<td[^>]*>([^<]*)</td>", body)
    assert found is not None, label
    return float(found.group(1))


@pytest.mark.parametrize("case", list(CASES))
def test_the_section_is_drawn_and_its_bars_are_the_models_backward_pass(
    case, task_data, run_cli, tmp_path
):
    out = tmp_path / "run"
    code, _, err = run_cli("train", *CASES[case](task_data), "--out", str(out), *TINY)
    assert code == 0, err
    page = html.unescape(render_report(out))
    body = page.split('<section id="gradients">')[1].split("</section>")[0]
    assert body.count("<img") == 3  # the flow, the per-step and the per-lag bars
    assert re.search(r"On \d+ (texts|sequences|sentences|normal sessions|pairs) from \S+", body)
    total = _figure(body, "‖∂L/∂W_hh‖: sum of the bars")
    assert total > 0
    assert total == pytest.approx(_figure(body, "‖∂L/∂W_hh‖: backward pass of the model"), rel=2e-3)
    assert "Gate saturation" in body
    if "--bidirectional" in CASES[case](task_data):
        assert "the first layer's forward direction" in body
    if case == "params":
        assert re.search(r"params-valid.jsonl, the key '[^']+' \(\d+ vectors\)", body)


# every case, and a language model (its own sections: samples, predictions)
ON_THE_GPU = {**CASES, "lm": lambda d: ["--task", "lm", "--train", str(d / "text.txt")]}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("case", list(ON_THE_GPU))
def test_on_the_gpu_the_bars_are_the_models_backward_pass_there(case, task_data, run_cli, tmp_path):
    """`rnnkit report --device cuda`: the whole page (the attention pictures and the
    language model's predictions too, made from ids read on the host), the section's
    diagnostics and the model's own backward both on the GPU (TF32 off: float32 is
    float32)."""
    out = tmp_path / "run"
    code, _, err = run_cli("train", *ON_THE_GPU[case](task_data), "--out", str(out), *TINY)
    assert code == 0, err
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        page = html.unescape(render_report(out, device="cuda"))
    body = page.split('<section id="gradients">')[1].split("</section>")[0]
    total = _figure(body, "‖∂L/∂W_hh‖: sum of the bars")
    assert total > 0
    assert total == pytest.approx(_figure(body, "‖∂L/∂W_hh‖: backward pass of the model"), rel=2e-3)


def test_without_a_readable_file_the_section_says_so(task_data, run_cli, tmp_path):
    data = tmp_path / "labels.tsv"
    data.write_bytes((task_data / "labels.tsv").read_bytes())
    out = tmp_path / "run"
    code, _, err = run_cli(
        "train", "--task", "classify", "--train", str(data), "--out", str(out), *TINY
    )
    assert code == 0, err
    data.unlink()
    body = render_report(out).split('<section id="gradients">')[1].split("</section>")[0]
    assert "No sequences to read." in body


def test_an_events_model_with_a_window_is_named_not_drawn(task_data, run_cli, tmp_path):
    """A `--window` model reads the last H events only: the flow over whole sessions is
    not its function, and the section says so."""
    out = tmp_path / "run"
    argv = ["--task", "events", "--train", str(task_data / "sessions.jsonl"), "--window", "4"]
    code, _, err = run_cli("train", *argv, "--out", str(out), *TINY)
    assert code == 0, err
    body = render_report(out).split('<section id="gradients">')[1].split("</section>")[0]
    assert "reads the last 4 events" in body and "<img" not in body


def test_a_decoder_only_translator_is_named_not_drawn(task_data, run_cli, tmp_path):
    out = tmp_path / "run"
    argv = ["--task", "seq2seq", "--train", str(task_data / "pairs.tsv"), "--decoder-only"]
    code, _, err = run_cli("train", *argv, "--out", str(out), *TINY)
    assert code == 0, err
    body = render_report(out).split('<section id="gradients">')[1].split("</section>")[0]
    assert "--decoder-only" in body and "<img" not in body
