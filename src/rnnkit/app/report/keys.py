"""The metrics and training sections of a ``params`` run, read from its keys' runs.

A ``params`` run trains one ``regress`` run per log key, each in its own directory
(``keys/000``, ``keys/001``, … in the order of ``keys.json``: most vectors first). The run
directory itself logs no step and no evaluation — its ``summary.json`` holds the
thresholds' figures — so the sections every run has read each key's run instead: its
``summary.json`` (steps, epochs, why it stopped, the validation MSE next to the
persistence baseline) and its log (``metrics.jsonl``, the events of ``metrics.csv``: loss
curves and gradient norms). A key is named by its directory, beside its log key.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from rnnkit.app.report.html import esc, image, note, section, table
from rnnkit.app.report.run import Run, last_step, read_run
from rnnkit.data.files import read_run_file
from rnnkit.data.limits import loads_json
from rnnkit.errors import RnnkitError

__all__ = ["KeyRun", "key_runs", "params_metrics_section", "params_training_section"]

#: Keys drawn in the loss and gradient-norm figures (the first, most vectors first): more
#: lines than colours are a tangle; the tables list every key.
DRAWN_KEYS = 10


@dataclass
class KeyRun:
    """One key's ``regress`` run: its directory's name (``keys/000``), its log key, and
    what the report reads of it."""

    name: str
    key: str
    run: Run


def key_runs(run: Run) -> list[KeyRun]:
    """The keys' runs of a ``params`` run, in the order of ``keys.json``; what cannot be
    read becomes a note of the page (never a traceback)."""
    path = run.path / "keys.json"
    if not path.is_file():
        run.notes.append(f"The keys' runs are not shown: {path} is missing.")
        return []
    try:
        # loads_json: a file nested thousands deep is a DataError, not a RecursionError
        entries = loads_json(read_run_file(path), path)["keys"]
        if not isinstance(entries, list):
            raise ValueError(f"{path}: keys is not a list")
    except (RnnkitError, OSError, ValueError, KeyError, TypeError) as exc:
        run.notes.append(f"The keys' runs are not shown: {exc}")
        return []
    found: list[KeyRun] = []
    for entry in entries:
        where = entry.get("dir") if isinstance(entry, dict) else None
        # a directory outside the run (absolute, or up with ..) is not one of its keys
        if not isinstance(where, str) or Path(where).is_absolute() or ".." in Path(where).parts:
            run.notes.append(f"{path}: a key without a run directory inside the run is skipped.")
            continue
        try:
            sub = read_run(run.path / where)
        except (RnnkitError, OSError, ValueError) as exc:
            run.notes.append(f"The run of {where} is not shown: {exc}")
            continue
        found.append(KeyRun(Path(where).as_posix(), str(entry.get("key", "")), sub))
    return found


def _number(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return float(value) if ok else None


def _best(k: KeyRun) -> dict[str, Any]:
    """The key's best evaluation (its saved weights): the summary's, else the log's."""
    evaluations = k.run.of("valid")
    said = k.run.summary.get("valid")
    if isinstance(said, dict) and said:
        return said
    return next((e for e in reversed(evaluations) if e.get("best")), {})


def _persistence(k: KeyRun) -> float | None:
    baselines = k.run.summary.get("baselines")
    figures = baselines.get("persistence") if isinstance(baselines, dict) else None
    return _number(figures.get("mse")) if isinstance(figures, dict) else None


def params_metrics_section(run: Run, keys: list[KeyRun]) -> tuple[str, str, str]:
    """Each key's validation MSE (its best evaluation) next to its persistence baseline,
    and which keys end behind it (each key's summary's line)."""
    if not keys:
        return section("metrics", "Metrics", note("No key's run could be read (keys/NNN)."))
    rows = []
    for k in keys:
        best = _best(k)
        mse, baseline = _number(best.get("mse")), _persistence(k)
        change = f"{mse / baseline - 1:+.1%}" if mse is not None and baseline else None
        rows.append(
            [
                k.name,
                k.key,
                best.get("step"),
                mse,
                baseline,
                change,
                _number(best.get("rmse")),
                _number(best.get("mae")),
                best.get("elements"),
            ]
        )
    header = ["key", "log key", "best step", "validation MSE", "persistence MSE"]
    header += ["MSE vs persistence", "RMSE", "MAE", "values scored"]
    body = (
        "<p>One recurrent regressor per log key, each its own run in its directory "
        f"(<code>{esc(keys[0].name)}</code> …): its best validation (the weights kept) on "
        "the key's normalised values, next to the persistence baseline (the last value "
        "seen) on the same values.</p>" + table(rows, header)
    )
    behind = [
        (k, line)
        for k in keys
        if isinstance(b := k.run.summary.get("behind_baseline"), dict)
        and isinstance(line := b.get("line"), str)
    ]
    for k, line in behind:
        body += f'<p class="warn"><b>{esc(k.name)} ({esc(k.key)}): {esc(line)}</b></p>'
    if not behind:
        body += "<p>No key's model is behind its persistence baseline on validation MSE.</p>"
    return section("metrics", "Metrics", body)


def params_training_section(run: Run, keys: list[KeyRun]) -> tuple[str, str, str]:
    """Each key's training (steps, epochs, why it stopped, time, loss, clipping, gradient
    norms and their signals), the loss curves and gradient norms of the keys in one
    figure each."""
    from rnnkit.app.report.page import _gradient_signals, _norms_text, _stopped_by

    s = run.summary
    clip = run.cfg.clip_norm
    overall: list[list[Any]] = [
        ["keys modelled", len(keys)],
        ["parameters (all keys)", s.get("parameters")],
        ["training time (s), all keys with validation and thresholds", s.get("elapsed_s")],
        ["gradient clipping threshold κ", clip if clip is not None else "off"],
    ]
    body = table(overall)
    if not keys:
        return section("training", "Training", body + note("No key's run could be read."))
    rows, signals = [], []
    for k in keys:
        sub, ks = k.run, k.run.summary
        logged = [
            e for e in sub.of("train") if "step" in e and _number(e.get("grad_norm")) is not None
        ]
        norms = [float(e["grad_norm"]) for e in logged]
        losses = [v for e in logged if (v := _number(e.get("loss_nats"))) is not None]
        steps = ks.get("steps", last_step(sub.events))
        clipped = ks.get("clipped_steps")
        rows.append(
            [
                k.name,
                steps,
                ks.get("epoch"),
                _stopped_by(sub, last_step(sub.events)),
                _number(ks.get("elapsed_s")),
                ks.get("parameters"),
                _number(ks.get("train_loss_nats")),
                f"{clipped:,} of {steps:,}"
                if isinstance(clipped, int) and isinstance(steps, int)
                else None,
                _norms_text(norms) if norms else None,
            ]
        )
        said = _gradient_signals(
            sub.cfg.clip_norm,
            [e["step"] for e in logged],
            norms,
            losses if len(losses) == len(norms) else None,
        )
        if 'class="warn"' in said:
            signals.append(f"<p><b>{esc(k.name)}</b> ({esc(k.key)}):</p>{said}")
    header = ["key", "optimizer steps", "epochs completed", "stopped by", "training time (s)"]
    header += ["parameters", "final training loss (MSE per value)", "steps clipped"]
    body += table(rows, [*header, "gradient norm at logged steps (median / max / last)"])
    body += "".join(signals) or note(
        "No key's logged gradient norms show a vanishing or exploding signal (the rule of "
        "a single run's report, on each key's log)."
    )
    body += _figures(keys)
    return section("training", "Training", body)


def _figures(keys: list[KeyRun]) -> str:
    """The keys' loss curves in one figure (a colour per key) and their gradient norms in
    another."""
    drawn = keys[:DRAWN_KEYS]
    losses = Figure(figsize=(7.5, 4.2), dpi=100, layout="constrained")
    ax = losses.add_subplot()
    ax.set_title("Training and validation MSE per key")
    norms = Figure(figsize=(7.5, 3.6), dpi=100, layout="constrained")
    bx = norms.add_subplot()
    bx.set_title("Gradient norm during training, per key")
    any_norm = False
    for i, k in enumerate(drawn):
        color = f"C{i}"
        train = [e for e in k.run.of("train") if _number(e.get("loss_nats")) is not None]
        # a regressor's evaluations hold its own loss (the MSE) under "loss"; "loss_nats"
        # is a Gaussian NLL
        valid = [e for e in k.run.of("valid") if _number(e.get("loss")) is not None]
        ax.plot(
            [e["step"] for e in train],
            [e["loss_nats"] for e in train],
            color=color,
            lw=1.2,
            label=k.name,
        )
        ax.plot(
            [e["step"] for e in valid],
            [e["loss"] for e in valid],
            color=color,
            lw=1.2,
            ls="--",
            marker="o",
            ms=3,
        )
        baseline = _persistence(k)
        if baseline is not None:
            ax.axhline(baseline, color=color, lw=1, ls=":")
        logged = [e for e in k.run.of("train") if (_number(e.get("grad_norm")) or 0) > 0]
        if logged:
            any_norm = True
            bx.plot(
                [e["step"] for e in logged],
                [e["grad_norm"] for e in logged],
                color=color,
                lw=1,
                label=k.name,
            )
    for a, ylabel in ((ax, "MSE per value (normalised values)"), (bx, "gradient norm")):
        a.set_xlabel("optimizer step (each key's own)")
        a.set_ylabel(ylabel)
        a.grid(True, alpha=0.3)
        a.legend(loc="upper right", fontsize=8)  # not "best": it scans every point
    more = (
        f" The first {len(drawn)} of {len(keys)} keys are drawn." if len(keys) > len(drawn) else ""
    )
    out = image(
        losses,
        "training and validation MSE of each key's model against the step",
        "One colour per key: training loss (solid; the mean since the previous logged step), "
        "validation MSE (dashed, dots) and the persistence baseline's validation MSE "
        "(dotted)." + more,
    )
    if any_norm:
        bx.set_yscale("log")
        out += image(
            norms,
            "gradient norm of each key's model during training",
            "Global gradient norm before clipping at the logged steps, one colour per key "
            "(log scale)." + more,
        )
    return out
