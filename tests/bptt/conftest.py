"""Fixtures of the time-loop tests."""

from __future__ import annotations

import os
import sys

import pytest

KERNELS = "rnnkit.bptt.triton_kernels"


@pytest.fixture(scope="module")
def triton_interpreter():
    """Triton's interpreter for one test module's kernels (``rnnkit.bptt.gpu_steps`` on
    the CPU); nothing of it stays afterwards (triton reads the variable when the kernels
    are decorated, at their import)."""
    before = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    sys.modules.pop(KERNELS, None)
    yield
    sys.modules.pop(KERNELS, None)
    if before is None:
        del os.environ["TRITON_INTERPRET"]
    else:
        os.environ["TRITON_INTERPRET"] = before
