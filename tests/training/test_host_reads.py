"""A training step reads the device once, for its figures after the backward, as a plain
PyTorch loop that prints ``loss.item()`` does; every other host read would wait for the
GPU.

Counted on the CPU with :class:`host_reads.HostReads` (what would live on the device is
marked, reads of it counted by call site), the layers forced onto the path a GPU takes
for them (PyTorch's fused kernels: cuDNN there); and, on a GPU, with torch's own
detection of synchronizing calls. Before the deferred figures a step of the character
language model read the device 10 times: the token-id check, the document starts, six
reads in the loss and the Trainer's two; a scheduled-sampling step once per time step.
"""

from __future__ import annotations

import collections
import json
import math
import random
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from host_reads import HostReads

import rnnkit.training.loop as loop_module
from rnnkit import deferred as deferred_module
from rnnkit.bptt.fused import use_fused
from rnnkit.data.events import write_sessions
from rnnkit.data.generated_sessions import generate_sessions

# The one read of the step's figures.
STEP_READ = "deferred.py"
WORDS = ["alpha", "beta", "gamma", "delta"]


def _lines(path: Path, lines: list[str]) -> str:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def _words(rng: random.Random, n: int) -> list[str]:
    return [rng.choice(WORDS) for _ in range(n)]


def _text(tmp: Path, longest: int = 12) -> list[str]:
    rng = random.Random(0)
    lines = [" ".join(_words(rng, rng.randint(1, longest))) for _ in range(200)]
    return ["--train", _lines(tmp / "t.txt", lines)]


def _labelled(tmp: Path) -> list[str]:
    rng = random.Random(1)
    rows = [f"{rng.choice('ab')}\t{' '.join(_words(rng, rng.randint(1, 9)))}" for _ in range(200)]
    data = _lines(tmp / "c.tsv", rows)
    return ["--train", data, "--valid", data]


def _tagged(tmp: Path) -> list[str]:
    rng = random.Random(2)
    lines: list[str] = []
    for _ in range(100):
        lines += [f"{w}\t{w[0].upper()}" for w in _words(rng, rng.randint(1, 7))] + [""]
    data = _lines(tmp / "t.tsv", lines)
    return ["--train", data, "--valid", data]


def _pairs(tmp: Path) -> list[str]:
    rng = random.Random(3)
    rows = []
    for _ in range(200):
        w = _words(rng, rng.randint(1, 4))
        rows.append(f"{' '.join(w)}\t{' '.join(reversed(w))}")
    data = _lines(tmp / "p.tsv", rows)
    return ["--train", data, "--valid", data]


def _sequences(tmp: Path) -> list[str]:
    rows = []
    for i in range(40):
        seq = [[math.sin(0.3 * i + 0.4 * k), math.cos(0.3 * i + 0.4 * k)] for k in range(3 + i % 7)]
        rows.append(json.dumps({"seq": seq, "y": [seq[0][0]]}))
    data = _lines(tmp / "r.jsonl", rows)
    return ["--train", data, "--valid", data]


def _sessions(tmp: Path) -> list[str]:
    write_sessions(tmp / "e.jsonl", generate_sessions(40, seed=0))
    write_sessions(tmp / "v.jsonl", generate_sessions(30, seed=1, prefix="v"))
    return ["--train", str(tmp / "e.jsonl"), "--valid", str(tmp / "v.jsonl")]


# case: (data, options). No mask is copied to the host in a step: a task's masks are made on
# the host and moved with their host copies kept (rnnkit.bptt.mask_facts.move_mask): the
# time loop asks them there, and of their views (a step's column under scheduled
# sampling, a segment) and flipped forms; a tagger picks its real words on that copy and
# makes its character mask from its characters' host copy.
CASES: dict[str, tuple[Callable[[Path], list[str]], list[str]]] = {
    "lm": (_text, ["--task", "lm"]),  # stream segments; document starts on the host
    "lm-scheduled-sampling": (
        lambda tmp: _text(tmp, 5),
        ["--task", "lm", "--bptt", "full", "--scheduled-sampling", "linear:5"],
    ),
    "classify": (_labelled, ["--task", "classify"]),
    "tag": (_tagged, ["--task", "tag", "--no-char-rnn"]),
    # the character RNN's mask is made from the characters' host copy too
    "tag-chars": (_tagged, ["--task", "tag", "--char-rnn"]),
    "seq2seq-attention": (
        _pairs,
        ["--task", "seq2seq", "--attention", "additive", "--bidirectional"],
    ),
    "regress": (_sequences, ["--task", "regress"]),
    "regress-gaussian": (_sequences, ["--task", "regress", "--loss", "gaussian"]),
    "events": (_sessions, ["--task", "events"]),
    "events-segments": (_sessions, ["--task", "events", "--bptt", "segment:3"]),
}


def _train(run_cli, tmp_path: Path, case: str, *device: str) -> None:
    data, options = CASES[case]
    code, _, err = run_cli(
        "train", *data(tmp_path), *options, "--out", str(tmp_path / "run"), "--steps", "3",
        "--quiet", "--hidden", "8", "--threads", "1", *device,
    )  # fmt: skip
    assert code == 0, err


def _per_step(monkeypatch, wrap: Callable[..., collections.Counter[str]]) -> list:
    """Each ``Trainer._train_step`` run under ``wrap(run)``, its count kept."""
    per_step: list[collections.Counter[str]] = []
    original = loop_module.Trainer._train_step

    def step(self, *args, **kwargs):
        taken: list = []
        per_step.append(wrap(self, lambda: taken.append(original(self, *args, **kwargs))))
        return taken[0]

    monkeypatch.setattr(loop_module.Trainer, "_train_step", step)
    return per_step


@pytest.mark.parametrize("case", list(CASES))
def test_a_step_reads_its_figures_once_and_each_mask_once(
    run_cli, tmp_path: Path, monkeypatch, case: str
) -> None:
    def counted(trainer, run) -> collections.Counter[str]:
        with HostReads(trainer.model) as reads:
            run()
        return collections.Counter(s.split(":")[0] for s in reads.sites.elements())

    per_step = _per_step(monkeypatch, counted)
    monkeypatch.setattr(deferred_module, "waits", lambda tensor: True)  # as on a GPU
    with use_fused("fused"):
        _train(run_cli, tmp_path, case)
    expected = collections.Counter({STEP_READ: 1})
    assert len(per_step) == 3 and all(step == expected for step in per_step), per_step


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("case", list(CASES))
def test_on_cuda_a_step_waits_for_the_device_as_often_as_counted(
    run_cli, tmp_path: Path, monkeypatch, case: str
) -> None:
    """What the count above stands for, checked where it matters: torch's own detection
    of synchronizing CUDA calls (``torch.cuda.set_sync_debug_mode``) inside each step,
    batches copied to the device included (from pinned memory: no wait)."""

    def waits(trainer, run) -> collections.Counter[str]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                run()
            finally:
                torch.cuda.set_sync_debug_mode("default")
        messages = [str(w.message) for w in caught if "synchroniz" in str(w.message)]
        return collections.Counter(messages)

    from rnnkit.bptt import gpu_route

    if gpu_route.triton_available():  # its first-use probe reads one value back, once
        gpu_route._runs_on(torch.device("cuda", torch.cuda.current_device()))
    per_step = _per_step(monkeypatch, waits)
    _train(run_cli, tmp_path, case, "--device", "cuda")
    assert len(per_step) == 3, per_step
    assert all(sum(step.values()) == 1 for step in per_step), per_step
