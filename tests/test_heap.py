"""Keeping freed memory: who may decide, what is set, and the page faults it saves."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from rnnkit import heap
from rnnkit.heap import (
    M_MMAP_THRESHOLD,
    M_TRIM_THRESHOLD,
    MMAP_THRESHOLD,
    TRIM_THRESHOLD,
    keep_freed_memory,
    user_chose_allocator,
)


class FakeLibc:
    def __init__(self, result: int = 1) -> None:
        self.calls: list[tuple[int, int]] = []
        self.result = result

    def mallopt(self, param: int, value: int) -> int:
        self.calls.append((param, value))
        return self.result


@pytest.mark.parametrize(
    ("environ", "chosen"),
    [
        ({}, None),
        ({"PATH": "/usr/bin", "LD_PRELOAD": "libfoo.so"}, None),
        ({"RNNKIT_KEEP_HEAP": "0"}, "RNNKIT_KEEP_HEAP"),
        ({"RNNKIT_KEEP_HEAP": "1"}, None),
        ({"MALLOC_TRIM_THRESHOLD_": "131072"}, "MALLOC_TRIM_THRESHOLD_"),
        ({"MALLOC_MMAP_THRESHOLD_": "0"}, "MALLOC_MMAP_THRESHOLD_"),
        ({"MALLOC_ARENA_MAX": "2"}, "MALLOC_ARENA_MAX"),
        ({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=0"}, "GLIBC_TUNABLES"),
        ({"GLIBC_TUNABLES": "glibc.pthread.rseq=0"}, None),
        ({"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"}, "LD_PRELOAD"),
        ({"LD_PRELOAD": "/opt/libmimalloc.so"}, "LD_PRELOAD"),
    ],
)
def test_user_chose_allocator(environ: dict[str, str], chosen: str | None) -> None:
    assert user_chose_allocator(environ) == chosen


def test_sets_the_mmap_threshold_then_the_trim_threshold() -> None:
    libc = FakeLibc()
    assert keep_freed_memory({}, libc) is True
    assert libc.calls == [(M_MMAP_THRESHOLD, 32 << 20), (M_TRIM_THRESHOLD, 64 << 20)]
    assert (MMAP_THRESHOLD, TRIM_THRESHOLD) == (32 << 20, 64 << 20)


def test_leaves_a_user_choice_alone() -> None:
    libc = FakeLibc()
    assert keep_freed_memory({"MALLOC_TOP_PAD_": "0"}, libc) is False
    assert keep_freed_memory({"RNNKIT_KEEP_HEAP": "0"}, libc) is False
    assert libc.calls == []


def test_reports_a_refused_setting() -> None:
    assert keep_freed_memory({}, FakeLibc(result=0)) is False


def test_without_glibc_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(heap.platform, "libc_ver", lambda: ("", ""))
    assert heap._glibc() is None
    assert keep_freed_memory({}) is False


_CHURN = """
import ctypes, resource, torch, rnnkit

rnnkit.tune_process()  # a program's explicit choice: importing rnnkit alone changes nothing

# Count faults in 4 KiB pages: where transparent huge pages are on for every mapping, one
# fault can fill 2 MiB and the count would say little about what was handed back.
assert ctypes.CDLL(None).prctl(41, 1, 0, 0, 0) == 0  # PR_SET_THP_DISABLE

def churn():  # a step's worth of buffers: 8 blocks of 4 MiB, written, then all freed
    bufs = [torch.empty(1 << 20).fill_(1.0) for _ in range(8)]
    del bufs

churn()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    churn()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) // 5)
"""


def _faults_per_churn(keep: str) -> int:
    env = {**os.environ, "RNNKIT_KEEP_HEAP": keep}
    for name in ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_"):
        env.pop(name, None)
    out = subprocess.run(
        [sys.executable, "-c", _CHURN], env=env, capture_output=True, text=True, check=True
    )
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
    reason="the thresholds are glibc's",
)
@pytest.mark.skipif(
    any(a in os.environ.get("LD_PRELOAD", "") for a in ("jemalloc", "tcmalloc", "mimalloc")),
    reason="another allocator is preloaded",
)
def test_freed_buffers_are_reused_instead_of_faulted_in_again() -> None:
    pages = 8 * (4 << 20) // 4096  # what one churn writes
    # glibc's own thresholds hand back all of the 32 MiB after every churn, or a part of
    # it when small allocations land above some blocks (it varies with the address
    # layout: in 56 runs, 8,156 faults a churn in 41 and 1,833 in 15) ...
    handed_back = _faults_per_churn("0")
    # ... kept, the next churn reuses the same pages (0 or 204 faults)
    kept = _faults_per_churn("1")
    assert kept < pages // 8 < handed_back
