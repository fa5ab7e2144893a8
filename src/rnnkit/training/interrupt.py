"""Stopping training cleanly on SIGINT or SIGTERM: the step in flight is finished and
saved, then :class:`TrainingInterrupted` (exit status 130) ends the run.

When training ends by an error instead, the command line has a line to say about it
before the process may go. A launcher's SIGTERM often comes right then: torchrun ends
the other processes within a tenth of a second of one dying, and the others' error is
that death reaching them. With the default action, a SIGTERM between the end of the loop
and the line killed the process silently. Within :func:`hold_sigterm_until_said`, a
SIGTERM from that moment on is held until :func:`release_sigterm` (the line is said),
then acted on as usual.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

from rnnkit.errors import RnnkitError

__all__ = ["TrainingInterrupted", "hold_sigterm_until_said", "release_sigterm"]


class TrainingInterrupted(RnnkitError):
    """SIGINT or SIGTERM arrived: the step in flight was finished and saved."""

    exit_code = 130


class _Hold:
    """SIGTERM between an error that ended training and the line that says it."""

    def __init__(self) -> None:
        self.scopes = 0  # open :func:`hold_sigterm_until_said` blocks
        self.restore: Any = None  # SIGTERM's handler to put back; None: not holding
        self.arrived = False  # a SIGTERM came while held (or unheeded by the loop)

    def held(self, signum: int, frame: Any) -> None:
        self.arrived = True


_HOLD = _Hold()


@contextlib.contextmanager
def hold_sigterm_until_said() -> Iterator[None]:
    """Within it, training ended by an error holds SIGTERM until :func:`release_sigterm`
    (the error's line is said) or the end of the block, whichever comes first.

    Only the command line, which says the line, opens it: from Python, an error leaves
    :meth:`~rnnkit.training.loop.Trainer.fit` with SIGTERM's handler as it was before.
    """
    _HOLD.scopes += 1
    try:
        yield
    finally:
        _HOLD.scopes -= 1
        release_sigterm()


def release_sigterm() -> None:
    """End a hold (nothing when none): SIGTERM's own handler back, and a SIGTERM that
    arrived meanwhile delivered now (by default, the process ends as that signal asked)."""
    if _HOLD.restore is None:
        return
    handler, arrived = _HOLD.restore, _HOLD.arrived
    _HOLD.restore, _HOLD.arrived = None, False
    signal.signal(signal.SIGTERM, handler)
    if arrived:
        signal.raise_signal(signal.SIGTERM)


def _hold(old: Any, unheeded: bool) -> None:
    """SIGTERM held from now on instead of ``old`` coming back (no moment without
    a handler); ``unheeded``: one came during training and did not stop it."""
    if _HOLD.restore is None:
        _HOLD.restore = old
    _HOLD.arrived = _HOLD.arrived or unheeded
    signal.signal(signal.SIGTERM, _HOLD.held)


@contextlib.contextmanager
def stop_on_signals(flag: list[int]) -> Iterator[None]:
    """Turn SIGINT/SIGTERM (and SIGHUP, unless ignored) into a request to stop after the
    current step (the signal's number is appended to ``flag``).

    A second signal while the first is pending stops at once (KeyboardInterrupt). Only
    the main thread can own signal handlers; elsewhere nothing is installed. An error
    that ends the block within :func:`hold_sigterm_until_said` holds SIGTERM from here;
    a SIGTERM of ``flag`` that did not stop training is then held too. A signal of
    ``flag`` that the block did not stop for (it ended on its own) is raised again once
    the handlers found on entry are back: it reaches the program's own.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        if flag:
            raise KeyboardInterrupt
        flag.append(signum)

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    # SIGHUP (the terminal closed, an ssh session dropped) killed a run without its step;
    # under nohup it is ignored, and stays so
    hangup = getattr(signal, "SIGHUP", None)
    if hangup is not None and signal.getsignal(hangup) is not signal.SIG_IGN:
        old[hangup] = signal.signal(hangup, handler)
    failed = heeded = False
    try:
        yield
    except BaseException as exc:
        failed = True
        # the stop a signal asked for (or the second signal's at once) ended the run
        heeded = isinstance(exc, (TrainingInterrupted, KeyboardInterrupt))
        raise
    finally:
        signal.signal(signal.SIGINT, old[signal.SIGINT])
        if hangup in old:
            signal.signal(hangup, old[hangup])
        if failed and _HOLD.scopes:
            _hold(old[signal.SIGTERM], signal.SIGTERM in flag and not heeded)
        else:
            signal.signal(signal.SIGTERM, old[signal.SIGTERM])
        if flag and not failed:
            # The block ended on its own (the last step, early stopping, the time budget)
            # with a signal pending: the program's handler gets it now, as if it had come
            # just after; it was lost (a service's shutdown request gone).
            signal.raise_signal(flag[0])
