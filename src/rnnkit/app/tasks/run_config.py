"""A run's ``config.json``: written with the fingerprints of its data files, read back and
checked (``--resume``, ``evaluate``, ``predict``, ``rnnkit.load``), and what a resumed run
must find as it was (its data files, its labels, its vocabulary's size)."""

from __future__ import annotations

import dataclasses
import numbers
from pathlib import Path
from typing import Any

from rnnkit.app.config import TrainConfig
from rnnkit.data.files import fingerprint
from rnnkit.errors import CheckpointError, ConfigError, DataError
from rnnkit.training.checkpoint import FORMAT_VERSION, atomic_write_json, read_json
from rnnkit.training.manifest import verify_run

__all__ = [
    "check_batch_size",
    "check_count",
    "check_labels",
    "data_fingerprints",
    "load_config",
    "refuse_tabbed_line",
    "resume_data",
    "save_config",
]


def save_config(out_dir: Path, cfg: TrainConfig, **info: Any) -> None:
    """Write ``config.json``: the options the run reads (those of ``--print-config``;
    :meth:`TrainConfig.applies`), the task's ``info`` (vocabulary size, ...) and the
    fingerprints of the data files (:func:`data_fingerprints`). An option left out reads
    back at its default (:meth:`TrainConfig.from_dict`), which the run never reads; one
    the run does not read but set away from that default is kept."""
    info.setdefault("data", data_fingerprints(cfg))
    # An option the run does not read is no fact about it: a tagger's
    # "bidirectional": false said its (always bidirectional) encoder had one direction.
    # One away from the value a missing key reads back as (TrainConfig.from_dict) is kept
    # all the same: a config built in Python is not checked as the command line's is,
    # and a builder may read it (layer_norm of a decoder-only seq2seq model), so it must
    # load back as it was.
    defaults = TrainConfig(train=cfg.train, out=cfg.out).to_dict()
    options = {k: v for k, v in cfg.to_dict().items() if cfg.applies(k) or v != defaults.get(k)}
    atomic_write_json(
        out_dir / "config.json",
        {"format_version": FORMAT_VERSION, "config": options, **info},
    )


def load_config(
    run_dir: str | Path, task: str | None = None, *, verify: bool = True
) -> tuple[TrainConfig, dict[str, Any]]:
    """Read ``config.json`` of a run directory; errors name the file. With ``task``, a run
    of another task is a ``CheckpointError`` too. Every file of the run is checked against
    its ``manifest.json`` first (:func:`rnnkit.training.manifest.verify_run`; ``verify``
    False: the caller checked already)."""
    if not str(run_dir):  # Path("") is ".": the working directory was read as the run
        raise CheckpointError("--checkpoint is an empty path: name a run directory")
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        if run_dir.exists():  # model.safetensors given for its run, say
            raise CheckpointError(
                f"{run_dir}: not a directory; --checkpoint names a run directory "
                f"(here perhaps {run_dir.parent})"
            )
        raise CheckpointError(f"{run_dir}: no such checkpoint directory")
    if verify:
        verify_run(run_dir)
    path = run_dir / "config.json"
    if not path.exists() and not path.is_symlink():
        raise CheckpointError(
            f"{path}: missing: {run_dir} is not a run directory written by rnnkit train"
        )
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
    said = info.get(key)
    if said == count:
        return
    config = path.parent / "config.json"
    if count is None:  # config.json's task or inputs have no such file
        raise CheckpointError(f"{config}: says {key} {said}, but this run's task reads no {noun}")
    if said is None:
        raise CheckpointError(f"{config}: no {key} ({path.name} holds {count} {noun})")
    raise CheckpointError(f"{path}: {count} {noun} but config.json says {said}")


def check_batch_size(batch_size: object, *, none: str | None = "the run's") -> None:
    """A ``ConfigError`` naming ``batch_size`` unless it is an integer ≥ 1, or None where
    ``none`` says what None means (``evaluate`` and ``predictor``: the run's batch size).

    Checked before the run is read, as the command line checks ``--batch-size``: 0 is
    not "the run's" (only None is), and a negative or fractional size never reaches a
    batcher (one took -1 as "no lines", another failed deep inside the scorer).

    >>> check_batch_size(None), check_batch_size(8)
    (None, None)
    >>> check_batch_size(0)
    Traceback (most recent call last):
    ...
    rnnkit.errors.ConfigError: batch_size must be an integer ≥ 1 or None (the run's), got 0
    """
    if batch_size is None and none is not None:
        return
    if (
        isinstance(batch_size, bool)
        or not isinstance(batch_size, numbers.Integral)
        or int(batch_size) < 1
    ):
        allowed = "an integer ≥ 1" + ("" if none is None else f" or None ({none})")
        raise ConfigError(f"batch_size must be {allowed}, got {batch_size!r}")


def refuse_tabbed_line(text: str, path: str, line: int, unit: str, form: str) -> None:
    """``predict`` reads one ``unit`` (text, source) a line, which never holds a tab (the
    training files end it with one): a line with a tab is the ``form`` file
    (``label<TAB>text``) given by mistake, whose label would be read as text."""
    if "\t" in text:
        raise DataError(
            f"holds a tab: predict reads one {unit} a line; a {form} file is read by evaluate",
            path,
            line,
        )
