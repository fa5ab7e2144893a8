"""Every task trains on a GPU (the CUDA tier, ``pytest -m gpu``; skipped without one).

Each task trains a few steps with ``--device cuda`` and with ``--device cpu`` from the same
seed, without dropout (the two devices draw different masks): the run must finish, its
training loss be finite and equal the CPU's to float32 rounding over a few steps. The
encoder–decoder runs every attention kind and wiring, and decodes on the GPU greedily, by
beam search and by sampling. A run of each task trained on the CPU answers every command
that loads it (``evaluate``, ``predict``, ``generate``, ``score``, ``report``) with
``--device cuda``, its figures the CPU's. ``_cases`` and ``_answers`` also run on the CPU
alone (``test_the_cases_train_on_the_cpu``, ``test_the_commands_answer_on_the_cpu``) so
that the tier's own data and options stay valid on a machine without a GPU.
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
        "tag": ["--task", "tag", "--train", str(d / "tags.tsv"), "--dropout", "0", *EMB],
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


@pytest.mark.gpu
@NEEDS_GPU
@pytest.mark.parametrize("path", ["auto", "loop", "triton"])
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_training_on_cuda_under_deterministic_algorithms(
    task_data, run_cli, tmp_path, monkeypatch, path, precision
):
    """A user's ``torch.use_deterministic_algorithms(True)``: torch raises for the
    operations that have no deterministic CUDA kernel; none of rnnkit's training may be
    one (dropout on, every GPU path, truncated and full BPTT), nor top-p sampling."""
    from rnnkit.bptt.fused import use_fused

    if path == "triton":
        pytest.importorskip("triton")
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # torch.nn needs it as well
    argv = [*_cases(task_data)["lm"], "--dropout", "0.3", "--precision", precision]
    sample = ["--prompt", "ab", "--max-len", "5", "--top-p", "0.9", "--device", "cuda"]
    torch.use_deterministic_algorithms(True)
    try:
        with use_fused(path):
            for bptt in ("segment:16", "full"):
                _train(run_cli, [*argv, "--bptt", bptt], tmp_path / bptt[:3], "cuda")
            code, out, err = run_cli("generate", "--checkpoint", str(tmp_path / "seg"), *sample)
        assert code == 0 and out.strip(), err[-2000:]
    finally:
        torch.use_deterministic_algorithms(False)


def _answers(d: Path, run: Path) -> dict[str, dict[str, list[str]]]:
    """The commands that load a trained run, for each case of :func:`_trained` (whose
    fixture writes ``lines.txt`` and ``sources.txt`` into ``d``): the figures of
    ``evaluate`` and ``score`` compare across devices, the others must answer."""
    lines, sources = d / "lines.txt", d / "sources.txt"
    report = ["report", "--out", str(run.parent / f"{run.name}.html")]
    return {
        "lm": {
            "evaluate": ["evaluate", "--data", str(d / "text.txt"), "--json"],
            "predict": ["predict", "--input", str(lines)],
            "generate": ["generate", "--prompt", "ab", "--max-len", "5", "--greedy"],
            "report": report,
        },
        "tag": {
            "evaluate": ["evaluate", "--data", str(d / "tags.tsv"), "--json"],
            "predict": ["predict", "--input", str(lines)],
            "report": report,
        },
        "classify": {
            "evaluate": ["evaluate", "--data", str(d / "labels.tsv"), "--json"],
            "predict": ["predict", "--input", str(lines)],
            "report": report,
        },
        "events": {
            "evaluate": ["evaluate", "--data", str(d / "valid.jsonl"), "--json"],
            "score": ["score", "--data", str(d / "valid.jsonl")],
            "predict": ["predict", "--input", str(d / "valid.jsonl"), "--top", "3"],
            "report": report,
        },
        "params": {
            "evaluate": ["evaluate", "--data", str(d / "params-valid.jsonl"), "--json"],
            "score": ["score", "--data", str(d / "params-valid.jsonl")],
            "report": report,
        },
        "regress": {
            "evaluate": ["evaluate", "--data", str(d / "seq-valid.jsonl"), "--json"],
            "predict": ["predict", "--input", str(d / "seq-valid.jsonl")],
            "report": report,
        },
        "seq2seq-additive-before": {
            "evaluate": ["evaluate", "--data", str(d / "pairs.tsv"), "--json"],
            "predict": ["predict", "--input", str(sources)],
            "generate": ["generate", "--input", "abc", "--beam", "3"],
            "report": report,
        },
    }


def _numbers(text: str) -> list[float]:
    """Every number of the JSON lines of ``text``."""
    found: list[float] = []

    def walk(v: object) -> None:
        if isinstance(v, bool):
            return
        if isinstance(v, int | float):
            found.append(float(v))
        elif isinstance(v, dict):
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)

    for line in text.splitlines():
        if line.startswith("{"):
            walk(json.loads(line))
    return found


def _answer(run_cli, argv: list[str], run: Path, device: str) -> str:
    code, out, err = run_cli(*argv[:1], "--checkpoint", str(run), *argv[1:], "--device", device)
    assert code == 0, f"{argv[0]} on {device}: {err[-2000:]}"
    return out


@pytest.fixture(scope="module")
def _trained(task_data, tmp_path_factory) -> dict[str, Path]:
    """Each case of :func:`_answers` trained here, on the CPU (a few steps)."""
    from rnnkit.app.cli.main import main

    root = tmp_path_factory.mktemp("trained")
    (task_data / "lines.txt").write_text("abc abd\nbca\n", encoding="utf-8")
    (task_data / "sources.txt").write_text("abc\nba\n", encoding="utf-8")
    runs = {}
    for name in _answers(task_data, root / "x"):
        runs[name] = root / name
        argv = [*_cases(task_data)[name], "--out", str(runs[name]), *TINY]
        assert main(["train", *argv, "--device", "cpu"]) == 0, name
    return runs


@pytest.mark.parametrize(
    "name, command", [(n, c) for n, cs in _answers(Path("."), Path("x")).items() for c in cs]
)
def test_the_commands_answer_on_the_cpu(task_data, run_cli, _trained, name, command):
    """The tier's commands are valid: each answers here, on the CPU."""
    argv = _answers(task_data, _trained[name])[name][command]
    _answer(run_cli, argv, _trained[name], "cpu")


@pytest.mark.gpu
@NEEDS_GPU
@pytest.mark.parametrize(
    "name, command", [(n, c) for n, cs in _answers(Path("."), Path("x")).items() for c in cs]
)
def test_every_command_answers_on_cuda_as_on_the_cpu(task_data, run_cli, _trained, name, command):
    """A run trained on the CPU, loaded onto the GPU by each command of its task: it
    answers, and the figures of ``evaluate`` and ``score`` are the CPU's to float32
    rounding (TF32 off)."""
    run = _trained[name]
    argv = _answers(task_data, run)[name][command]
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        on_gpu = _answer(run_cli, argv, run, "cuda")
    on_cpu = _answer(run_cli, argv, run, "cpu")
    if command in ("evaluate", "score"):
        assert _numbers(on_gpu) == pytest.approx(_numbers(on_cpu), rel=1e-4, abs=1e-5)
    else:
        assert len(on_gpu.splitlines()) == len(on_cpu.splitlines())
