"""Every task trains on a GPU (the CUDA tier, ``pytest -m gpu``; skipped without one).

Each task trains a few steps with ``--device cuda`` and with ``--device cpu`` from the same
seed, without dropout (the two devices draw different masks): the run must finish, its
training loss be finite and equal the CPU's to float32 rounding over a few steps. The
encoder–decoder runs every attention kind and wiring, and decodes on the GPU greedily, by
beam search and by sampling. ``_cases`` and ``_train`` also run on the CPU alone
(``test_the_cases_train_on_the_cpu``) so that the tier's own data and options stay valid
on a machine without a GPU.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

TINY = ["--hidden", "16", "--batch-size", "8", "--steps", "4", "--seed", "0", "--quiet"]
TINY += ["--no-report", "--json"]
EMB = ["--embedding", "8"]
NEEDS_GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(autouse=True, scope="module")
def _one_thread(single_thread):
    yield


def _cases(d: Path) -> dict[str, list[str]]:
    events = ["--train", str(d / "sessions.jsonl"), "--valid", str(d / "valid.jsonl"), *EMB]
    pairs = ["--task", "seq2seq", "--train", str(d / "pairs.tsv"), *EMB]
    text = ["--train", str(d / "text.txt"), "--dropout", "0", *EMB]
    cases = {
        "lm": ["--task", "lm", *text],
        "lm-gru-window": ["--task", "lm", *text, "--cell", "gru", "--bptt", "window:8"],
        "tag": ["--task", "tag", "--train", str(d / "tags.tsv"), "--dropout", "0",
                "--bidirectional", *EMB],
        "classify": ["--task", "classify", "--train", str(d / "labels.tsv"), "--dropout", "0",
                     *EMB],
        "events": ["--task", "events", *events, "--dropout", "0"],
        "params": ["--task", "params", "--train", str(d / "params.jsonl"), "--valid",
                   str(d / "params-valid.jsonl"), "--dropout", "0"],
        "regress": ["--task", "regress", "--train", str(d / "seq.jsonl"), "--valid",
                    str(d / "seq-valid.jsonl"), "--dropout", "0"],
        "seq2seq": [*pairs, "--attention", "none"],
    }  # fmt: skip
    for kind in ("dot", "bilinear", "additive"):
        # dot attention needs the decoder's width: a bidirectional encoder doubles it
        both = [] if kind == "dot" else ["--bidirectional"]
        for wiring in ("before", "after"):
            cases[f"seq2seq-{kind}-{wiring}"] = [
                *pairs, "--attention", kind, "--attention-wiring", wiring, *both,
            ]  # fmt: skip
    return cases


def _loss(out: str) -> float:
    """The training loss in a run's ``--json`` summary (the parameter-value model's: its
    session threshold, a quantile of its validation scores)."""
    for line in reversed(out.splitlines()):
        if line.startswith("{"):
            summary = json.loads(line)
            for key in ("train_loss_nats", "train_loss", "loss", "session_threshold"):
                if isinstance(summary.get(key), int | float):
                    return float(summary[key])
    raise AssertionError(f"no training loss in the summary: {out[-300:]}")


def _train(run_cli, argv: list[str], out: Path, device: str) -> float:
    code, stdout, err = run_cli("train", *argv, "--out", str(out), "--device", device, *TINY)
    assert code == 0, err[-2000:]
    loss = _loss(stdout)
    assert math.isfinite(loss), f"{device}: loss {loss}"
    return loss


@pytest.mark.parametrize("name", list(_cases(Path("."))))
def test_the_cases_train_on_the_cpu(task_data, run_cli, tmp_path, name):
    """The tier's data and options are valid: each case trains here, on the CPU."""
    _train(run_cli, _cases(task_data)[name], tmp_path / name, "cpu")


@pytest.mark.gpu
@NEEDS_GPU
@pytest.mark.parametrize("name", list(_cases(Path("."))))
def test_every_task_trains_on_cuda_as_on_the_cpu(task_data, run_cli, tmp_path, name):
    argv = _cases(task_data)[name]
    # TF32 off, so that float32 is float32: cuDNN's recurrent kernels use TF32 by default
    # (torch.backends.cudnn.allow_tf32; cuBLAS's matmuls do not), whose 10-bit mantissa
    # over a few steps can move the loss by more than the tolerance
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        on_gpu = _train(run_cli, argv, tmp_path / "cuda", "cuda")
    on_cpu = _train(run_cli, argv, tmp_path / "cpu", "cpu")
    assert on_gpu == pytest.approx(on_cpu, rel=1e-3), name


@pytest.mark.gpu
@NEEDS_GPU
@pytest.mark.parametrize("decode", [["--greedy"], ["--beam", "3"], ["--seed", "1"]])
def test_an_attention_model_decodes_on_cuda(task_data, run_cli, tmp_path, decode):
    argv = _cases(task_data)["seq2seq-additive-before"]
    _train(run_cli, argv, tmp_path / "run", "cuda")
    code, out, err = run_cli("generate", "--checkpoint", str(tmp_path / "run"), "--input",
                             "abc", "--device", "cuda", *decode)  # fmt: skip
    assert code == 0 and out.strip(), err[-2000:]
