"""``manifest.json``: the size and SHA-256 of every file of a finished run, checked on every
read.

A run writes its files one by one (``config.json``, vocabularies, ``model.safetensors``,
``summary.json``, and each task's auxiliary files: ``baseline.safetensors``,
``ngram.safetensors``, ``calibration.safetensors``, ``valid_scores.safetensors``,
``thresholds.json``, ``keys.json``, the per-key runs under ``keys/``...). When training
ends, :func:`write_manifest` writes last, atomically, one ``manifest.json`` holding the size
and SHA-256 of every one of them. :func:`verify_run`, called whenever a run is read
(``evaluate``, ``predict``, ``generate``, ``score``, ``report``, ``train --resume``),
recomputes them: a changed, truncated, missing or added file is a
:class:`~rnnkit.errors.CheckpointError` naming it, and so is a run without a manifest (one
still training, killed, or written by an older rnnkit; a run stopped by Ctrl-C or SIGTERM
saved whole files and has one). ``train --resume`` accepts a run without one: its snapshot
carries its own checksums.

Not covered, by design: ``metrics.jsonl`` (a log that grows; its reader skips and counts a
bad line) and ``metrics.csv`` derived from it, report pages (``*.html``, rewritten by
``rnnkit report``), snapshots (``snapshots/``: each holds its own checksums in
``state.json``), the lock ``.lock`` and hidden temporary files.

The check can be skipped on request only: ``--skip-checksums`` on the command line, the
environment variable ``RNNKIT_SKIP_CHECKSUMS=1``, or :func:`skipping_checksums` in Python.
Skipping also admits a ``model.safetensors`` without the checksum of its own metadata.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rnnkit.data.files import atomic_write_bytes, read_run_file, sha256_file
from rnnkit.data.limits import loads_json
from rnnkit.errors import CheckpointError, DataError
from rnnkit.training.interrupt import TrainingInterrupted
from rnnkit.training.nonfinite import TrainingDiverged

__all__ = [
    "MANIFEST",
    "MANIFEST_FORMAT",
    "RUN_SAVED",
    "SKIP_HINT",
    "checksums_skipped",
    "covered_files",
    "saved_files",
    "skipping_checksums",
    "verify_run",
    "write_manifest",
    "writing_run",
]

MANIFEST = "manifest.json"
#: The start of the name of the directory in which a run waits while ``train
#: --overwrite`` replaces it (``rnnkit.app.tasks.run_dir``).
REPLACED_PREFIX = ".replaced-"
#: What a manifest says it is (its "format")
MANIFEST_FORMAT = "rnnkit.manifest"
_VERSION = 1
#: Files and folders a run holds that the manifest leaves out (see the module doc).
_LEFT_OUT = {MANIFEST, "metrics.jsonl", "metrics.csv", "snapshots"}
_SKIP_ENV = "RNNKIT_SKIP_CHECKSUMS"
#: How to read a run anyway, in the words of the command line and of Python (the same
#: readers serve both).
SKIP_HINT = (
    "pass --skip-checksums (RNNKIT_SKIP_CHECKSUMS=1; in Python: with "
    "rnnkit.training.manifest.skipping_checksums():) to read it anyway"
)

# skipping_checksums() nesting, of this thread (a context variable: each thread starts at
# 0), so that one thread's `with skipping_checksums():` never lets another thread's load
# of a run whose files changed go unchecked
_skip_depth: contextvars.ContextVar[int] = contextvars.ContextVar("rnnkit_skip_depth", default=0)
_writing: set[Path] = set()  # runs this process is training now: their files change
_verified: dict[Path, tuple[Any, ...]] = {}  # run -> the stat signature last verified


def checksums_skipped() -> bool:
    """Whether the user asked to skip the checks (``--skip-checksums``,
    ``RNNKIT_SKIP_CHECKSUMS=1``, :func:`skipping_checksums`)."""
    value = os.environ.get(_SKIP_ENV, "").strip().lower()
    return _skip_depth.get() > 0 or value in ("1", "true", "yes")


@contextlib.contextmanager
def skipping_checksums() -> Iterator[None]:
    """Read runs without checking their manifest (and weights without their checksum), in
    this thread (and the code it calls), not in the program's other threads."""
    token = _skip_depth.set(_skip_depth.get() + 1)
    try:
        yield
    finally:
        _skip_depth.reset(token)


def _key(path: Path) -> Path:
    return Path(os.path.abspath(path))


@contextlib.contextmanager
def writing_run(run_dir: str | os.PathLike[str], main: bool = True) -> Iterator[None]:
    """While this process trains into ``run_dir``: its manifest is removed first (a run
    cut short has none, so it never vouches for files that changed since) and reads of the
    run are not checked; on success a new manifest is written, last (``main``: the
    process that owns the directory), as after an interruption or a divergence (the
    files are whole then). A run that fails before it changed a file (a ``--resume``
    refused) gets its old manifest back."""
    run = _key(Path(run_dir))
    old: bytes | None = None
    if main:
        with contextlib.suppress(FileNotFoundError):
            old = (run / MANIFEST).read_bytes()
            (run / MANIFEST).unlink()
    _writing.add(run)
    try:
        yield
    except (TrainingInterrupted, TrainingDiverged):
        # Ctrl-C or SIGTERM: the step in flight finished and everything was saved. A
        # divergence: no file was written after the bad step, the last good checkpoint
        # is kept. Either way the files are whole, so the manifest vouches for them
        # (evaluate and predict read the kept weights, train --resume goes on).
        _writing.discard(run)
        if main:
            write_manifest(run)
        raise
    except BaseException:
        _writing.discard(run)
        if old is not None and _unchanged(run, old):
            atomic_write_bytes(run / MANIFEST, old)
        raise
    finally:
        _writing.discard(run)
        _verified.pop(run, None)
    if main:
        write_manifest(run)


#: What a run leaves once it saved something (a run that failed before leaves only its
#: start: ``config.json``, its log), so that a new run in its directory would replace it.
RUN_SAVED = ("model.safetensors", "latest.json", "snapshots", "summary.json", "report.html")


def saved_files(run_dir: str | os.PathLike[str]) -> list[str]:
    """The names of :data:`RUN_SAVED` in ``run_dir``. ``snapshots/`` counts when it holds
    a snapshot, not when it is empty or holds only one being written (a run that failed
    writing its first one, on a full disk, saved nothing)."""
    root = Path(run_dir)
    found = []
    for name in RUN_SAVED:
        path = root / name
        if name == "snapshots" and path.is_dir() and not path.is_symlink():
            if any(not entry.name.startswith(".") for entry in path.iterdir()):
                found.append(name)
        elif path.exists():
            found.append(name)
    return found


def _replacing(root: Path, path: Path, aside: Path) -> str:
    """What a reader says of a run that a ``train --overwrite`` is replacing or was
    replacing when it was killed: the earlier run waits in ``aside``, and what becomes of
    it depends on whether the new run is still training, and whether it saved."""
    holder = _lock_holder(root / ".lock")
    if holder is not None:
        return (
            f"{path}: missing: the run in {root} is being replaced by an rnnkit train "
            f"still running (pid {holder}); the earlier run waits in {aside}, and goes "
            "when the new one has saved"
        )
    if saved_files(root):  # what decides, in the next train, whether it goes on
        return (
            f"{path}: missing: a train --overwrite was stopped after its new run saved; "
            f"train --resume with this --out continues the new run and removes the earlier "
            f"one, which waits in {aside} (to keep it instead, put its files back in "
            f"{root} in place of the new run's)"
        )
    return (
        f"{path}: missing: the run in {root} was being replaced when its process "
        f"ended, and the earlier run waits in {aside}; the next rnnkit "
        "train with this --out puts it back (or train --overwrite again)"
    )


def _lock_holder(lock_path: Path) -> str | None:
    """The pid written in a run's lock file where that process lives (a training running
    now); None otherwise. Read, not locked: a reader taking the lock even for an instant
    would make a training starting then refuse the directory as in use."""
    try:
        text = lock_path.read_bytes()[:32].decode("ascii", "replace").strip()
        pid = int(text)
    except (OSError, ValueError):
        return None
    if pid <= 0 or pid == os.getpid():
        return None
    try:
        os.kill(pid, 0)  # no signal: whether it exists
    except ProcessLookupError:
        return None
    except OSError:  # exists, another user's
        return text
    return text


def _unchanged(run: Path, manifest: bytes) -> bool:
    """Whether every file of ``run`` is still what ``manifest`` (its bytes) lists."""
    try:
        files = json.loads(manifest)["files"]
        if sorted(files) != sorted(covered_files(run)):
            return False
        return all(
            (run / n).stat().st_size == e["size"] and sha256_file(run / n) == e["sha256"]
            for n, e in files.items()
        )
    except (OSError, ValueError, KeyError, TypeError):
        return False


def covered_files(run_dir: str | os.PathLike[str]) -> list[str]:
    """The files of ``run_dir`` the manifest covers: every regular file, in every folder,
    as a ``/``-separated relative path, except those the module doc leaves out."""
    root = Path(run_dir)
    out: list[str] = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in _LEFT_OUT and not d.startswith("."))
        for name in sorted(files):
            if name in _LEFT_OUT or name.startswith(".") or name.endswith(".html"):
                continue
            path = Path(folder) / name
            if path.is_file() and not path.is_symlink():
                out.append(path.relative_to(root).as_posix())
    return out


def write_manifest(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Write ``run_dir/manifest.json`` (atomically) with the size and SHA-256 of every
    covered file; returns the document."""
    root = Path(run_dir)
    files = {}
    for name in covered_files(root):
        path = root / name
        files[name] = {"size": path.stat().st_size, "sha256": sha256_file(path)}
    doc = {"format": MANIFEST_FORMAT, "version": _VERSION, "files": files}
    atomic_write_bytes(root / MANIFEST, (json.dumps(doc, indent=1) + "\n").encode())
    return doc


def _read_manifest(path: Path) -> dict[str, dict[str, Any]]:
    try:
        doc = loads_json(read_run_file(path), path)
    except DataError as exc:
        raise CheckpointError(str(exc)) from None
    files = doc.get("files") if isinstance(doc, dict) else None
    ok = (
        isinstance(doc, dict)
        and doc.get("format") == MANIFEST_FORMAT
        and doc.get("version") == _VERSION
        and isinstance(files, dict)
        and all(
            isinstance(e, dict)
            and isinstance(e.get("size"), int)
            and isinstance(e.get("sha256"), str)
            and ".." not in Path(name).parts
            and not Path(name).is_absolute()
            for name, e in files.items()
        )
    )
    if not ok:
        raise CheckpointError(f"{path}: not an rnnkit manifest of version {_VERSION}")
    assert isinstance(files, dict)
    return files


def _signature(root: Path, names: list[str]) -> tuple[Any, ...]:
    """What changes when a file is rewritten: sizes and modification times (ns)."""
    out: list[tuple[Any, ...]] = []
    for name in [MANIFEST, *names]:
        try:
            st = (root / name).stat()
            out.append((name, st.st_size, st.st_mtime_ns, st.st_ino))
        except OSError:
            out.append((name, None))
    return tuple(out)


def _enclosing_run(root: Path, levels: int = 3) -> Path | None:
    """The nearest folder above ``root`` whose manifest lists files under ``root``."""
    for outer in list(root.parents)[:levels]:
        if (outer / MANIFEST).is_file():
            prefix = root.relative_to(outer).as_posix() + "/"
            try:
                listed = _read_manifest(outer / MANIFEST)
            except CheckpointError:
                return outer  # its own check names the damage
            if any(name.startswith(prefix) for name in listed):
                return outer
    return None


def verify_run(run_dir: str | os.PathLike[str], *, missing_ok: bool = False) -> None:
    """Check every file of a run against its ``manifest.json``.

    Args:
        run_dir: the run directory.
        missing_ok: a run without a manifest passes (``--resume`` of a run cut short:
            its snapshot carries its own checksums).

    Raises:
        CheckpointError: no manifest (unless ``missing_ok``), a file changed, missing or
            added since the manifest was written; one line naming the file and how to
            read the run anyway. Nothing is checked when checks are skipped, or while
            this process trains into ``run_dir``.
    """
    root = _key(Path(run_dir))
    if checksums_skipped() or not root.is_dir() or {root, *root.parents} & _writing:
        return
    path = root / MANIFEST
    if not path.exists():
        outer = _enclosing_run(root)
        if outer is not None:  # a run inside a run (a params run's keys/K): checked whole
            verify_run(outer)
            return
        if missing_ok or not (root / "config.json").exists():
            return  # not a run at all: its reader names what is missing
        aside = sorted(p.name for p in root.glob(f"{REPLACED_PREFIX}*") if p.is_dir())
        if aside:  # a `train --overwrite` running, or killed
            raise CheckpointError(_replacing(root, path, root / aside[0]))
        raise CheckpointError(
            f"{path}: missing, so the run's files cannot be checked (a run still training "
            f"or cut short: finish it with train --resume; or written by an older rnnkit); "
            f"{SKIP_HINT}"
        )
    files = _read_manifest(path)
    present = covered_files(root)
    signature = _signature(root, sorted(set(present) | set(files)))
    if _verified.get(root) == signature:
        return  # checked already in this process, and nothing changed since
    for name in present:
        # Only what a reader reads can be planted: a user's notes.txt is no threat.
        if name not in files and name.endswith((".json", ".safetensors")):
            raise CheckpointError(
                f"{root / name}: not in {MANIFEST} (added after the run was written); "
                f"remove it, or {SKIP_HINT}"
            )
    for name, entry in files.items():
        target = root / name
        if not target.is_file():
            raise CheckpointError(f"{target}: missing (listed in {MANIFEST}); {SKIP_HINT}")
        if target.stat().st_size != entry["size"] or sha256_file(target) != entry["sha256"]:
            raise CheckpointError(
                f"{target}: does not match its SHA-256 in {MANIFEST} (changed after the run "
                f"wrote it: damaged, or edited; weights saved into the run on purpose are "
                f"vouched for with rnnkit.training.manifest.write_manifest(run)); {SKIP_HINT}"
            )
    _verified[root] = signature
