"""Checkpoints: round trips, integrity checks, refusal to run code, atomic writes."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from rnnkit import GRU, LSTM
from rnnkit.errors import CheckpointError, WriteError
from rnnkit.models.builders import build_language_model
from rnnkit.models.language_model import LanguageModel
from rnnkit.models.spec import ModelSpec
from rnnkit.training import checkpoint as ck
from rnnkit.training.checkpoint import (
    atomic_write_bytes,
    atomic_write_json,
    load_model_weights,
    load_snapshot,
    save_model_weights,
    save_snapshot,
)


@pytest.fixture(autouse=True)
def _one_thread(single_thread):
    # Tiny models: threads only add contention (and time) on a shared machine.
    yield


def make_lm(hidden=8, cell="lstm", seed=0):
    torch.manual_seed(seed)
    enc = {"lstm": LSTM, "gru": GRU}[cell](4, hidden)
    return LanguageModel(nn.Embedding(9, 4), enc, nn.Linear(hidden, 9))


def trained(model, steps=2):
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    x = torch.randint(0, 9, (2, 5), generator=torch.Generator().manual_seed(0))
    for _ in range(steps):
        opt.zero_grad()
        model.loss(x, x).loss.backward()
        opt.step()
    return opt


def same_weights(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def leftovers(root: Path) -> list[str]:
    """Temporary files or directories anywhere under ``root``."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if ".tmp" in p.name)


@pytest.fixture
def run_dir(tmp_path):
    """A run directory with one snapshot at step 3; returns (dir, model, optimizer)."""
    model = make_lm()
    opt = trained(model)
    extra = {"rng/torch": torch.get_rng_state(), "carry/state": torch.ones(1, 1, 2, 8)}
    save_snapshot(tmp_path, 3, model, opt, {"note": "x"}, extra)
    return tmp_path, model, opt


def snapshot_dir(out: Path) -> Path:
    return out / json.loads((out / "latest.json").read_text())["snapshot"]


def rewrite_checksums(out: Path) -> None:
    """What an attacker who edits the files would also do: make the sums agree again."""
    snap = snapshot_dir(out)
    state = json.loads((snap / "state.json").read_text())
    state["sha256"] = {f: ck.sha256_file(snap / f) for f in state["sha256"]}
    atomic_write_json(snap / "state.json", state)
    pointer = json.loads((out / "latest.json").read_text())
    pointer["state_sha256"] = ck.sha256_file(snap / "state.json")
    atomic_write_json(out / "latest.json", pointer)


class _Payload:
    """Unpickling this creates ``marker``: proof that code ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def malicious_bytes(marker: Path) -> bytes:
    return pickle.dumps({"embedding.weight": _Payload(marker)})


# -- round trips ------------------------------------------------------------------------------
def test_snapshot_round_trip(run_dir):
    out, model, opt = run_dir
    fresh = make_lm(seed=1)
    fresh_opt = torch.optim.Adam(fresh.parameters(), lr=0.01)
    state, extra = load_snapshot(out, fresh, fresh_opt)
    assert state["step"] == 3 and state["note"] == "x"
    assert same_weights(model, fresh)
    a, b = opt.state_dict(), fresh_opt.state_dict()
    for pid in a["state"]:
        for key, value in a["state"][pid].items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(b["state"][pid][key]))
    assert torch.equal(extra["carry/state"], torch.ones(1, 1, 2, 8))
    assert leftovers(out) == []


def test_only_the_newest_snapshot_is_kept(run_dir):
    out, model, opt = run_dir
    save_snapshot(out, 7, model, opt, {})
    names = sorted(p.name for p in (out / "snapshots").iterdir())
    assert [n.rsplit("-", 1)[0] for n in names] == ["step-000000007"]
    assert json.loads((out / "latest.json").read_text())["step"] == 7


def test_tied_model_round_trip(tmp_path):
    spec = ModelSpec(hidden=6, embedding=6, tie_weights=True)
    torch.manual_seed(0)
    model = build_language_model(spec, 9)
    save_model_weights(model, tmp_path / "model.safetensors")
    assert "head.embedding.weight" not in load_file(str(tmp_path / "model.safetensors"))
    torch.manual_seed(1)
    fresh = build_language_model(spec, 9)
    load_model_weights(fresh, tmp_path / "model.safetensors")
    assert fresh.head.weight is fresh.embedding.weight
    assert same_weights(model, fresh)


# -- integrity --------------------------------------------------------------------------------
def test_truncated_snapshot_weights_are_named(run_dir):
    out, _, _ = run_dir
    path = snapshot_dir(out) / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-40])
    with pytest.raises(CheckpointError, match=r"model\.safetensors.*(checksum|truncated)"):
        load_snapshot(out, make_lm(), None)


def test_corrupted_snapshot_weights_are_named(run_dir):
    out, _, _ = run_dir
    path = snapshot_dir(out) / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF  # one flipped bit pattern inside a tensor: same length, valid header
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError) as info:
        load_snapshot(out, make_lm(), None)
    assert str(path) in str(info.value)


def test_tampered_state_json_is_named(run_dir):
    out, _, _ = run_dir
    path = snapshot_dir(out) / "state.json"
    state = json.loads(path.read_text())
    state["step"] = 999
    path.write_text(json.dumps(state))
    with pytest.raises(CheckpointError, match=r"state\.json.*checksum"):
        load_snapshot(out, make_lm(), None)


def test_truncated_top_level_weights_are_named(tmp_path):
    path = tmp_path / "model.safetensors"
    save_model_weights(make_lm(), path)
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(CheckpointError) as info:
        load_model_weights(make_lm(), path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("fmt", ["pickle", "torch-zip"])
def test_malicious_pickle_as_weights_is_refused_not_run(tmp_path, fmt):
    marker = tmp_path / "pwned"
    path = tmp_path / "model.safetensors"
    if fmt == "pickle":
        path.write_bytes(malicious_bytes(marker))
    else:
        torch.save({"embedding.weight": _Payload(marker)}, path)
    assert not marker.exists()  # torch.save pickles; it does not unpickle
    with pytest.raises(CheckpointError) as info:
        load_model_weights(make_lm(), path)
    assert str(path) in str(info.value)
    assert not marker.exists()
    # Control: the payload is live — unpickling it does run code.
    pickle.loads(malicious_bytes(tmp_path / "control"))["embedding.weight"].close()
    assert (tmp_path / "control").exists()


def test_malicious_pickle_in_snapshot_with_matching_checksums_is_refused(run_dir):
    out, _, _ = run_dir
    marker = out.parent / f"{out.name}-pwned"
    path = snapshot_dir(out) / "model.safetensors"
    path.write_bytes(malicious_bytes(marker))
    rewrite_checksums(out)
    with pytest.raises(CheckpointError) as info:
        load_snapshot(out, make_lm(), None)
    assert str(path) in str(info.value)
    assert not marker.exists()


@pytest.mark.parametrize("where", ["parent", "absolute", "symlink"])
def test_latest_json_pointing_outside_the_run_is_refused(run_dir, tmp_path_factory, where):
    out, _, _ = run_dir
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    shutil.copytree(snapshot_dir(out), elsewhere / "snap")  # a complete, valid snapshot
    pointer = json.loads((out / "latest.json").read_text())
    if where == "parent":
        pointer["snapshot"] = os.path.relpath(elsewhere / "snap", out)
    elif where == "absolute":
        pointer["snapshot"] = str(elsewhere / "snap")
    else:
        (out / "snapshots" / "step-000000009").symlink_to(elsewhere / "snap")
        pointer["snapshot"] = "snapshots/step-000000009"
    pointer["state_sha256"] = ck.sha256_file(elsewhere / "snap" / "state.json")
    atomic_write_json(out / "latest.json", pointer)
    with pytest.raises(CheckpointError, match=r"latest\.json.*escapes"):
        load_snapshot(out, make_lm(), None)


def test_missing_latest_json_is_named(tmp_path):
    with pytest.raises(CheckpointError, match=r"latest\.json: missing"):
        load_snapshot(tmp_path, make_lm(), None)


def test_malformed_latest_json_is_named(run_dir):
    out, _, _ = run_dir
    (out / "latest.json").write_text('{"format_version": 1, "snap')
    with pytest.raises(CheckpointError, match=r"latest\.json: not valid JSON"):
        load_snapshot(out, make_lm(), None)


@pytest.mark.parametrize(
    ("other", "words"),
    [
        (dict(hidden=12), "shape"),
        (dict(cell="gru"), "another configuration"),
    ],
)
def test_weights_of_another_config_are_refused(tmp_path, other, words):
    path = tmp_path / "model.safetensors"
    save_model_weights(make_lm(), path)
    model = make_lm(**other)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointError) as info:
        load_model_weights(model, path)
    assert str(path) in str(info.value) and words in str(info.value)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def _beyond_float32(t: torch.Tensor) -> torch.Tensor:
    wide = t.double().contiguous()
    wide.view(-1)[0] = 1e300  # finite in a float64 export, inf in the float32 model
    return wide


@pytest.mark.parametrize(
    ("change", "words"),
    [
        *[
            (lambda t, d=dtype: (t * 3).to(d), f"is {str(dtype)[6:]} in the checkpoint but "
             "float32 in the model (not weights rnnkit wrote)")
            for dtype in (torch.int64, torch.bool, torch.complex64)
        ],
        (_beyond_float32, "holds values beyond float32's range (the model's dtype; the "
         "checkpoint's is float64)"),
    ],
    ids=["int64", "bool", "complex64", "float64-beyond-float32"],
)  # fmt: skip
def test_weights_of_another_kind_or_range_are_refused_not_converted(
    tmp_path, monkeypatch, change, words
):
    # copy_ would load integer weights truncated (0.37 -> 0), and 1e300 as inf (every loss
    # NaN), in silence; the checksum in the metadata is skipped here, as with
    # --skip-checksums, so only this check is left.
    monkeypatch.setenv("RNNKIT_SKIP_CHECKSUMS", "1")
    path = tmp_path / "model.safetensors"
    tensors = {k: v.contiguous() for k, v in make_lm().state_dict().items()}
    name = sorted(tensors)[0]
    tensors[name] = change(tensors[name])
    save_file(tensors, str(path))
    model = make_lm(seed=1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointError) as info:
        load_model_weights(model, path)
    assert str(info.value) == f"{path}: {name} {words}"
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_weights_of_another_float_width_load_as_the_models(tmp_path, monkeypatch):
    monkeypatch.setenv("RNNKIT_SKIP_CHECKSUMS", "1")
    path = tmp_path / "model.safetensors"
    source = make_lm()
    save_file({k: v.double().contiguous() for k, v in source.state_dict().items()}, str(path))
    model = make_lm(seed=1)
    load_model_weights(model, path)
    assert same_weights(model, source)


def test_snapshot_of_another_config_is_refused(run_dir):
    out, _, _ = run_dir
    with pytest.raises(CheckpointError, match=r"model\.safetensors.*another configuration"):
        load_snapshot(out, make_lm(hidden=5), None)


# -- atomic writes ----------------------------------------------------------------------------
def _boom(*args, **kwargs):
    raise OSError(28, "No space left on device")


def test_atomic_write_leaves_old_file_and_no_temp_on_error(tmp_path, monkeypatch):
    path = tmp_path / "config.json"
    atomic_write_json(path, {"a": 1})
    monkeypatch.setattr(ck.os, "fsync", _boom)  # fails after part of the data is written
    with pytest.raises(WriteError, match=r"config\.json: cannot write: No space left on device"):
        atomic_write_bytes(path, b'{"a": 2, "much": "more"}')
    assert json.loads(path.read_text()) == {"a": 1}
    assert leftovers(tmp_path) == []


# A full disk as each library reports it: the OS (OSError), safetensors (SafetensorError,
# which is not an OSError) — every one becomes one WriteError line naming the file.
DISK_FULL = [
    OSError(28, "No space left on device"),
    SafetensorError("Error while serializing: IoError(Os { code: 28, kind: StorageFull })"),
]


@pytest.mark.parametrize("error", DISK_FULL, ids=["OSError", "SafetensorError"])
def test_save_model_weights_error_mid_write_keeps_old_file(tmp_path, monkeypatch, error):
    path = tmp_path / "model.safetensors"
    save_model_weights(make_lm(), path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()

    def half_then_fail(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"\x00" * 64)  # half a file on disk...
        raise error  # ...then the disk is full

    monkeypatch.setattr(ck, "save_file", half_then_fail)
    with pytest.raises(WriteError, match=r"model\.safetensors: cannot write: "):
        save_model_weights(make_lm(seed=3), path)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("error", DISK_FULL, ids=["OSError", "SafetensorError"])
@pytest.mark.parametrize("fail_at", ["optimizer", "state"])
def test_save_snapshot_error_mid_write_keeps_the_last_good_one(
    run_dir, monkeypatch, fail_at, error
):
    out, model, opt = run_dir
    pointer_before = (out / "latest.json").read_bytes()
    real_save_file, real_json = ck.save_file, ck.atomic_write_json

    def flaky_save_file(tensors, filename, metadata=None):
        if fail_at == "optimizer" and "optimizer.safetensors" in Path(filename).name:
            Path(filename).write_bytes(b"\x00" * 10)
            raise error
        return real_save_file(tensors, filename, metadata=metadata)

    def flaky_json(path, obj):
        if fail_at == "state" and Path(path).name == "state.json":
            raise OSError(28, "No space left on device")
        return real_json(path, obj)

    monkeypatch.setattr(ck, "save_file", flaky_save_file)
    monkeypatch.setattr(ck, "atomic_write_json", flaky_json)
    trained(model, 1)
    with pytest.raises((WriteError, OSError)):
        save_snapshot(out, 4, model, opt, {})
    monkeypatch.undo()
    assert (out / "latest.json").read_bytes() == pointer_before
    assert leftovers(out) == []
    names = sorted(p.name for p in (out / "snapshots").iterdir())
    assert [n.rsplit("-", 1)[0] for n in names] == ["step-000000003"]
    state, _ = load_snapshot(out, make_lm(), None)
    assert state["step"] == 3


def test_weights_not_yet_written_by_a_run_with_a_snapshot_are_said_so(tmp_path):
    """A run stopped by Ctrl-C before its first validation has a snapshot and no
    model.safetensors: evaluate and report said only "model.safetensors: file not found",
    after training had said "the checkpoint is saved"."""
    from torch import nn

    from rnnkit.errors import CheckpointError
    from rnnkit.training.checkpoint import load_model_weights

    (tmp_path / "latest.json").write_text("{}")
    with pytest.raises(CheckpointError, match=r"model\.safetensors: not written yet: the run "
                       r"stopped before its first validation.*--resume"):  # fmt: skip
        load_model_weights(nn.Linear(2, 2), tmp_path / "model.safetensors")
    (tmp_path / "latest.json").unlink()
    with pytest.raises(CheckpointError, match=r"model\.safetensors: file not found"):
        load_model_weights(nn.Linear(2, 2), tmp_path / "model.safetensors")
