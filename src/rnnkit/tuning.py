"""Process-wide tuning for a program that trains with rnnkit, and only when asked.

``import rnnkit`` changes nothing outside rnnkit: a library is a guest in its users'
programs (a web service, a notebook with other models). Two process-wide settings make
training faster on a shared machine, and the ``rnnkit`` command applies them to its own
process; a program that uses the library applies them with one call,
:func:`tune_process`:

* **OpenMP's idle threads spin ~10 µs, not ~1 ms, before they sleep**
  (``GOMP_SPINCOUNT=10000``; :func:`rnnkit.threads.configure_wait_policy`), so that a
  waiting thread does not take the CPU from the one it waits for. OpenMP reads it once,
  when torch loads it: the ``rnnkit`` command sets it before torch loads; a program sets
  ``GOMP_SPINCOUNT=10000`` in its environment before it starts.
* **Freed memory is kept for the next training step** (glibc's ``mallopt``;
  :func:`rnnkit.heap.keep_freed_memory`): without it a step's buffers go back to the
  kernel after every step and are page-faulted in again (docs/speed.md, "Memory kept
  between steps", has the measured cost).

Each is left alone where the user chose for themselves (``OMP_WAIT_POLICY`` or
``GOMP_SPINCOUNT`` set; a ``MALLOC_*_`` variable, a ``glibc.malloc`` tunable, another
allocator preloaded, or ``RNNKIT_KEEP_HEAP=0``).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

from rnnkit.heap import keep_freed_memory
from rnnkit.threads import configure_wait_policy

__all__ = [
    "interpreter_module",
    "interrupt_quietly_while_loading",
    "launched_as_command",
    "loaded",
    "tune_process",
]


def tune_process() -> dict[str, bool]:
    """Apply both settings (module docstring) to this process; which ones took effect.

    The OpenMP one only takes effect before torch is imported, so from a program that has
    imported rnnkit (and so torch) it reports False: set ``GOMP_SPINCOUNT`` there instead.

    >>> sorted(tune_process())
    ['keep_freed_memory', 'openmp_spin']
    """
    return {"openmp_spin": configure_wait_policy(), "keep_freed_memory": keep_freed_memory()}


def launched_as_command(argv: list[str] | None = None, orig_argv: list[str] | None = None) -> bool:
    """Whether this process is the ``rnnkit`` command (``rnnkit ...`` or ``python -m
    rnnkit ...``), not a program that imports the library.

    >>> launched_as_command(["/usr/bin/rnnkit", "train"], [])
    True
    >>> launched_as_command(["-m"], ["python", "-m", "rnnkit", "train"])
    True
    >>> launched_as_command(["app.py"], ["python", "app.py"])
    False
    >>> launched_as_command(["-m"], ["python", "-m", "pytest", "-m", "rnnkit"])  # a marker
    False
    """
    argv = sys.argv if argv is None else argv
    orig = list(getattr(sys, "orig_argv", [])) if orig_argv is None else orig_argv
    if argv and Path(argv[0]).name in ("rnnkit", "rnnkit.exe"):
        return True
    return interpreter_module(orig) == "rnnkit"


# The interpreter's options that take an argument (``-W ignore``, ``-X dev``): the next
# word, or the rest of the word (``-Wignore``), is theirs.
_OPTIONS_WITH_ARGUMENT = frozenset("WX")


def interpreter_module(orig_argv: list[str]) -> str | None:
    """The module the interpreter itself runs with ``-m`` (``python -B -m rnnkit``), read
    from its own options only: a ``-m rnnkit`` among a program's arguments (``python -m
    pytest -m rnnkit``, a pytest marker) is the program's, not the interpreter's.

    >>> interpreter_module(["python", "-X", "dev", "-Bm", "rnnkit", "train"])
    'rnnkit'
    >>> interpreter_module(["python", "app.py", "-m", "rnnkit"]), interpreter_module(["py"])
    (None, None)
    """
    words = iter(orig_argv[1:])
    for word in words:
        if word == "--check-hash-based-pycs":
            next(words, None)
            continue
        if word.startswith("--"):  # --version, --help ...; "--": a script follows
            if word == "--":
                return None
            continue
        if not word.startswith("-") or word == "-":  # a script, or standard input
            return None
        flags = word[1:]
        for i, flag in enumerate(flags):
            rest = flags[i + 1 :]
            if flag == "m":
                return rest or next(words, None)
            if flag == "c":
                return None
            if flag in _OPTIONS_WITH_ARGUMENT:
                if not rest:
                    next(words, None)
                break
    return None


def _interrupted_while_loading(signum: int, frame: Any) -> None:
    """Ctrl-C before the command runs: nothing is open or written yet; one line, exit 130
    (as the command's own Ctrl-C) instead of a traceback from inside torch's import."""
    os.write(2, b"rnnkit: interrupted\n")
    os._exit(130)  # not SystemExit: raised inside an import, a module could catch it


def interrupt_quietly_while_loading() -> None:
    """The ``rnnkit`` command's Ctrl-C while it loads torch (a second or two): one line
    and exit status 130, until :func:`loaded` gives Python's own handler back. Only the
    command calls it (a program's SIGINT handler is its own)."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not one of a user's
        signal.signal(signal.SIGINT, _interrupted_while_loading)


def loaded() -> None:
    """Python's own Ctrl-C handling again (KeyboardInterrupt, which the commands catch),
    where :func:`interrupt_quietly_while_loading` had replaced it."""
    if signal.getsignal(signal.SIGINT) is _interrupted_while_loading:
        signal.signal(signal.SIGINT, signal.default_int_handler)
