"""The run directory: refused when it holds another run (unless ``--resume`` or
``--overwrite``), locked while one process trains into it, and the wrapper that does both
around a task's ``train`` (:func:`guarded_run`)."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from rnnkit import messages
from rnnkit.app.config import TrainConfig
from rnnkit.app.tasks.run_config import load_config, resume_data
from rnnkit.data.files import atomic_write_bytes
from rnnkit.data.locks import lock as lock_file
from rnnkit.errors import CheckpointError, ConfigError, RnnkitError, RunFinished, WriteError
from rnnkit.training.checkpoint import atomic_write_json, read_json
from rnnkit.training.manifest import (
    MANIFEST,
    MANIFEST_FORMAT,
    REPLACED_PREFIX,
    RUN_SAVED,
    saved_files,
    verify_run,
    writing_run,
)
from rnnkit.training.run_files import read_summary

__all__ = [
    "BUDGET_OPTIONS",
    "LOCK_NAME",
    "RUN_FILES",
    "RUN_SAVED",
    "guarded_run",
    "lock_run_dir",
    "prepare_run_dir",
    "record_budget",
    "replacing_run",
    "snapshot_step",
    "written_report",
]


# Everything a training run writes into its directory (``--overwrite`` removes exactly
# these; other files a user keeps there are left alone).
RUN_FILES = (
    "config.json",
    "vocab.json",
    "source_vocab.json",
    "chars.json",
    "labels.json",
    "model.safetensors",
    "latest.json",
    "snapshots",
    "metrics.jsonl",
    "metrics.csv",
    "summary.json",
    "ngram.safetensors",
    "thresholds.json",
    "valid_scores.safetensors",
    "baseline.safetensors",
    "calibration.safetensors",
    "keys.json",
    "keys",
    "report.html",
    "manifest.json",
)


# The files that make a directory a run worth protecting from a new one.


LOCK_NAME = ".lock"


def _is_main_process() -> bool:
    # Under torchrun every rank runs the same command with the same --out; rank 0 alone
    # owns the directory (the others never write to it).
    return os.environ.get("RANK", "0") == "0"


def prepare_run_dir(
    out: str | Path,
    resume: bool = False,
    overwrite: bool = False,
    inputs: Mapping[str, str | None] | None = None,
) -> None:
    """Check that ``out`` may receive this run, before anything is written.

    A new or empty directory is fine. A directory that already holds a run is refused:
    training again would silently replace its weights and metrics (and, without a new
    report, leave the old report describing another run). ``resume`` continues it instead;
    ``overwrite`` removes the old run's files (:data:`RUN_FILES`) first.
    :func:`replacing_run` does the same, and keeps the old files until the new run has
    saved something.

    Args:
        inputs: the files the new run reads, by option (``{"--train": path}``): one of
            the files to be removed is refused, not removed (a ``--train`` among them
            would be gone before it is read).
    """
    for name in _old_run_files(Path(out), resume, overwrite, inputs):
        _remove(Path(out) / name)


@contextlib.contextmanager
def replacing_run(
    out: str | Path,
    resume: bool = False,
    overwrite: bool = False,
    inputs: Mapping[str, str | None] | None = None,
) -> Iterator[None]:
    """:func:`prepare_run_dir` around a run, the old run's files moved aside instead of
    removed: a new run that fails before it saved anything (a typo in ``--train``, bad
    data, an interrupt at the first step) leaves the old run as it was; when the run ends
    having saved (weights, a snapshot), the old files are removed. The aside directory is
    ``OUT/.replaced-*``: a process killed meanwhile leaves the old run there, and the next
    run in ``OUT`` (the caller holds its lock) settles it first: put back where the killed
    run had saved nothing, else removed."""
    out = Path(out)
    if _is_main_process() and out.is_dir():
        for left in sorted(out.glob(f"{_ASIDE}*")):
            if left.is_dir() and not left.is_symlink():
                _settle(out, left)
    found = _old_run_files(out, resume, overwrite, inputs)
    if not found:
        yield
        return
    aside = Path(tempfile.mkdtemp(prefix=_ASIDE, dir=out))
    for name in found:
        os.replace(out / name, aside / name)  # the same directory: a rename, atomic
    try:
        yield
    except BaseException:
        _settle(out, aside)
        raise
    finally:
        shutil.rmtree(aside, ignore_errors=True)


_ASIDE = REPLACED_PREFIX  # the directory an old run waits in (replacing_run)


def _settle(out: Path, aside: Path) -> None:
    """The old run in ``aside`` back into ``out`` where the new run saved nothing (its
    start removed first: ``config.json``, its log, an empty ``snapshots/``); ``aside``
    removed either way."""
    if not saved_files(out):
        for name in RUN_FILES:
            if (out / name).exists() or (out / name).is_symlink():
                _remove(out / name)
        for old in aside.iterdir():
            os.replace(old, out / old.name)
    shutil.rmtree(aside, ignore_errors=True)


def _old_run_files(
    out: Path, resume: bool, overwrite: bool, inputs: Mapping[str, str | None] | None
) -> list[str]:
    """The names of :data:`RUN_FILES` in ``out`` a new run replaces, checked (see
    :func:`prepare_run_dir`); empty for ``resume``."""
    if resume and overwrite:
        raise ConfigError("--resume and --overwrite exclude each other")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: exists and is not a directory")
    if resume:
        if not (out / "config.json").is_file():
            raise CheckpointError(f"--resume: {out} holds no run to continue (no config.json)")
        return []
    if not _is_main_process():
        return []
    found = [name for name in RUN_FILES if (out / name).exists() or (out / name).is_symlink()]
    foreign = _not_written_by_rnnkit(out, found)
    if foreign:
        listed = ", ".join(foreign[:3]) + (", …" if len(foreign) > 3 else "")
        were, them = ("was", "it") if len(foreign) == 1 else ("were", "them")
        raise ConfigError(
            f"--out {out}: {listed} {were} not written by rnnkit train, and a new run "
            f"would replace {them}; move {them}, or choose another --out"
        )
    # What a finished or resumable run leaves; a run that failed before saving anything
    # (bad data, divergence at step 2) leaves only its start, which a new run replaces.
    saved = saved_files(out)
    if saved and not overwrite:
        raise ConfigError(
            f"--out {out} already holds a run ({', '.join(saved[:3])}); continue it with "
            "--resume or replace it with --overwrite"
        )
    for option, value in (inputs or {}).items():
        if not value:
            continue
        try:
            path = Path(value).resolve()
        except (RuntimeError, OSError):  # a symlink loop: its reader says so, in one line
            continue
        for name in found:
            try:
                old = (out / name).resolve()
            except (RuntimeError, OSError):
                continue
            if path == old or old in path.parents:
                raise ConfigError(
                    f"{option} {value}: is the run's {name} in --out {out}, which the new "
                    "run replaces; copy it out of the run directory first"
                )
    return found


# What a run writes only once it has written its config.json (the run's start writes a
# vocabulary before it): without an rnnkit config.json beside them, they are a user's.
_AFTER_CONFIG = (*RUN_SAVED, "metrics.jsonl", "metrics.csv", "manifest.json")


def _not_written_by_rnnkit(out: Path, found: list[str]) -> list[str]:
    """The files among ``found`` (names of :data:`RUN_FILES` in ``out``) that no rnnkit
    run wrote, so that neither ``--overwrite`` nor a new run may replace them: where
    ``out`` holds no run of rnnkit's (:func:`_rnnkit_run`), those a run writes after its
    config.json (:data:`_AFTER_CONFIG`) but an rnnkit report page; beside a run, a
    ``report.html`` that is not an rnnkit report and entries of ``snapshots/`` that are
    not snapshots."""
    report = out / "report.html"
    ours = {"report.html"} if _written_report_file(report) else set()
    if not _rnnkit_run(out):
        return [name for name in found if name in _AFTER_CONFIG and name not in ours]
    foreign = []
    if "report.html" in found and report.is_file() and not report.is_symlink() and not ours:
        foreign.append("report.html")
    snapshots = out / "snapshots"
    if "snapshots" in found and snapshots.is_dir() and not snapshots.is_symlink():
        foreign += sorted(
            f"snapshots/{p.name}"
            for p in snapshots.iterdir()
            # a snapshot, a write of one cut short (.step-*.tmp), or a hidden file the
            # system keeps (.DS_Store)
            if not p.name.startswith(("step-", "."))
        )
    return foreign


def _rnnkit_run(out: Path) -> bool:
    """Whether ``out`` holds what an rnnkit run writes first or last: its config.json,
    its latest.json (a snapshot's pointer) or its manifest.json (a run whose config.json
    is gone, or was moved aside by a replacement cut short, is still rnnkit's)."""
    marks = {
        "config.json": lambda d: "format_version" in d and "config" in d,
        "latest.json": lambda d: "format_version" in d and "snapshot" in d,
        MANIFEST: lambda d: d.get("format") == MANIFEST_FORMAT,
    }
    for name, is_ours in marks.items():
        try:
            with open(out / name, "rb") as f:
                data = json.loads(f.read(1 << 20))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and is_ours(data):
            return True
    return False


def _written_report_file(path: Path) -> bool:
    """Whether ``path`` is a regular file holding a report page rnnkit wrote."""
    if not path.is_file() or path.is_symlink():
        return False
    try:
        with open(path, "rb") as f:
            return written_report(f.read(4096))
    except OSError:
        return False


def written_report(head: bytes) -> bool:
    """Whether ``head``, the first bytes of a file, begins a report page rnnkit wrote
    (``rnnkit report``, the report of ``rnnkit train``)."""
    return head.startswith(b"<!DOCTYPE html>") and b"<title>rnnkit report" in head


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


@contextlib.contextmanager
def lock_run_dir(out: str | Path) -> Iterator[None]:
    """Hold an exclusive lock on the run directory ``out`` (created if needed) while
    training or resuming: a second process on the same directory is refused at once,
    with the pid of the holder, instead of both writing into one run.

    The lock is ``flock`` on ``OUT/.lock``: the kernel releases it when the holder exits,
    however it exits (a SIGKILL leaves no stale lock). The file itself stays.
    """
    out = Path(out)
    if not _is_main_process():
        yield
        return
    created = not out.exists()
    _make_out_dir(out)
    path = out / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        if not lock_file(fd, blocking=False):
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            raise ConfigError(
                f"--out {out} is in use by another rnnkit process (pid {holder}); wait for "
                "it to finish or choose another --out"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
        if os.fstat(fd).st_nlink == 0 and not (out / "config.json").is_file():
            # The lock file and the run's config.json are gone: the directory was removed
            # (rm -rf) while the run trained, and what was written since (its writers make
            # the directory again) lacks the run's start: no run to evaluate or resume
            # (--overwrite replaces it). (The lock file alone removed: the run is whole.)
            raise WriteError(
                f"--out {out}: the run directory was removed while the run trained; what "
                "was written since is not a whole run: train again (with --overwrite)"
            )
    finally:
        # A run refused before it wrote anything leaves no directory behind.
        with contextlib.suppress(OSError):
            if created and os.listdir(out) == [LOCK_NAME]:
                path.unlink(missing_ok=True)
                out.rmdir()
        os.close(fd)


def _make_out_dir(out: Path) -> None:
    """Create ``--out``; one line naming it when that is impossible (``/dev/null`` gave the
    raw ``[Errno 17] File exists``)."""
    if out.exists() and not out.is_dir():
        kind = "regular file" if out.is_file() else "special file (a device, FIFO or socket)"
        raise ConfigError(f"--out {out}: exists and is a {kind}, not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--out {out}: cannot create the directory ({exc.strerror})") from None


#: The options of ``config.json`` that say how long a run trains: a ``--resume`` that
#: changes them records them (:func:`record_budget`), so the next plain ``--resume`` goes on
#: under that budget rather than the first one's. (``--max-time`` is not among them: it is
#: the time of one invocation.)
BUDGET_OPTIONS = ("epochs", "steps")


def record_budget(cfg: TrainConfig) -> bytes | None:
    """Write ``cfg``'s budget (:data:`BUDGET_OPTIONS`) into the run's ``config.json``
    where it differs from it, the rest of the file kept as it is; returns the file's bytes
    before (None: nothing written). Only the process that owns the run directory writes."""
    if not _is_main_process():
        return None
    path = Path(cfg.out) / "config.json"
    before = path.read_bytes()
    data = read_json(path)
    saved = data.get("config") if isinstance(data, dict) else None
    if not isinstance(saved, dict):
        return None  # load_config refused such a file before training began
    now = cfg.to_dict()
    changed = {k: now[k] for k in BUDGET_OPTIONS if saved.get(k) != now[k]}
    if not changed:
        return None
    atomic_write_json(path, {**data, "config": {**saved, **changed}})
    return before


def snapshot_step(out: str | Path) -> int | None:
    """The step of the run's latest snapshot (``latest.json``: what ``--resume``
    continues from), or None where it cannot be read (the resume itself then says why)."""
    try:
        step = read_json(Path(out) / "latest.json").get("step")
    except (RnnkitError, OSError, AttributeError):
        return None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def _put_back(out: str | Path, before: bytes | None) -> None:
    """``config.json`` as it was before :func:`record_budget` changed it (if it did)."""
    if before is not None:
        atomic_write_bytes(Path(out) / "config.json", before)


def guarded_run(train: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
    """Wrap a task's ``train(cfg, resume=False, quiet=False, ...)``: the run directory
    is locked (:func:`lock_run_dir`) for the whole run and checked
    (:func:`replacing_run`) before anything is written. Adds the keyword ``overwrite``
    (default False: a directory holding a run is refused unless ``resume``)."""

    @functools.wraps(train)
    def wrapper(cfg: TrainConfig, *args: Any, overwrite: bool = False, **kwargs: Any):
        resume = bool(kwargs.get("resume", args[0] if args else False))
        inputs = {
            "--train": cfg.train,
            "--valid": cfg.valid,
            "--pretrained-vectors": cfg.pretrained_vectors,
        }
        with (
            lock_run_dir(cfg.out),
            replacing_run(cfg.out, resume=resume, overwrite=overwrite, inputs=inputs),
        ):
            if resume:
                # A run cut short has no manifest: its snapshot carries its checksums.
                verify_run(cfg.out, missing_ok=True)
                cfg = resume_data(cfg, load_config(cfg.out, verify=False)[1])
            # The manifest goes first and is written again last, when the run is whole.
            with writing_run(cfg.out, main=_is_main_process()):
                # A resume under a new budget records it first: a run killed while it
                # trains on under it (SIGKILL, out of memory) resumes under it too.
                started_at = snapshot_step(cfg.out)
                before = record_budget(cfg) if resume else None
                try:
                    return train(cfg, *args, **kwargs)
                except RunFinished as done:
                    _put_back(cfg.out, before)  # the run stays exactly as it finished
                    if not _is_main_process():
                        # torchrun: rank 0 alone says so, and reports (once, not twice)
                        return {"task": cfg.task, "rank": int(os.environ["RANK"])}
                    messages.info(str(done))
                    return read_summary(cfg.out)
                except BaseException:
                    if snapshot_step(cfg.out) == started_at:  # not a step under the new one
                        _put_back(cfg.out, before)
                    raise

    return wrapper
