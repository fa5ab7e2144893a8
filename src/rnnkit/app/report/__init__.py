"""The run report: one self-contained HTML page per run directory (``rnnkit report``).

The report is application code, not a library of diagnostics: it reads the run directory
of any task (``config.json``, ``summary.json``, ``metrics.jsonl``, the model), reloads the
model through the task that trained it and calls the diagnostics and plots of
:mod:`rnnkit.diagnostics` on it. It therefore sits beside :mod:`rnnkit.app.tasks`, just above
it (no task needs the report; the command line writes it after training), and not inside
``tasks``, whose modules are one task each and the glue they share.

* ``page``: :func:`write_report` / :func:`render_report` and the sections every run has
  (metrics, training, configuration).
* ``lm``: the samples, gradient-flow and prediction sections of language-model runs.
* ``attention``: the attention heatmaps of seq2seq runs.
* ``detection``: the anomaly-detection sections of ``events`` and ``params`` runs.
* ``keys``: the metrics and training sections of ``params`` runs, read from the keys'
  runs (``keys/NNN``).
* ``html``: the HTML pieces (escaping, tables, embedded figures, sections, style sheet).
* ``run``: what the report reads from a run directory.
"""

from rnnkit.app.report.page import REPORT_NAME, render_report, write_report

__all__ = ["REPORT_NAME", "render_report", "write_report"]
