"""``rnnkit train``: parse options into a ``TrainConfig``, validate, run the task.

The options of the configuration are not written here: each is built from its field of
``TrainConfig`` (``rnnkit.app.config``), whose metadata holds the help text, the choices,
the metavar and the tasks and cells that read it, one argument group per concern. Only
the options of the command itself (``--config``, ``--resume``, ``--json``, ...),
``--no-clip`` (a switch that unsets ``--clip-norm``) and, for a switch that a task turns
on by default (``--char-rnn`` for ``tag``), its opposite (``--no-char-rnn``) are added by
hand.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any, cast

from rnnkit import messages
from rnnkit.app.cli.ranks import is_other_rank
from rnnkit.app.cli.train_summary import print_summary
from rnnkit.app.config import (
    CELL_OPTIONS,
    CONCERNS,
    RESUME_CHANGEABLE,
    TASK_DEFAULTS,
    TASK_OPTIONS,
    TrainConfig,
    task_defaults,
)
from rnnkit.app.config.fields import SAME, flag, option_fields, option_of, value_kinds
from rnnkit.data.limits import MAX_PARAMETERS
from rnnkit.errors import ConfigError, RnnkitError

__all__ = ["add_config_options", "register", "run"]

#: The configuration's fields: the destinations of the options built from them.
CONFIG_FIELDS = frozenset(f.name for f in dataclasses.fields(TrainConfig))


#: The switches some task turns on by default (:data:`TASK_DEFAULTS`): each has an
#: opposite, ``--no-NAME``, to turn it off on the command line (``--no-char-rnn``).
NEGATED = tuple(
    sorted({name for d in TASK_DEFAULTS.values() for name, value in d.items() if value is True})
)


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return f"{value:g}" if isinstance(value, float) else str(value)


def option_help(name: str, text: str) -> str:
    """The help of the option ``name``: its field's ``text``, the tasks whose own default
    differs (:data:`rnnkit.app.config.TASK_DEFAULTS`), and ``[tasks: …]`` / ``[cells: …]``
    when only some tasks or cells read it (so the help and the refusal cannot disagree).

    >>> option_help("lr", "learning rate (default %(default)s)")
    'learning rate (default %(default)s; regress: 0.005)'
    >>> option_help("pooling", "how")
    'how [tasks: classify]'
    """
    own = "; ".join(f"{task}: {_shown(d[name])}" for task, d in TASK_DEFAULTS.items() if name in d)
    if own:
        # "learning rate (default 0.002)" -> "learning rate (default 0.002; regress: 0.005)"
        closing = text.endswith(")") and "(default" in text
        text = f"{text[:-1]}; {own})" if closing else f"{text} ({own})"
    notes = []
    if name in TASK_OPTIONS:
        notes.append("tasks: " + ", ".join(TASK_OPTIONS[name]))
    if name in CELL_OPTIONS:
        notes.append("cells: " + ", ".join(CELL_OPTIONS[name]))
    return f"{text} [{'; '.join(notes)}]" if notes else text


def add_config_options(p: argparse.ArgumentParser) -> None:
    """Every field of ``TrainConfig`` as an option of ``p``, one argument group per concern
    (:data:`rnnkit.app.config.CONCERNS`; the task among the command's own options): a
    ``bool`` field is a switch, the others take a value of the field's type."""
    kinds = value_kinds(TrainConfig)
    for concern in CONCERNS:
        title = getattr(concern, "title", "")
        group = p.add_argument_group(title) if title else p
        for field in option_fields(concern):
            meta = option_of(field)
            kind, _ = kinds[field.name]
            text = option_help(field.name, meta.help)
            if kind is bool:
                group.add_argument(flag(field.name), action="store_true", help=text)
            else:
                typed: dict[str, Any] = {} if kind is str else {"type": kind}
                group.add_argument(
                    flag(field.name),
                    **typed,
                    default=field.default if meta.command_line is SAME else meta.command_line,
                    choices=meta.choices,
                    metavar=meta.metavar,
                    help=text,
                )
            if field.name == "clip_norm":
                group.add_argument("--no-clip", action="store_true", help="do not clip gradients")
            if field.name in NEGATED:
                group.add_argument(
                    "--no" + flag(field.name)[1:],
                    action="store_true",
                    help=f"turn {flag(field.name)} off (on by default for "
                    + ", ".join(t for t, d in TASK_DEFAULTS.items() if d.get(field.name))
                    + ")",
                )


def register(sub: Any) -> None:
    p = sub.add_parser("train", help="train a model", description="Train a recurrent model.")
    p.add_argument(
        "--config",
        metavar="FILE",
        help="read options from a TOML file (keys: the options without --, e.g. "
        "batch-size = 32); options on the command line override it (docs/cli.md)",
    )
    p.add_argument(
        "--print-config",
        action="store_true",
        help="print the complete effective configuration as TOML (loadable with --config) "
        "and exit without training; without --train/--out, a template",
    )
    p.add_argument(
        "--resume", action="store_true", help="continue the run in --out from its latest snapshot"
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the run already in --out (without it, or --resume, an existing run "
        "is refused)",
    )
    add_config_options(p)
    p.add_argument(
        "--max-parameters",
        type=int,
        help="refuse a model whose recurrent layers would hold more parameters than this "
        f"(default {MAX_PARAMETERS.default:,}, or ${MAX_PARAMETERS.env})",
    )
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.add_argument(
        "--no-report",
        action="store_true",
        default=os.environ.get("RNNKIT_REPORT", "1") == "0",
        help="do not write OUT/report.html at the end (default: write it; the environment "
        "variable RNNKIT_REPORT=0 changes the default)",
    )
    p.set_defaults(func=run)


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    values = {k: v for k, v in vars(args).items() if k in CONFIG_FIELDS}
    explicit = getattr(args, "explicit", None)  # set by cli.main; None when called directly
    if args.no_clip:
        values["clip_norm"] = None
    if explicit is not None and "no_clip" in explicit:
        explicit = explicit | {"clip_norm"}
    switched_off = {name for name in NEGATED if getattr(args, "no_" + name, False)}
    for name in switched_off:
        if values[name]:
            raise ConfigError(f"{flag(name)} and --no{flag(name)[1:]}: give one of them")
        values[name] = False
    if explicit is not None:
        explicit = explicit | {name for name in NEGATED if "no_" + name in explicit}
    if not args.resume:
        global_defaults = TrainConfig()
        for key, value in task_defaults(values["task"], values).items():
            # The task's own default for an option not given (without the parse's record
            # of what was typed: one still at the global default counts as not given).
            if key in switched_off:
                continue
            if (
                key not in explicit
                if explicit is not None
                else (values[key] == getattr(global_defaults, key))
            ):
                values[key] = value
        cfg = TrainConfig(**values).validate()
        return cfg.check_applies(None if explicit is None else explicit & CONFIG_FIELDS)
    # --resume: the run's own config holds; options given on the command line may only
    # change how long or where to train. Anything else would be another model.
    from rnnkit.app.tasks.run_config import load_config
    from rnnkit.training.manifest import verify_run

    # A run cut short has no manifest (its snapshot carries its checksums); a finished
    # one's files must match theirs.
    verify_run(args.out, missing_ok=True)
    saved, info = load_config(args.out, verify=False)
    defaults = TrainConfig(train=saved.train, out=saved.out).to_dict()
    merged = saved.to_dict()

    def given(key: str) -> bool:
        return key in explicit if explicit is not None else values[key] != defaults.get(key)

    # --train (and --valid, if given) are the files given now; the task accepts them only
    # if their content is what the run was trained on (tasks.run_config.resume_data).
    merged["train"] = values["train"]
    if given("valid"):
        merged["valid"] = values["valid"]
    elif info.get("data") is not None:
        merged["valid"] = None  # the run's own file, by its recorded absolute path
    for key, value in values.items():
        if key in ("train", "valid", "out") or not given(key) or value == merged[key]:
            continue
        if key not in RESUME_CHANGEABLE:
            raise ConfigError(
                f"--{key.replace('_', '-')} differs from the run being resumed "
                f"({merged[key]!r} in {args.out}/config.json); only "
                f"{', '.join('--' + k.replace('_', '-') for k in sorted(RESUME_CHANGEABLE))} "
                "may change"
            )
        merged[key] = value
    if given("epochs") and not given("steps"):
        # a budget in epochs now: the run's --steps (which would override it) goes
        merged["steps"] = None
    # The run directory is the one given now: a run that was moved (or resumed from
    # another working directory) must not train on in the place config.json remembers.
    if Path(args.out).resolve() != Path(saved.out).resolve():
        merged["out"] = args.out
    cfg = TrainConfig(**merged).validate()
    given_now = {k for k in values if k not in ("train", "out") and given(k)}
    return cfg.check_applies(given_now)


def _recorded_file(out: str, key: str) -> str | None:
    """The ``key`` (``train``, ``valid``) file of the run in ``out`` as ``config.json``
    recorded it (absolute); None where there is no such record. A recorded file that is
    gone is a ConfigError: the resume could not read it."""
    from rnnkit.training.checkpoint import read_json

    try:
        record = read_json(Path(out) / "config.json").get("data", {}).get(key) or {}
        path = record.get("path")
    except (RnnkitError, OSError, AttributeError):
        return None
    if not isinstance(path, str) or not path:
        return None
    if not Path(path).is_file():
        what = "training" if key == "train" else key
        raise ConfigError(
            f"--resume: the {what} file of this run, {path}, is gone; give it with --{key}"
        )
    return path


def _as_resumed(cfg: TrainConfig, args: argparse.Namespace) -> TrainConfig:
    """``cfg`` as ``--print-config`` shows it: on ``--resume`` without ``--valid``, with
    the validation file the run goes on reading (its recorded one), so that the printed
    configuration loads with ``--config`` to the same run."""
    if not args.resume or cfg.valid is not None:
        return cfg
    valid = _recorded_file(args.out, "valid")
    return cfg if valid is None else dataclasses.replace(cfg, valid=valid)


def _write_report(out: str, device: str = "cpu") -> str | None:
    """The HTML report of a finished run, its figures computed on the device it trained
    on; a failure to draw it never fails the run."""
    from rnnkit.messages import warning as warn

    try:
        from rnnkit.app.report import write_report

        return str(write_report(out, device=device))
    except Exception as exc:  # the trained model is saved: say what failed, do not fail
        warn(
            f"the report could not be written ({exc.__class__.__name__}: {exc}); "
            f"try: rnnkit report --checkpoint {out}"
        )
        return None


def recurrent_parameters(cfg: TrainConfig) -> int:
    """The parameters of the recurrent layers ``cfg`` asks for (weights and biases of every
    gate, layer and direction; not the embedding and output layer, which depend on the
    vocabulary): ``Σ_layers dirs · gates · H · (I + H + 1)``.

    >>> recurrent_parameters(TrainConfig(cell="lstm", hidden=8, embedding=4, layers=2))
    960

    A tagger's sentence encoder has both directions, and its character encoder (on by
    default) is counted with it.
    """
    gates = {"rnn": 1, "gru": 3, "lstm": 4}.get(cfg.cell, 4)
    # the tagger's sentence encoder is always bidirectional (it reads no --bidirectional)
    dirs = 2 if cfg.bidirectional or cfg.task == "tag" else 1
    total, width = 0, cfg.embedding
    if cfg.task == "tag" and cfg.char_rnn:
        # its character encoder: one bidirectional layer, whose both directions' last
        # states widen each word's input
        from rnnkit.models.tagger import CHAR_EMBEDDING, CHAR_HIDDEN

        total += 2 * gates * CHAR_HIDDEN * (CHAR_EMBEDDING + CHAR_HIDDEN + 1)
        width += 2 * CHAR_HIDDEN
    for _ in range(min(cfg.layers, 1 << 20)):  # no loop of a billion steps to say no
        total += dirs * gates * cfg.hidden * (width + cfg.hidden + 1)
        width = dirs * cfg.hidden
    return total * max(cfg.layers // (1 << 20), 1)


def check_size(cfg: TrainConfig, limit: int | None) -> None:
    """Refuse at once a model too large to build in reasonable time and memory
    (``--layers 1000000`` would otherwise spend minutes allocating before failing)."""
    if limit is not None and (isinstance(limit, bool) or limit < 1):
        # The limit's own check names the Python keyword (max_parameters), not the option.
        raise ConfigError(f"--max-parameters must be ≥ 1, got {limit}")
    cap = MAX_PARAMETERS.value(limit)
    count = recurrent_parameters(cfg)
    if count > cap:
        raise ConfigError(
            f"--layers {cfg.layers} --hidden {cfg.hidden} --embedding {cfg.embedding}: the "
            f"recurrent layers alone would hold {count:,} parameters, over the limit of "
            f"{cap:,} (raise it with --max-parameters N or {MAX_PARAMETERS.env}=N)"
        )


def _train_parser() -> argparse.ArgumentParser:
    """The ``train`` subcommand's parser (the one a configuration file is checked against)."""
    from rnnkit.app.cli.main import build_parser  # same layer; main imports this module lazily

    action = next(a for a in build_parser()._actions if a.dest == "command")
    choices = cast(dict[str, argparse.ArgumentParser], action.choices)
    return choices["train"]


def effective_options(
    cfg: TrainConfig, args: argparse.Namespace, parser: argparse.ArgumentParser
) -> dict[str, Any]:
    """Every option of a configuration file that applies to ``cfg``'s task and cell, with
    the value this run uses (None: unset): what ``--print-config`` prints."""
    from rnnkit.app.cli.config_file import file_actions

    values: dict[str, Any] = {}
    for action in file_actions(parser):
        dest = action.dest
        if dest == "no_clip":
            values[dest] = cfg.clip_norm is None
        elif dest.startswith("no_") and dest[3:] in NEGATED:
            continue  # the switch itself is printed, true or false
        elif dest in CONFIG_FIELDS:
            if cfg.applies(dest):
                values[dest] = getattr(cfg, dest)
        else:  # options of the command itself (--max-parameters, --no-report)
            values[dest] = getattr(args, dest, None)
    return values


def print_config_text(
    cfg: TrainConfig,
    args: argparse.Namespace,
    parser: argparse.ArgumentParser,
    unset: Iterable[str] = (),
) -> str:
    """The TOML of ``--print-config`` (``unset``: options shown unset, a template's)."""
    from rnnkit import __version__
    from rnnkit.app.cli.config_file import render

    values = effective_options(cfg, args, parser)
    values.update(dict.fromkeys(unset))
    cell = "no cell (--wiring jordan)" if cfg.wiring == "jordan" else f"the {cfg.cell} cell"
    header = (
        f"rnnkit train configuration (rnnkit {__version__}): task {cfg.task}, {cell}.",
        "Use it with: rnnkit train --config FILE (options on the command line win).",
        "Every option that applies is here; those of other tasks or cells are left out.",
    )
    return render(parser, values, header)


def run(args: argparse.Namespace) -> int:
    origins: dict[str, str] = {}
    parser = _train_parser()
    explicit = getattr(args, "explicit", None)
    if args.no_clip and explicit is not None and "clip_norm" in explicit:
        # both typed: one would be dropped (a --config file's clip-norm is overridden)
        raise ConfigError("--clip-norm and --no-clip: give one of them")
    if args.config is not None:
        from rnnkit.app.cli.config_file import apply_config_file

        given = set(explicit) if explicit is not None else set()
        origins = apply_config_file(parser, args, given, args.config)
        if "no_clip" in origins and args.no_clip:
            if "clip_norm" in given:  # the command line's --clip-norm over the file's no-clip
                args.no_clip = False
            elif "clip_norm" in origins:
                raise ConfigError(f"{args.config}: clip-norm and no-clip: give one of them")
        if explicit is not None:  # options from the file are given, as if typed
            args.explicit = explicit | {k for k in origins if not k.startswith("--")}
    # "" is empty, not "not given" (it was "--out is required ..."), as --valid '' is
    for name, fix in (("train", "name a data file"), ("out", "name the run directory")):
        if getattr(args, name) == "":
            from rnnkit.app.cli.config_file import blame

            raise blame(ConfigError(f"--{name} is empty: {fix}"), origins, args.config)
    if args.resume and args.out and not args.train:
        # the run's own training file, by the absolute path config.json recorded (its
        # content is checked against the record before the run goes on)
        args.train = _recorded_file(args.out, "train")
    if args.out and not args.print_config:
        from rnnkit.training.checkpoint import utf8_path

        if not utf8_path(args.out):  # trained for hours, then no command could read it
            raise ConfigError(
                f"--out {args.out}: the path is not valid UTF-8, and the weights' files "
                "(safetensors) open UTF-8 paths only; choose another name"
            )
    unset = [name for name in ("train", "out") if not getattr(args, name)]
    if unset:
        if not args.print_config or args.resume:
            raise ConfigError(f"--{unset[0]} is required (on the command line or in --config)")
        for name in unset:  # --print-config alone: a template; these two stay unset
            setattr(args, name, f"<{name}>")
    try:
        cfg = config_from_args(args)
        check_size(cfg, getattr(args, "max_parameters", None))
    except ConfigError as exc:
        from rnnkit.app.cli.config_file import blame

        raise blame(exc, origins, args.config) from None
    if args.print_config:
        sys.stdout.write(print_config_text(_as_resumed(cfg, args), args, parser, unset))
        return 0
    if messages.LOGGER.isEnabledFor(logging.DEBUG) and not is_other_rank():  # once
        text = print_config_text(_as_resumed(cfg, args), args, parser).rstrip()
        messages.debug("the effective configuration (--print-config):\n" + text)
    if cfg.tensorboard is not None:  # a missing package is said before anything is trained
        from rnnkit.training.tensorboard import require_tensorboard

        require_tensorboard("--tensorboard")
        if os.path.exists(cfg.tensorboard) and not os.path.isdir(cfg.tensorboard):
            raise ConfigError(f"--tensorboard {cfg.tensorboard}: exists and is not a directory")
    from rnnkit.app.tasks.registry import check_processes, task_module  # lazy: fast --help
    from rnnkit.app.tasks.run_dir import snapshot_step

    check_processes(cfg.task)
    resumed_at = snapshot_step(cfg.out) if args.resume else None
    try:
        summary = task_module(cfg.task).train(
            cfg, resume=args.resume, quiet=args.quiet, overwrite=getattr(args, "overwrite", False)
        )
    finally:
        from rnnkit.training.distributed import shutdown_distributed

        shutdown_distributed()
    if summary.get("rank", 0) != 0:
        return 0  # under torchrun only rank 0 reports
    if not args.no_report:
        summary["report"] = _write_report(cfg.out, cfg.device)
    if args.json:
        from rnnkit.training.checkpoint import dumps_strict

        print(dumps_strict(summary))  # a diverged loss is null, never the non-JSON NaN
    else:
        print_summary(summary, resumed_at=resumed_at)
    behind = summary.get("behind_baseline")
    if behind:  # on stderr, so that --json's stdout stays one JSON object
        sys.stdout.flush()
        messages.warning(behind["line"], label="")  # "behind baseline: …" names itself
    return 0
