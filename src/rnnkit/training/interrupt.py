"""Stopping training cleanly on SIGINT or SIGTERM: the step in flight is finished and
saved, then :class:`TrainingInterrupted` (exit status 130) ends the run."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

from rnnkit.errors import RnnkitError

__all__ = ["TrainingInterrupted"]


class TrainingInterrupted(RnnkitError):
    """SIGINT or SIGTERM arrived: the step in flight was finished and saved."""

    exit_code = 130


@contextlib.contextmanager
def stop_on_signals(flag: list[int]) -> Iterator[None]:
    """Turn SIGINT/SIGTERM into a request to stop after the current step (the signal's
    number is appended to ``flag``).

    A second signal while the first is pending stops at once (KeyboardInterrupt). Only
    the main thread can own signal handlers; elsewhere nothing is installed.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        if flag:
            raise KeyboardInterrupt
        flag.append(signum)

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
