"""``--device`` of ``evaluate``, ``predict``, ``generate``, ``score`` and ``report``: the
model loads where it is asked; ``auto`` is the CPU where there is no GPU and gives the
default's results; ``cuda`` without a GPU is one line naming the option. On a GPU, every
command of every task against the CPU's figures: ``tests/app/cli/test_tasks_on_cuda.py``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rnnkit.app.cli.main import main
from rnnkit.data.events import write_sessions
from rnnkit.data.generated_pairs import generate_pairs, write_pairs
from rnnkit.data.generated_sessions import generate_sessions

TINY = ["--hidden", "8", "--embedding", "8", "--batch-size", "8", "--quiet", "--no-report"]


@pytest.fixture(autouse=True, scope="module")
def _one_thread(single_thread):
    yield


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("device")
    (d / "text.txt").write_text("abc abd\nbca cab\n" * 30, encoding="utf-8")
    write_pairs(d / "pairs.tsv", generate_pairs("reverse", 48, seed=0, max_len=5))
    write_sessions(d / "sessions.jsonl", generate_sessions(60, anomalies=0, seed=1))
    write_sessions(d / "valid.jsonl", generate_sessions(30, anomalies=3, seed=2))
    tasks = {
        "lm": ["--task", "lm", "--train", str(d / "text.txt"), "--bptt", "full"],
        "seq2seq": ["--task", "seq2seq", "--train", str(d / "pairs.tsv")],
        "events": [
            "--task", "events", "--train", str(d / "sessions.jsonl"),
            "--valid", str(d / "valid.jsonl"),
        ],
    }  # fmt: skip
    out = {"data": d}
    for name, argv in tasks.items():
        out[name] = d / name
        assert main(["train", *argv, "--out", str(out[name]), "--steps", "3", *TINY]) == 0
    return out


def _commands(runs: dict[str, Path]) -> dict[str, list[str]]:
    d = runs["data"]
    return {
        "evaluate": ["evaluate", "--checkpoint", str(runs["lm"]), "--data", str(d / "text.txt"),
                     "--json"],
        "predict": ["predict", "--checkpoint", str(runs["lm"]), "--input", str(d / "text.txt")],
        "generate-lm": ["generate", "--checkpoint", str(runs["lm"]), "--prompt", "ab",
                        "--max-len", "5", "--seed", "3"],
        "generate-seq2seq": ["generate", "--checkpoint", str(runs["seq2seq"]), "--input", "abc"],
        "score": ["score", "--checkpoint", str(runs["events"]), "--data",
                  str(d / "valid.jsonl")],
        "report": ["report", "--checkpoint", str(runs["lm"]), "--out", str(d / "r.html")],
    }  # fmt: skip


@pytest.mark.parametrize(
    "command", ["evaluate", "predict", "generate-lm", "generate-seq2seq", "score", "report"]
)
def test_auto_on_a_machine_without_a_gpu_is_the_default(runs, run_cli, command):
    argv = _commands(runs)[command]
    code, default, err = run_cli(*argv)
    assert code == 0, err
    code, auto, err = run_cli(*argv, "--device", "auto")
    assert code == 0, err
    if torch.cuda.is_available():  # auto is the GPU there, whose figures differ in rounding
        return
    if command != "report":  # the report's path is the same; its content has a timestamp
        assert auto == default
    code, out, err = run_cli(*argv, "--device", "cuda")
    assert code == 2 and out == "", err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "--device cuda: no CUDA device" in lines[0], err


def test_a_wrong_device_is_refused_by_the_parser(runs, run_cli):
    code, _, err = run_cli(*_commands(runs)["evaluate"], "--device", "tpu")
    assert code == 2 and "invalid choice: 'tpu'" in err
