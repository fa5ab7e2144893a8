"""Exclusive locks on open files, on every platform Python runs on.

``fcntl.flock`` where it exists (Linux, macOS, the BSDs): the kernel releases the lock
when the holder's file is closed or the holder exits, however it exits. On Windows,
``msvcrt.locking`` on the file's first byte, released the same way. Elsewhere no lock can
be taken and :func:`lock` says so by returning True at once (nothing else runs there
that could hold it). ``fcntl`` is imported here, where it is used, so that ``import
rnnkit`` works where it does not exist.
"""

from __future__ import annotations

import errno
import os
import time
from types import ModuleType

__all__ = ["lock"]


def _module(name: str) -> ModuleType | None:
    try:
        return __import__(name)
    except ImportError:
        return None


def lock(fd: int, blocking: bool = True) -> bool:
    """Lock the open file ``fd`` for this process: True once held; with
    ``blocking=False``, False at once if another process holds it.

    >>> import tempfile
    >>> with tempfile.TemporaryFile() as f:
    ...     lock(f.fileno(), blocking=False)
    True
    """
    fcntl = _module("fcntl")
    if fcntl is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except OSError as exc:
            if blocking or exc.errno not in (errno.EWOULDBLOCK, errno.EACCES):
                raise
            return False
        return True
    msvcrt = _module("msvcrt")
    if msvcrt is None:
        return True
    os.lseek(fd, 0, os.SEEK_SET)
    while True:  # Windows: the file's first byte; a blocking lock polls
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
            return True
        except OSError:
            if not blocking:
                return False
            time.sleep(0.1)
