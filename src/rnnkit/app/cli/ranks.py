"""Error lines under torchrun said once, by rank 0, instead of once per process.

torchrun starts every process with the same command line, so a bad option or a missing
file fails in all of them alike. Each would print the same line; worse, torchrun ends
the others (SIGTERM) as soon as the first one exits, so whether rank 0's line shows at all
was a race. A process other than rank 0 therefore waits a moment before it speaks: when
rank 0 failed alike, torchrun ends the waiting process silently; an error of this process
alone (rank 0 still training, blocked in a collective) is printed after the wait.

The line also goes to the error file torchrun names (``TORCHELASTIC_ERROR_FILE``), so that
torchrun's own failure report shows it as the root cause instead of "To enable traceback
see: …".
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time

__all__ = ["OTHER_RANK_WAIT_S", "is_other_rank", "say_error"]

#: How long a process other than rank 0 waits for torchrun to end it before it prints its
#: own error line (torchrun ends the others within a second of the first failure).
OTHER_RANK_WAIT_S = 5.0


def is_other_rank() -> bool:
    """This process is one of several torchrun started, and not rank 0."""
    rank, world = os.environ.get("RANK", "0"), os.environ.get("WORLD_SIZE", "1")
    return rank != "0" and world not in ("", "0", "1")


def say_error(line: str) -> None:
    """Print the error ``line`` on stderr, after :data:`OTHER_RANK_WAIT_S` seconds in a
    process other than rank 0 (where torchrun's SIGTERM usually ends it first)."""
    if is_other_rank():
        sys.stderr.flush()
        time.sleep(OTHER_RANK_WAIT_S)
    print(line, file=sys.stderr)
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if error_file and os.environ.get("WORLD_SIZE") is not None:
        # torchrun's format (its report shows "py_callstack": here the line itself, no
        # traceback); failing to write it must not hide the error itself
        info = {"py_callstack": line, "timestamp": str(int(time.time()))}
        with contextlib.suppress(OSError), open(error_file, "w", encoding="utf-8") as f:
            json.dump({"message": {"message": line, "extraInfo": info}}, f)
