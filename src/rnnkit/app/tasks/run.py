"""What every task's run shares: the config file, device choice, seeding, loop options."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import random
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.numpy import save_file as save_numpy

from rnnkit import messages
from rnnkit.app.config import TrainConfig
from rnnkit.data.files import atomic_write, fingerprint
from rnnkit.data.locks import lock as lock_file
from rnnkit.errors import CheckpointError, ConfigError, RunFinished
from rnnkit.models.spec import ModelSpec
from rnnkit.training.baseline_check import RunSettings, behind_baseline
from rnnkit.training.checkpoint import FORMAT_VERSION, atomic_write_json, load_arrays, read_json
from rnnkit.training.loop import TrainOptions
from rnnkit.training.manifest import verify_run, writing_run
from rnnkit.training.run_files import read_summary

__all__ = [
    "BASELINE_FILE",
    "RUN_FILES",
    "check_count",
    "check_labels",
    "choose_device",
    "data_fingerprints",
    "device_name",
    "finish_summary",
    "guarded_run",
    "load_baseline",
    "load_config",
    "lock_run_dir",
    "model_spec",
    "prepare_run_dir",
    "resume_data",
    "run_settings",
    "save_baseline",
    "save_config",
    "seed_everything",
    "train_options",
    "warn",
]


def warn(message: str) -> None:
    """A one-line warning for the user on stderr (``rnnkit: warning: …``; hidden by
    ``-qq``: :mod:`rnnkit.messages`)."""
    messages.warning(message)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def choose_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device is available here")
    return torch.device(name)


def model_spec(cfg: TrainConfig) -> ModelSpec:
    """The model part of ``cfg`` for the builders of :mod:`rnnkit.models` (which never see
    the configuration: each :class:`~rnnkit.models.spec.ModelSpec` field is the option of
    its name).

    >>> model_spec(TrainConfig(train="x", cell="gru", hidden=8)).hidden
    8
    """
    return ModelSpec(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(ModelSpec)})


def run_settings(cfg: TrainConfig) -> RunSettings:
    """The budget and knobs of ``cfg`` that the behind-the-baseline advice names
    (:class:`~rnnkit.training.baseline_check.RunSettings`: each field the option of its
    name)."""
    return RunSettings(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(RunSettings)})


def save_config(out_dir: Path, cfg: TrainConfig, **info: Any) -> None:
    """Write ``config.json``: the config, the task's ``info`` (vocabulary size, ...) and
    the fingerprints of the data files (:func:`data_fingerprints`)."""
    info.setdefault("data", data_fingerprints(cfg))
    atomic_write_json(
        out_dir / "config.json",
        {"format_version": FORMAT_VERSION, "config": cfg.to_dict(), **info},
    )


def finish_summary(cfg: TrainConfig, summary: dict[str, Any]) -> dict[str, Any]:
    """Add ``behind_baseline`` (the model against its best baseline, one line saying why
    when it is behind: :mod:`rnnkit.training.baseline_check`) and write ``summary.json``.
    Returns the summary."""
    summary["behind_baseline"] = behind_baseline(summary, cfg.task, run_settings(cfg))
    summary["device"] = device_name(cfg.device)
    atomic_write_json(Path(cfg.out) / "summary.json", summary)
    return summary


def device_name(name: str) -> str:
    """The device ``--device NAME`` trains on, as the summary names it (``cpu``, or
    ``cuda (the card's name)``).

    >>> device_name("cpu")
    'cpu'
    """
    device = choose_device(name)
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    return device.type


BASELINE_FILE = "baseline.safetensors"


def save_baseline(out: str | Path, arrays: dict[str, np.ndarray]) -> None:
    """Write the fitted baseline of a run (``baseline.safetensors``: numpy arrays, no
    pickling), so that ``rnnkit evaluate`` scores it beside the model on new data."""
    atomic_write(Path(out) / BASELINE_FILE, write_path=lambda tmp: save_numpy(arrays, tmp))


def load_baseline(run_dir: str | Path) -> dict[str, np.ndarray] | None:
    """The arrays of ``baseline.safetensors`` (None for a run that has none: one from
    before the file existed). A damaged file is a ``CheckpointError`` naming it."""
    path = Path(run_dir) / BASELINE_FILE
    if not os.path.lexists(path):
        return None
    return load_arrays(path)


def data_fingerprints(cfg: TrainConfig) -> dict[str, Any]:
    """Absolute path, size and SHA-256 of the training and validation files: what a
    ``--resume`` checks the data it is given against."""
    return {
        key: fingerprint(path) if path and Path(path).is_file() else None
        for key, path in (("train", cfg.train), ("valid", cfg.valid))
    }


def resume_data(cfg: TrainConfig, info: dict[str, Any]) -> TrainConfig:
    """The config to resume with: ``--train`` (and ``--valid``) accepted only if their
    content is what the run was trained on (``info["data"]`` of ``config.json``), so a
    different file of the same name, or the same name resolved from another directory,
    never silently continues the run. Without ``--valid``, the run's own validation file
    is used (by its absolute path), if it is still the same.
    """
    saved = info.get("data")
    if saved is None:  # a run from before fingerprints were recorded: nothing to check
        return cfg
    where = Path(cfg.out) / "config.json"
    try:
        ok = isinstance(saved, dict) and all(
            saved.get(k) is None
            or (
                isinstance(saved[k]["path"], str)
                and isinstance(saved[k]["size"], int)
                and isinstance(saved[k]["sha256"], str)
            )
            for k in ("train", "valid")
        )
    except (KeyError, TypeError):
        ok = False
    if not ok:
        raise CheckpointError(f"{where}: 'data' is not a valid record of the data files")
    changes: dict[str, Any] = {}
    for key in ("train", "valid"):
        want, given = saved.get(key), getattr(cfg, key)
        if want is None:
            if given is not None:
                raise ConfigError(
                    f"--{key} {given}: the run was trained without --{key}; resume without it"
                )
            continue
        path = given if given is not None else want["path"]
        if given is None and not Path(path).is_file():
            raise CheckpointError(
                f"--resume: the {key} file of this run, {path}, is gone; give it with --{key}"
            )
        got = fingerprint(path)
        if (got["size"], got["sha256"]) != (want["size"], want["sha256"]):
            raise ConfigError(
                f"--{key} {path} is not the data this run was trained on ({want['path']}, "
                f"{want['size']:,} bytes, sha256 {want['sha256'][:12]}…); resume with that file"
            )
        changes[key] = got["path"]
    return dataclasses.replace(cfg, **changes)


def load_config(
    run_dir: str | Path, task: str | None = None, *, verify: bool = True
) -> tuple[TrainConfig, dict[str, Any]]:
    """Read ``config.json`` of a run directory; errors name the file. With ``task``, a run
    of another task is a ``CheckpointError`` too. Every file of the run is checked against
    its ``manifest.json`` first (:func:`rnnkit.training.manifest.verify_run`; ``verify``
    False: the caller checked already)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise CheckpointError(f"{run_dir}: no such checkpoint directory")
    if verify:
        verify_run(run_dir)
    path = run_dir / "config.json"
    data = read_json(path)
    if not isinstance(data, dict) or data.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{path}: not an rnnkit checkpoint of format {FORMAT_VERSION}")
    try:
        cfg = TrainConfig.from_dict(data.get("config"), where=str(path))
    except ConfigError as exc:
        raise CheckpointError(str(exc)) from None
    try:
        # The command line's own rules: `dropout: 5`, `hidden: -1` or a seed of 2^70
        # written into config.json are refused as they would be as options.
        cfg.validate()
    except ConfigError as exc:
        raise CheckpointError(f"{path}: {exc}") from None
    if task is not None and cfg.task != task:
        raise CheckpointError(f"{path}: task is {cfg.task!r}, not {task!r}")
    return cfg, data


def check_labels(run_dir: str | Path, saved: Any, found: Any, data_path: str) -> None:
    """On resume, ``labels.json`` (``saved``) must hold exactly the labels the training
    data has (``found``, a ``LabelSet`` built from it, as at training time): a label
    renamed or removed in the file would silently drop that class's lines."""
    if list(saved.labels) != list(found.labels):
        missing = sorted(set(found.labels) - set(saved.labels))
        extra = sorted(set(saved.labels) - set(found.labels))
        raise CheckpointError(
            f"{Path(run_dir) / 'labels.json'}: does not match the labels of {data_path} "
            f"(missing {missing[:3]}, unknown {extra[:3]}): edited since training?"
        )


def check_count(path: Path, count: int | None, noun: str, info: dict[str, Any], key: str) -> None:
    """``count`` (what ``path`` holds) must equal ``info[key]`` (what config.json says)."""
    if info.get(key) != count:
        raise CheckpointError(f"{path}: {count} {noun} but config.json says {info.get(key)}")


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
RUN_SAVED = ("model.safetensors", "latest.json", "snapshots", "summary.json", "report.html")

LOCK_NAME = ".lock"


def _is_main_process() -> bool:
    # Under torchrun every rank runs the same command with the same --out; rank 0 alone
    # owns the directory (the others never write to it).
    return os.environ.get("RANK", "0") == "0"


def prepare_run_dir(out: str | Path, resume: bool = False, overwrite: bool = False) -> None:
    """Check that ``out`` may receive this run, before anything is written.

    A new or empty directory is fine. A directory that already holds a run is refused:
    training again would silently replace its weights and metrics (and, without a new
    report, leave the old report describing another run). ``resume`` continues it instead;
    ``overwrite`` removes the old run's files (:data:`RUN_FILES`) first.
    """
    out = Path(out)
    if resume and overwrite:
        raise ConfigError("--resume and --overwrite exclude each other")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: exists and is not a directory")
    if resume:
        if not (out / "config.json").is_file():
            raise CheckpointError(f"--resume: {out} holds no run to continue (no config.json)")
        return
    if not _is_main_process():
        return
    found = [name for name in RUN_FILES if (out / name).exists()]
    # What a finished or resumable run leaves; a run that failed before saving anything
    # (bad data, divergence at step 2) leaves only its start, which a new run replaces.
    saved = [name for name in RUN_SAVED if (out / name).exists()]
    if saved and not overwrite:
        raise ConfigError(
            f"--out {out} already holds a run ({', '.join(saved[:3])}); continue it with "
            "--resume or replace it with --overwrite"
        )
    for name in found:
        path = out / name
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
    finally:
        # A run refused before it wrote anything leaves no directory behind.
        if created and os.listdir(out) == [LOCK_NAME]:
            path.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
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


def guarded_run(train: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
    """Wrap a task's ``train(cfg, resume=False, quiet=False, ...)``: the run directory
    is locked (:func:`lock_run_dir`) for the whole run and checked
    (:func:`prepare_run_dir`) before anything is written. Adds the keyword ``overwrite``
    (default False: a directory holding a run is refused unless ``resume``)."""

    @functools.wraps(train)
    def wrapper(cfg: TrainConfig, *args: Any, overwrite: bool = False, **kwargs: Any):
        resume = bool(kwargs.get("resume", args[0] if args else False))
        with lock_run_dir(cfg.out):
            prepare_run_dir(cfg.out, resume=resume, overwrite=overwrite)
            if resume:
                # A run cut short has no manifest: its snapshot carries its checksums.
                verify_run(cfg.out, missing_ok=True)
                cfg = resume_data(cfg, load_config(cfg.out, verify=False)[1])
            # The manifest goes first and is written again last, when the run is whole.
            with writing_run(cfg.out, main=_is_main_process()):
                try:
                    return train(cfg, *args, **kwargs)
                except RunFinished as done:
                    # The run stays exactly as it finished; the caller gets its summary.
                    messages.info(str(done))
                    return read_summary(cfg.out)

    return wrapper


def train_options(cfg: TrainConfig, quiet: bool, units: str = "ppl") -> TrainOptions:
    """The training loop's options from the command line's config (every task the same).

    >>> train_options(TrainConfig(steps=3), quiet=True).steps
    3
    """
    return TrainOptions(
        epochs=cfg.epochs,
        steps=cfg.steps,
        max_time=cfg.max_time,
        clip_norm=cfg.clip_norm,
        clip_value=cfg.clip_value,
        eval_every=cfg.eval_every,
        patience=cfg.patience,
        log_every=cfg.log_every,
        tensorboard=cfg.tensorboard,
        on_nonfinite=cfg.on_nonfinite,
        precision=cfg.precision,
        threads=cfg.threads,
        rows=cfg.batch_size,
        quiet=quiet,
        units=units,
        lr_schedule=cfg.effective_lr_schedule(),
        warmup=cfg.warmup,
        lr_decay=cfg.lr_decay,
        init_range=cfg.init_range,
    )


def load_pretrained_vectors(
    cfg: TrainConfig, embedding: torch.nn.Embedding, tokens: list[str]
) -> dict[str, Any] | None:
    """``--pretrained-vectors FILE``: copy the vector of every token of ``tokens`` (the
    vocabulary, index order) found in the file into its row of ``embedding``; the other
    rows keep their initialisation. Returns ``{"file", "found", "vocabulary"}`` (None
    without the option) and says it on stderr."""
    if cfg.pretrained_vectors is None:
        return None
    from rnnkit.data.word_vectors import read_word_vectors

    dim = embedding.embedding_dim
    vectors = read_word_vectors(cfg.pretrained_vectors, dim, tokens)
    found = 0
    with torch.no_grad():
        for index, token in enumerate(tokens):
            vector = vectors.get(token)
            if vector is not None:
                embedding.weight[index] = torch.from_numpy(vector).to(embedding.weight)
                found += 1
    messages.info(
        f"pretrained vectors: {found} of {len(tokens)} vocabulary words found in "
        f"{cfg.pretrained_vectors}"
    )
    return {"file": cfg.pretrained_vectors, "found": found, "vocabulary": len(tokens)}
