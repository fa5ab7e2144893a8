"""The run report: one self-contained HTML file with a run's numbers and pictures.

``write_report(run_dir)`` reads a run directory written by ``rnnkit train`` —
``config.json``, ``summary.json``, ``metrics.jsonl`` and the model — and writes
``run_dir/report.html`` atomically. Everything is inside the file: the pictures are PNG
``data:`` URIs, the style sheet is inline, there is no script, and a Content-Security-Policy
forbids loading anything else, so the page looks the same offline, mailed or archived.

Sections: metrics (validation loss, bits per character and perplexity next to the n-gram
baseline or the task's own baselines, and one line when the model is behind its best
baseline, with the likely cause and what to try), training (loss curves, gradient norm
and clipping, vanishing/exploding signals), samples, gradient flow through time
(‖∂L/∂h_k‖, ‖∂h_t/∂h_k‖₂ against the bound (γλ)^{t−k}, per-step and per-lag
contributions to ∂L/∂W_hh, gate saturation), what the model predicts (next-symbol
distribution and hidden states along a text), attention (seq2seq), anomaly detection
(events and params) and the configuration. The gradient flow is drawn for language
models, classifiers, taggers, regressors, event models and encoder–decoders, the
attention maps for seq2seq runs with attention.

This module assembles the page and writes the sections every run has (metrics,
training, configuration); a task's own sections are in :mod:`rnnkit.app.report.lm`,
:mod:`rnnkit.app.report.sequences` (classify, tag, regress, events, seq2seq; the
gradient-flow section itself in :mod:`rnnkit.app.report.flow`),
:mod:`rnnkit.app.report.attention` and :mod:`rnnkit.app.report.detection` (a ``params``
run's metrics and training, read from its keys' runs, in :mod:`rnnkit.app.report.keys`),
the HTML pieces in :mod:`rnnkit.app.report.html` and the reading of the run directory in
:mod:`rnnkit.app.report.run`. Nothing is printed.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rnnkit.app.report.attention import attention_sections
from rnnkit.app.report.html import CSP, STYLE, esc, fmt, image, note, section, table
from rnnkit.app.report.lm import lm_sections
from rnnkit.app.report.run import Run, last_step, read_run
from rnnkit.app.report.sequences import SEQUENCE_TASKS, sequence_sections
from rnnkit.app.tasks.run_dir import written_report
from rnnkit.data.files import check_replaceable
from rnnkit.diagnostics import plots
from rnnkit.training.baseline_check import LABELS, compare
from rnnkit.training.checkpoint import atomic_write_bytes
from rnnkit.training.run_log import counted
from rnnkit.training.trajectory import SMOOTH_RECORDS

__all__ = ["REPORT_NAME", "render_report", "write_report"]

REPORT_NAME = "report.html"
LN2 = math.log(2)


# ---- metrics and training -------------------------------------------------------------
METRIC_NAMES = {
    "loss_nats": "loss (nats per token)",
    "bits_per_char": "bits per character",
    "perplexity": "perplexity",
    "tokens": "tokens scored",
}


def _metric_names(counts: str) -> dict[str, str]:
    """:data:`METRIC_NAMES` in the unit the task's loss counts (``counted``): a classifier's
    loss is nats per example, its "tokens" the examples scored."""
    if counts == "tokens":
        return METRIC_NAMES
    one = counts.removesuffix("s")
    # a regressor's figure in nats is a Gaussian's negative log-likelihood (of unit
    # variance for --loss mse: ½(mse + ln 2π)), beside its own loss
    nats = "Gaussian NLL (nats per value)" if counts == "values" else f"loss (nats per {one})"
    return {**METRIC_NAMES, "loss_nats": nats, "tokens": f"{counts} scored"}


def metrics_section(run: Run) -> tuple[str, str, str]:
    counts = counted(run.summary.get("task", run.cfg.task))
    names = _metric_names(counts)
    evaluations = run.of("valid")
    last = evaluations[-1] if evaluations else {}
    # The saved weights are the best evaluation: the summary says which, else the log.
    valid = run.summary.get("valid") or next(
        (e for e in reversed(evaluations) if e.get("best")), last
    )
    ngram = run.summary.get("ngram") or {}
    columns: list[tuple[str, dict[str, Any]]] = []
    if valid:
        at = f", step {valid['step']}" if "step" in valid else ""
        columns.append((f"model (best{at})", valid))
    if last and last.get("step") != valid.get("step"):
        columns.append((f"model (last evaluation, step {last.get('step')})", last))
    if ngram:
        columns.append((f"{ngram.get('order', 'n')}-gram Kneser–Ney baseline", ngram))
    baselines = run.summary.get("baselines") or {}
    for name, figures in baselines.items():
        columns.append((f"baseline: {figures.get('kind', name)}", figures))
    keys = [k for k in names if any(k in c for _, c in columns)]
    if counts != "tokens" and any(counts in c for _, c in columns):
        keys.remove("tokens")  # the same count, under its own name below
    keys += sorted(
        k
        for _, c in columns
        for k, v in c.items()
        if k not in names
        # the learning rate an evaluation's event records is training's, not a figure
        # of the model (it showed for some runs, a dash under the summary's best)
        and k not in ("step", "epoch", "best", "event", "order", "lr")
        # a baseline's figure the model's evaluation carries: its own column shows it
        and not (k.startswith("baseline_") and (baselines or ngram))
        and isinstance(v, (int, float))
        and not isinstance(v, bool)
    )
    keys = list(dict.fromkeys(keys))
    if not columns:
        return section("metrics", "Metrics", note("No validation metrics were recorded."))
    rows = [[names.get(k, k), *(c.get(k) for _, c in columns)] for k in keys]
    body = table(rows, ["metric", *(name for name, _ in columns)])
    if valid and ngram and "loss_nats" in valid and "loss_nats" in ngram:
        diff = ngram["loss_nats"] - valid["loss_nats"]
        unit, value = (
            ("bits per character", diff / LN2)
            if "bits_per_char" in valid
            else ("nats per token", diff)
        )
        better = "better" if diff > 0 else "worse"
        body += (
            f"<p>The recurrent model is <b>{abs(value):.3f} {unit} {better}</b> than the "
            f"n-gram baseline on the same validation tokens "
            f"(perplexity {fmt(valid.get('perplexity'))} vs {fmt(ngram.get('perplexity'))}).</p>"
        )
    body += _baseline_verdict(run)
    return section("metrics", "Metrics", body)


def _baseline_verdict(run: Run) -> str:
    """One paragraph: the model behind its best baseline (the summary's line: likely cause
    and what to try), or ahead of it on the task's headline metric."""
    behind = run.summary.get("behind_baseline")
    if behind:
        line = f'<p class="warn"><b>{esc(behind["line"])}</b></p>'
        if "training loss" in str(behind.get("cause", "")):
            # three training losses are on the page: say which one this line quotes
            line += note(
                f"The training losses in this line are smoothed: each is the mean of the "
                f"{SMOOTH_RECORDS} logged training records nearest its step (at the end, "
                "the last ones), as the training table's smoothed row."
            )
        return line
    found = compare(run.summary, run.cfg.task)
    if found is None or run.cfg.task in ("lm", "events"):  # said above, in loss units
        return ""
    label = LABELS.get(found["metric"], found["metric"])
    return (
        f"<p>The recurrent model is not behind its best baseline on validation {esc(label)}: "
        f"{fmt(found['model'])} vs {fmt(found['baseline'])} for the {esc(found['kind'])}.</p>"
    )


#: Logged gradient norms whose median is read for the signals: one step's norm moves
#: tenfold from batch to batch where a few easy examples make a batch (a classifier's).
SIGNAL_MEDIAN = 5


def _running_median(values: list[float]) -> list[float]:
    """The median of each value and the :data:`SIGNAL_MEDIAN` − 1 before it."""
    return [
        float(np.median(values[max(0, i + 1 - SIGNAL_MEDIAN) : i + 1])) for i in range(len(values))
    ]


def _points(n: int) -> str:
    return f"{n} logged point{'' if n == 1 else 's'}"


def _times(ratio: float) -> str:
    """A ratio in words: ``"22,157 times"``, ``"3.5 times"``."""
    return f"{ratio:,.0f} times" if ratio >= 100 else f"{ratio:.3g} times"


def _signal_line(ev: Any, monitor: Any) -> str:
    """One signal in the words of the report: its window counts logged points."""
    if ev.kind == "nonfinite" or ev.grad_norm is None or ev.reference_norm is None:
        return str(ev.message)
    change = "fell" if ev.kind == "vanishing" else "rose"
    return (
        f"step {ev.step}: the median gradient norm {change} to {ev.grad_norm:.3g} from "
        f"{ev.reference_norm:.3g} within {_points(monitor.window)} (factor "
        f"{monitor.factor:g}): {ev.kind} gradients"
    )


def _gradient_signals(
    clip_norm: float | None,
    steps: list[Any],
    norms: list[float],
    losses: list[float] | None = None,
) -> str:
    """Vanishing / exploding signals over the logged norms (the training monitor's rule),
    read on the running median of :data:`SIGNAL_MEDIAN` logged norms: a trend, not one
    batch's norm (a healthy classifier's logged norms moved between 0.095 and 2.15 and
    drew ten alarms).

    Moves of a model near its minimum are not counted (each was a false alarm on a
    healthy run whose training loss went to ~0.003): a fall of the norm that the training
    loss ``losses`` (the same logged steps, running medians) matches, ``(n_ref / n) /
    (ℓ_ref / ℓ) < factor`` — a cross-entropy's gradient shrinks with its loss, so that is
    convergence; a fall of a model that fits the training data: its loss two decades
    (``factor²``) or more below the first whole window's, ``ℓ₀ / ℓ ≥ factor²``, and the
    norm's fall since then matched by it, ``(n₀ / n) / (ℓ₀ / ℓ) < factor`` — near a perfect
    fit a cross-entropy's gradient is about proportional to its loss (−ln p ≈ 1 − p), and
    the few examples left to fit make the norm move tenfold from one window to the next
    (a tagger at 1e-4 nats whose norm fell to 0.0004 from 0.011 while its loss only
    halved); and a rise that stays at or below the largest
    norm of the first ``window`` logged steps — the untrained model's scale, which an
    exploding gradient passes.
    """
    from rnnkit.diagnostics import GradientMonitor

    # medians of whole windows only: the first few points' "median" is one batch's norm
    # (a relu network's first logged norm, 7.71 against 0.5 after, read as vanishing)
    first = SIGNAL_MEDIAN - 1
    medians = _running_median(norms)[first:]
    steps = list(steps)[first:]
    if len(medians) < 2:  # fewer than two whole windows: no trend to read
        return ""
    monitor = GradientMonitor(clip_norm=clip_norm, window=max(1, min(20, len(medians) - 1)))
    for step, norm in zip(steps, medians, strict=True):
        monitor.record([], pre_clip_norm=norm, step=int(step))
    loss_medians = _running_median(losses)[first:] if losses and len(losses) == len(norms) else None
    start_scale = max(medians[: monitor.window], default=0.0)
    at = {int(step): i for i, step in enumerate(steps)}
    kept, converging, below_start = [], 0, 0
    fitted: list[int] = []  # where a fitted model's norm fell with its loss
    for ev in monitor.events:
        i = at[ev.step]
        if ev.kind == "vanishing" and loss_medians is not None:
            window = range(max(0, i - monitor.window), i)
            ref = max(window, key=lambda k: medians[k])  # where the reference norm was
            if loss_medians[ref] > 0 and loss_medians[i] > 0 and medians[i] > 0:
                fall = (medians[ref] / medians[i]) / (loss_medians[ref] / loss_medians[i])
                if fall < monitor.factor:
                    converging += 1
                    continue
                # the window's reference can be one noisy window of a fitted model: its
                # course since the first whole window tells (the loss factor² down, and
                # the norm down no more than the factor beyond it)
                loss_fall = loss_medians[0] / loss_medians[i]
                if loss_fall >= monitor.factor**2 and medians[0] / medians[i] / loss_fall < (
                    monitor.factor
                ):
                    fitted.append(i)
                    continue
        if ev.kind == "exploding" and ev.grad_norm is not None and ev.grad_norm <= start_scale:
            below_start += 1
            continue
        kept.append(ev)
    left_out = []
    if converging:
        left_out.append(f"{converging} fall(s) that the training loss matched (convergence)")
    if fitted and loss_medians is not None:
        i = fitted[-1]
        left_out.append(
            f"{len(fitted)} fall(s) of a model that fits the training data: gradients shrink "
            f"with the loss (at step {steps[i]} the median training loss was "
            f"{loss_medians[i]:.3g}, {_times(loss_medians[0] / loss_medians[i])} below its "
            f"{loss_medians[0]:.3g} at step {steps[0]}, and the median gradient norm "
            f"{medians[i]:.3g}, {_times(medians[0] / medians[i])} below its {medians[0]:.3g})"
        )
    if below_start:
        left_out.append(
            f"{below_start} rise(s) that stayed below the norms of the first "
            f"{_points(monitor.window)} ({start_scale:.3g})"
        )
    aside = "; ".join(left_out)
    if kept:
        items = "".join(f"<li>{esc(_signal_line(ev, monitor))}</li>" for ev in kept[:10])
        return (
            f'<p class="warn">Gradient signals (the median of {SIGNAL_MEDIAN} consecutive '
            f"logged norms):</p><ul>{items}</ul>"
            + (note(f"Not counted, a converging model's moves: {aside}.") if aside else "")
        )
    if aside:
        return note(
            f"No vanishing or exploding signal: the median of {SIGNAL_MEDIAN} consecutive "
            f"logged gradient norms moved by a factor of {monitor.factor:g} within "
            f"{_points(monitor.window)} only as a converging model's does: {aside}."
        )
    if len(medians) > 1:
        return note(
            f"No vanishing or exploding signal: the median of {SIGNAL_MEDIAN} consecutive "
            f"logged gradient norms never moved by a factor of {monitor.factor:g} within "
            f"{_points(monitor.window)}."
        )
    return ""


def _stopped_by(run: Run, final_step: int | None) -> str:
    """Why training ended: the summary's own words; without a summary, from the events
    (a run stopped by Ctrl-C or SIGTERM writes none until it is resumed to its end)."""
    said = run.summary.get("stopped")
    if isinstance(said, str) and said:
        return said
    # the last event of training (a --resume that failed before its first step logged
    # only its mark)
    last: dict[str, Any] = next(
        (e for e in reversed(run.events) if e.get("event") != "resumed"), {}
    )
    if last.get("event") == "interrupted":
        return f"a signal (Ctrl-C or SIGTERM) after step {last.get('step')}; --resume goes on"
    if run.of("early_stop"):
        return "early stop (patience)"
    if run.of("time_limit"):
        return "time limit (--max-time)"
    return (
        f"not finished: no summary.json (still training, or killed after step {final_step})"
        if not run.summary
        else "all steps done"
    )


def _norms_text(norms: list[float]) -> str:
    """The logged gradient norms as the training tables give them: median / max / last."""
    return f"{np.median(norms):.4g} / {max(norms):.4g} / {norms[-1]:.4g}"


def _final_losses(s: dict[str, Any], train: list[dict[str, Any]], per: str) -> list[list[Any]]:
    """The training table's rows of the loss at the end, each named by where it is read,
    so that it can be checked against the run's files: summary.json's ``train_loss_nats``
    (the mean over the steps since the log's last training record: that record's loss
    when the run ended on a logged step, else steps metrics.csv does not hold), the log's
    last training record, and the smoothed loss the behind-baseline line quotes (the
    mean of the last records)."""
    steps, value = s.get("steps"), s.get("train_loss_nats")
    records = [e for e in train if isinstance(e.get("loss_nats"), (int, float))]
    last = records[-1] if records else None
    if last is None or not isinstance(steps, int) or not isinstance(value, (int, float)):
        label = f"final training loss ({per})"
    elif last["step"] >= steps:
        label = (
            f"final training loss, the log's last training record (metrics.csv, step "
            f"{last['step']:,}: the mean since the record before) ({per})"
        )
    else:
        first = last["step"] + 1
        after = (
            f"step {steps:,} alone"
            if first == steps
            else f"the mean over steps {first:,}–{steps:,}"
        )
        label = (
            f"final training loss, {after} (summary.json; after the log's last training "
            f"record, step {last['step']:,}) ({per})"
        )
    rows: list[list[Any]] = [[label, value]]
    if last is not None and (not isinstance(steps, int) or last["step"] < steps):
        rows.append(
            [
                f"training loss of the log's last record (metrics.csv, step {last['step']:,}: "
                f"the mean since the record before) ({per})",
                last["loss_nats"],
            ]
        )
    course = s.get("trajectory")
    end = course.get("train_loss_end") if isinstance(course, dict) else None
    if isinstance(end, (int, float)) and last is not None:
        n = min(SMOOTH_RECORDS, len(records))
        rows.append(
            [
                f"smoothed training loss at the end: the mean of the log's last {n} training "
                f"records (steps {records[-n]['step']:,}–{last['step']:,}) ({per})",
                end,
            ]
        )
    return rows


def training_section(run: Run) -> tuple[str, str, str]:
    cfg, s = run.cfg, run.summary
    train = [e for e in run.of("train") if "step" in e]
    logged = [e for e in train if isinstance(e.get("grad_norm"), (int, float))]
    norm_steps = [e["step"] for e in logged]
    norms = [float(e["grad_norm"]) for e in logged]
    # the training loss at the same steps, when every one has it (the signals read it)
    losses = [float(v) for e in logged if isinstance(v := e.get("loss_nats"), (int, float))]
    norm_losses = losses if len(losses) == len(logged) else None
    # without a summary (a run stopped by Ctrl-C, or still training): the last step any
    # event names (an interrupted run's last record can be steps before its stop)
    last = last_step(run.events)
    steps = s.get("steps", last)
    resumed = s.get("resumed_at")
    since = ""
    if isinstance(resumed, int) and isinstance(steps, int) and steps > resumed:
        since = f", the {steps - resumed:,} steps since the resume at step {resumed:,}"
    clipped = s.get("clipped_steps", train[-1].get("clipped_total") if train else None)
    # what the loss counts: a classifier's examples, a regressor's values (mse or nats)
    counts = counted(s.get("task", cfg.task))
    per = "per value" if counts == "values" else f"nats per {counts.removesuffix('s')}"
    rows: list[list[Any]] = [
        ["optimizer steps", steps],
        ["epochs completed", s.get("epoch")],
        [f"training time (s){since}", s.get("elapsed_s")],
        [f"training {counts} per second{since}", s.get("tokens_per_s")],
        ["parameters", s.get("parameters")],
        *_final_losses(s, train, per),
        ["gradient clipping threshold κ", cfg.clip_norm if cfg.clip_norm is not None else "off"],
    ]
    if isinstance(clipped, int) and isinstance(steps, int) and steps > 0:
        rows.append(["steps clipped", f"{clipped:,} of {steps:,} ({100 * clipped / steps:.1f} %)"])
    if norms:
        rows.append(["gradient norm at logged steps (median / max / last)", _norms_text(norms)])
    rows.append(["stopped by", _stopped_by(run, last)])
    if run.of("skipped"):
        rows.append(["steps skipped (non-finite loss or gradient)", len(run.of("skipped"))])
    body = table(rows) + _gradient_signals(cfg.clip_norm, norm_steps, norms, norm_losses)
    if run.bad_lines:
        body += note(f"{run.bad_lines} unreadable line(s) of metrics.jsonl were skipped.")
    char = cfg.task == "lm" and cfg.unit == "char"
    baseline = (s.get("ngram") or {}).get("loss_nats")
    # a regressor's training records hold its own loss (the mse for --loss mse) under
    # "loss_nats", its evaluations the same under "loss" and a Gaussian NLL under
    # "loss_nats": the curves compare the same loss
    scored = "loss" if counts == "values" else "loss_nats"
    valid = [e for e in run.of("valid") if "step" in e and isinstance(e.get(scored), (int, float))]
    fig = plots.plot_losses(
        [e["step"] for e in train if "loss_nats" in e and e["loss_nats"] is not None],
        [e["loss_nats"] for e in train if "loss_nats" in e and e["loss_nats"] is not None],
        [e["step"] for e in valid],
        [e[scored] for e in valid],
        bits_per_char=char,
        baseline=baseline,
        ylabel=f"loss ({per})",
    )
    body += image(
        fig,
        "training and validation loss against the step",
        "Training loss (mean since the previous logged step) and validation loss"
        + (" per value" if counts == "values" else f" in {per}")
        + (", right axis in bits per character" if char else "")
        + ("; dashed: the n-gram baseline's validation loss." if baseline else "."),
    )
    if norms:
        fig = plots.plot_grad_norms(norm_steps, norms, clip_norm=cfg.clip_norm)
        body += image(
            fig,
            "gradient norm during training",
            "Global gradient norm before clipping at the logged steps (log scale)"
            + ("; dashed: the clipping threshold κ." if cfg.clip_norm is not None else "."),
        )
    else:
        body += note("No gradient norm was logged (the run logs one every 50 steps).")
    return section("training", "Training", body)


def config_section(run: Run) -> tuple[str, str, str]:
    # the options this task and cell read, as `rnnkit train --print-config` lists them (a
    # classifier's page listed the attention, the beam and the BPTT of other tasks)
    rows = [
        [key, json.dumps(value)]
        for key, value in sorted(run.cfg.to_dict().items())
        if run.cfg.applies(key)
    ]
    extra = [
        [k, json.dumps(v)]
        for k, v in sorted(run.info.items())
        if k not in ("config", "format_version")
    ]
    return section("config", "Configuration", table(rows + extra, ["option", "value"]))


# ---- the page ---------------------------------------------------------------------------
@contextmanager
def single_thread() -> Iterator[None]:
    """One intra-op thread while diagnostics run: they are many tiny ops, and on a busy
    machine OpenMP spin-waiting makes them ten times slower. Restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def render_report(run_dir: str | Path, device: str = "cpu") -> str:
    """The report of a run directory as HTML text (self-contained, no network needed).

    Args:
        run_dir: a directory written by ``rnnkit train``.

    Raises:
        CheckpointError: no such directory, or no readable ``config.json``.
    """
    run = read_run(run_dir)
    run.device = device
    if run.cfg.task == "params":
        # the run directory logs no step: each key's run (keys/NNN) holds the training
        from rnnkit.app.report.keys import (
            key_runs,
            params_metrics_section,
            params_training_section,
        )

        keys = key_runs(run)
        parts = [params_metrics_section(run, keys), params_training_section(run, keys)]
    else:
        parts = [metrics_section(run), training_section(run)]
    with single_thread():
        if run.cfg.task == "lm":
            parts += lm_sections(run)
        elif run.cfg.task == "seq2seq":
            parts += attention_sections(run)
        elif run.cfg.task == "events":
            from rnnkit.app.report.detection import detection_sections

            parts += detection_sections(run)
        elif run.cfg.task == "params":
            from rnnkit.app.report.detection import params_sections

            parts += params_sections(run)
        if run.cfg.task in SEQUENCE_TASKS:
            parts += sequence_sections(run)
    parts.append(config_section(run))
    nav = " ".join(f'<a href="#{a}">{esc(t)}</a>' for a, t, _ in parts)
    cfg = run.cfg
    title = f"rnnkit report: {run.path.name or run.path}"
    what = f"{cfg.task} · {cfg.cell.upper()} · {cfg.layers} layer(s) × {cfg.hidden} units"
    if cfg.task == "lm":
        what += f" · {cfg.unit}-level"
        what += " · Jordan wiring" if cfg.wiring == "jordan" else ""
    from rnnkit import __version__

    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    notes = "".join(note(n) for n in run.notes)
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{esc(title)}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n"
        f'<header><h1>{esc(title)}</h1>\n<p class="meta">{esc(what)}<br>'
        f"run directory {esc(run.path)} · written {esc(stamp)} by rnnkit {esc(__version__)}, "
        f"torch {esc(torch.__version__)}</p>\n<nav>{nav}</nav></header>\n{notes}\n"
        + "\n".join(body for _, _, body in parts)
        + "\n</body>\n</html>\n"
    )


def write_report(run_dir: str | Path, out: str | Path | None = None, device: str = "cpu") -> Path:
    """Write the self-contained HTML report of a run; returns its path.

    Args:
        run_dir: a directory written by ``rnnkit train``.
        out: where to write (default ``run_dir/report.html``; a directory gets a
            ``report.html`` inside). Written atomically: a reader never sees half a report.
            An existing file is replaced only if it is a report written by rnnkit (else a
            ``WriteError``: a data file given by mistake is never lost).
        device: where the run's model computes the report's figures (``"cpu"``,
            ``"cuda"``, ``"auto"``).

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     write_report(d)
    Traceback (most recent call last):
    ...
    rnnkit.errors.CheckpointError: ...config.json: missing: ... is not a run directory ...
    """
    path = Path(run_dir) / REPORT_NAME if out is None else Path(out)
    if path.is_dir():
        path = path / REPORT_NAME
    check_replaceable(path, written_report, "a report written by rnnkit")
    text = render_report(run_dir, device)
    # a path that is not UTF-8 (a file name of other bytes, read as lone surrogates) is
    # shown with a replacement character rather than failing the page
    atomic_write_bytes(path, text.encode("utf-8", errors="replace"))
    return path
