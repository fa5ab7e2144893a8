"""``rnnkit train``: parse options into a ``TrainConfig``, validate, run the task."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any, cast

from rnnkit import messages
from rnnkit.app.config import (
    CELL_OPTIONS,
    CONDITIONS,
    DOC_BOUNDARIES,
    LENGTHS,
    PRECISIONS,
    RESUME_CHANGEABLE,
    TASK_DEFAULTS,
    TASK_OPTIONS,
    TASKS,
    WIRINGS,
    TrainConfig,
)
from rnnkit.data.limits import MAX_PARAMETERS
from rnnkit.errors import ConfigError

__all__ = ["add_model_options", "register", "run"]


def add_model_options(p: argparse.ArgumentParser) -> None:
    d = TrainConfig()
    g = p.add_argument_group("model")
    g.add_argument(
        "--cell",
        choices=("rnn", "lstm", "gru"),
        default=d.cell,
        help="recurrent cell (default %(default)s)",
    )
    g.add_argument(
        "--hidden", type=int, default=d.hidden, help="hidden width H (default %(default)s)"
    )
    g.add_argument(
        "--layers", type=int, default=d.layers, help="stacked layers (default %(default)s)"
    )
    g.add_argument("--bidirectional", action="store_true", help="two directions per layer")
    g.add_argument(
        "--embedding", type=int, default=d.embedding, help="embedding width (default %(default)s)"
    )
    g.add_argument(
        "--tie-weights",
        action="store_true",
        help="share the embedding with the output layer (a projection is added "
        "when --hidden differs from --embedding)",
    )
    g.add_argument(
        "--pretrained-vectors",
        metavar="FILE",
        help="initialise the word embedding from vectors in word2vec/GloVe text format "
        "(one 'word v1 … vd' per line, d = --embedding); says how many words were found",
    )
    g.add_argument(
        "--dropout",
        type=float,
        default=d.dropout,
        help="dropout on embeddings, between layers and before the head",
    )
    g.add_argument(
        "--nonlinearity",
        default=d.nonlinearity,
        metavar="{tanh,relu,sigmoid}[,...]",
        help="simple RNN activation φ: tanh, relu or sigmoid (the logistic), or one per "
        "layer bottom first, e.g. tanh,sigmoid (default %(default)s)",
    )
    g.add_argument(
        "--update",
        choices=("candidate", "keep"),
        default=d.update,
        help="GRU update convention: z weighs the candidate or the kept state "
        "(default %(default)s)",
    )
    g.add_argument(
        "--reset",
        choices=("before", "after"),
        default=d.reset,
        help="GRU reset gate before or after the recurrent matrix (default %(default)s)",
    )
    g.add_argument(
        "--recompute",
        type=int,
        metavar="K",
        help="keep only the state every K steps for the backward and recompute the rest: "
        "the same gradients in O(T/K + K) memory for long sequences, ~1/3 more time",
    )


def register(sub: Any) -> None:
    d = TrainConfig()
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
    p.add_argument("--task", choices=TASKS, default="lm", help="what to learn (default lm)")
    # Not argparse-required: --config may give them (checked in run()).
    p.add_argument("--train", help="training data file (required, here or in --config)")
    p.add_argument("--valid", help="validation data file (default: hold out the end of --train)")
    p.add_argument(
        "--out", help="run directory for checkpoints and reports (required, here or in --config)"
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
    add_model_options(p)
    g = p.add_argument_group("data")
    g.add_argument(
        "--unit",
        choices=("char", "word"),
        default=d.unit,
        help="token unit (default %(default)s)",
    )
    g.add_argument(
        "--min-freq",
        type=int,
        default=d.min_freq,
        help="rarer tokens become <unk> (default %(default)s)",
    )
    g.add_argument(
        "--max-len",
        type=int,
        default=d.max_len,
        help="longer lines are cut into pieces of this many tokens (sequence mode)",
    )
    g.add_argument(
        "--doc-boundary",
        choices=DOC_BOUNDARIES,
        default=d.doc_boundary,
        help="lm streams (--bptt segment:K): 'eos': every line ends with </s> and the "
        "state carries on across lines (sentence-per-line corpora such as the Penn "
        "Treebank); 'line': every line is a document, ended by </s>, and the carried "
        "state is reset at each line start; 'none' (default): the text as it is (for "
        "--unit word, line ends are then only whitespace)",
    )
    g.add_argument(
        "--valid-fraction",
        type=float,
        default=d.valid_fraction,
        help="share of --train held out when no --valid (default %(default)s)",
    )
    g = p.add_argument_group("optimisation")
    g.add_argument(
        "--epochs",
        type=int,
        help="passes over the data (default, with no --steps or --max-time either: train "
        "until validation stops improving, validating ~10 times per epoch, with a cap of "
        "100 epochs or an hour; see docs/training.md)",
    )
    g.add_argument("--steps", type=int, help="optimizer steps (overrides --epochs)")
    g.add_argument(
        "--max-time",
        type=float,
        help="stop after this many seconds of training (then validate and save)",
    )
    g.add_argument("--batch-size", type=int, default=d.batch_size, help="batch size B")
    g.add_argument(
        "--threads",
        type=int,
        help="CPU threads to train with (default: RNNKIT_THREADS, else chosen from the CPUs "
        "free now, the cgroup quota and the batch size, and re-checked as the load changes)",
    )
    g.add_argument(
        "--optimizer",
        choices=("adam", "sgd"),
        default=d.optimizer,
        help="adam (default) or sgd with learning-rate decay on plateau",
    )
    g.add_argument("--lr", type=float, default=d.lr, help="learning rate (default %(default)s)")
    g.add_argument(
        "--lr-decay",
        type=float,
        default=d.lr_decay,
        help="--lr-schedule plateau: factor applied when validation stops improving "
        "(default %(default)s)",
    )
    g.add_argument(
        "--lr-schedule",
        metavar="constant|plateau|step:E:F|cosine",
        help="learning-rate schedule: constant; plateau (multiply by --lr-decay when "
        "validation stops improving); step:E:F (multiply by F at the end of epoch E and of "
        "every later epoch, e.g. step:4:0.5); cosine (down to 0 over --steps/--epochs). "
        "Default: plateau with --optimizer sgd, constant with adam",
    )
    g.add_argument(
        "--warmup",
        type=int,
        default=d.warmup,
        metavar="N",
        help="raise the learning rate linearly over the first N steps (default 0)",
    )
    g.add_argument(
        "--init-range",
        type=float,
        metavar="R",
        help="initialise every parameter uniformly in [-R, R] (default: each layer's own "
        "initialisation)",
    )
    g.add_argument(
        "--clip-norm",
        type=float,
        default=d.clip_norm,
        help="clip the global gradient norm to this (default %(default)s)",
    )
    g.add_argument("--no-clip", action="store_true", help="do not clip gradients")
    g.add_argument("--clip-value", type=float, help="clip each gradient entry to [-v, v]")
    g.add_argument(
        "--loss-reduction",
        choices=("token", "sequence"),
        default=d.loss_reduction,
        help="how the training loss averages: every target token weighs the same (token, "
        "default) or every sequence (sequence: the mean within each, then over them); the "
        "figures reported stay per token",
    )
    g.add_argument(
        "--bptt",
        default=d.bptt,
        help="full | segment:K (streams, state carried) | window:K (exact "
        "windowed BPTT(K): the loss at step t reaches steps t-K..t); default %(default)s",
    )
    g.add_argument("--eval-every", type=int, help="validate every N steps (default: each epoch)")
    g.add_argument("--patience", type=int, help="early stop after N validations without gain")
    g.add_argument("--seed", type=int, default=d.seed, help="random seed")
    g.add_argument(
        "--device",
        choices=("cpu", "cuda", "auto"),
        default=d.device,
        help="where to train (default %(default)s)",
    )
    g.add_argument(
        "--precision",
        choices=PRECISIONS,
        default=d.precision,
        help="fp32 (default), or mixed precision: forward and loss under torch.autocast "
        "in bf16 or fp16 (fp16 with a GradScaler); the recurrence itself stays float32",
    )
    g.add_argument(
        "--on-nonfinite",
        choices=("stop", "skip"),
        default=d.on_nonfinite,
        help="a NaN or inf loss or gradient: stop training (default; the checkpoint keeps "
        "the last good state) or skip that step; either way the step and batch are named",
    )
    g.add_argument(
        "--ngram-order",
        type=int,
        default=d.ngram_order,
        help="order of the n-gram baseline (default %(default)s)",
    )
    g = p.add_argument_group("classify options")
    g.add_argument(
        "--pooling",
        choices=("last", "mean", "max"),
        default=d.pooling,
        help="how the encoder states become one vector (default %(default)s)",
    )
    g = p.add_argument_group("tag options")
    g.add_argument(
        "--tag-column",
        default=d.tag_column,
        help="CoNLL-U column holding the tag (upos, xpos, deprel, …)",
    )
    g.add_argument(
        "--char-rnn",
        action="store_true",
        help="add a character-level RNN over each word (helps unknown words)",
    )
    g = p.add_argument_group("seq2seq options")
    g.add_argument(
        "--source-unit",
        choices=("char", "word"),
        default=d.source_unit,
        help="unit of the source side (word = split on spaces)",
    )
    g.add_argument(
        "--target-unit",
        choices=("char", "word"),
        default=d.target_unit,
        help="unit of the target side",
    )
    g.add_argument(
        "--attention",
        choices=("none", "dot", "bilinear", "additive"),
        default=d.attention,
        help="attention over encoder states",
    )
    g.add_argument(
        "--attention-wiring",
        choices=("before", "after"),
        default=d.attention_wiring,
        help="before: the previous decoder state attends and the context is fed into the "
        "step (Bahdanau); after: the new state attends after the step and the context "
        "reaches only the output layer (Luong, no input feeding; trains faster: the "
        "decoder runs as one layer call)",
    )
    g.add_argument(
        "--context",
        choices=("init", "input", "both"),
        default=d.context,
        help="the encoder's final state initializes the decoder, is fed "
        "at every decoder step, or both",
    )
    g.add_argument(
        "--scheduled-sampling",
        default=d.scheduled_sampling,
        help="none | linear:K | exponential:K | inverse-sigmoid:K",
    )
    g.add_argument(
        "--decoder-only",
        action="store_true",
        help="one language model over 'source <sep> target'",
    )
    g.add_argument("--beam", type=int, default=d.beam, help="beam width for decoding")
    g = p.add_argument_group("lm and seq2seq options")
    g.add_argument(
        "--length",
        choices=LENGTHS,
        default=d.length,
        help="how a sequence ends: the </s> symbol (eos, default), a stop "
        "output per step (stop), or a length predicted first, at most --max-len, with the "
        "steps remaining fed to every step (predict); lm: needs --bptt full or window:K",
    )
    g = p.add_argument_group("regress options")
    g.add_argument(
        "--target",
        choices=("next", "value"),
        default=d.target,
        help="next: predict x_(t+1) from x_1..x_t at every step (default); value: predict "
        "each sequence's y from the whole sequence",
    )
    g.add_argument(
        "--loss",
        choices=("mse", "gaussian"),
        default=d.loss,
        help="mse: mean squared error (default); gaussian: a mean and a variance per value, "
        "the Gaussian negative log-likelihood",
    )
    g = p.add_argument_group("lm options")
    g.add_argument(
        "--wiring",
        choices=WIRINGS,
        default=d.wiring,
        help="hidden-to-hidden recurrence (hidden, default) or output-to-hidden only "
        "(jordan: one layer of width --hidden, trained with no time loop; "
        "--cell and --embedding do not apply)",
    )
    g.add_argument(
        "--condition",
        choices=CONDITIONS,
        default=d.condition,
        help="class-conditional LM on label<TAB>text lines; the class embedding "
        "enters the initial state (init), every step (input) or both; needs --bptt full; "
        "generate --condition LABEL",
    )
    _add_events_options(p)
    _add_params_options(p)
    g = p.add_argument_group("logging")
    g.add_argument(
        "--log-every",
        type=int,
        metavar="N",
        help="steps between training records in metrics.jsonl (and lines with -v); "
        "default: every ⌊steps/50⌋ steps, 1 to 50, when the run's length is known "
        "(--steps, --epochs), else every ⌈S/20⌉ for S steps per epoch, 1 to 50",
    )
    g.add_argument(
        "--tensorboard",
        metavar="DIR",
        help="also write the training records and validation figures as TensorBoard "
        "scalars into DIR (train/loss_nats, train/lr, valid/…; needs the extra: "
        "pip install 'rnnkit[tensorboard]')",
    )
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
    mark_applicability(p)
    p.set_defaults(func=run)


def _shown(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def mark_applicability(p: argparse.ArgumentParser) -> None:
    """Append ``[tasks: …]`` / ``[cells: …]`` to the help of every option that only some
    tasks or cells read, from the one table in ``rnnkit.app.config`` (so the help and the
    refusal can never disagree), and the tasks whose own default differs
    (:data:`rnnkit.app.config.TASK_DEFAULTS`)."""
    for action in p._actions:
        own = "; ".join(
            f"{task}: {_shown(d[action.dest])}"
            for task, d in TASK_DEFAULTS.items()
            if action.dest in d
        )
        if own and action.help is not None:
            # "learning rate (default 0.002)" -> "learning rate (default 0.002; regress: 0.005)"
            closing = action.help.endswith(")") and "(default" in action.help
            action.help = f"{action.help[:-1]}; {own})" if closing else f"{action.help} ({own})"
        notes = []
        if action.dest in TASK_OPTIONS:
            notes.append("tasks: " + ", ".join(TASK_OPTIONS[action.dest]))
        if action.dest in CELL_OPTIONS:
            notes.append("cells: " + ", ".join(CELL_OPTIONS[action.dest]))
        if notes and action.help is not None:
            action.help = f"{action.help} [{'; '.join(notes)}]"


CONFIG_FIELDS = {f for f in TrainConfig.__dataclass_fields__} - {"extra"}

#: ``--task events`` options: command-line name -> key of the config's ``extra``.
EVENTS_OPTIONS = {
    "events_target_fpr": "target_fpr",
    "events_top_g": "top_g",
    "events_window": "window",
    "events_score": "score",
    "events_threshold_method": "threshold",
}


def _add_events_options(p: argparse.ArgumentParser) -> None:
    from rnnkit.anomaly.scores import SCORES
    from rnnkit.anomaly.thresholds import THRESHOLD_METHODS

    g = p.add_argument_group("anomaly detection (--task events; params: the two marked)")
    g.add_argument(
        "--target-fpr",
        dest="events_target_fpr",
        type=float,
        metavar="A",
        help="false-positive rate the thresholds aim at on normal validation sessions "
        "(default 0.01; params too: its session threshold)",
    )
    g.add_argument(
        "--top-g",
        dest="events_top_g",
        type=int,
        metavar="G",
        help="an event outside the G most probable is a miss (the count score; default 9)",
    )
    g.add_argument(
        "--window",
        dest="events_window",
        type=int,
        metavar="H",
        help="each prediction sees only the last H events (DeepLog's window; default: "
        "the whole session so far)",
    )
    g.add_argument(
        "--score",
        dest="events_score",
        choices=SCORES,
        help="the session score giving verdicts (default max); docs/anomaly.md compares them",
    )
    g.add_argument(
        "--threshold-method",
        dest="events_threshold_method",
        choices=THRESHOLD_METHODS,
        help="quantile: the empirical one (default); gpd: a generalized Pareto fit of the "
        "validation scores' tail, for rates the validation sessions are too few to show "
        "(params too)",
    )


#: ``--task params`` options: command-line name -> key of the config's ``extra``.
PARAMS_OPTIONS = {
    "params_confidence": "confidence",
    "events_target_fpr": "target_fpr",
    "events_threshold_method": "threshold",
}
#: Each option kept in the config's ``extra``: destination -> (its key there, the tasks
#: it applies to).
EXTRA_OPTIONS: dict[str, tuple[str, tuple[str, ...]]] = {
    dest: (
        key,
        tuple(
            t
            for t, table in (("events", EVENTS_OPTIONS), ("params", PARAMS_OPTIONS))
            if dest in table
        ),
    )
    for dest, key in {**EVENTS_OPTIONS, **PARAMS_OPTIONS}.items()
}


def _add_params_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("parameter values (--task params)")
    g.add_argument(
        "--confidence",
        dest="params_confidence",
        type=float,
        metavar="C",
        help="a parameter vector whose prediction error is above the upper end of this "
        "confidence interval of the key's validation errors is anomalous (default 0.99)",
    )


def _events_extra(args: argparse.Namespace) -> dict[str, Any]:
    """The ``--task events`` (or ``params``) options given, as the config's ``extra``."""
    extra: dict[str, Any] = {}
    for dest, (key, tasks) in EXTRA_OPTIONS.items():
        value = getattr(args, dest, None)
        if value is None:
            continue
        if args.task not in tasks:
            flag = "--" + dest.split("_", 1)[1].replace("_", "-")
            raise ConfigError(
                f"{flag} does not apply to --task {args.task} (only to: {', '.join(tasks)})"
            )
        extra[key] = value
    return extra


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    values = {k: v for k, v in vars(args).items() if k in CONFIG_FIELDS}
    if args.no_clip:
        values["clip_norm"] = None
    extra = _events_extra(args)
    explicit = getattr(args, "explicit", None)  # set by cli.main; None when called directly
    if explicit is not None and "no_clip" in explicit:
        explicit = explicit | {"clip_norm"}
    if not args.resume:
        if extra:
            from rnnkit.app.tasks.registry import check_task_options

            check_task_options(args.task, TrainConfig(train=values["train"], extra=extra))
        global_defaults = TrainConfig()
        for key, value in TASK_DEFAULTS.get(values["task"], {}).items():
            # The task's own default for an option not given (without the parse's record
            # of what was typed: one still at the global default counts as not given).
            if (
                key not in explicit
                if explicit is not None
                else (values[key] == getattr(global_defaults, key))
            ):
                values[key] = value
        cfg = TrainConfig(**values, extra=extra).validate()
        return cfg.check_applies(None if explicit is None else explicit & CONFIG_FIELDS)
    if extra:
        raise ConfigError("the anomaly-detection options cannot change on --resume")
    # --resume: the run's own config holds; options given on the command line may only
    # change how long or where to train. Anything else would be another model.
    from rnnkit.app.tasks.run import load_config

    saved, info = load_config(args.out)
    defaults = TrainConfig(train=saved.train, out=saved.out).to_dict()
    merged = saved.to_dict()

    def given(key: str) -> bool:
        return key in explicit if explicit is not None else values[key] != defaults.get(key)

    # --train (and --valid, if given) are the files given now; the task accepts them only
    # if their content is what the run was trained on (tasks.run.resume_data).
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
    # The run directory is the one given now: a run that was moved (or resumed from
    # another working directory) must not train on in the place config.json remembers.
    if Path(args.out).resolve() != Path(saved.out).resolve():
        merged["out"] = args.out
    cfg = TrainConfig(**merged).validate()
    given_now = {k for k in values if k not in ("train", "out") and given(k)}
    return cfg.check_applies(given_now)


#: The validation figures the summary prints, for the model and for each baseline.
SHOWN_METRICS = (
    "accuracy",
    "oov_accuracy",
    "macro_f1",
    "span_f1",
    "exact_match",
    "character_error_rate",
    "token_error_rate",
    "bleu",
)


def _print_params(summary: dict[str, Any]) -> None:
    """A params run: the keys modelled, the threshold, validation false positives."""
    keys = summary["keys"]
    print(
        f"modelled {keys['modelled']} key(s) ({keys['vectors_modelled']} training vectors; "
        f"{keys['skipped']} key(s) too rare or without numbers, {keys['vectors_skipped']} "
        f"vectors) in {summary['elapsed_s']:.0f} s, {summary['parameters']:,} parameters"
    )
    print(
        f"threshold: a vector's error above the {summary['confidence']:g} interval of its "
        f"key's validation errors (mean + {summary['z']:.4g} standard deviations); a "
        f"session's largest error above {summary['session_threshold']:.4g} standard "
        f"deviations (target FPR {summary['target_fpr']:g}; "
        f"{summary['session_threshold_how']})"
        if "session_threshold" in summary
        else f"threshold: a vector's error above the {summary['confidence']:g} interval of "
        f"its key's validation errors (mean + {summary['z']:.4g} standard deviations)"
    )
    fpr = summary["validation_fpr"]
    lo, hi = fpr["interval95"]
    print(
        f"validation: {fpr['false_positives']} of {fpr['sessions']} normal sessions flagged; "
        f"false-positive rate {lo:.2%} to {hi:.2%} (95 % Clopper–Pearson)"
    )
    m = summary.get("valid_detection")
    if m:
        auc = f"{m['auc']:.4f}" if "auc" in m else "-"
        print(
            f"labelled validation sessions: AUC {auc}, precision {m['precision']:.4f}, "
            f"recall {m['recall']:.4f}, F1 {m['f1']:.4f}"
        )


def _print_summary(summary: dict[str, Any]) -> None:
    if summary.get("task") == "params":
        _print_params(summary)
        if summary.get("report"):
            print(f"report: {summary['report']}")
        return
    valid, ngram = summary.get("valid"), summary.get("ngram")
    print(
        f"trained {summary['steps']} steps in {summary['elapsed_s']:.0f} s "
        f"({summary.get('tokens_per_s') or 0:.0f} tokens/s), "
        f"{summary['parameters']:,} parameters"
    )
    if summary.get("stopped"):
        best = (valid or {}).get("step")
        print(f"stopped: {summary['stopped']}" + (f"; weights of step {best}" if best else ""))
    if valid and ("bits_per_char" in valid or "perplexity" in valid):
        key = "bits_per_char" if "bits_per_char" in valid else "perplexity"
        label = "bits/char" if key == "bits_per_char" else "perplexity"
        line = f"validation {label}: recurrent {valid[key]:.3f}"
        if ngram:
            line += f" | {ngram['order']}-gram baseline {ngram.get(key, float('nan')):.3f}"
        print(line + f"  (nats/token {valid['loss_nats']:.3f})")
    if valid:
        shown = [
            f"{k.replace('_', ' ')} {valid[k]:.4f}"
            for k in SHOWN_METRICS
            if isinstance(valid.get(k), (int, float))
        ]
        if shown:
            print("validation " + ", ".join(shown))
    baselines = summary.get("baselines") or {}
    if summary.get("task") == "regress" and valid and isinstance(valid.get("mse"), float):
        base = (baselines.get("persistence") or {}).get("mse")
        line = f"validation mse: recurrent {valid['mse']:.4g}"
        if isinstance(base, float):
            line += f" | persistence baseline {base:.4g}"
        print(line + f"  (loss {valid['loss']:.4g} per value)")
    else:
        for name, figures in baselines.items():
            shown = [
                f"{k.replace('_', ' ')} {figures[k]:.4f}"
                for k in SHOWN_METRICS
                if isinstance(figures.get(k), (int, float))
            ]
            if shown:
                print(f"baseline, {figures.get('kind', name)}: " + ", ".join(shown))
    if summary.get("task") == "events":
        _print_detection(summary)
    if summary.get("threads"):
        print(summary["threads"])
    for sample in summary.get("samples", []):
        print(f"sample: {sample!r}")
    if summary.get("report"):
        print(f"report: {summary['report']}")


def _print_detection(summary: dict[str, Any]) -> None:
    """The events run's thresholds, what validation shows of the false-positive rate, and
    detection on labelled validation sessions, the recurrent model next to the n-gram."""
    thr = summary["thresholds"]
    name = thr["score"]
    print(
        f"threshold: {name} score above {thr['rnn'][name]:.4g} (target FPR "
        f"{thr['target_fpr']:g}; {thr.get('how', 'empirical quantile')})"
    )
    fpr = summary.get("validation_fpr")
    if fpr:
        lo, hi = fpr["interval95"]
        print(
            f"validation: {fpr['false_positives']} of {fpr['sessions']} normal sessions above "
            f"it; false-positive rate {lo:.2%} to {hi:.2%} (95 % Clopper–Pearson)"
        )
    if summary.get("note"):
        print(f"note: {summary['note']}")
    detection = summary.get("detection")
    if not detection:
        return
    print(f"labelled validation sessions, {name} score:")
    print("  model      AUC     precision recall  F1      TP    FP    FN    TN")
    for model, label in (("rnn", "recurrent"), ("ngram", f"{summary['ngram']['order']}-gram")):
        m = detection[model][name]
        auc = f"{m['auc']:.4f}" if "auc" in m else "  -   "
        print(
            f"  {label:<10} {auc}  {m['precision']:.4f}    {m['recall']:.4f}  {m['f1']:.4f}  "
            f"{m['tp']:<5} {m['fp']:<5} {m['fn']:<5} {m['tn']:<5}"
        )


def _write_report(out: str) -> str | None:
    """The HTML report of a finished run; a failure to draw it never fails the run."""
    from rnnkit.app.tasks.run import warn

    try:
        from rnnkit.app.report import write_report

        return str(write_report(out))
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
    """
    gates = {"rnn": 1, "gru": 3, "lstm": 4}.get(cfg.cell, 4)
    dirs = 2 if cfg.bidirectional else 1
    total, width = 0, cfg.embedding
    for _ in range(min(cfg.layers, 1 << 20)):  # no loop of a billion steps to say no
        total += dirs * gates * cfg.hidden * (width + cfg.hidden + 1)
        width = dirs * cfg.hidden
    return total * max(cfg.layers // (1 << 20), 1)


def check_size(cfg: TrainConfig, limit: int | None) -> None:
    """Refuse at once a model too large to build in reasonable time and memory
    (``--layers 1000000`` would otherwise spend minutes allocating before failing)."""
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
        if dest in EXTRA_OPTIONS:
            key, tasks = EXTRA_OPTIONS[dest]
            if cfg.task in tasks:
                values[dest] = cfg.extra.get(key)
        elif dest == "no_clip":
            values[dest] = cfg.clip_norm is None
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
    if args.config is not None:
        from rnnkit.app.cli.config_file import apply_config_file

        given = set(explicit) if explicit is not None else set()
        origins = apply_config_file(parser, args, given, args.config)
        for dest, (key, _) in EXTRA_OPTIONS.items():  # the tasks name them by these keys
            if dest in origins:
                origins[key] = origins[dest]
        if explicit is not None:  # options from the file are given, as if typed
            args.explicit = explicit | {k for k in origins if not k.startswith("--")}
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
        sys.stdout.write(print_config_text(cfg, args, parser, unset))
        return 0
    if messages.LOGGER.isEnabledFor(logging.DEBUG):
        text = print_config_text(cfg, args, parser).rstrip()
        messages.debug("the effective configuration (--print-config):\n" + text)
    if cfg.tensorboard is not None:  # a missing package is said before anything is trained
        from rnnkit.training.tensorboard import require_tensorboard

        require_tensorboard()
        if os.path.exists(cfg.tensorboard) and not os.path.isdir(cfg.tensorboard):
            raise ConfigError(f"--tensorboard {cfg.tensorboard}: exists and is not a directory")
    from rnnkit.app.tasks.registry import task_module  # lazy: keeps `rnnkit --help` fast

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
        summary["report"] = _write_report(cfg.out)
    if args.json:
        from rnnkit.training.checkpoint import dumps_strict

        print(dumps_strict(summary))  # a diverged loss is null, never the non-JSON NaN
    else:
        _print_summary(summary)
    behind = summary.get("behind_baseline")
    if behind:  # on stderr, so that --json's stdout stays one JSON object
        sys.stdout.flush()
        messages.warning(behind["line"], label="")  # "behind baseline: …" names itself
    return 0
