"""``manifest.json``: written last over every file of a run, checked on every read; a run
without one, or with a file changed, added or removed since, is refused unless the check
is skipped on request."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from rnnkit.errors import CheckpointError
from rnnkit.training.checkpoint import load_model_weights, save_model_weights
from rnnkit.training.manifest import (
    MANIFEST,
    checksums_skipped,
    covered_files,
    skipping_checksums,
    verify_run,
    write_manifest,
    writing_run,
)


def _run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    (run / "snapshots" / "step-1").mkdir(parents=True)
    (run / "keys" / "k0").mkdir(parents=True)
    (run / "config.json").write_text('{"a": 1}\n')
    (run / "ngram.safetensors").write_bytes(b"x" * 100)
    (run / "keys" / "k0" / "model.safetensors").write_bytes(b"y" * 10)
    (run / "keys" / "k0" / "metrics.jsonl").write_text("{}\n")
    (run / "snapshots" / "step-1" / "state.json").write_text("{}")
    for name in ("metrics.jsonl", "metrics.csv", "report.html", ".lock", ".x.tmp"):
        (run / name).write_text("log\n")
    write_manifest(run)
    return run


def test_the_manifest_covers_every_run_file_and_leaves_out_logs_and_snapshots(tmp_path):
    run = _run(tmp_path)
    assert sorted(covered_files(run)) == ["config.json", "keys/k0/model.safetensors",
                                        "ngram.safetensors"]  # fmt: skip
    doc = json.loads((run / MANIFEST).read_text())
    assert doc["files"]["ngram.safetensors"]["size"] == 100
    import hashlib

    assert doc["files"]["config.json"]["sha256"] == hashlib.sha256(b'{"a": 1}\n').hexdigest()
    verify_run(run)
    (run / "metrics.jsonl").write_text("more\n")  # logs grow: not covered
    (run / "report.html").write_text("<html>")
    verify_run(run)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda r: (r / "ngram.safetensors").write_bytes(b"x" * 50 + b"z" * 32 + b"x" * 18),
         "ngram.safetensors: does not match its SHA-256 in manifest.json"),
        (lambda r: (r / "keys" / "k0" / "model.safetensors").write_bytes(b"y" * 9),
         "k0/model.safetensors: does not match its SHA-256"),
        (lambda r: (r / "ngram.safetensors").unlink(), "ngram.safetensors: missing"),
        (lambda r: (r / "baseline.safetensors").write_bytes(b"b"),
         "baseline.safetensors: not in manifest.json (added after the run was written)"),
        (lambda r: (r / MANIFEST).unlink(), "manifest.json: missing, so the run's files"),
        (lambda r: (r / MANIFEST).write_text('{"format": "rnnkit.manifest", "version": 1, '
                                             '"files": {"../x": {"size": 1, "sha256": ""}}}'),
         "manifest.json: not an rnnkit manifest"),
        (lambda r: (r / MANIFEST).write_text("[" * 1000 + "]" * 1000), "nested too deeply"),
    ],
)  # fmt: skip
def test_a_changed_missing_or_added_file_is_one_line_naming_it(tmp_path, change, words):
    run = _run(tmp_path)
    verify_run(run)  # checked once: the cache must not hide a later change
    change(run)
    with pytest.raises(CheckpointError) as info:
        verify_run(run)
    message = str(info.value)
    assert words in message and "\n" not in message
    assert (
        "--skip-checksums" in message
        or "not an rnnkit manifest" in message
        or ("nested" in message)
    )
    with skipping_checksums():
        verify_run(run)


def test_the_environment_skips_and_a_cut_short_run_may_resume(tmp_path, monkeypatch):
    run = _run(tmp_path)
    (run / MANIFEST).unlink()
    verify_run(run, missing_ok=True)  # --resume of a run cut short
    with pytest.raises(CheckpointError):
        verify_run(run)
    monkeypatch.setenv("RNNKIT_SKIP_CHECKSUMS", "1")
    verify_run(run)


def test_a_run_whose_replacement_was_killed_says_where_the_old_run_waits(tmp_path):
    """``train --overwrite`` moves the old run aside until the new one saved; killed in
    between, the directory holds the new run's start and the old run aside: a reader
    says so, and how to get it back, instead of pointing to --resume."""
    run = tmp_path / "run"
    (run / ".replaced-k1").mkdir(parents=True)
    (run / ".replaced-k1" / "model.safetensors").write_bytes(b"old")
    (run / "config.json").write_text('{"a": 1}\n')
    with pytest.raises(CheckpointError) as info:
        verify_run(run)
    message = str(info.value)
    assert "was being replaced when its process ended" in message and "\n" not in message
    assert str(run / ".replaced-k1") in message and "--resume" not in message
    # The new run still training (the process whose pid the lock file holds lives): it
    # is not "ended". (Read, not locked: a reader's lock made a training starting then fail.)
    import subprocess
    import sys

    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (run / ".lock").write_text(f"{holder.pid}\n")
        with pytest.raises(CheckpointError, match=rf"train still running \(pid {holder.pid}\)"):
            verify_run(run)
    finally:
        holder.kill()
        holder.wait()
    with pytest.raises(CheckpointError, match="was being replaced when its process ended"):
        verify_run(run)
    # Stopped after the new run saved: --resume goes on with it, and the earlier run goes.
    (run / "snapshots" / "step-000000004").mkdir(parents=True)
    with pytest.raises(CheckpointError) as info:
        verify_run(run)
    assert "train --resume with this --out continues the new run and removes" in str(info.value)


def test_writing_a_run_removes_its_manifest_until_it_is_whole(tmp_path):
    run = _run(tmp_path)
    with pytest.raises(RuntimeError), writing_run(run):
        raise RuntimeError("refused before a file changed")
    verify_run(run)  # the old manifest is back: the run is as it was
    with pytest.raises(RuntimeError), writing_run(run):
        assert not (run / MANIFEST).exists()
        verify_run(run)  # its own files, mid-write: not checked
        (run / "config.json").write_text('{"a": 2}\n')
        raise RuntimeError("killed")
    assert not (run / MANIFEST).exists()  # cut short: no manifest vouches for it
    with writing_run(run):
        (run / "summary.json").write_text("{}")
    verify_run(run)
    assert "summary.json" in json.loads((run / MANIFEST).read_text())["files"]


def test_a_run_that_diverged_keeps_a_manifest_over_its_kept_checkpoint(tmp_path):
    """The divergence says the last good checkpoint is kept: evaluate and predict must
    read it without --skip-checksums (there was no manifest, so they refused it)."""
    from rnnkit.training.nonfinite import TrainingDiverged

    run = _run(tmp_path)
    with pytest.raises(TrainingDiverged), writing_run(run):
        (run / "config.json").write_text('{"a": 3}\n')  # written before the bad step
        raise TrainingDiverged("the training loss is nan at step 7; the last good ...")
    verify_run(run)
    assert "config.json" in json.loads((run / MANIFEST).read_text())["files"]


def test_weights_without_their_checksum_do_not_load_silently(tmp_path):
    # All tensors set to 0.5 and the sha256 metadata removed: evaluate ran, rc 0.
    model = torch.nn.Linear(3, 2)
    path = tmp_path / "model.safetensors"
    save_model_weights(model, path)
    tensors = {k: torch.full_like(v, 0.5) for k, v in load_file(str(path)).items()}
    save_file(tensors, str(path), metadata={"format": "rnnkit"})
    other = torch.nn.Linear(3, 2)
    with pytest.raises(CheckpointError, match=r"model\.safetensors: no SHA-256 in its metadata"):
        load_model_weights(other, path)
    assert not torch.equal(other.weight, torch.full_like(other.weight, 0.5))
    with skipping_checksums():
        load_model_weights(other, path)
    assert torch.equal(other.weight, torch.full_like(other.weight, 0.5))


def test_weights_saved_into_a_run_on_purpose_are_vouched_for_as_the_message_says(tmp_path):
    """From Python the message named only --skip-checksums; it names the Python ways too,
    and the one it gives for weights saved on purpose works."""
    run = _run(tmp_path)
    model = torch.nn.Linear(2, 1)
    save_model_weights(model, run / "model.safetensors")
    write_manifest(run)
    with torch.no_grad():
        model.weight.add_(1e-3)  # fine-tuned, then saved back into the run
    save_model_weights(model, run / "model.safetensors")
    with pytest.raises(CheckpointError) as info:
        verify_run(run)
    message = str(info.value)
    assert "with rnnkit.training.manifest.skipping_checksums():" in message
    assert "rnnkit.training.manifest.write_manifest(run)" in message
    write_manifest(run)
    verify_run(run)
    fresh = torch.nn.Linear(2, 1)
    load_model_weights(fresh, run / "model.safetensors")
    assert torch.equal(fresh.weight, model.weight)


def test_skipping_checksums_in_one_thread_leaves_the_others_checked():
    """The bypass was a module-wide counter: while one thread of a program was inside
    ``with skipping_checksums():``, another thread loaded a tampered run unchecked."""
    import threading

    inside, done = threading.Event(), threading.Event()
    seen: dict[str, bool] = {}

    def other() -> None:
        with skipping_checksums():
            seen["inside"] = checksums_skipped()
            inside.set()
            done.wait(10)

    worker = threading.Thread(target=other)
    worker.start()
    assert inside.wait(10)
    try:
        seen["here"] = checksums_skipped()
    finally:
        done.set()
        worker.join()
    assert seen == {"inside": True, "here": False}
    with skipping_checksums():
        with skipping_checksums():  # nested
            assert checksums_skipped()
        assert checksums_skipped()
    assert not checksums_skipped()
