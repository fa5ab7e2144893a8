"""SIGTERM between an error that ended training and the line that says it: held until
the line is said, then acted on (the process ends as the signal asked)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

# Training (``stop_on_signals``) ends by ERROR; a SIGTERM comes AT a moment; the command
# line says the error, releases the hold, and would go on to "after".
_SCRIPT = """
import contextlib, os, signal, sys
from rnnkit.training.interrupt import (
    TrainingInterrupted, hold_sigterm_until_said, release_sigterm, stop_on_signals)

error, at, scope = sys.argv[1:4]
errors = {"peer": RuntimeError("another process died"),
          "stopped": TrainingInterrupted("stopped by SIGTERM after step 3")}
hold = hold_sigterm_until_said() if scope == "cli" else contextlib.nullcontext()
with hold:
    try:
        with stop_on_signals(flag := []):
            if at == "training":
                os.kill(os.getpid(), signal.SIGTERM)
                assert flag == [signal.SIGTERM]  # a request to stop after the step
            raise errors[error]
    except Exception as exc:
        if at == "unwinding":
            os.kill(os.getpid(), signal.SIGTERM)
        print(f"said: {exc}", flush=True)
        release_sigterm()
print("after", flush=True)
"""


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_SCRIPT), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("error", "at", "scope", "stdout", "returncode"),
    [
        # the race: SIGTERM after the loop's handler is gone, before the line
        ("peer", "unwinding", "cli", "said: another process died\n", -signal.SIGTERM),
        # a SIGTERM during training that an error overtook: acted on after the line too
        ("peer", "training", "cli", "said: another process died\n", -signal.SIGTERM),
        # the SIGTERM that stopped training was heeded: not acted on a second time
        ("stopped", "training", "cli", "said: stopped by SIGTERM after step 3\nafter\n", 0),
        ("peer", "nowhere", "cli", "said: another process died\nafter\n", 0),
        # from Python (no command line to say a line): SIGTERM's own handler is back
        ("peer", "unwinding", "python", "", -signal.SIGTERM),
    ],
)
def test_sigterm_is_held_from_the_error_until_its_line_is_said(
    error, at, scope, stdout, returncode
):
    res = _run(error, at, scope)
    assert (res.stdout, res.returncode) == (stdout, returncode), res.stderr[-2000:]


def test_the_hold_ends_with_its_block_and_puts_back_the_handler():
    from rnnkit.training import interrupt

    before = signal.getsignal(signal.SIGTERM)
    with interrupt.hold_sigterm_until_said():
        with pytest.raises(RuntimeError), interrupt.stop_on_signals([]):
            raise RuntimeError("a collective broke")
        assert signal.getsignal(signal.SIGTERM) == interrupt._HOLD.held
    assert signal.getsignal(signal.SIGTERM) == before
    with interrupt.hold_sigterm_until_said():
        with interrupt.stop_on_signals([]):
            pass
        assert signal.getsignal(signal.SIGTERM) == before  # ended well: nothing held
