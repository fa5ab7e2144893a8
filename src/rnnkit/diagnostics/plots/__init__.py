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

from rnnkit.diagnostics.plots.base import display_token, to_png
from rnnkit.diagnostics.plots.detection import plot_detection_curves, plot_score_histograms
from rnnkit.diagnostics.plots.gradients import (
    plot_contributions,
    plot_gradient_flow,
    projected_contributions,
)
from rnnkit.diagnostics.plots.heatmaps import plot_attention, plot_hidden_states, plot_next_symbol
from rnnkit.diagnostics.plots.training import plot_grad_norms, plot_losses

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
