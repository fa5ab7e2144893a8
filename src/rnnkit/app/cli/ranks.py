"""Error lines under torchrun said once, by rank 0, instead of once per process.

torchrun starts every process with the same command line, so a bad option or a missing
file fails in all of them alike. Each would print the same line; worse, torchrun ends
the others (SIGTERM) as soon as the first one exits, so whether rank 0's line shows at all
was a race. A process other than rank 0 therefore waits a moment before it speaks: when
rank 0 failed alike, torchrun ends the waiting process silently; an error of this process
alone (rank 0 still training, blocked in a collective) is printed after the wait.

The line also goes to the error file torchrun names (``TORCHELASTIC_ERROR_FILE``), so that
torchrun's own failure report shows it as the root cause instead of "To enable traceback
see: …". torchrun's root cause is the failure of the earliest time in those files, so the
time written is the moment the error was raised, not the end of the wait.

When one process fails alone (bad data of its own), the others' next collective breaks
(:class:`~rnnkit.training.distributed.PeerLost`): a consequence, not the cause. Such a
process says its line at once, then waits :data:`AFTER_PEER_WAIT_S`, longer than the
failing process's wait, before it writes torchrun's error file and exits: meanwhile the
failing process prints its own error, torchrun ends the waiting one, and its report names
the failing process's line as the root cause. (Before, rank 0 exited at once with gloo's
traceback, torchrun ended the failing process in its wait, and its error was never seen.)

torchrun's SIGTERM can come before the line is said: a process stopped by another's
death gets it within a tenth of a second. Training ended by an error holds SIGTERM
(:func:`~rnnkit.training.interrupt.hold_sigterm_until_said`, opened by the command line)
until :func:`say_error` has said the line, or, in a process other than rank 0, until it
starts its wait: a SIGTERM come meanwhile then ends the process, as it would have.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time

from rnnkit.training.interrupt import release_sigterm

__all__ = ["AFTER_PEER_WAIT_S", "OTHER_RANK_WAIT_S", "is_other_rank", "say_error"]

#: How long a process other than rank 0 waits for torchrun to end it before it prints its
#: own error line (torchrun ends the others within a second of the first failure).
OTHER_RANK_WAIT_S = 5.0


#: How long a process stopped by another's failure waits after saying so, before it writes
#: torchrun's error file and exits: longer than :data:`OTHER_RANK_WAIT_S`.
AFTER_PEER_WAIT_S = OTHER_RANK_WAIT_S + 2.0


def _launched() -> bool:
    """This process is one of several torchrun started."""
    return os.environ.get("WORLD_SIZE", "1") not in ("", "0", "1")


def is_other_rank() -> bool:
    """This process is one of several torchrun started, and not rank 0."""
    return _launched() and os.environ.get("RANK", "0") != "0"


def say_error(line: str, after_peer: bool = False) -> None:
    """Print the error ``line`` on stderr, after :data:`OTHER_RANK_WAIT_S` seconds in a
    process other than rank 0 (where torchrun's SIGTERM usually ends it first), and write
    it to torchrun's error file. ``after_peer``: the error is another process's failure
    reaching this one (module docstring): said at once, the error file after
    :data:`AFTER_PEER_WAIT_S`. A SIGTERM held since training ended by the error
    (:func:`~rnnkit.training.interrupt.release_sigterm`) ends the process once the line
    is said, or, in a process other than rank 0, as its wait begins."""
    failed_at = int(time.time())
    if after_peer:
        print(line, file=sys.stderr, flush=True)
        release_sigterm()  # said: torchrun's SIGTERM, come meanwhile, ends the process now
        if _launched():
            time.sleep(AFTER_PEER_WAIT_S)
        _error_file(line, int(time.time()))
        return
    other = is_other_rank()
    if other:
        sys.stderr.flush()
        release_sigterm()  # rank 0 says it: torchrun's SIGTERM ends this one silently
        time.sleep(OTHER_RANK_WAIT_S)
    print(line, file=sys.stderr, flush=True)
    _error_file(line, failed_at)
    if not other:
        release_sigterm()


def _error_file(line: str, timestamp: int) -> None:
    """``line`` into the error file torchrun names, with the failure's ``timestamp``."""
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if error_file and os.environ.get("WORLD_SIZE") is not None:
        # torchrun's format (its report shows "py_callstack": here the line itself, no
        # traceback); failing to write it must not hide the error itself
        info = {"py_callstack": line, "timestamp": str(timestamp)}
        with contextlib.suppress(OSError), open(error_file, "w", encoding="utf-8") as f:
            json.dump({"message": {"message": line, "extraInfo": info}}, f)
