"""Checkpoints: safetensors and JSON only, every write atomic, loads never run code.

Layout of a run directory ``OUT``::

    config.json          what was trained and how (format version, task, model, options)
    vocab.json           the vocabulary (vocabularies) of the task
    model.safetensors    the weights to use: best on validation (latest if no validation)
    latest.json          pointer to the newest resumable snapshot, with its checksum
    snapshots/step-N/    model.safetensors, optimizer.safetensors, state.json
    metrics.jsonl        one JSON object per logged event

Every file is written to a temporary name in the same directory, flushed, fsynced and
renamed over the old one, so a crash leaves the old file or the new one, never half of
one. A snapshot is complete before ``latest.json`` points to it; older snapshots are
removed only after that. Each snapshot's ``state.json`` records SHA-256 sums of its
tensor files, and ``latest.json`` that of ``state.json``: a truncated or corrupted file
is a ``CheckpointError`` naming it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from rnnkit.data.limits import loads_json
from rnnkit.errors import CheckpointError, DataError

__all__ = [
    "FORMAT_VERSION",
    "atomic_write_bytes",
    "atomic_write_json",
    "load_model_weights",
    "load_snapshot",
    "read_json",
    "save_model_weights",
    "save_snapshot",
    "sha256_file",
]

FORMAT_VERSION = 1
SNAPSHOT_FILES = ("model.safetensors", "optimizer.safetensors", "extra.safetensors")


def _default_mode(path: str) -> None:
    # mkstemp creates 0600; a finished file gets the mode a plain open() would give.
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temporary file, fsync, rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        _default_mode(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> None:
    """Write ``obj`` as indented JSON, atomically."""
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def read_json(path: str | os.PathLike[str]) -> Any:
    """Read a JSON file; a missing or malformed file is a ``CheckpointError`` naming it."""
    path = Path(path)
    try:
        return loads_json(path.read_bytes(), path)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing") from None
    except IsADirectoryError:
        raise CheckpointError(f"{path}: is a directory, not a JSON file") from None
    except DataError as exc:
        # Deep nesting, a 5,000-digit integer, bad UTF-8: all one line naming the file.
        at = f" at line {exc.line}" if exc.line is not None else ""
        detail = exc.message.removeprefix("invalid JSON: ")
        raise CheckpointError(f"{path}: not valid JSON{at}: {detail}") from None


def sha256_file(path: str | os.PathLike[str]) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _state_tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    # Tied weights appear under several names; safetensors refuses shared storage, so
    # keep the first name of each tensor (load_model_weights restores the others).
    seen: dict[int, str] = {}
    out: dict[str, torch.Tensor] = {}
    for name, t in module.state_dict().items():
        key = id(t) if t.data_ptr() == 0 else (t.data_ptr(), t.dtype, tuple(t.shape))
        if key in seen:
            continue
        seen[key] = name
        out[name] = t.detach().contiguous().cpu()
    return out


def save_model_weights(module: nn.Module, path: str | os.PathLike[str]) -> None:
    """Save ``module``'s weights as safetensors, atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        save_file(_state_tensors(module), tmp, metadata={"format": "rnnkit"})
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        _default_mode(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _load_tensors(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise CheckpointError(f"{path}: missing")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: not a valid safetensors file ({exc})") from None


def load_model_weights(module: nn.Module, path: str | os.PathLike[str]) -> None:
    """Load safetensors weights into ``module``; mismatched names or shapes are a
    ``CheckpointError`` naming the file (a checkpoint of another configuration)."""
    path = Path(path)
    tensors = _load_tensors(path)
    own = module.state_dict()
    by_storage: dict[Any, str] = {}
    for name, t in own.items():
        by_storage.setdefault((t.data_ptr(), t.dtype, tuple(t.shape)), name)
    missing = []
    for name, t in own.items():
        source = by_storage[(t.data_ptr(), t.dtype, tuple(t.shape))]
        if source not in tensors:
            missing.append(name)
            continue
        if tuple(tensors[source].shape) != tuple(t.shape):
            raise CheckpointError(
                f"{path}: {name} has shape {tuple(tensors[source].shape)} in the checkpoint "
                f"but {tuple(t.shape)} in the model (checkpoint of another configuration)"
            )
    unexpected = set(tensors) - set(own)
    if missing or unexpected:
        raise CheckpointError(
            f"{path}: weights do not match the model (missing {sorted(missing)[:3]}, "
            f"unexpected {sorted(unexpected)[:3]}): checkpoint of another configuration"
        )
    with torch.no_grad():
        for name, t in own.items():
            source = by_storage[(t.data_ptr(), t.dtype, tuple(t.shape))]
            if source == name:
                t.copy_(tensors[name])


def _optimizer_split(state: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors: dict[str, torch.Tensor] = {}
    plain: dict[str, Any] = {"param_groups": state["param_groups"], "state": {}}
    for pid, entry in state["state"].items():
        plain["state"][str(pid)] = {}
        for key, value in entry.items():
            if torch.is_tensor(value):
                tensors[f"{pid}/{key}"] = value.detach().contiguous().cpu()
            else:
                plain["state"][str(pid)][key] = value
    return tensors, plain


def _optimizer_join(tensors: dict[str, torch.Tensor], plain: dict[str, Any]) -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {int(p): dict(v) for p, v in plain["state"].items()}
    for name, t in tensors.items():
        pid, key = name.split("/", 1)
        state.setdefault(int(pid), {})[key] = t
    return {"state": state, "param_groups": plain["param_groups"]}


def save_snapshot(
    out_dir: str | os.PathLike[str],
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    state: dict[str, Any],
    extra_tensors: dict[str, torch.Tensor] | None = None,
    keep: int = 1,
) -> Path:
    """Write a complete resumable snapshot, then point ``latest.json`` at it.

    ``state`` must be JSON-serialisable (epoch, data position, scheduler, metrics);
    ``extra_tensors`` (RNG states, a carried recurrent state) go to ``extra.safetensors``.
    """
    out_dir = Path(out_dir)
    # A unique name: a snapshot of a step saved before (say, by a run killed after it)
    # is never touched while latest.json may still point to it.
    name = f"step-{step:09d}-{uuid.uuid4().hex[:8]}"
    snap = out_dir / "snapshots" / name
    tmp = out_dir / "snapshots" / f".{name}.tmp"
    tmp.mkdir(parents=True)
    try:
        save_model_weights(model, tmp / "model.safetensors")
        opt_tensors, opt_plain = _optimizer_split(optimizer.state_dict())
        save_file(opt_tensors, str(tmp / "optimizer.safetensors"))
        extra = {k: v.detach().contiguous().cpu() for k, v in (extra_tensors or {}).items()}
        save_file(extra, str(tmp / "extra.safetensors"))
        full = {
            "format_version": FORMAT_VERSION,
            "step": step,
            "optimizer": opt_plain,
            "sha256": {f: sha256_file(tmp / f) for f in SNAPSHOT_FILES},
            **state,
        }
        atomic_write_json(tmp / "state.json", full)
        os.replace(tmp, snap)
    except BaseException:
        # A failed write (disk full, interrupt) leaves no half-written snapshot behind;
        # latest.json still points to the previous, complete one.
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    atomic_write_json(
        out_dir / "latest.json",
        {
            "format_version": FORMAT_VERSION,
            "snapshot": f"snapshots/{name}",
            "step": step,
            "state_sha256": sha256_file(snap / "state.json"),
        },
    )
    # Only now may older snapshots go — and leftovers of writes a crash cut short.
    snaps = sorted(
        (p for p in (out_dir / "snapshots").iterdir() if p.name.startswith("step-") and p != snap),
        key=lambda p: p.stat().st_mtime,
    )
    for old in snaps[: max(len(snaps) - (keep - 1), 0)]:
        shutil.rmtree(old, ignore_errors=True)
    for stale in (out_dir / "snapshots").glob(".step-*.tmp"):
        if stale != tmp:
            shutil.rmtree(stale, ignore_errors=True)
    for stale in out_dir.glob(".*.tmp"):  # atomic_write_bytes temp files of a killed run
        stale.unlink(missing_ok=True)
    return snap


def load_snapshot(
    out_dir: str | os.PathLike[str], model: nn.Module, optimizer: torch.optim.Optimizer | None
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Restore the snapshot ``latest.json`` points to; return ``(state, extra_tensors)``."""
    out_dir = Path(out_dir)
    pointer = read_json(out_dir / "latest.json")
    if not isinstance(pointer, dict) or pointer.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{out_dir / 'latest.json'}: unknown checkpoint format")
    rel = Path(str(pointer.get("snapshot", "")))
    snap = (out_dir / rel).resolve()
    if rel.is_absolute() or out_dir.resolve() not in snap.parents:
        raise CheckpointError(f"{out_dir / 'latest.json'}: snapshot path escapes {out_dir}")
    state_path = snap / "state.json"
    if not state_path.is_file():
        raise CheckpointError(f"{state_path}: missing")
    if sha256_file(state_path) != pointer.get("state_sha256"):
        raise CheckpointError(f"{state_path}: checksum mismatch (corrupted or truncated)")
    state = read_json(state_path)
    for fname, digest in state.get("sha256", {}).items():
        if fname not in SNAPSHOT_FILES:
            raise CheckpointError(f"{state_path}: unexpected file entry {fname!r}")
        if not (snap / fname).is_file():
            raise CheckpointError(f"{snap / fname}: missing")
        if sha256_file(snap / fname) != digest:
            raise CheckpointError(f"{snap / fname}: checksum mismatch (corrupted or truncated)")
    load_model_weights(model, snap / "model.safetensors")
    if optimizer is not None:
        tensors = _load_tensors(snap / "optimizer.safetensors")
        try:
            optimizer.load_state_dict(_optimizer_join(tensors, state["optimizer"]))
        except (ValueError, KeyError, RuntimeError) as exc:
            raise CheckpointError(f"{snap}: optimizer state does not fit ({exc})") from None
    return state, _load_tensors(snap / "extra.safetensors")
