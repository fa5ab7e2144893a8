"""What rnnkit says on stderr, and how much: the ``rnnkit`` logger of the standard
``logging`` module, with one level for every command and for library use.

=========  ============  ==============================================================
verbosity  logging level  what is shown on stderr
=========  ============  ==============================================================
``-v``     ``DEBUG``      and details: a line per ``--log-every`` training record and per
                          validation, the effective configuration, what was loaded
(none)     ``INFO``       progress bars, summaries and notes (the default)
``-q``     ``WARNING``    warnings and errors only
``-qq``    ``ERROR``      errors only
=========  ============  ==============================================================

Results (stdout) never depend on the level: ``-q`` silences the talk, not the answer.

The logger has a handler of its own, installed when this module is first imported, that
writes ``rnnkit: <message>`` (``rnnkit: warning: <message>`` for warnings) to whatever
``sys.stderr`` is at that moment, through ``tqdm.write`` on a terminal so that a line never
tears a progress bar. It does not propagate to the root logger (as ``transformers`` does),
so a program's own ``logging.basicConfig`` does not print every line twice; such a program
can change the level with :func:`set_verbosity` or ``logging.getLogger("rnnkit")``.

>>> set_verbosity(-1); level_name()
'WARNING'
>>> set_verbosity(0); level_name()
'INFO'
"""

from __future__ import annotations

import logging
import re
import sys
import warnings
from typing import TextIO

__all__ = [
    "LOGGER",
    "debug",
    "info",
    "level_name",
    "quiet_in_module",
    "set_verbosity",
    "verbosity",
    "warning",
]

LOGGER = logging.getLogger("rnnkit")

# verbosity (the count of -v minus the count of -q) -> logging level
_LEVELS = {1: logging.DEBUG, 0: logging.INFO, -1: logging.WARNING, -2: logging.ERROR}


class _StderrHandler(logging.Handler):
    """Writes to the current ``sys.stderr`` (not the one of import time: pytest and
    programs replace it), via ``tqdm.write`` on a terminal where a bar may be drawn."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
            stream: TextIO = sys.stderr
            isatty = getattr(stream, "isatty", None)
            if isatty is not None and isatty():
                from tqdm import tqdm  # clears the bar, writes the line, redraws the bar

                tqdm.write(text, file=stream)
            else:
                stream.write(text + "\n")
                stream.flush()
        except BrokenPipeError:
            raise
        except Exception:
            self.handleError(record)


class _Formatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        who = getattr(record, "who", "rnnkit")
        label = getattr(record, "label", None)
        if label is None:
            label = {logging.WARNING: "warning"}.get(record.levelno, "")
            label = "error" if record.levelno >= logging.ERROR else label
        return f"{who}: {label + ': ' if label else ''}{record.getMessage()}"


def _install() -> None:
    if any(isinstance(h, _StderrHandler) for h in LOGGER.handlers):
        return  # a reload of this module must not add a second handler
    handler = _StderrHandler()
    handler.setFormatter(_Formatter())
    LOGGER.addHandler(handler)
    LOGGER.propagate = False
    LOGGER.setLevel(logging.INFO)


_install()


def set_verbosity(level: int) -> None:
    """Set the level from a verbosity count: 1 or more ``DEBUG``, 0 ``INFO`` (the
    default), -1 ``WARNING``, -2 or less ``ERROR``."""
    LOGGER.setLevel(_LEVELS[max(-2, min(1, level))])


def verbosity() -> int:
    """The verbosity count the logger's level stands for (the inverse of
    :func:`set_verbosity`; a level set by other means rounds to the nearest below)."""
    level = LOGGER.getEffectiveLevel()
    if level <= logging.DEBUG:
        return 1
    if level <= logging.INFO:
        return 0
    return -1 if level <= logging.WARNING else -2


def level_name() -> str:
    return logging.getLevelName(LOGGER.getEffectiveLevel())


def debug(message: str, who: str = "rnnkit") -> None:
    """A detail, shown with ``-v``."""
    LOGGER.debug(message, extra={"who": who})


def info(message: str, who: str = "rnnkit") -> None:
    """A note or summary (``rnnkit: <message>``), hidden by ``-q``."""
    LOGGER.info(message, extra={"who": who})


def warning(message: str, who: str = "rnnkit", label: str = "warning") -> None:
    """A warning (``rnnkit: warning: <message>``; ``label`` replaces ``warning``, for a
    message that names its own kind), hidden by ``-qq``."""
    LOGGER.warning(message, extra={"who": who, "label": label})


def quiet_in_module(message: str, module: str) -> None:
    """Ignore the warnings whose text matches ``message`` (a regular expression, from its
    start) that the code of ``module`` (a ``__name__``) raises, and no others: a note of
    torch's about rnnkit's own call, which would reach users as if their program had
    caused it.

    One filter at the front of ``warnings.filters``, put there again only when it is not
    in force: a ``warnings.catch_warnings()`` block of the caller's removed it, or a
    filter of the caller's (not another of these) went before it. Call it before each
    call that may warn, not once at import: importing rnnkit changes no filter. A
    ``catch_warnings()`` around each call instead would empty every module's record of
    warnings already shown (each change of the filters does), so that every "default"
    warning of the program, meant to show once, showed again after each call; and it
    swaps the process-wide filter list, which threads calling at once would leave in
    either thread's state.
    """
    pattern = re.escape(module) + r"\Z"
    for action, msg, category, mod, lineno in warnings.filters:
        text, where = getattr(msg, "pattern", None), getattr(mod, "pattern", None)
        mine = category is Warning and lineno == 0  # not a user's narrower near-copy
        if action == "ignore" and text == message and where == pattern and mine:
            return  # in force: only filters of this function's went before it
        if action != "ignore" or not (where or "").startswith(r"rnnkit\."):
            break
    warnings.filterwarnings("ignore", message=message, module=pattern)
