"""What ``rnnkit train`` prints at the end of a run (without ``--json``): the steps and
time, the validation figures beside the baselines', and for the anomaly-detection tasks
the thresholds and what validation shows of their false-positive rate."""

from __future__ import annotations

from typing import Any

from rnnkit.training.run_log import counted

__all__ = ["SHOWN_METRICS", "UNDEFINED", "print_summary", "ratio"]


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
        print(
            f"labelled validation sessions: AUC {ratio(m.get('auc'), 'auc')}, precision "
            f"{ratio(m.get('precision'), 'precision')}, recall {ratio(m.get('recall'), 'recall')}"
            f", F1 {ratio(m.get('f1'), 'f1')}"
        )


#: Why a detection ratio is undefined (None in ``summary.json``): its denominator is 0.
UNDEFINED = {
    "auc": "needs normal and anomalous sessions",
    "precision": "no session flagged",
    "recall": "no anomalous sessions",
    "f1": "no anomalous session, none flagged",
    "fpr": "no normal sessions",
}


def ratio(value: Any, key: str = "", width: int = 0) -> str:
    """A detection figure to 4 decimals; an undefined one (None) as ``n/a (why)``, or as
    ``—`` padded to ``width`` in a table (``width`` > 0), never as ``None`` or a 0 that
    reads as "none found".

    >>> ratio(0.5), ratio(None, "recall"), ratio(None, "recall", width=6) + "|"
    ('0.5000', 'n/a (no anomalous sessions)', '—     |')
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{value:.4f}"
    if width:
        return f"{'—':<{width}}"
    why = UNDEFINED.get(key)
    return f"n/a ({why})" if why else "—"


def _print_unknown_labels(valid: dict[str, Any]) -> None:
    """Validation labels (classes, tags) the model never saw cannot be scored and are left
    out of every figure: said here, not only in ``summary.json``, or a validation
    accuracy over half the file reads as one over all of it."""
    unknown = valid.get("unknown_labels")
    if not isinstance(unknown, int) or isinstance(unknown, bool) or unknown < 1:
        return
    counts = valid.get("unknown_label_counts")
    counts = counts if isinstance(counts, dict) else {}
    named = ", ".join(f"{label} ({n})" for label, n in list(counts.items())[:5])
    more = ", …" if len(counts) > 5 else ""
    print(
        f"validation: {unknown} label(s) not seen in training, left out of the figures"
        + (f": {named}{more}" if named else "")
    )


def print_summary(summary: dict[str, Any], resumed_at: int | None = None) -> None:
    """Print the end of a run; ``resumed_at``: the step a ``--resume`` continued from (the
    time and rate are this invocation's, the steps the run's)."""
    if summary.get("task") == "params":
        _print_params(summary)
        if summary.get("report"):
            print(f"report: {summary['report']}")
        return
    valid, ngram = summary.get("valid"), summary.get("ngram")
    steps = summary["steps"]
    done = f"{steps} step" + ("" if steps == 1 else "s")
    if resumed_at is not None and isinstance(steps, int) and steps > resumed_at:
        # "trained 600 steps in 1 s" read as the whole run's time: 31 of them were.
        done += f" ({steps - resumed_at} of them now, resumed at step {resumed_at})"
    processes = summary.get("processes", 1)
    if isinstance(processes, int) and processes > 1:  # torchrun: said once, by rank 0
        done += f" on {processes} processes"
    rate = summary.get("tokens_per_s")
    speed = ""
    if rate:
        # the rate of the training steps; the seconds before it include validation
        speed = f" ({rate:.0f} {counted(summary.get('task'))}/s, validation apart)"
    elif resumed_at is not None and resumed_at == steps:
        # resumed after its last step (stopped before it ended): it only validated and
        # wrote the run now; not "0 tokens/s"
        speed = " (no step trained now)"
    # (no rate, else: no training record was logged, a run stopped before its first)
    took = f"{summary['elapsed_s']:.0f} s{speed}"
    print(f"trained {done} in {took}, {summary['parameters']:,} parameters")
    if summary.get("stopped"):
        best = (valid or {}).get("step")
        print(f"stopped: {summary['stopped']}" + (f"; weights of step {best}" if best else ""))
    if valid and ("bits_per_char" in valid or "perplexity" in valid):
        key = "bits_per_char" if "bits_per_char" in valid else "perplexity"
        label = "bits/char" if key == "bits_per_char" else "perplexity"
        line = f"validation {label}: recurrent {valid[key]:.3f}"
        if ngram:
            line += f" | {ngram['order']}-gram baseline {ngram.get(key, float('nan')):.3f}"
        # A classifier's loss is one prediction per sequence ("examples"), not per token.
        per = "example" if "examples" in valid else "token"
        print(line + f"  (nats/{per} {valid['loss_nats']:.3f})")
    if valid:
        shown = [
            f"{k.replace('_', ' ')} {valid[k]:.4f}"
            for k in SHOWN_METRICS
            if isinstance(valid.get(k), (int, float))
        ]
        if shown:
            print("validation " + ", ".join(shown))
        _print_unknown_labels(valid)
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
    if summary.get("device", "cpu") != "cpu":  # on the CPU, the threads line says so
        print(f"device: {summary['device']}")
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
        auc, precision, recall, f1 = (
            ratio(m.get(k), width=6) for k in ("auc", "precision", "recall", "f1")
        )
        print(
            f"  {label:<10} {auc}  {precision}    {recall}  {f1}  "
            f"{m['tp']:<5} {m['fp']:<5} {m['fn']:<5} {m['tn']:<5}"
        )
