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
(events: :mod:`rnnkit.app.report.detection`) and the configuration. Model pictures are
drawn for language models and attention maps for seq2seq runs with attention; other
tasks get the numbers and curves.

The diagnostics run on a small batch of the run's own validation text (or training
text, or — when neither file can be read — text the model generates). Nothing is printed.
"""

from __future__ import annotations

import base64
import html
import json
import math
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from matplotlib.figure import Figure
from torch import Tensor

from rnnkit.app.config import TrainConfig
from rnnkit.app.tasks.run import load_config
from rnnkit.diagnostics import plots
from rnnkit.training.baseline_check import LABELS, compare
from rnnkit.training.checkpoint import atomic_write_bytes
from rnnkit.training.run_files import read_metrics, read_summary

__all__ = ["REPORT_NAME", "render_report", "write_report"]

REPORT_NAME = "report.html"
DPI = 100
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"
LN2 = math.log(2)

STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;
  margin:0 auto;max-width:1100px;padding:1rem 1.5rem 3rem;color:#1d1d1f;line-height:1.45}
h1{margin-bottom:.2rem}h2{border-bottom:2px solid #ddd;padding-bottom:.2rem;margin-top:2.2rem}
.meta{color:#666;font-size:.9rem}nav a{margin-right:1rem}
table{border-collapse:collapse;margin:.6rem 0 1rem;font-size:.92rem}
th,td{border:1px solid #ddd;padding:.25rem .6rem;text-align:left;vertical-align:top}
th{background:#f4f4f6}td.num{text-align:right;font-variant-numeric:tabular-nums}
figure{margin:1rem 0 1.6rem}figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{color:#555;font-size:.88rem;max-width:900px}
pre{background:#f7f7f9;border:1px solid #e4e4e8;padding:.6rem;white-space:pre-wrap;
  word-break:break-word;font-size:.85rem}
.note{color:#555;font-style:italic}.warn{color:#a33}
"""


# ---- reading the run directory --------------------------------------------------------
@dataclass
class Run:
    """What the report reads from a run directory."""

    path: Path
    cfg: TrainConfig
    info: dict[str, Any]
    summary: dict[str, Any]
    events: list[dict[str, Any]]
    bad_lines: int = 0
    notes: list[str] = field(default_factory=list)

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("event") == kind]


def read_run(run_dir: str | Path) -> Run:
    """Config (required), summary and logged events (optional) of a run directory."""
    path = Path(run_dir)
    cfg, info = load_config(path)
    # One set of rules for the logs (training.run_files): a tampered summary is one line;
    # a bad log line (cut by a crash, wrong types) is counted and shown, never fatal.
    summary = read_summary(path)
    events, bad = read_metrics(path)
    return Run(path, cfg, info, summary, events, bad)


# ---- HTML pieces ----------------------------------------------------------------------
def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def fmt(value: Any) -> str:
    """A number for a table: thousands separated, else 4 significant digits; text escaped.

    >>> fmt(12345.6), fmt(0.000123456), fmt(3), fmt(None)
    ('12,346', '0.0001235', '3', '—')
    """
    if isinstance(value, bool) or value is None:
        return esc("—" if value is None else value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if not math.isfinite(value):
            return esc(value)
        return f"{value:,.0f}" if abs(value) >= 1e4 else f"{value:.4g}"
    return esc(value)


def table(rows: Sequence[Sequence[Any]], header: Sequence[str] | None = None) -> str:
    """An HTML table; numbers right-aligned, everything escaped."""
    out = ["<table>"]
    if header:
        out.append("<tr>" + "".join(f"<th>{esc(h)}</th>" for h in header) + "</tr>")
    for row in rows:
        cells = []
        for i, value in enumerate(row):
            if i == 0:
                cells.append(f"<th>{esc(value)}</th>")
            else:
                numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
                cells.append(f"<td{' class=num' if numeric else ''}>{fmt(value)}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    return "\n".join(out) + "\n</table>"


def image(fig: Figure, alt: str, caption: str = "") -> str:
    """A figure as an embedded PNG (``data:`` URI) with its caption."""
    png = plots.to_png(fig, dpi=DPI)
    width, height = (round(v * DPI) for v in fig.get_size_inches())
    data = base64.b64encode(png).decode("ascii")
    cap = f"<figcaption>{esc(caption)}</figcaption>" if caption else ""
    return (
        f'<figure><img src="data:image/png;base64,{data}" alt="{esc(alt)}" '
        f'width="{width}" height="{height}">{cap}</figure>'
    )


def section(anchor: str, title: str, body: str) -> tuple[str, str, str]:
    return anchor, title, f'<section id="{anchor}"><h2>{esc(title)}</h2>\n{body}\n</section>'


def note(text: str) -> str:
    return f'<p class="note">{esc(text)}</p>'


# ---- metrics and training -------------------------------------------------------------
METRIC_NAMES = {
    "loss_nats": "loss (nats per token)",
    "bits_per_char": "bits per character",
    "perplexity": "perplexity",
    "tokens": "tokens scored",
}


def metrics_section(run: Run) -> tuple[str, str, str]:
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
    keys = [k for k in METRIC_NAMES if any(k in c for _, c in columns)]
    keys += sorted(
        k
        for _, c in columns
        for k, v in c.items()
        if k not in METRIC_NAMES
        and k not in ("step", "epoch", "best", "event", "order")
        and isinstance(v, (int, float))
        and not isinstance(v, bool)
    )
    keys = list(dict.fromkeys(keys))
    if not columns:
        return section("metrics", "Metrics", note("No validation metrics were recorded."))
    rows = [[METRIC_NAMES.get(k, k), *(c.get(k) for _, c in columns)] for k in keys]
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
        return f'<p class="warn"><b>{esc(behind["line"])}</b></p>'
    found = compare(run.summary, run.cfg.task)
    if found is None or run.cfg.task in ("lm", "events"):  # said above, in loss units
        return ""
    label = LABELS.get(found["metric"], found["metric"])
    return (
        f"<p>The recurrent model is not behind its best baseline on validation {esc(label)}: "
        f"{fmt(found['model'])} vs {fmt(found['baseline'])} for the {esc(found['kind'])}.</p>"
    )


def training_section(run: Run) -> tuple[str, str, str]:
    from rnnkit.diagnostics import GradientMonitor

    cfg, s = run.cfg, run.summary
    train = [e for e in run.of("train") if "step" in e]
    valid = [e for e in run.of("valid") if "step" in e and "loss_nats" in e]
    logged = [e for e in train if isinstance(e.get("grad_norm"), (int, float))]
    norm_steps = [e["step"] for e in logged]
    norms = [float(e["grad_norm"]) for e in logged]
    steps = s.get("steps", train[-1]["step"] if train else None)
    clipped = s.get("clipped_steps", train[-1].get("clipped_total") if train else None)
    rows: list[list[Any]] = [
        ["optimizer steps", steps],
        ["epochs completed", s.get("epoch")],
        ["training time (s)", s.get("elapsed_s")],
        ["training tokens per second", s.get("tokens_per_s")],
        ["parameters", s.get("parameters")],
        ["final training loss (nats per token)", s.get("train_loss_nats")],
        ["gradient clipping threshold κ", cfg.clip_norm if cfg.clip_norm is not None else "off"],
    ]
    if isinstance(clipped, int) and isinstance(steps, int) and steps > 0:
        rows.append(["steps clipped", f"{clipped:,} of {steps:,} ({100 * clipped / steps:.1f} %)"])
    if norms:
        rows.append(
            [
                "gradient norm at logged steps (median / max / last)",
                f"{np.median(norms):.4g} / {max(norms):.4g} / {norms[-1]:.4g}",
            ]
        )
    stop = (
        "early stop (patience)"
        if run.of("early_stop")
        else "time limit (--max-time)"
        if run.of("time_limit")
        else "all steps done"
    )
    rows.append(["stopped by", stop])
    if run.of("skipped"):
        rows.append(["steps skipped (non-finite loss or gradient)", len(run.of("skipped"))])
    body = table(rows)
    # Vanishing / exploding signals over the logged norms (the training monitor's rule).
    monitor = GradientMonitor(clip_norm=cfg.clip_norm, window=max(1, min(20, len(norms) - 1)))
    for step, norm in zip(norm_steps, norms, strict=True):
        monitor.record([], pre_clip_norm=norm, step=int(step))
    if monitor.events:
        items = "".join(f"<li>{esc(ev.message)}</li>" for ev in monitor.events[:10])
        body += f'<p class="warn">Gradient signals (logged steps):</p><ul>{items}</ul>'
    elif len(norms) > 1:
        body += note(
            f"No vanishing or exploding signal: the logged gradient norm never moved "
            f"by a factor of {monitor.factor:g} within {monitor.window} logged points."
        )
    if run.bad_lines:
        body += note(f"{run.bad_lines} unreadable line(s) of metrics.jsonl were skipped.")
    char = cfg.task == "lm" and cfg.unit == "char"
    baseline = (s.get("ngram") or {}).get("loss_nats")
    fig = plots.plot_losses(
        [e["step"] for e in train if "loss_nats" in e and e["loss_nats"] is not None],
        [e["loss_nats"] for e in train if "loss_nats" in e and e["loss_nats"] is not None],
        [e["step"] for e in valid],
        [e["loss_nats"] for e in valid],
        bits_per_char=char,
        baseline=baseline,
    )
    body += image(
        fig,
        "training and validation loss against the step",
        "Training loss (mean since the previous logged step) and validation loss in "
        "nats per token"
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
    rows = [[key, json.dumps(value)] for key, value in sorted(run.cfg.to_dict().items())]
    extra = [
        [k, json.dumps(v)]
        for k, v in sorted(run.info.items())
        if k not in ("config", "format_version")
    ]
    return section("config", "Configuration", table(rows + extra, ["option", "value"]))


# ---- language-model diagnostics ----------------------------------------------------------
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


def read_sample_text(run: Run, limit: int = 1 << 18) -> tuple[str, str] | None:
    """``(text, where)`` from the run's validation (else training) file, if readable."""
    for name in (run.cfg.valid, run.cfg.train):
        if not name:
            continue
        for candidate in (Path(name), run.path / name):
            try:
                with open(candidate, encoding="utf-8", errors="replace") as f:
                    text = f.read(limit)
            except OSError:
                continue
            if text.strip():
                return text, str(candidate)
    return None


def diagnostic_batch(run: Run, vocab: Any, model: Any, rows: int = 8, steps: int = 64):
    """``(ids (B, T + 1), snippet ids, where)``: evenly spaced windows of the run's text.

    Falls back to text the model generates when no corpus file can be read.
    """
    from rnnkit.app.tasks.lm import sample_texts

    found = read_sample_text(run)
    if found is not None:
        text, where = found
    else:
        text = "".join(
            sample_texts(
                run.cfg, vocab, model, None, num=1, max_length=rows * (steps + 1), seed=run.cfg.seed
            )
        )
        where = "text generated by the model (no corpus file could be read)"
        run.notes.append(f"Diagnostics ran on {where}.")
    ids = torch.as_tensor(vocab.encode_array(text, dtype=np.int64))
    n = int(ids.numel())
    if n < 3:
        return None, None, where
    rows = max(1, min(rows, n // 3))
    steps = max(2, min(steps, n // rows - 1))
    starts = np.linspace(0, n - steps - 1, rows).astype(int)
    batch = torch.stack([ids[a : a + steps + 1] for a in starts])  # (B, T + 1)
    return batch, ids[: min(n, 49)], where


def lm_gradient_section(run: Run, model: Any, batch: Tensor, where: str):
    from rnnkit.cells.rnn import RNNCell
    from rnnkit.diagnostics import (
        activation_gain,
        jacobian_norms,
        lag_contributions,
        layer_statistics,
        rnn_jacobian_bound,
        spectral_norm,
        state_gradient_norms,
        step_contributions,
    )
    from rnnkit.layers.recurrent import Recurrent
    from rnnkit.metrics.losses import sequence_cross_entropy

    encoder = model.encoder
    first = encoder.layers[0]
    if not isinstance(first, Recurrent):
        return section(
            "gradients",
            "Gradient flow through time",
            note("Gradient-flow pictures are drawn for unidirectional stacks."),
        )
    cell = first.cell
    inputs, targets = batch[:, :-1], batch[:, 1:]
    B, T = inputs.shape
    with torch.no_grad():
        x = model.embedding(inputs)  # (B, T, E)

    def logits_of(h: Tensor) -> Tensor:
        """Outputs of the first layer (B, T, H) → logits, through the layers above it."""
        z = h.transpose(0, 1)  # (T, B, H)
        for layer in encoder.layers[1:]:
            z, _ = layer(z)
        return model.head(z.transpose(0, 1))

    def loss_all(tgt: Tensor):
        return lambda h: sequence_cross_entropy(logits_of(h), tgt)

    def loss_last(h: Tensor) -> Tensor:
        return sequence_cross_entropy(logits_of(h)[:, -1:], targets[:, -1:])

    g_all = state_gradient_norms(first, x, loss_fn=loss_all(targets)).numpy()
    g_last = state_gradient_norms(first, x, loss_fn=loss_last).numpy()
    lam = spectral_norm(cell.weight_hh)
    rnn = cell if isinstance(cell, RNNCell) else None  # the bound is for the simple cell
    simple = rnn is not None
    gamma = activation_gain(rnn.nonlinearity) if rnn is not None else None
    lines = {
        r"$L$ = mean of $\ell_t$ over all steps": g_all,
        r"$\ell_T$ only (the last step's loss)": g_last,
    }
    # ‖∂ℓ_T/∂h_k‖ ≤ ‖∂ℓ_T/∂h_T‖ (γλ)^{T−k}: the bound on the last step's gradient.
    last_bound = g_last[-1] * (gamma * lam) ** np.arange(T, -1, -1.0) if gamma is not None else None
    Bj, Tj = min(B, 4), min(T, 32)
    width = cell.hidden_size * (2 if cell.is_lstm else 1)
    method = "exact" if width <= 64 else "power"
    J = jacobian_norms(first, x[:Bj, :Tj], method=method, iterations=10).numpy()
    bound = rnn_jacobian_bound(rnn, range(Tj + 1)).numpy() if rnn is not None else None
    body = (
        f"<p>On {B} windows of {T} {esc(run.cfg.unit)}s from {esc(where)}, through the first "
        f"layer ({esc(type(cell).__name__)}, H = {cell.hidden_size}). "
        "∂h_t/∂h_k = Π diag(φ′(a_j)) W_h, so ‖∂h_t/∂h_k‖₂ ≤ (γλ)^(t−k) with λ = ‖W_h‖₂ "
        "and γ = 1 for tanh, ¼ for the logistic (the bound is for the simple cell).</p>"
    )
    flow = plots.plot_gradient_flow(lines, J, bound, weight_norm=lam, state_grad_bound=last_bound)
    body += image(
        flow,
        "gradient norm through time and Jacobian norms against the bound",
        "Left: ‖∂L/∂h_k‖ for every state of the first layer (log scale)"
        + (", dashed: its bound ‖∂ℓ_T/∂h_T‖ (γλ)^(T−k) for the last step's loss" if simple else "")
        + ". Right: "
        f"‖∂h_t/∂h_0‖₂ over the first {Tj} steps of {Bj} windows "
        f"({'exact' if method == 'exact' else 'power-iteration estimate'})"
        + (
            ", dashed: the bound (γλ)^(t−k)."
            if simple
            else "; the (γλ)^(t−k) bound is for the simple cell only."
        ),
    )
    steps = step_contributions(first, x, loss_fn=loss_all(targets))
    values, total = plots.projected_contributions(steps.weight_hh)
    model.zero_grad(set_to_none=True)
    with torch.enable_grad():
        sequence_cross_entropy(model(inputs).logits, targets).backward()
    grad = cell.weight_hh.grad
    assert grad is not None  # the backward just ran through this cell
    reference = float(grad.norm())
    model.zero_grad(set_to_none=True)
    body += image(
        plots.plot_contributions(values, total=total),
        "per-step contributions to the gradient of the recurrent weight",
        "Each bar is step k's copy of W_hh: its contribution C_k = ∂L/∂W_hh^(k) "
        "projected on the direction of the total gradient G = Σ_k C_k, so the "
        "bars add up to ‖G‖ (the dark bar). Red bars pull against the update.",
    )
    Bl, Tl = min(B, 4), min(T, 32)
    lags = lag_contributions(first, x[:Bl, :Tl], loss_fn=loss_all(targets[:Bl, :Tl]))
    lag_values, lag_total = plots.projected_contributions(lags.weight_hh)
    body += image(
        plots.plot_contributions(lag_values, total=lag_total, axis="lag"),
        "contributions to the gradient of the recurrent weight by time lag",
        f"The same gradient split by how far it travelled (lag t − k, on {Bl} "
        f"windows of {Tl} steps): long lags are what vanish.",
    )
    rows: list[list[Any]] = [
        ["λ = ‖W_hh‖₂ (first layer)", lam],
        ["‖∂L/∂W_hh‖: sum of the bars", total],
        ["‖∂L/∂W_hh‖: backward pass of the model", reference],
        [
            "‖∂ℓ_T/∂h_0‖ / ‖∂ℓ_T/∂h_T‖ (how much of the last loss reaches the start)",
            float(g_last[0] / g_last[-1]) if g_last[-1] > 0 else None,
        ],
    ]
    if gamma is not None:
        rows += [
            ["γ (activation)", gamma],
            ["γλ", gamma * lam],
            ["bound after 20 steps (γλ)^20", (gamma * lam) ** 20],
        ]
    body += table(rows)
    stats = layer_statistics(encoder, x)
    gates = sorted({g for st in stats.values() for g in st.saturation})
    srows = [
        [name, *(st.saturation.get(g) for g in gates), st.state_norm, st.cell_norm]
        for name, st in stats.items()
    ]
    body += "<p>Gate saturation (share of values within 0.02 of 0 or 1) and state norms:</p>"
    body += table(srows, ["layer", *(f"{g} saturated" for g in gates), "mean ‖h_t‖", "mean ‖c_t‖"])
    return section("gradients", "Gradient flow through time", body)


def lm_prediction_section(run: Run, vocab: Any, model: Any, snippet: Tensor):
    if snippet is None or snippet.numel() < 2:
        return section("predictions", "What the model predicts", note("No text to read."))
    ids = snippet[None, :-1]  # (1, T)
    with torch.no_grad():
        probs = torch.softmax(model(ids).logits[0].double(), dim=-1).numpy()  # (T, V)
        states = model.encoder(model.embedding(ids)).outputs[0].numpy()  # (T, D·H)
    context = [vocab.itos[i] for i in ids[0].tolist()]
    targets = snippet[1:].tolist()
    text = vocab.decode(snippet.tolist(), skip_specials=False)
    body = f"<p>Along the start of the text:</p><pre>{esc(text)}</pre>"
    body += image(
        plots.plot_next_symbol(probs, vocab.itos, context, targets=targets),
        "heatmap of the next-symbol distribution along the text",
        "Column t: the model's distribution over the next symbol after reading "
        "the symbol below it (the most likely symbols overall as rows); squares "
        "mark the symbol that really came next.",
    )
    body += image(
        plots.plot_hidden_states(states, context),
        "hidden-state activations over time",
        "Hidden state h_t of the last layer at every position (units with the "
        "largest variance when there are many).",
    )
    return section("predictions", "What the model predicts", body)


def lm_sections(run: Run, samples: int = 3) -> list[tuple[str, str, str]]:
    """Samples, gradient flow and predictions of a language-model run."""
    from rnnkit.app.tasks.lm import lm_labels, load_lm, sample_texts
    from rnnkit.models.language_model import LanguageModel

    cfg, vocab, model = load_lm(run.path)
    labels = lm_labels(run.path, cfg)
    # A class-conditional model samples once for each of its first classes.
    classes = [None] if labels is None else list(range(min(samples, len(labels))))
    texts = []
    for k in classes:
        drawn = sample_texts(
            cfg,
            vocab,
            model,
            None,
            num=samples if k is None else 1,
            max_length=200 if cfg.unit == "char" else 50,
            temperature=0.8,
            seed=cfg.seed,
            condition=k,
        )
        texts += drawn if labels is None or k is None else [f"[{labels.labels[k]}] {drawn[0]}"]
    body = "".join(f"<pre>{esc(t)}</pre>" for t in texts)
    out = [
        section(
            "samples",
            "Samples",
            f"<p>Sampled at temperature 0.8 (seed {cfg.seed}), no prompt:</p>" + body,
        )
    ]
    # The pictures below read a LanguageModel's embedding → stack → head directly.
    if not isinstance(model, LanguageModel) or (model.length and model.length.input_size):
        out.append(
            section(
                "gradients",
                "Gradient flow through time",
                note(
                    "Gradient-flow and prediction pictures are drawn for the hidden-to-hidden "
                    "LM (not --wiring jordan, --condition or --length predict)."
                ),
            )
        )
        return out
    batch, snippet, where = diagnostic_batch(run, vocab, model)
    if batch is None:
        out.append(section("gradients", "Gradient flow through time", note("No text to read.")))
    else:
        out.append(lm_gradient_section(run, model, batch, where))
    out.append(lm_prediction_section(run, vocab, model, snippet))
    return out


def attention_sections(run: Run, pairs_shown: int = 3) -> list[tuple[str, str, str]]:
    """Attention heatmaps (teacher-forced on validation pairs) of a seq2seq run."""
    cfg = run.cfg
    title = "Attention"
    if cfg.decoder_only or cfg.attention == "none":
        return [section("attention", title, note("This model has no attention."))]
    from rnnkit.app.tasks.seq2seq import load_seq2seq
    from rnnkit.data.pairs import encode_pairs, make_pair_batch, read_pairs
    from rnnkit.errors import DataError

    _, source_vocab, target_vocab, model = load_seq2seq(run.path)
    pairs = None
    # The first validation pairs; without a validation file, the last training pairs
    # (the ones training held out).
    for name, held_out in ((cfg.valid, False), (cfg.train, True)):
        for candidate in (Path(name), run.path / name) if name else ():
            try:
                every = read_pairs(candidate)
                pairs = every[-pairs_shown:] if held_out else every[:pairs_shown]
                src, tgt = encode_pairs(pairs, source_vocab, target_vocab, candidate)
                break
            except (DataError, OSError):
                pairs = None
        if pairs:
            break
    if not pairs:
        return [section("attention", title, note("No readable source<TAB>target pairs."))]
    batch = make_pair_batch(src, tgt)
    with torch.no_grad():
        out = model(batch.source, batch.source_mask, batch.target_in, batch.target_mask)
    if out.attention is None:
        return [section("attention", title, note("The model returned no attention weights."))]
    body = ""
    for i, pair in enumerate(pairs):
        S, M = len(src[i]), len(tgt[i]) + 1  # outputs y_1 … y_m </s>
        weights = out.attention[i, :M, :S].double().numpy()
        labels = [target_vocab.itos[j] for j in batch.target_out[i, :M].tolist()]
        fig = plots.plot_attention(
            weights,
            [source_vocab.itos[j] for j in src[i].tolist()],
            labels,
            title=f"Attention, pair {i + 1}",
        )
        body += image(
            fig,
            f"attention heatmap of pair {i + 1}",
            f"{pair.source} → {pair.target} (teacher forcing: row t is the step "
            "that predicts the target token on the left).",
        )
    return [section("attention", title, body)]


# ---- the page ---------------------------------------------------------------------------
def render_report(run_dir: str | Path) -> str:
    """The report of a run directory as HTML text (self-contained, no network needed).

    Args:
        run_dir: a directory written by ``rnnkit train``.

    Raises:
        CheckpointError: no such directory, or no readable ``config.json``.
    """
    run = read_run(run_dir)
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


def write_report(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write the self-contained HTML report of a run; returns its path.

    Args:
        run_dir: a directory written by ``rnnkit train``.
        out: where to write (default ``run_dir/report.html``; a directory gets a
            ``report.html`` inside). Written atomically: a reader never sees half a report.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     write_report(d)
    Traceback (most recent call last):
    ...
    rnnkit.errors.CheckpointError: ...config.json: missing
    """
    path = Path(run_dir) / REPORT_NAME if out is None else Path(out)
    if path.is_dir():
        path = path / REPORT_NAME
    text = render_report(run_dir)
    atomic_write_bytes(path, text.encode("utf-8"))
    return path
