"""Checkpoints: safetensors and JSON only, every write atomic, loads never run code.

Layout of a run directory ``OUT``::

    config.json          what was trained and how (format version, task, model, options)
    vocab.json           the vocabulary (vocabularies) of the task
    model.safetensors    the weights to use: best on validation (latest if no validation)
    latest.json          pointer to the newest resumable snapshot, with its checksum
    snapshots/step-N/    model.safetensors, optimizer.safetensors, state.json
    metrics.jsonl        one JSON object per logged event
    metrics.csv          the same events as a table (training.run_files)

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
import math
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.numpy import load_file as load_numpy
from safetensors.torch import save_file
from torch import nn

from rnnkit import messages
from rnnkit.data.files import (
    append_line,
    atomic_write,
    atomic_write_bytes,
    read_run_file,
    require_regular_file,
    sha256_file,
)
from rnnkit.data.limits import loads_json
from rnnkit.errors import CheckpointError, DataError
from rnnkit.training.manifest import SKIP_HINT, checksums_skipped

__all__ = [
    "FORMAT_VERSION",
    "append_jsonl",
    "atomic_write_bytes",
    "atomic_write_json",
    "dumps_strict",
    "load_arrays",
    "load_model_weights",
    "load_snapshot",
    "read_json",
    "save_model_weights",
    "save_snapshot",
    "save_tensors",
    "sha256_file",
    "tensors_sha256",
    "utf8_path",
]

FORMAT_VERSION = 1
SNAPSHOT_FILES = ("model.safetensors", "optimizer.safetensors", "extra.safetensors")


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> None:
    """Write ``obj`` as indented strict JSON (see :func:`dumps_strict`), atomically."""
    text = dumps_strict(obj, indent=2, sort_keys=True) + "\n"
    atomic_write_bytes(path, text.encode())


def dumps_strict(obj: Any, **kwargs: Any) -> str:
    """JSON text that every strict parser reads: a non-finite float (a diverged loss, an
    undefined metric) becomes ``null``, never the non-standard ``NaN``/``Infinity``.

    >>> dumps_strict({"loss": float("nan"), "ok": [1.5, float("inf")]})
    '{"loss": null, "ok": [1.5, null]}'
    """
    return json.dumps(_finite_or_none(obj), allow_nan=False, **kwargs)


def _finite_or_none(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite_or_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite_or_none(v) for v in obj]
    return obj


def append_jsonl(path: str | os.PathLike[str], obj: Any) -> None:
    """Append ``obj`` as one strict JSON line (``metrics.jsonl``)."""
    append_line(path, dumps_strict(obj))


def read_json(path: str | os.PathLike[str]) -> Any:
    """Read a JSON file; a missing or malformed file is a ``CheckpointError`` naming it."""
    path = Path(path)
    if not os.path.lexists(path):
        raise CheckpointError(f"{path}: missing")
    try:
        raw = read_run_file(path)
    except DataError as exc:
        raise CheckpointError(str(exc)) from None
    try:
        return loads_json(raw, path)
    except DataError as exc:
        # Deep nesting, a 5,000-digit integer, bad UTF-8: all one line naming the file.
        at = f" at line {exc.line}" if exc.line is not None else ""
        detail = exc.message.removeprefix("invalid JSON: ")
        raise CheckpointError(f"{path}: not valid JSON{at}: {detail}") from None


def _state_tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    # Tied weights appear under several names; safetensors refuses shared storage, so
    # keep the first name of each tensor (load_model_weights restores the others).
    seen: dict[object, str] = {}
    out: dict[str, torch.Tensor] = {}
    for name, t in module.state_dict().items():
        key = id(t) if t.data_ptr() == 0 else (t.data_ptr(), t.dtype, tuple(t.shape))
        if key in seen:
            continue
        seen[key] = name
        out[name] = t.detach().contiguous().cpu()
    return out


def tensors_sha256(tensors: dict[str, torch.Tensor]) -> str:
    """SHA-256 over the names, dtypes, shapes and bytes of ``tensors``, in name order.

    Stored in a weights file's own metadata, it lets a load notice flipped bytes in the
    tensor data (a damaged disk, a bad copy) that safetensors' header check cannot see.
    """
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        h.update(f"{name}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def save_model_weights(module: nn.Module, path: str | os.PathLike[str]) -> None:
    """Save ``module``'s weights as safetensors, atomically, with their checksum in the
    file's metadata (``sha256``, see :func:`tensors_sha256`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = _state_tensors(module)
    metadata = {"format": "rnnkit", "sha256": tensors_sha256(tensors)}
    atomic_write(path, write_path=lambda tmp: save_file(tensors, tmp, metadata=metadata))


def save_tensors(tensors: dict[str, torch.Tensor], path: str | os.PathLike[str]) -> None:
    """Save named tensors as safetensors, atomically (the one writer's rules)."""
    tensors = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    atomic_write(path, write_path=lambda tmp: save_file(tensors, tmp))


def utf8_path(path: str | os.PathLike[str]) -> bool:
    """Whether ``path``, as given, is UTF-8 text: the safetensors library opens no other
    (a name of other bytes reads as lone surrogates). A relative path is what it is
    given, whatever the name of the working directory.

    >>> utf8_path("runs/café"), utf8_path(os.fsdecode(b"runs/caf\\xe9"))
    (True, False)
    """
    try:
        os.fspath(path).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _not_utf8(path: Path) -> CheckpointError:
    return CheckpointError(
        f"{path}: the path is not valid UTF-8, which the safetensors library cannot open; "
        "rename the directory (or file) with a UTF-8 name"
    )


def _load_tensors(path: Path, checked: bool = False) -> dict[str, torch.Tensor]:
    try:
        require_regular_file(path)  # weights are mapped, not read: no size cap
    except DataError as exc:
        raise CheckpointError(str(exc)) from None
    if not utf8_path(path):  # it said "not a valid safetensors file": the file is fine
        raise _not_utf8(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
            tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: not a valid safetensors file ({exc})") from None
    if checked:
        digest = metadata.get("sha256")
        if digest is None and not checksums_skipped():
            # Every weights file rnnkit writes carries one: removed, or another program's.
            raise CheckpointError(
                f"{path}: no SHA-256 in its metadata, so the weights cannot be checked (written "
                f"by another program, or the checksum was removed); {SKIP_HINT}"
            )
        if digest is not None and digest != tensors_sha256(tensors):
            raise CheckpointError(f"{path}: checksum mismatch (corrupted or truncated)")
        for name, t in tensors.items():
            if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                raise CheckpointError(f"{path}: {name} holds NaN or infinite values")
    return tensors


def load_arrays(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """The arrays of a numpy safetensors file of a run (``ngram.safetensors``,
    ``valid_scores.safetensors``); anything wrong is a ``CheckpointError`` naming it."""
    path = Path(path)
    try:
        require_regular_file(path)
    except DataError as exc:
        raise CheckpointError(str(exc).replace("file not found", "missing")) from None
    if not utf8_path(path):
        raise _not_utf8(path)
    try:
        return load_numpy(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: not a valid safetensors file ({exc})") from None


def load_model_weights(module: nn.Module, path: str | os.PathLike[str]) -> None:
    """Load safetensors weights into ``module``; mismatched names or shapes, or a tensor
    of another kind (integers for a float weight), are a ``CheckpointError`` naming the
    file (a checkpoint of another configuration, or not rnnkit's)."""
    path = Path(path)
    if not os.path.lexists(path) and (path.parent / "latest.json").is_file():
        # a run stopped (Ctrl-C) or killed before its first validation: it has a snapshot
        # to go on from, and no validated weights yet
        raise CheckpointError(
            f"{path}: not written yet: the run stopped before its first validation, which "
            "writes the best weights (rnnkit train --resume goes on from its snapshot)"
        )
    tensors = _load_tensors(path, checked=True)
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
        saved = tensors[source].dtype
        # copy_ converts any dtype: integer (or boolean) weights would load truncated, in
        # silence. Another float width is a value of the same kind (a float64 export).
        if saved != t.dtype and not (saved.is_floating_point and t.dtype.is_floating_point):
            raise CheckpointError(
                f"{path}: {name} is {str(saved).removeprefix('torch.')} in the checkpoint but "
                f"{str(t.dtype).removeprefix('torch.')} in the model (not weights rnnkit wrote)"
            )
        if saved != t.dtype and not bool(torch.isfinite(tensors[source].to(t.dtype)).all()):
            # finite in the file's width, infinite in the model's: every result would be NaN
            raise CheckpointError(
                f"{path}: {name} holds values beyond {str(t.dtype).removeprefix('torch.')}'s "
                f"range (the model's dtype; the checkpoint's is "
                f"{str(saved).removeprefix('torch.')})"
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
    count = sum(t.numel() for t in tensors.values())
    messages.debug(f"loaded {path}: {len(tensors)} tensors, {count:,} values, SHA-256 checked")


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


def _check_optimizer_state(optimizer: torch.optim.Optimizer, saved: dict[str, Any]) -> None:
    """A saved optimizer state must have the live optimizer's form: the same groups with
    the same kinds of values (a learning rate stays a finite number), and per parameter,
    tensors of that parameter's shape, finite. ``load_state_dict`` checks only the group
    sizes: a forged state would otherwise fail (or poison the weights) steps later.
    Raises ``ValueError`` naming what does not fit."""
    live = optimizer.state_dict()
    groups = saved.get("param_groups")
    if not isinstance(groups, list) or len(groups) != len(live["param_groups"]):
        raise ValueError("param_groups differ")
    for group, ref in zip(groups, live["param_groups"], strict=True):
        if not isinstance(group, dict) or set(group) != set(ref):
            raise ValueError("param_groups have other keys")
        for key, value in ref.items():
            got = group[key]
            if isinstance(value, bool) or value is None:
                ok = (
                    got is None or isinstance(got, bool) if value is None else isinstance(got, bool)
                )
            elif isinstance(value, (int, float)):
                ok = isinstance(got, (int, float)) and not isinstance(got, bool)
                ok = ok and math.isfinite(got)
            elif isinstance(value, (list, tuple)):
                ok = isinstance(got, (list, tuple)) and len(got) == len(value)
                if key != "params":
                    ok = ok and all(isinstance(g, (int, float)) and math.isfinite(g) for g in got)
            else:
                ok = isinstance(got, type(value))
            if not ok:
                raise ValueError(f"param_groups {key} is {got!r}"[:120])
    shapes = {
        pid: tuple(p.shape)
        for pid, p in zip(
            (i for g in live["param_groups"] for i in g["params"]),
            (p for g in optimizer.param_groups for p in g["params"]),
            strict=True,
        )
    }
    for pid, entry in saved.get("state", {}).items():
        if pid not in shapes or not isinstance(entry, dict):
            raise ValueError(f"state of unknown parameter {pid!r}"[:120])
        for key, value in entry.items():
            if not torch.is_tensor(value):
                if not (isinstance(value, (int, float)) and math.isfinite(value)):
                    raise ValueError(f"state {pid}/{key} is {value!r}"[:120])
                continue
            if not bool(torch.isfinite(value).all()):
                raise ValueError(f"state {pid}/{key} holds NaN or infinite values")
            if key == "step" and bool((value < 0).any()):
                raise ValueError(f"state {pid}/step is negative")
            if value.dim() > 0 and tuple(value.shape) != shapes[pid]:
                raise ValueError(
                    f"state {pid}/{key} has shape {tuple(value.shape)}, the parameter {shapes[pid]}"
                )


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
        save_tensors(opt_tensors, tmp / "optimizer.safetensors")
        save_tensors(extra_tensors or {}, tmp / "extra.safetensors")
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
    where = out_dir / "latest.json"
    name, digest = pointer.get("snapshot"), pointer.get("state_sha256")
    if not isinstance(name, str) or not name or "\0" in name or not isinstance(digest, str):
        raise CheckpointError(f"{where}: snapshot must be a path and state_sha256 a checksum")
    rel = Path(name)
    snap = (out_dir / rel).resolve()
    if rel.is_absolute() or out_dir.resolve() not in snap.parents:
        raise CheckpointError(f"{out_dir / 'latest.json'}: snapshot path escapes {out_dir}")
    state_path = snap / "state.json"
    if not state_path.is_file():
        raise CheckpointError(f"{state_path}: missing")
    if sha256_file(state_path) != pointer.get("state_sha256"):
        raise CheckpointError(f"{state_path}: checksum mismatch (corrupted or truncated)")
    state = read_json(state_path)
    sums = state.get("sha256") if isinstance(state, dict) else None
    if not isinstance(sums, dict) or not isinstance(state.get("step"), int):
        raise CheckpointError(f"{state_path}: not a snapshot state (step, sha256)")
    for fname, digest in sums.items():
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
            saved = _optimizer_join(tensors, state["optimizer"])
            _check_optimizer_state(optimizer, saved)
            optimizer.load_state_dict(saved)
        except (ValueError, KeyError, RuntimeError, TypeError, AttributeError) as exc:
            detail = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
            raise CheckpointError(
                f"{snap}: optimizer state does not fit ({type(exc).__name__}: {detail})"
            ) from None
    return state, _load_tensors(snap / "extra.safetensors")
