"""Keep freed working memory in the process between training steps (glibc's malloc).

A training step allocates its buffers — the saved gates, states and their gradients, a
few MB to tens of MB — and frees them all at its end. glibc hands the top of its heap
back to the kernel whenever more than its *trim threshold* lies free there; that
threshold starts at 128 KiB and grows only to twice the largest mapped block freed so
far (at most 64 MiB). A step that frees more than that in all, in blocks each smaller,
has its memory returned to the kernel after every step, and the next step takes a page
fault on each 4 KiB page as it writes it again (the kernel zeroes each page), where
``torch.nn.LSTM`` takes none: thousands of faults a step and a slower step at a batch of
64 (the measurement: ``benchmarks/HISTORY.md``, "How the time loop got here", step 11;
``docs/speed.md``, "Memory kept between steps").

``keep_freed_memory`` sets the two thresholds to the values glibc's own rule ends at —
blocks up to 32 MiB from the heap, and up to 64 MiB of free heap kept — so that the
buffers of one step are reused by the next. Larger blocks are still mapped and unmapped
one by one, and the process keeps at most 64 MiB it does not use. The ``rnnkit`` command
calls it, and so does ``rnnkit.tune_process()`` (importing the library does not:
``rnnkit.tuning``), unless the user chose for themselves: any ``MALLOC_*_`` setting or
``glibc.malloc`` tunable, another allocator preloaded (jemalloc, tcmalloc, mimalloc),
or ``RNNKIT_KEEP_HEAP=0``. Without glibc (macOS, Windows, musl) it does nothing.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys
from typing import Protocol

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "keep_freed_memory", "user_chose_allocator"]

# mallopt's parameter numbers (<malloc.h>)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's ceiling for its dynamic mmap threshold
TRIM_THRESHOLD = 64 << 20  # twice that: where glibc's dynamic trim threshold ends

# The environment through which a user sets glibc's malloc (man 3 mallopt, tunables(7)).
_MALLOC_ENV = (
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "MALLOC_MMAP_MAX_",
    "MALLOC_ARENA_MAX",
)
_OTHER_ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc")


class _Libc(Protocol):
    def mallopt(self, param: int, value: int) -> int: ...


def user_chose_allocator(environ: dict[str, str] | os._Environ[str] | None = None) -> str | None:
    """The setting by which the user chose the allocator's behaviour, or None.

    >>> user_chose_allocator({"MALLOC_TRIM_THRESHOLD_": "0"})
    'MALLOC_TRIM_THRESHOLD_'
    >>> user_chose_allocator({"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"})
    'LD_PRELOAD'
    >>> user_chose_allocator({"PATH": "/usr/bin"}) is None
    True
    """
    env = os.environ if environ is None else environ
    if env.get("RNNKIT_KEEP_HEAP", "").strip() == "0":
        return "RNNKIT_KEEP_HEAP"
    for name in _MALLOC_ENV:
        if name in env:
            return name
    if "glibc.malloc." in env.get("GLIBC_TUNABLES", ""):
        return "GLIBC_TUNABLES"
    preload = env.get("LD_PRELOAD", "").lower()
    if any(name in preload for name in _OTHER_ALLOCATORS):
        return "LD_PRELOAD"
    return None


def _glibc() -> _Libc | None:
    """The C library when it is glibc (whose ``mallopt`` this module sets), else None."""
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return None
    try:  # glibc's soname where torch runs (find_library would run ldconfig)
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def keep_freed_memory(
    environ: dict[str, str] | os._Environ[str] | None = None, libc: _Libc | None = None
) -> bool:
    """Set glibc's mmap and trim thresholds (see the module's text); True if they were set.

    Does nothing (False) where the user chose the allocator's behaviour or the C library
    is not glibc. ``libc`` is for tests: an object with glibc's ``mallopt``.
    """
    if user_chose_allocator(environ) is not None:
        return False
    lib = libc if libc is not None else _glibc()
    if lib is None:
        return False
    # mallopt returns 1 on success; the mmap threshold first, since setting either one
    # turns glibc's dynamic adjustment off
    return bool(lib.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        lib.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
