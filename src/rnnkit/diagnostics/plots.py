"""The pictures of a run: one function per picture, each returning a matplotlib ``Figure``.

Every function takes plain arrays (numpy, tensors or lists), so it can draw data from a
run directory, from ``rnnkit.diagnostics`` or from anywhere else; ``to_png`` turns a
figure into PNG bytes. Figures are built with ``matplotlib.figure.Figure`` and rendered by
the Agg canvas: no pyplot, no global figure registry, no window, nothing printed, and the
caller's matplotlib backend is never changed.

Token labels (characters and words from a vocabulary) are drawn literally, never as
mathtext; spaces, newlines, tabs, control characters and characters the font has no glyph
for are shown as visible stand-ins (``display_token``), so matplotlib has nothing to warn
about.

>>> import numpy as np
>>> fig = plot_losses([1, 2, 3], [2.0, 1.5, 1.2], [3], [1.3], bits_per_char=True)
>>> png = to_png(fig, dpi=50)
>>> png[:8] == b"\\x89PNG\\r\\n\\x1a\\n"
True
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

import numpy as np
from matplotlib import colors, font_manager, ft2font, rcParams, ticker
from matplotlib.axes import Axes
from matplotlib.figure import Figure

__all__ = [
    "display_token",
    "plot_attention",
    "plot_contributions",
    "plot_detection_curves",
    "plot_grad_norms",
    "plot_gradient_flow",
    "plot_hidden_states",
    "plot_losses",
    "plot_next_symbol",
    "plot_score_histograms",
    "projected_contributions",
    "to_png",
]

LN2 = math.log(2)
# Above this many positions, tick labels are thinned so they stay legible.
MAX_TICK_LABELS = 64
STAND_INS = {" ": "␣", "\n": "↵", "\t": "⇥", "\r": "␍"}


# ---- shared helpers --------------------------------------------------------------------
def _array(values: Any, name: str, ndim: int | None = None) -> np.ndarray:
    """``values`` (list, numpy or torch) as a float64 numpy array of ``ndim`` dimensions."""
    if hasattr(values, "detach"):
        values = values.detach().cpu().double().numpy()
    a = np.asarray(values, dtype=np.float64)
    if ndim is not None and a.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimension(s), got shape {a.shape}")
    return a


def _figure(width: float, height: float) -> Figure:
    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def to_png(fig: Figure, *, dpi: int = 100) -> bytes:
    """Render ``fig`` as PNG bytes, ``width × dpi`` by ``height × dpi`` pixels.

    The PNG carries no timestamp, so the same figure gives the same bytes.

    >>> fig = Figure(figsize=(2, 1))
    >>> png = to_png(fig, dpi=40)
    >>> int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")  # IHDR size
    (80, 40)
    """
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, metadata={"Software": None})
    return buffer.getvalue()


@lru_cache(maxsize=1)
def _glyphs() -> frozenset[int]:
    """Code points the default font can draw (matplotlib warns on a missing glyph)."""
    path = font_manager.findfont(font_manager.FontProperties(family=rcParams["font.family"]))
    return frozenset(ft2font.FT2Font(path).get_charmap())


def display_token(token: str) -> str:
    """A token as a tick label: whitespace, control and glyph-less characters made visible.

    >>> [display_token(t) for t in (" ", "\\n", "a", "\\x07", "<s>")]
    ['␣', '↵', 'a', '\\\\x07', '<s>']
    """
    glyphs = _glyphs()
    out = []
    for ch in token:
        if ch in STAND_INS:
            out.append(STAND_INS[ch])
        elif not ch.isprintable():
            out.append(ascii(ch)[1:-1])
        elif ord(ch) not in glyphs:
            out.append(f"U+{ord(ch):04X}")
        else:
            out.append(ch)
    return "".join(out) or "∅"


def _token_ticks(ax: Axes, axis: str, labels: Sequence[str] | None, n: int) -> None:
    """Label ``n`` positions with tokens (literal text, thinned when there are many)."""
    if labels is None:
        return
    if len(labels) != n:
        raise ValueError(f"expected {n} {axis} labels, got {len(labels)}")
    stride = max(1, math.ceil(n / MAX_TICK_LABELS))
    ticks = list(range(0, n, stride))
    text = [display_token(str(labels[i])) for i in ticks]
    # parse_math=False: a "$" in a token is a dollar sign, not the start of mathtext.
    if axis == "x":
        long = max(len(t) for t in text) > 2 and len(ticks) > 6 if text else False
        ax.set_xticks(ticks, text, parse_math=False, fontsize=8, rotation=90 if long else 0)
    else:
        ax.set_yticks(ticks, text, parse_math=False, fontsize=8)


def _positive(values: np.ndarray) -> np.ndarray:
    """Non-positive and non-finite values → NaN (not drawn on a log axis)."""
    out = values.astype(np.float64, copy=True)
    out[~np.isfinite(out) | (out <= 0)] = np.nan
    return out


def _log_axis(ax: Axes, *arrays: np.ndarray) -> None:
    """Log scale when there is something positive to draw (else matplotlib would warn).

    Minor ticks are left out: over many decades they are hundreds of artists that make
    rendering several times slower and the picture no easier to read."""
    if any(np.isfinite(a).any() for a in arrays if a.size):
        ax.set_yscale("log")
        ax.yaxis.set_minor_locator(ticker.NullLocator())


def _focus(ax: Axes, *measured: np.ndarray) -> None:
    """On a log axis, show the measured values' range (a decade of margin, and up to four
    decades above them for a bound), not a bound's that runs off by many decades."""
    values = np.concatenate([m.ravel() for m in measured]) if measured else np.array([])
    values = values[np.isfinite(values)]
    if ax.get_yscale() != "log" or not values.size:
        return
    low, high = float(values.min()), float(values.max())
    drawn = [line.get_ydata() for line in ax.lines]
    top = max((float(np.nanmax(d)) for d in drawn if np.isfinite(d).any()), default=high)
    ax.set_ylim(low / 3, min(max(top, high) * 3, high * 1e4))


def _empty(ax: Axes, message: str) -> None:
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes, color="0.4")
    ax.set_xticks([])
    ax.set_yticks([])


# ---- training curves -------------------------------------------------------------------
def _nats_to_bits(nats: Any) -> Any:
    return np.asarray(nats) / LN2


def _bits_to_nats(bits: Any) -> Any:
    return np.asarray(bits) * LN2


def plot_losses(
    train_steps: Sequence[float],
    train_loss: Sequence[float],
    valid_steps: Sequence[float] = (),
    valid_loss: Sequence[float] = (),
    *,
    bits_per_char: bool = False,
    baseline: float | None = None,
    baseline_label: str = "n-gram baseline",
    title: str = "Training and validation loss",
    width: float = 7.0,
    height: float = 4.0,
) -> Figure:
    """Training and validation loss (nats per token) against the optimizer step.

    Args:
        train_steps, train_loss: ``(N,)`` steps and mean training loss over the steps
            since the previous point (nats).
        valid_steps, valid_loss: ``(M,)`` the validation evaluations (nats).
        bits_per_char: add a right-hand axis in bits per character (character models).
        baseline: a reference validation loss in nats (the n-gram), drawn dashed.

    >>> fig = plot_losses([10, 20], [3.0, 2.5], [20], [2.6], bits_per_char=True, baseline=2.7)
    >>> fig.axes[0].get_ylabel()
    'loss (nats per token)'
    """
    ts, tl = _array(train_steps, "train_steps", 1), _array(train_loss, "train_loss", 1)
    vs, vl = _array(valid_steps, "valid_steps", 1), _array(valid_loss, "valid_loss", 1)
    if ts.shape != tl.shape or vs.shape != vl.shape:
        raise ValueError("steps and losses must have the same length")
    fig = _figure(width, height)
    ax = fig.add_subplot()
    ax.set_title(title)
    if not ts.size and not vs.size and baseline is None:
        _empty(ax, "no losses logged")
        return fig
    if ts.size:
        marker = "." if ts.size < 30 else None
        ax.plot(ts, tl, color="tab:blue", lw=1.5, marker=marker, label="training")
    if vs.size:
        ax.plot(vs, vl, color="tab:orange", lw=2, marker="o", ms=4, label="validation")
    if baseline is not None and math.isfinite(baseline):
        ax.axhline(baseline, color="0.3", ls="--", lw=1.2, label=f"{baseline_label}")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss (nats per token)")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper right", fontsize=9)
    if bits_per_char:
        right = ax.secondary_yaxis("right", functions=(_nats_to_bits, _bits_to_nats))
        right.set_ylabel("bits per character")
    return fig


def plot_grad_norms(
    steps: Sequence[float],
    norms: Sequence[float],
    *,
    clip_norm: float | None = None,
    title: str = "Gradient norm during training",
    width: float = 7.0,
    height: float = 3.5,
) -> Figure:
    """The global gradient norm (before clipping) at the logged steps, on a log scale.

    Args:
        steps, norms: ``(N,)`` steps and ‖g‖₂ over all parameters before clipping.
        clip_norm: the clipping threshold κ (a dashed line; points above it were clipped).

    >>> fig = plot_grad_norms([1, 2, 3], [0.5, 8.0, 2.0], clip_norm=5.0)
    >>> fig.axes[0].get_yscale(), fig.axes[0].get_xlabel()
    ('log', 'optimizer step')
    """
    s, n = _array(steps, "steps", 1), _positive(_array(norms, "norms", 1))
    if s.shape != n.shape:
        raise ValueError("steps and norms must have the same length")
    fig = _figure(width, height)
    ax = fig.add_subplot()
    ax.set_title(title)
    if not np.isfinite(n).any():
        _empty(ax, "no gradient norms logged")
        return fig
    ax.plot(
        s, n, color="tab:purple", lw=1.2, marker="." if s.size < 50 else None, label=r"$\|g\|_2$"
    )
    if clip_norm is not None:
        ax.axhline(
            clip_norm, color="tab:red", ls="--", lw=1.2, label=f"clip threshold κ = {clip_norm:g}"
        )
        above = n > clip_norm
        if above.any():
            ax.plot(s[above], n[above], "x", color="tab:red", ms=5, label="clipped")
    _log_axis(ax, n)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(r"gradient norm $\|g\|_2$ (before clipping)")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper right", fontsize=9)  # "best" scans every point: slow on long runs
    return fig


# ---- gradient flow through time ------------------------------------------------------------
def plot_gradient_flow(
    state_grad_norms: Any,
    jacobian_norms: Any = None,
    bound: Any = None,
    *,
    start: int = 0,
    weight_norm: float | None = None,
    state_grad_bound: Any = None,
    title: str = "Gradient through time",
    width: float = 10.0,
    height: float = 4.0,
) -> Figure:
    """‖∂L/∂h_k‖ for every state, and ‖∂h_t/∂h_k‖₂ against the bound (γλ)^{t−k}; log scale.

    The argument names are the keys of ``GradientFlow.to_dict()``, so
    ``plot_gradient_flow(**gradient_flow(...).to_dict())`` draws a ``GradientFlow``.

    Args:
        state_grad_norms: ``(T + 1,)`` ‖∂L/∂h_k‖ for ``k = 0 … T`` (``h_0`` the initial
            state); or a mapping ``label → (T + 1,)`` to compare losses (e.g. the loss at
            every step against the loss at the last step only).
        jacobian_norms: ``(B, n)`` or ``(n,)`` ‖∂h_{k+j}/∂h_k‖₂ for ``j = 0 … n − 1``, or
            None for the left panel only. Several sequences are drawn as median and range.
        bound: ``(n,)`` ``(γλ)^j`` (simple cell), or ``(B, n)`` per sequence (masked
            steps are no factor, so sequences with holes have their own bound: the
            loosest one is drawn, which every sequence's norm is below), or None.
        start: ``k`` of the Jacobians.  weight_norm: ``λ = ‖W_h‖₂`` for the legend.
        state_grad_bound: ``(T + 1,)`` a bound on the left panel's norms (dashed), e.g.
            ``‖∂ℓ_T/∂h_T‖ (γλ)^{T−k}`` for the loss at the last step only.

    The vertical range follows the measured values: a bound far above them leaves the
    top of the panel (itself a finding: the bound is loose there).

    >>> import numpy as np
    >>> fig = plot_gradient_flow(np.geomspace(1e-6, 1, 11), np.geomspace(1, 1e-3, 11)[None],
    ...                          0.9 ** np.arange(11), weight_norm=0.9)
    >>> [ax.get_yscale() for ax in fig.axes]
    ['log', 'log']
    """
    series = state_grad_norms if isinstance(state_grad_norms, Mapping) else {"": state_grad_norms}
    lines = {label: _positive(_array(v, "state_grad_norms", 1)) for label, v in series.items()}
    panels = 1 if jacobian_norms is None else 2
    fig = _figure(width if panels == 2 else width / 1.7, height)
    fig.suptitle(title)
    ax = fig.add_subplot(1, panels, 1)
    for label, values in lines.items():
        ax.plot(
            np.arange(values.size),
            values,
            marker="." if values.size <= 40 else None,
            label=label or None,
        )
    if state_grad_bound is not None:
        b = _positive(_array(state_grad_bound, "state_grad_bound", 1))
        ax.plot(np.arange(b.size), b, "k--", lw=1.2, label="bound")
    _log_axis(ax, *lines.values())
    _focus(ax, *lines.values())
    ax.set_xlabel("state index k (0 = initial state)")
    ax.set_ylabel(r"$\|\partial L/\partial h_k\|_2$ (whole batch)")
    ax.set_title("gradient reaching each state", fontsize=10)
    ax.grid(True, alpha=0.3)
    if any(lines):
        ax.legend(fontsize=8, loc="best")
    if jacobian_norms is not None:
        J = _array(jacobian_norms, "jacobian_norms")
        J = J[None] if J.ndim == 1 else J
        if J.ndim != 2:
            raise ValueError(f"jacobian_norms must be (B, n) or (n,), got shape {J.shape}")
        lags = np.arange(J.shape[1])
        right = fig.add_subplot(1, 2, 2)
        median = _positive(np.median(J, axis=0))
        right.plot(lags, median, color="tab:blue", lw=1.8, label="measured (median over batch)")
        if J.shape[0] > 1:
            right.fill_between(
                lags,
                _positive(J.min(0)),
                _positive(J.max(0)),
                color="tab:blue",
                alpha=0.2,
                lw=0,
                label="min–max over batch",
            )
        drawn = [median]
        if bound is not None:
            b = _array(bound, "bound")
            b = _positive(b.max(0) if b.ndim == 2 else b)
            if b.shape != lags.shape:
                raise ValueError(f"bound must have {lags.size} entries per row, got {b.shape}")
            lam = f", λ = {weight_norm:.3g}" if weight_norm is not None else ""
            right.plot(lags, b, "k--", lw=1.5, label=r"bound $(\gamma\lambda)^{t-k}$" + lam)
            drawn.append(b)
        elif weight_norm is not None:
            right.plot(
                [], [], " ", label=rf"$\|W_h\|_2$ = {weight_norm:.3g} (bound: simple cell only)"
            )
        _log_axis(right, *drawn)
        _focus(right, _positive(J))
        right.set_xlabel(f"steps back t − k (k = {start})")
        right.set_ylabel(r"$\|\partial h_t/\partial h_k\|_2$ (spectral norm)")
        right.set_title("Jacobian norm vs the bound", fontsize=10)
        right.grid(True, alpha=0.3)
        right.legend(fontsize=8, loc="best")
    return fig


def projected_contributions(parts: Any) -> tuple[np.ndarray, float]:
    """Signed scalar shares of a gradient that add up to its norm.

    ``parts`` stacks the contributions ``C_k`` of one parameter (``Contributions.weight_hh``,
    ``(K, …)``) whose sum is the gradient ``G``. Each is projected on the direction of
    ``G``: ``c_k = ⟨C_k, G⟩ / ‖G‖``, so ``Σ_k c_k = ‖G‖`` exactly, and a negative ``c_k``
    is a step that pulls against the update (the contributions can have different
    signs; their sum is what matters).

    Returns:
        ``(values (K,), total)`` in float64; all zeros and ``0.0`` when ``G = 0``.

    >>> import numpy as np
    >>> values, total = projected_contributions(np.array([[3.0, 0.0], [0.0, 4.0]]))
    >>> values.round(6).tolist(), total
    ([1.8, 3.2], 5.0)
    """
    P = _array(parts, "parts")
    if P.ndim < 1 or P.shape[0] == 0:
        raise ValueError(f"parts must stack at least one contribution, got shape {P.shape}")
    flat = P.reshape(P.shape[0], -1)
    G = flat.sum(0)
    norm = float(np.linalg.norm(G))
    if norm == 0.0 or not math.isfinite(norm):
        return np.zeros(flat.shape[0]), 0.0 if norm == 0.0 else norm
    return flat @ (G / norm), norm


def plot_contributions(
    values: Any,
    *,
    total: float | None = None,
    axis: str = "step",
    quantity: str = "∂L/∂W_hh",
    title: str | None = None,
    rtol: float = 1e-6,
    width: float = 8.0,
    height: float = 3.8,
) -> Figure:
    """Bars of each step's (or lag's) share of a gradient, and their sum, the total.

    The step bars are drawn in one container labelled ``"contributions"`` and the total in
    one labelled ``"total"`` (tests read the heights from ``ax.containers``).

    Args:
        values: ``(K,)`` signed shares (``projected_contributions``, or one entry of
            the weight for a one-unit network).
        total: the total they must add up to (e.g. the autograd gradient), or None for
            their sum; a total that the bars do not add up to is a ``ValueError``.
        axis: ``"step"`` (index k of the weight's copy) or ``"lag"`` (t − k).
        quantity: what the shares are of, for the labels.

    >>> fig = plot_contributions([0.5, -0.25, 1.0], total=1.25)
    >>> bars = {c.get_label(): [p.get_height() for p in c] for c in fig.axes[0].containers}
    >>> bool(sum(bars["contributions"]) == bars["total"][0])
    True
    """
    v = _array(values, "values", 1)
    if v.size == 0:
        raise ValueError("values must hold at least one contribution")
    if axis not in ("step", "lag"):
        raise ValueError(f"axis must be 'step' or 'lag', got {axis!r}")
    drawn_total = float(v.sum())
    if total is not None and not math.isclose(
        drawn_total, total, rel_tol=rtol, abs_tol=rtol * max(np.abs(v).max(), 1e-300)
    ):
        raise ValueError(
            f"the contributions add up to {drawn_total:.6g}, not the total {total:.6g}"
        )
    fig = _figure(width, height)
    ax = fig.add_subplot()
    ks = np.arange(v.size)
    colours = np.where(v >= 0, "tab:blue", "tab:red")
    ax.bar(ks, v, color=colours, width=0.8, label="contributions")
    gap = max(2.0, v.size * 0.08)
    ax.bar(
        [v.size - 1 + gap],
        [drawn_total],
        color="0.25",
        width=0.8 * max(1.0, v.size / 25),
        label="total",
    )
    ax.axhline(0, color="k", lw=0.6)
    ax.margins(y=0.12)
    ax.annotate(
        f"Σ = {drawn_total:.4g}",
        (v.size - 1 + gap, drawn_total),
        ha="center",
        va="bottom" if drawn_total >= 0 else "top",
        fontsize=9,
        xytext=(0, 3 if drawn_total >= 0 else -3),
        textcoords="offset points",
    )
    stride = max(1, math.ceil(v.size / 16))
    ticks = [k for k in range(0, v.size, stride) if k <= v.size - 1 + gap - 1.5 * stride]
    ax.set_xticks([*ticks, v.size - 1 + gap], [*map(str, ticks), "total"])
    what = "time step k (copy of the weight used at step k)" if axis == "step" else "time lag t − k"
    ax.set_xlabel(what)
    ax.set_ylabel(f"share of {quantity}")
    ax.set_title(
        title
        or f"Contribution of each {'step' if axis == 'step' else 'lag'} to "
        f"{quantity}: the bars add up to the total"
    )
    ax.grid(True, axis="y", alpha=0.3)
    return fig


# ---- heatmaps ------------------------------------------------------------------------------
def _heatmap(ax: Axes, data: np.ndarray, *, cmap: str, norm: colors.Normalize, label: str):
    image = ax.imshow(data, aspect="auto", interpolation="nearest", cmap=cmap, norm=norm)
    bar = ax.figure.colorbar(image, ax=ax, fraction=0.04, pad=0.02)
    bar.set_label(label)
    return image


def plot_attention(
    weights: Any,
    source_labels: Sequence[str] | None = None,
    target_labels: Sequence[str] | None = None,
    *,
    title: str = "Attention weights",
    width: float | None = None,
    height: float | None = None,
) -> Figure:
    """Heatmap of attention: one row per output (target) step, one column per source token.

    Args:
        weights: ``(T_target, T_source)``, each row a distribution over the source.
        source_labels: ``T_source`` tokens; target_labels: ``T_target`` tokens.

    >>> import numpy as np
    >>> fig = plot_attention(np.eye(3), ["a", "b", "c"], ["A", "B", "C"])
    >>> fig.axes[0].get_xlabel(), [t.get_text() for t in fig.axes[0].get_yticklabels()]
    ('source token', ['A', 'B', 'C'])
    """
    W = _array(weights, "weights", 2)
    n_out, n_in = W.shape
    fig = _figure(width or min(14.0, 3.0 + 0.25 * n_in), height or min(12.0, 2.0 + 0.25 * n_out))
    ax = fig.add_subplot()
    top = float(np.nanmax(W)) if W.size else 1.0
    _heatmap(
        ax, W, cmap="viridis", norm=colors.Normalize(0.0, max(top, 1e-12)), label="attention weight"
    )
    _token_ticks(ax, "x", source_labels, n_in)
    _token_ticks(ax, "y", target_labels, n_out)
    ax.set_xlabel("source token")
    ax.set_ylabel("output step (target token)")
    ax.set_title(title)
    return fig


def plot_next_symbol(
    probs: Any,
    symbols: Sequence[str],
    context: Sequence[str] | None = None,
    *,
    targets: Sequence[int] | None = None,
    top: int = 15,
    title: str = "Next-symbol distribution along the text",
    width: float | None = None,
    height: float | None = None,
) -> Figure:
    """Heatmap of ``P(next symbol | text so far)``: top-N symbols × positions.

    Args:
        probs: ``(T, V)``, row ``t`` the model's distribution after reading position t.
        symbols: ``V`` vocabulary entries (``vocab.itos``).
        context: ``T`` labels of the positions (the symbol read at each).
        targets: ``T`` ids of the symbol that really came next; framed where shown.
        top: how many symbols to show (those with the highest mean probability).

    >>> import numpy as np
    >>> p = np.full((4, 3), 0.1); p[np.arange(4), [0, 1, 2, 0]] = 0.8
    >>> fig = plot_next_symbol(p, ["x", "y", "z"], list("abcd"), targets=[0, 1, 2, 0], top=2)
    >>> fig.axes[0].images[0].get_array().shape
    (2, 4)
    """
    P = _array(probs, "probs", 2)
    T, V = P.shape
    if len(symbols) != V:
        raise ValueError(f"probs has {V} symbols but {len(symbols)} labels were given")
    if top < 1:
        raise ValueError(f"top must be ≥ 1, got {top}")
    rows = np.argsort(-P.mean(0), kind="stable")[: min(top, V)]  # most likely first
    fig = _figure(width or min(16.0, 3.5 + 0.22 * T), height or 1.8 + 0.24 * rows.size)
    ax = fig.add_subplot()
    _heatmap(
        ax,
        P[:, rows].T,
        cmap="magma_r",
        norm=colors.Normalize(0.0, 1.0),
        label="P(next symbol | text so far)",
    )
    _token_ticks(ax, "y", [symbols[i] for i in rows], rows.size)
    _token_ticks(ax, "x", context, T)
    if targets is not None:
        if len(targets) != T:
            raise ValueError(f"expected {T} targets, got {len(targets)}")
        where = {int(s): r for r, s in enumerate(rows)}
        shown = [(t, where[int(s)]) for t, s in enumerate(targets) if int(s) in where]
        if shown:
            xs, ys = zip(*shown, strict=True)
            ax.scatter(
                xs,
                ys,
                s=40,
                marker="s",
                facecolors="none",
                edgecolors="tab:cyan",
                linewidths=1.2,
                label="symbol that came next",
            )
            ax.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    ax.set_xlabel("position t (symbol read)")
    ax.set_ylabel(f"next symbol (top {rows.size} of {V})")
    ax.set_title(title, loc="left")
    return fig


def plot_hidden_states(
    states: Any,
    context: Sequence[str] | None = None,
    *,
    max_units: int = 64,
    title: str = "Hidden-state activations over time",
    width: float | None = None,
    height: float | None = None,
) -> Figure:
    """Heatmap of hidden activations ``h_t``: units × steps.

    Args:
        states: ``(T, H)`` hidden states of one sequence.
        context: ``T`` labels of the steps (the symbol read at each).
        max_units: above this many units, the ``max_units`` with the largest variance
            over time are shown (in unit order).

    >>> import numpy as np
    >>> fig = plot_hidden_states(np.tanh(np.random.default_rng(0).normal(size=(20, 100))),
    ...                          max_units=16)
    >>> fig.axes[0].images[0].get_array().shape
    (16, 20)
    """
    S = _array(states, "states", 2)
    T, H = S.shape
    units = np.arange(H)
    if max_units < H:
        units = np.sort(np.argsort(-S.var(0), kind="stable")[:max_units])
    fig = _figure(
        width or min(16.0, 3.5 + 0.2 * T), height or min(10.0, max(3.2, 2.0 + 0.08 * units.size))
    )
    ax = fig.add_subplot()
    limit = float(np.nanmax(np.abs(S))) if S.size else 1.0
    _heatmap(
        ax,
        S[:, units].T,
        cmap="RdBu_r",
        norm=colors.Normalize(-max(limit, 1e-12), max(limit, 1e-12)),
        label="activation h_t",
    )
    _token_ticks(ax, "x", context, T)
    step = max(1, math.ceil(units.size / 16))
    ax.set_yticks(range(0, units.size, step), [str(u) for u in units[::step]])
    shown = f"{units.size} of {H} units, largest variance" if units.size < H else f"{H} units"
    ax.set_ylabel(f"hidden unit ({shown})")
    ax.set_xlabel("position t (symbol read)" if context is not None else "time step t")
    ax.set_title(title)
    return fig


# ---- anomaly detection -----------------------------------------------------------------
def plot_detection_curves(
    curves: Mapping[str, Mapping[str, Any]],
    *,
    title: str = "Detection on labelled validation sessions",
    width: float = 10.0,
    height: float = 4.2,
) -> Figure:
    """ROC and precision–recall curves of several detectors side by side, each with its
    operating point (the verdicts at its threshold) marked.

    Args:
        curves: per detector name, ``fpr``, ``tpr`` (ROC), ``recall``, ``precision``
            (PR), ``auc``, and ``point``: ``(fpr, recall, precision)`` at the threshold.

    >>> c = {"a": {"fpr": [0, 0, 1], "tpr": [0, 1, 1], "recall": [1, 1], "precision": [1, .5],
    ...            "auc": 1.0, "point": (0.0, 1.0, 1.0)}}
    >>> [ax.get_title() for ax in plot_detection_curves(c).axes]
    ['ROC', 'Precision–recall']
    """
    fig = _figure(width, height)
    roc, pr = fig.subplots(1, 2)
    fig.suptitle(title)
    roc.set_title("ROC")
    pr.set_title("Precision–recall")
    roc.plot([0, 1], [0, 1], color="0.7", lw=1, ls=":")
    for i, (name, c) in enumerate(curves.items()):
        color = f"C{i}"
        fpr, tpr = _array(c["fpr"], "fpr", 1), _array(c["tpr"], "tpr", 1)
        rec, prec = _array(c["recall"], "recall", 1), _array(c["precision"], "precision", 1)
        roc.step(fpr, tpr, where="post", color=color, lw=1.8, label=f"{name} (AUC {c['auc']:.3f})")
        pr.step(rec, prec, where="post", color=color, lw=1.8, label=name)
        p_fpr, p_rec, p_prec = c["point"]
        roc.plot([p_fpr], [p_rec], "o", color=color, ms=7, mec="black")
        pr.plot([p_rec], [p_prec], "o", color=color, ms=7, mec="black")
    roc.set_xlabel("false-positive rate (normal sessions flagged)")
    roc.set_ylabel("true-positive rate (recall)")
    pr.set_xlabel("recall")
    pr.set_ylabel("precision")
    for ax in (roc, pr):
        ax.set_xlim(-0.02, 1.02)
        ax.set_ylim(-0.02, 1.02)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="lower right" if ax is roc else "lower left", fontsize=9)
    return fig


def plot_score_histograms(
    panels: Sequence[tuple[str, Any, Any, float]],
    *,
    score: str = "score",
    width: float | None = None,
    height: float = 3.6,
    bins: int = 40,
    xlabel: str | None = None,
    counted: str = "sessions",
) -> Figure:
    """Histograms of session scores, normal against anomalous, with the threshold drawn;
    one panel per detector.

    Args:
        panels: ``(title, normal scores, anomalous scores, threshold)`` each; the
            anomalous scores may be empty (unlabelled validation).
        score: the score's name (the x label).
        xlabel: the x label instead (default ``session score (score)``).
        counted: what the histograms count (the y label), default ``sessions``.

    >>> fig = plot_score_histograms([("m", [0.1, 0.2, 0.4], [2.0, 3.0], 1.0)])
    >>> fig.axes[0].get_xlabel()
    'session score (score)'
    """
    fig = _figure(width or 5.0 * max(1, len(panels)), height)
    axes = fig.subplots(1, max(1, len(panels)), squeeze=False)[0]
    for ax, (title, normal, anomalous, threshold) in zip(axes, panels, strict=False):
        n = _array(normal, "normal", 1)
        a = _array(anomalous, "anomalous", 1)
        finite = np.r_[n, a, threshold]
        finite = finite[np.isfinite(finite)]
        lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
        edges = np.linspace(lo, hi if hi > lo else lo + 1.0, bins + 1)
        ax.hist(n, bins=edges, color="tab:blue", alpha=0.6, label=f"normal ({n.size})")
        if a.size:
            ax.hist(a, bins=edges, color="tab:red", alpha=0.6, label=f"anomalous ({a.size})")
        if math.isfinite(threshold):
            ax.axvline(threshold, color="black", ls="--", lw=1.5, label="threshold")
        ax.set_yscale("symlog", linthresh=1)
        ax.set_title(title)
        ax.set_xlabel(xlabel or f"session score ({score})")
        ax.set_ylabel(counted)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="upper right", fontsize=8)  # not "best": it scans every bar, slow under load
    return fig
