"""Crash safety: SIGKILL at random moments never leaves an unloadable run directory, and
SIGTERM finishes the step in flight, saves and exits cleanly."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from rnnkit.app.tasks.lm import load_lm
from rnnkit.training.checkpoint import load_snapshot
from rnnkit.training.manifest import skipping_checksums, verify_run

RNNKIT = [sys.executable, "-m", "rnnkit"]


def _corpus(tmp_path: Path) -> Path:
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
    text = "\n".join(" ".join(words[(i * 3 + j) % 8] for j in range(10)) for i in range(400))
    path = tmp_path / "corpus.txt"
    path.write_text(text, encoding="utf-8")
    return path


def _train_cmd(corpus: Path, out: Path, resume: bool = False) -> list[str]:
    cmd = [
        *RNNKIT,
        "train",
        "--train",
        str(corpus),
        "--out",
        str(out),
        "--hidden",
        "16",
        "--embedding",
        "8",
        "--batch-size",
        "4",
        "--bptt",
        "segment:16",
        "--steps",
        "100000",
        "--eval-every",
        "3",
        "--quiet",
    ]
    return [*cmd, "--resume"] if resume else cmd


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def _snapshot_step(out: Path) -> int | None:
    if not (out / "latest.json").exists():
        return None
    with skipping_checksums():  # a run cut short by SIGKILL has no manifest
        model = load_lm(out)[2]  # config, vocab and best weights load
    state, _ = load_snapshot(out, model, None)  # checksums verified
    return int(state["step"])


def _pointer_step(out: Path) -> int | None:
    try:
        return int(json.loads((out / "latest.json").read_text())["step"])
    except FileNotFoundError:
        return None


def test_sigkill_at_random_moments_leaves_a_loadable_run(tmp_path):
    rng = random.Random(1234)
    corpus, out = _corpus(tmp_path), tmp_path / "run"
    last_step = None
    for kill in range(4):
        proc = subprocess.Popen(
            _train_cmd(corpus, out, resume=last_step is not None),
            env=_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        # Wait for the first snapshot of this run, then kill at a random moment.
        deadline = time.monotonic() + 240  # generous: CI machines may be loaded
        while time.monotonic() < deadline and proc.poll() is None:
            # Only the pointer while the trainer runs: it may delete an older snapshot
            # under a concurrent reader; latest.json itself is replaced atomically.
            step = _pointer_step(out)
            if step is not None and step != last_step:
                break
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 0.6))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        assert proc.returncode == -signal.SIGKILL
        step = _snapshot_step(out)
        assert step is not None, f"kill {kill}: no loadable snapshot"
        if last_step is not None:
            assert step >= last_step, "a resumed run lost saved progress"
        last_step = step
        if kill > 0:  # a resumed run saved at least once: leftovers of kills are gone
            snaps = [p for p in (out / "snapshots").iterdir() if p.name.startswith("step-")]
            stale = [p for p in (out / "snapshots").iterdir() if p.name.endswith(".tmp")]
            assert len(snaps) <= 2 and len(stale) <= 1, (snaps, stale)
    # The run directory is whole: metrics are valid JSON lines, weights load.
    for line in (out / "metrics.jsonl").read_text().splitlines():
        json.loads(line)
    with skipping_checksums():
        assert all(torch.isfinite(p).all() for p in load_lm(out)[2].parameters())


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_sigterm_and_sigint_save_and_exit_cleanly(tmp_path, sig):
    # SIGHUP (a closed terminal) killed the run without saving the step in flight
    corpus, out = _corpus(tmp_path), tmp_path / "run"
    proc = subprocess.Popen(
        _train_cmd(corpus, out),
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 240  # generous: CI machines may be loaded
    while time.monotonic() < deadline and _pointer_step(out) is None:
        time.sleep(0.05)
    time.sleep(0.3)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "saved" in lines[0] and "Traceback" not in err
    # "stopped: stopped by SIGINT" said it twice
    assert lines[0].startswith(f"rnnkit train: stopped: {sig.name} after step "), lines[0]
    events = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    stopped = [e for e in events if e["event"] == "interrupted"]
    assert stopped and _snapshot_step(out) == stopped[-1]["step"]
    verify_run(out)  # stopped cleanly: every file whole, and vouched for by the manifest
