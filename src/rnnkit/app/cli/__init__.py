"""The ``rnnkit`` command line: parses options and calls the library, nothing more.

``main`` dispatches to one module per subcommand (``train``, ``evaluate``, ``predict``,
``generate``, ``score``, ``sessions``, ``report``, ``gradcheck``, ``build-native``),
imported only when its subcommand runs, so that ``rnnkit --help`` stays fast.
"""

from rnnkit.app.cli.main import main

__all__ = ["main"]
