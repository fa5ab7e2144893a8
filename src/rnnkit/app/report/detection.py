"""The report's anomaly-detection sections: an ``events`` run's, and a ``params`` run's
(:func:`params_sections`).

Read from the run directory only (no model is run): ``thresholds.json``, the validation
sessions' scores in ``valid_scores.safetensors`` (normal ones, and the labelled anomalous
ones of ``--valid`` under ``anomalous/``) and ``summary.json``. It shows the thresholds and
what the validation sessions can show of the false-positive rate; with labelled anomalous
sessions, ROC and precision–recall curves with AUC, precision/recall/F1 and the confusion
counts at the thresholds for every score, histograms of normal against anomalous scores
with the threshold drawn, and the most surprising events of the highest-scoring sessions
— the recurrent model and the n-gram side by side throughout.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rnnkit.anomaly.scores import SCORES
from rnnkit.app.report.html import esc, fmt, image, note, section, table
from rnnkit.app.report.run import Run
from rnnkit.data.files import read_run_file
from rnnkit.data.limits import loads_json
from rnnkit.diagnostics import plots
from rnnkit.errors import CheckpointError, RnnkitError
from rnnkit.metrics.detection import detection_metrics, precision_recall_curve, roc_curve

__all__ = ["detection_sections", "params_sections"]

MODELS = (("rnn", "recurrent"), ("ngram", "n-gram"))


def _read(run: Run) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
    """The run's thresholds and validation scores, read and checked as ``rnnkit score``
    reads them; a file that is not what the run wrote becomes a note on the page (a
    truncated ``valid_scores.safetensors`` or a string threshold was a traceback)."""
    thresholds_path = run.path / "thresholds.json"
    scores_path = run.path / "valid_scores.safetensors"
    if not thresholds_path.is_file() or not scores_path.is_file():
        return None
    from rnnkit.app.tasks.events.thresholds import read_thresholds
    from rnnkit.training.checkpoint import load_arrays

    try:
        doc = read_thresholds(run.path)
        arrays = load_arrays(scores_path)
        name = doc["score"]
        for m, _ in MODELS:
            for key in (f"{m}/{name}", f"anomalous/{m}/{name}"):
                if key in arrays and not np.isfinite(np.asarray(arrays[key], float)).all():
                    raise CheckpointError(f"{scores_path}: {key} holds a value that is not finite")
        if "anomalous/rnn/" + name in arrays and "rnn/" + name not in arrays:
            raise CheckpointError(f"{scores_path}: rnn/{name} is missing")
    except (RnnkitError, OSError, ValueError) as exc:
        run.notes.append(f"The detection section is missing: {exc}")
        return None
    return doc, arrays


def _model_label(run: Run, model: str) -> str:
    if model == "ngram":
        return f"{run.summary.get('ngram', {}).get('order', run.cfg.ngram_order)}-gram"
    return f"{run.cfg.cell.upper()} {run.cfg.layers}×{run.cfg.hidden}"


def _thresholds_body(run: Run, doc: dict[str, Any]) -> str:
    name = doc["score"]
    rows = [
        ["score giving verdicts", name],
        ["target false-positive rate", doc["target_fpr"]],
        ["top-g (count score)", doc["top_g"]],
        ["history window", doc.get("window") or "whole session"],
        ["threshold method", doc.get("method", "quantile")],
        ["how it was found", doc.get("how", {}).get("rnn", {}).get(name, "empirical quantile")],
        ["normal validation sessions", doc.get("valid_sessions")],
    ]
    rows += [
        [f"threshold, {_model_label(run, m)}", doc[m].get(name)] for m, _ in MODELS if m in doc
    ]
    body = table(rows, ["", "value"])
    fpr = run.summary.get("validation_fpr")
    if fpr:
        lo, hi = fpr["interval95"]
        body += (
            f"<p>On the validation sessions <b>{fpr['false_positives']} of {fpr['sessions']}</b>"
            f" normal sessions score above the threshold: a false-positive rate between "
            f"<b>{lo:.2%} and {hi:.2%}</b> (95 % Clopper–Pearson interval). These sessions "
            f"can vouch for no rate below {fpr['resolvable']:.2%}.</p>"
        )
    if run.summary.get("note"):
        body += f'<p class="warn">{esc(run.summary["note"])}</p>'
    return body


def detection_sections(run: Run) -> list[tuple[str, str, str]]:
    """The detection section of an events run (empty when the run has no thresholds)."""
    found = _read(run)
    if found is None:
        return []
    doc, arrays = found
    name = doc["score"]
    body = _thresholds_body(run, doc)
    labelled = f"anomalous/rnn/{name}" in arrays
    panels: list[tuple[str, np.ndarray, Any, float]]
    if not labelled:
        panels = [
            (_model_label(run, m), arrays[f"{m}/{name}"], [], float(doc[m][name]))
            for m, _ in MODELS
            if f"{m}/{name}" in arrays
        ]
        body += image(
            plots.plot_score_histograms(panels, score=name),
            "score histograms of normal validation sessions",
            "Scores of the normal validation sessions with the threshold (dashed).",
        )
        body += note(
            "No labelled anomalous validation sessions: train with a --valid file holding "
            "sessions labelled 1 to see ROC and precision–recall curves, recall and F1."
        )
        return [section("detection", "Anomaly detection", body)]

    metrics, curves, panels = _labelled(run, doc, arrays)
    n_norm = arrays[f"rnn/{name}"].size
    n_anom = arrays[f"anomalous/rnn/{name}"].size
    body += (
        f"<p>Labelled validation sessions: {n_norm} normal, {n_anom} anomalous. Verdicts at "
        f"each score's own threshold (the run's score, <b>{esc(name)}</b>, in bold).</p>"
    )
    body += _metrics_table(run, metrics, name)
    body += image(
        plots.plot_detection_curves(curves),
        "ROC and precision-recall curves",
        f"ROC and precision–recall curves of the {name} score; the dots are the verdicts at "
        "the thresholds.",
    )
    body += image(
        plots.plot_score_histograms(panels, score=name),
        "score histograms, normal against anomalous",
        "Session scores of normal (blue) and anomalous (red) validation sessions; the "
        "dashed line is the threshold (above it: anomalous). Counts on a symmetric log scale.",
    )
    body += _worst_sessions(run, name)
    return [section("detection", "Anomaly detection", body)]


def _labelled(
    run: Run, doc: dict[str, Any], arrays: dict[str, np.ndarray]
) -> tuple[dict[str, dict[str, dict[str, Any]]], dict[str, dict[str, Any]], list[Any]]:
    """Per model, the verdict metrics of every score at its threshold on the labelled
    validation sessions, the curves of the run's score, and its histogram panels."""
    name = doc["score"]
    metrics: dict[str, dict[str, dict[str, Any]]] = {}
    curves: dict[str, dict[str, Any]] = {}
    panels = []
    for m, _ in MODELS:
        if f"anomalous/{m}/{name}" not in arrays:
            continue
        metrics[m] = {}
        for score in SCORES:
            normal, anomalous = arrays.get(f"{m}/{score}"), arrays.get(f"anomalous/{m}/{score}")
            if normal is None or anomalous is None or score not in doc[m]:
                continue
            labels = np.r_[np.zeros(normal.size), np.ones(anomalous.size)]
            metrics[m][score] = detection_metrics(np.r_[normal, anomalous], labels, doc[m][score])
        normal, anomalous = arrays[f"{m}/{name}"], arrays[f"anomalous/{m}/{name}"]
        labels = np.r_[np.zeros(normal.size), np.ones(anomalous.size)]
        curves[_model_label(run, m)] = _curves(np.r_[normal, anomalous], labels, metrics[m][name])
        panels.append((_model_label(run, m), normal, anomalous, float(doc[m][name])))
    return metrics, curves, panels


def _curves(scores: np.ndarray, labels: np.ndarray, at: dict[str, Any]) -> dict[str, Any]:
    """The ROC and precision–recall curves of ``scores``, with the verdicts ``at`` its
    threshold as the operating point."""
    fpr, tpr, _ = roc_curve(scores, labels)
    recall, precision, _ = precision_recall_curve(scores, labels)

    def coordinate(key: str) -> float:
        # None (nothing flagged has no precision) is NaN: a point matplotlib leaves out
        value = at.get(key)
        return float("nan") if value is None else float(value)

    return {
        "fpr": fpr,
        "tpr": tpr,
        "recall": recall,
        "precision": precision,
        "auc": at["auc"],
        "point": (coordinate("fpr"), coordinate("recall"), coordinate("precision")),
    }


def _metrics_table(run: Run, metrics: dict[str, dict[str, dict[str, Any]]], name: str) -> str:
    header = ["detector", "score", "AUC", "precision", "recall", "F1", "FPR"]
    header += ["TP", "FP", "FN", "TN", "threshold"]
    rows = []
    for m, _ in MODELS:
        for score, r in metrics.get(m, {}).items():
            label = f"<b>{esc(score)}</b>" if score == name else esc(score)
            rows.append(
                [
                    _model_label(run, m),
                    label,
                    *(r.get(k) for k in ("auc", "precision", "recall", "f1", "fpr")),
                    *(r[k] for k in ("tp", "fp", "fn", "tn", "threshold")),
                ]
            )
    return _raw_table(rows, header)


def _worst_sessions(run: Run, name: str) -> str:
    """The highest-scoring validation sessions with their most surprising events."""
    worst = run.summary.get("worst_sessions") or []
    if not worst:
        return ""
    rows = [
        [
            esc(str(w.get("session", ""))[:80]),  # runs of older versions kept no id
            "anomalous" if w["label"] else "normal",
            fmt(w["score"]),
            w["events"],
            "<br>".join(
                f"#{t['position']} {esc(t['event'])}: {t['surprise']:.2f} nats"
                + (" (miss)" if t.get("miss") else "")
                for t in w["top"]
            ),
        ]
        for w in worst
    ]
    head = "<h3>The highest-scoring validation sessions</h3>"
    # "#k": the event's position in the session counted from 0, as `rnnkit score` writes
    # it ("position"); the end of the session, </s>, is at the number of events
    header = [
        "session",
        "label",
        f"{name} score",
        "events",
        "most surprising events (#position, from 0)",
    ]
    return head + _raw_table(rows, header)


def _raw_table(rows: list[list[Any]], header: list[str]) -> str:
    """A table whose string cells are already HTML (numbers are formatted; None, an
    undefined figure such as the precision of no session flagged, is ``—``)."""
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    out = []
    for row in rows:
        cells = "".join(
            f'<td class="num">{fmt(c)}</td>'
            if c is None or isinstance(c, (int, float))
            else f"<td>{c}</td>"
            for c in row
        )
        out.append(f"<tr>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(out)}</tbody></table>"


def params_sections(run: Run) -> list[tuple[str, str, str]]:
    """The section of a ``params`` run: each key's model and error Gaussian, what the
    validation sessions show of the false-positive rate, the validation vectors' errors
    in standard deviations with the bound, and (with labelled anomalous validation
    sessions) the session scores, ROC and precision–recall curves."""
    found = _read_params(run)
    if found is None:
        return []
    keys, doc, arrays = found
    z = float(doc["z"])
    # The session threshold max(z, t); a run from before it had one: z alone.
    t = doc.get("session_score")
    limit = z if t is None else max(z, float(t))
    body = _keys_body(keys, doc, z, t, limit)
    fpr = run.summary.get("validation_fpr")
    if fpr:
        lo, hi = fpr["interval95"]
        body += (
            f"<p>On the validation sessions <b>{fpr['false_positives']} of {fpr['sessions']}"
            f"</b> normal sessions score above the session threshold: a false-positive rate "
            f"between <b>{lo:.2%} and {hi:.2%}</b> (95 % Clopper–Pearson; these sessions "
            "also chose the threshold, so the rate on new sessions is the one to trust). "
            "The per-vector bound alone would flag "
            f"<b>{int(np.sum(arrays.get('normal', np.zeros(0)) > z))}</b>: a session of many "
            "vectors has as many chances to cross it.</p>"
        )
    vz = arrays.get("valid_z", np.zeros(0))
    body += image(
        plots.plot_score_histograms(
            [("validation vectors", vz, [], z)],
            xlabel="prediction error in standard deviations of its key's, (e − μ) / σ",
            counted="vectors",
            # the dashed line is the per-vector bound; a session is flagged when one of
            # its vectors passes the session threshold, drawn too where it is higher
            threshold_label=f"per-vector bound z = {z:.4g}",
            lines=[(limit, f"session threshold {limit:.4g}")] if limit > z else (),
        ),
        "prediction errors of the validation vectors",
        "Each validation vector's error in standard deviations of its key's errors, "
        "(e − μ) / σ; the dashed line is the per-vector bound, the other the session "
        "threshold.",
    )
    body += _params_detection(arrays.get("normal", np.zeros(0)), arrays.get("anomalous"), limit)
    return [section("params", "Parameter values", body)]


def _read_params(run: Run) -> tuple[dict[str, Any], dict[str, Any], dict[str, np.ndarray]] | None:
    """``keys.json``, ``thresholds.json`` and the validation scores of a ``params`` run;
    None (and a note of the report) where they are missing or unreadable."""
    keys_path, thresholds_path = run.path / "keys.json", run.path / "thresholds.json"
    scores_path = run.path / "valid_scores.safetensors"
    if not (keys_path.is_file() and thresholds_path.is_file() and scores_path.is_file()):
        return None
    from rnnkit.training.checkpoint import load_arrays

    try:
        # loads_json: a file nested thousands deep is a DataError, not a RecursionError
        keys = loads_json(read_run_file(keys_path), keys_path)
        doc = loads_json(read_run_file(thresholds_path), thresholds_path)
        arrays = load_arrays(scores_path)
        float(doc["z"])
        if doc.get("session_score") is not None:
            float(doc["session_score"])
    except (RnnkitError, OSError, ValueError, KeyError, TypeError) as exc:
        run.notes.append(f"The parameter-value section is missing: {exc}")
        return None
    return keys, doc, arrays


def _keys_body(keys: dict[str, Any], doc: dict[str, Any], z: float, t: Any, limit: float) -> str:
    """What makes a vector and a session anomalous, and the table of the keys' models."""
    rows = [
        [
            esc(k["key"]),
            k["train_vectors"],
            k["valid_vectors"],
            f"{len(k['dims'])} of {k['width']}",
            k["error"]["mean"],
            k["error"]["std"],
            doc["bounds"].get(k["key"]),
        ]
        for k in keys.get("keys", [])
    ]
    body = (
        f"<p>One recurrent regressor per key; a vector is anomalous when its prediction "
        f"error is above the {doc['confidence']:g} confidence interval of its key's "
        f"validation errors (mean + {z:.4g} standard deviations). A session's score is "
        f"its largest error in standard deviations; it is anomalous above "
        f"<b>{limit:.4g}</b>"
        + (
            f", the score at most {doc['target_fpr']:g} of the normal validation sessions "
            f"exceed ({esc(str(doc.get('session_how', '')))}), and never below the "
            "per-vector bound.</p>"
            if t is not None and float(t) > z
            else ", the per-vector bound: a session is anomalous when any of its vectors is.</p>"
        )
    )
    header = ["key", "training vectors", "validation vectors", "values modelled"]
    body += _raw_table(rows, [*header, "error mean", "error std", "bound"])
    skipped = keys.get("skipped", [])
    if skipped:
        body += note(
            f"{len(skipped)} key(s) not modelled: "
            + "; ".join(f"{s['key'][:50]} ({s['reason']})" for s in skipped[:8])
        )
    return body


def _params_detection(normal: np.ndarray, anomalous: np.ndarray | None, limit: float) -> str:
    """With labelled anomalous validation sessions: the curves of the session score and
    the histograms of normal against anomalous sessions."""
    if anomalous is None or not anomalous.size or not normal.size:
        return ""
    labels = np.r_[np.zeros(normal.size), np.ones(anomalous.size)]
    # as the summary and `rnnkit evaluate` count them: +∞ (a value the model cannot
    # read) is the highest score there is, -∞ (nothing scored) the lowest
    scores = np.r_[normal, anomalous]
    at = detection_metrics(scores, labels, limit)
    body = image(
        plots.plot_detection_curves({"parameter values": _curves(scores, labels, at)}),
        "ROC and precision-recall curves of the parameter-value model",
        "Session score: the largest error z of its vectors; the dot is the verdict at "
        "the session threshold.",
    )
    panel = ("parameter values", normal[np.isfinite(normal)], anomalous[np.isfinite(anomalous)])
    body += image(
        plots.plot_score_histograms([(*panel, limit)], score="largest error z"),
        "session scores, normal against anomalous",
        "Session scores of normal (blue) and anomalous (red) validation sessions; the "
        "dashed line is the session threshold.",
    )
    off = {
        kind: int(np.count_nonzero(v == np.inf))
        for kind, v in (("normal", normal), ("anomalous", anomalous))
    }
    if any(off.values()):
        body += note(
            f"Off the histogram's scale: {off['anomalous']} anomalous and {off['normal']} "
            "normal session(s) scoring +∞ (a value the model cannot read, always above "
            "the threshold); the curves and metrics count them."
        )
    return body
