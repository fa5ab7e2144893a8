"""What every figure shares: arrays from numpy, tensors or lists, a figure built without
pyplot, PNG bytes (:func:`to_png`), tokens as literal tick labels (:func:`display_token`)
and log axes that show what was measured.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np
from matplotlib import font_manager, ft2font, rcParams, ticker
from matplotlib.axes import Axes
from matplotlib.figure import Figure

__all__ = ["display_token", "to_png"]

# Above this many positions, tick labels are thinned so they stay legible.
MAX_TICK_LABELS = 64
STAND_INS = {" ": "␣", "\n": "↵", "\t": "⇥", "\r": "␍"}


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
