"""A training step reads the device once (after the backward), as a plain PyTorch loop
that prints ``loss.item()`` does; every other host read waits for the GPU.

Counted on the CPU with :class:`host_reads.HostReads` (what would live on the device is
marked, reads of it counted by call site), the layers forced onto the path a GPU takes
for them (PyTorch's fused kernels: cuDNN there). Before the deferred figures a step of
the character language model read the device 10 times: the token-id check, the
document starts, six reads in the loss and the Trainer's two.
"""

from __future__ import annotations

import collections
import random
import warnings
from pathlib import Path

import pytest
import torch
from host_reads import HostReads

import rnnkit.training.loop as loop_module
from rnnkit.bptt.fused import use_fused

# The one read of the step's figures; the host copy of a padding mask, read once per
# mask to choose cuDNN's lengths (rnnkit.bptt.mask_facts: a reverse direction's flipped
# mask, the mask's views, a tagger's choice of real words and the attention decoder's
# check for sources without a real step are all answered from that copy).
STEP_READ = "metrics/deferred.py"
MASK_COPY = "bptt/mask_facts.py"


@pytest.fixture
def counted(monkeypatch):
    """Host reads per call of ``Trainer._train_step``, by file."""
    per_step: list[collections.Counter[str]] = []
    original = loop_module.Trainer._train_step

    def step(self, *args, **kwargs):
        with HostReads(self.model) as reads:
            taken = original(self, *args, **kwargs)
        per_step.append(collections.Counter(s.split(":")[0] for s in reads.sites.elements()))
        return taken

    monkeypatch.setattr(loop_module.Trainer, "_train_step", step)
    return per_step


def _lines(path: Path, lines: list[str]) -> str:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def _train(run_cli, tmp_path: Path, *argv: str) -> None:
    with use_fused("fused"):
        code, _, err = run_cli(
            "train", *argv, "--out", str(tmp_path / "run"), "--steps", "3", "--quiet",
            "--hidden", "8", "--threads", "1",
        )  # fmt: skip
    assert code == 0, err


def _words(rng: random.Random, n: int) -> list[str]:
    return [rng.choice(["alpha", "beta", "gamma", "delta"]) for _ in range(n)]


def test_scheduled_sampling_reads_its_figures_once_and_its_mask_once(
    run_cli, tmp_path: Path, counted
) -> None:
    """One step at a time through the stack, each with its column of the mask: the
    columns are views of one mask, answered from one host copy (it was one per step)."""
    rng = random.Random(4)
    text = _lines(tmp_path / "t.txt", [" ".join(_words(rng, rng.randint(1, 5))) for _ in range(80)])
    _train(run_cli, tmp_path, "--task", "lm", "--train", text, "--bptt", "full",
           "--scheduled-sampling", "linear:5")  # fmt: skip
    assert counted and all(step == {STEP_READ: 1, MASK_COPY: 1} for step in counted), counted


def test_the_character_language_model_reads_the_device_once_per_step(
    run_cli, tmp_path: Path, counted
) -> None:
    rng = random.Random(0)
    text = _lines(tmp_path / "t.txt", [" ".join(_words(rng, 12)) for _ in range(300)])
    _train(run_cli, tmp_path, "--task", "lm", "--train", text)  # stream segments, starts
    assert len(counted) == 3
    assert all(step == {STEP_READ: 1} for step in counted), counted


def test_a_classifier_reads_its_figures_once_and_its_mask_once(
    run_cli, tmp_path: Path, counted
) -> None:
    rng = random.Random(1)
    rows = [f"{rng.choice('ab')}\t{' '.join(_words(rng, rng.randint(1, 9)))}" for _ in range(200)]
    data = _lines(tmp_path / "c.tsv", rows)
    _train(run_cli, tmp_path, "--task", "classify", "--train", data, "--valid", data)
    assert counted and all(step == {STEP_READ: 1, MASK_COPY: 1} for step in counted), counted


@pytest.mark.parametrize("chars", [False, True])
def test_a_tagger_reads_its_figures_once_and_each_mask_once(
    run_cli, tmp_path: Path, counted, chars: bool
) -> None:
    rng = random.Random(2)
    lines: list[str] = []
    for _ in range(100):
        lines += [f"{w}\t{w[0].upper()}" for w in _words(rng, rng.randint(1, 7))] + [""]
    data = _lines(tmp_path / "t.tsv", lines)
    flag = "--char-rnn" if chars else "--no-char-rnn"
    _train(run_cli, tmp_path, "--task", "tag", "--train", data, "--valid", data, flag)
    # the character RNN: its own mask (the real words are picked on the word mask's copy)
    expected = {STEP_READ: 1, MASK_COPY: 2 if chars else 1}
    assert counted and all(step == expected for step in counted), counted


def test_an_encoder_decoder_with_attention_reads_its_figures_once_and_its_source_once(
    run_cli, tmp_path: Path, counted
) -> None:
    rng = random.Random(3)
    rows = []
    for _ in range(200):
        w = _words(rng, rng.randint(1, 4))
        rows.append(f"{' '.join(w)}\t{' '.join(reversed(w))}")
    data = _lines(tmp_path / "p.tsv", rows)
    _train(run_cli, tmp_path, "--task", "seq2seq", "--train", data, "--valid", data,
           "--attention", "additive", "--bidirectional")  # fmt: skip
    expected = {STEP_READ: 1, MASK_COPY: 1}  # the source's (empty sources asked of it)
    assert counted and all(step == expected for step in counted), counted


@pytest.mark.parametrize("loss", ["mse", "gaussian"])
def test_a_regressor_reads_its_figures_once_and_its_mask_once(
    run_cli, tmp_path: Path, counted, loss: str
) -> None:
    import json
    import math

    rows = []
    for i in range(40):
        t = [0.3 * i + 0.4 * k for k in range(3 + i % 7)]
        seq = [[math.sin(v), math.cos(v)] for v in t]
        rows.append(json.dumps({"seq": seq, "y": [seq[0][0]]}))
    data = _lines(tmp_path / "r.jsonl", rows)
    _train(run_cli, tmp_path, "--task", "regress", "--train", data, "--valid", data,
           "--loss", loss)  # fmt: skip
    assert counted and all(step == {STEP_READ: 1, MASK_COPY: 1} for step in counted), counted


@pytest.mark.parametrize("bptt", ["full", "segment:3"])
def test_an_events_model_reads_its_figures_once_and_its_mask_once(
    run_cli, tmp_path: Path, counted, bptt: str
) -> None:
    from rnnkit.data.events import write_sessions
    from rnnkit.data.generated_sessions import generate_sessions

    write_sessions(tmp_path / "e.jsonl", generate_sessions(40, seed=0))
    write_sessions(tmp_path / "v.jsonl", generate_sessions(30, seed=1, prefix="v"))
    _train(run_cli, tmp_path, "--task", "events", "--train", str(tmp_path / "e.jsonl"),
           "--valid", str(tmp_path / "v.jsonl"), "--bptt", bptt)  # fmt: skip
    assert counted and all(step == {STEP_READ: 1, MASK_COPY: 1} for step in counted), counted


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_a_language_model_step_waits_for_the_device_once(
    run_cli, tmp_path: Path, monkeypatch
) -> None:
    """What the count above stands for, checked where it matters: torch's own detection
    of synchronizing CUDA calls (``torch.cuda.set_sync_debug_mode``) inside each step,
    batches copied to the device included (from pinned memory: no wait)."""
    waits: list[list[str]] = []
    original = loop_module.Trainer._train_step

    def step(self, *args, **kwargs):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                return original(self, *args, **kwargs)
            finally:
                torch.cuda.set_sync_debug_mode("default")
                waits.append([str(w.message) for w in caught if "synchroniz" in str(w.message)])

    monkeypatch.setattr(loop_module.Trainer, "_train_step", step)
    rng = random.Random(0)
    text = _lines(tmp_path / "t.txt", [" ".join(_words(rng, 12)) for _ in range(300)])
    code, _, err = run_cli("train", "--task", "lm", "--train", text, "--out",
                           str(tmp_path / "run"), "--steps", "3", "--quiet", "--hidden", "8",
                           "--device", "cuda")  # fmt: skip
    assert code == 0, err
    assert len(waits) == 3 and all(len(w) == 1 for w in waits), waits
