"""Files for a tiny run of every task (``task_data``), shared by the tests that train each
task once: tests/app/tasks/test_run_outputs.py and tests/app/cli/test_tasks_on_cuda.py."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from rnnkit.data.events import write_sessions
from rnnkit.data.generated import (
    letter_order_examples,
    previous_word_sentences,
    write_labelled,
    write_token_tags,
)
from rnnkit.data.generated_pairs import generate_pairs, write_pairs
from rnnkit.data.generated_sessions import generate_sessions


def _sequences(path: Path, n: int, seed: int, labelled: bool = False) -> None:
    """Two-value sequences of 8 frames (a sine and a cosine from a random phase); with
    ``labelled``, ``up`` or ``down`` by the first value's first move."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        t = float(torch.rand(1, generator=gen)) * 6 + 0.4 * torch.arange(8)
        seq = torch.stack([t.sin(), t.cos()], 1).tolist()
        label = {"label": "up" if seq[1][0] > seq[0][0] else "down"} if labelled else {}
        rows.append(json.dumps({"seq": seq, **label}))
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")


def _params_sessions(path: Path, n: int, seed: int) -> None:
    """Sessions ``open (size) → reads (latency) → close`` with their parameter values."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        reads = rng.randint(2, 4)
        events = ["open", *["read"] * reads, "close"]
        params = [[rng.gauss(1000, 100)], *[[rng.gauss(10, 1)] for _ in range(reads)], []]
        rows.append(json.dumps({"session": f"s{seed}-{i}", "events": events, "params": params}))
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")


@pytest.fixture(scope="module")
def task_data(tmp_path_factory) -> Path:
    """A directory with small training (and validation) files of every task: text,
    tagged tokens, labelled lines, pairs, event sessions, sessions with parameters,
    real-valued sequences (unlabelled and labelled)."""
    d = tmp_path_factory.mktemp("task_data")
    (d / "text.txt").write_text("abc abd\nbca cab\n" * 40, encoding="utf-8")
    write_token_tags(previous_word_sentences(60, seed=0, noise=0.1), d / "tags.tsv")
    write_labelled(letter_order_examples(80, seed=0, noise=0.1), d / "labels.tsv")
    write_pairs(d / "pairs.tsv", generate_pairs("reverse", 48, seed=0, max_len=5))
    write_sessions(d / "sessions.jsonl", generate_sessions(60, anomalies=0, seed=1))
    write_sessions(d / "valid.jsonl", generate_sessions(30, anomalies=3, seed=2))
    _params_sessions(d / "params.jsonl", 40, 0)
    _params_sessions(d / "params-valid.jsonl", 20, 1)
    _sequences(d / "seq.jsonl", 40, 0)
    _sequences(d / "seq-valid.jsonl", 10, 1)
    _sequences(d / "labelled.jsonl", 40, 2, labelled=True)
    return d
