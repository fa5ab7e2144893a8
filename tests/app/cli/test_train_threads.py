"""``rnnkit train --threads`` / ``RNNKIT_THREADS``: the count used, its line in the
summary, torch's count restored afterwards, and bad values as one line (exit 2)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from rnnkit.app.cli.main import main

WORDS = ["the", "cat", "sat", "on", "a", "mat", "and", "dog"]


@pytest.fixture(scope="module")
def train_file(tmp_path_factory) -> Path:
    rng = random.Random(0)
    d = tmp_path_factory.mktemp("data")
    text = "".join(" ".join(rng.choice(WORDS) for _ in range(5)) + "\n" for _ in range(40))
    (d / "train.txt").write_text(text, encoding="utf-8")
    return d / "train.txt"


def _args(train_file: Path, out: Path, *extra: str) -> list[str]:
    return [
        "train",
        "--train",
        str(train_file),
        "--out",
        str(out),
        "--hidden",
        "8",
        "--embedding",
        "8",
        "--batch-size",
        "4",
        "--ngram-order",
        "2",
        "--steps",
        "2",
        "--quiet",
        *extra,
    ]


def test_threads_option_is_used_reported_and_restored(train_file, tmp_path, capsys) -> None:
    before = torch.get_num_threads()
    assert main(_args(train_file, tmp_path / "r", "--threads", "2")) == 0
    out = capsys.readouterr().out
    assert "threads: 2 (fixed by --threads/RNNKIT_THREADS)" in out
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["threads"].startswith("threads: 2 (fixed")
    assert torch.get_num_threads() == before


def test_automatic_choice_is_reported(train_file, tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.delenv("RNNKIT_THREADS", raising=False)
    assert main(_args(train_file, tmp_path / "r")) == 0
    # batch 4 < 8 rows a thread: one thread whatever the load
    assert "threads: 1 of " in capsys.readouterr().out


@pytest.mark.parametrize(
    ("extra", "env", "message"),
    [
        (["--threads", "0"], None, "--threads must be >= 1, got 0"),
        ([], "lots", "RNNKIT_THREADS must be a positive integer or 'auto', got 'lots'"),
    ],
)
def test_bad_thread_counts(train_file, tmp_path, capsys, monkeypatch, extra, env, message):
    if env is not None:
        monkeypatch.setenv("RNNKIT_THREADS", env)
    assert main(_args(train_file, tmp_path / "r", *extra)) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
