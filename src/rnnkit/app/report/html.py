"""The HTML pieces of the report: escaping, numbers for tables, tables, embedded figures,
sections and notes, and the page's style sheet and Content-Security-Policy.

Everything here returns HTML text with every value escaped; a figure becomes a PNG
``data:`` URI, so the page needs nothing outside itself.
"""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Sequence
from typing import Any

from matplotlib.figure import Figure

from rnnkit.diagnostics import plots

__all__ = ["CSP", "STYLE", "esc", "fmt", "image", "note", "section", "table"]

DPI = 100
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"

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


def esc(value: Any) -> str:
    """Any value as HTML text, quotes escaped too (safe inside an attribute)."""
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
    """``(anchor, title, html)`` of one section; the page's navigation links to ``anchor``."""
    return anchor, title, f'<section id="{anchor}"><h2>{esc(title)}</h2>\n{body}\n</section>'


def note(text: str) -> str:
    """A paragraph in the note style: what a section cannot show, and why."""
    return f'<p class="note">{esc(text)}</p>'
