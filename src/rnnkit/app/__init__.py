"""The application: what turns the library into ``rnnkit train`` and its siblings.

Top down, each importing only the ones below it:

* ``cli``: one module per subcommand, options in, library calls, one line per error;
* ``report``: the self-contained HTML report of a run of any task;
* ``tasks``: per task, the glue from a configuration to data, model, training loop,
  metrics and baselines; ``rnnkit.load`` of a finished run;
* ``config``: every training option, its default and its checks.

Nothing below ``app`` imports from it: the library (cells up to diagnostics) is usable
from Python without a configuration or a command line.
"""
