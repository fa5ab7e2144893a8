"""The compiled time loop: the same forward and explicit BPTT as ``recurrence.py``, in C++.

The pure-PyTorch loop of ``recurrence.py`` pays 3–5 µs of Python and dispatch per eager
op, a dozen ops per step; at small sizes that is most of the time. This module compiles
the C++ sources of ``rnnkit/csrc`` (once, on first use, into a per-user cache): one loop
per cell kind (``rnn.h``, ``lstm.h``, ``gru.h``, ``layer_norm.h`` for the
layer-normalised LSTM and GRU; entry points in ``loop.cpp``) that does, per
step, ONE matrix product (float32: W_hh packed once per call and a register-blocked
kernel, AVX-512 where the CPU has it, else AVX2; float64: the BLAS torch links) and ONE
fused pass of the gate math over contiguous rows — forward, and the hand-written backward
of ``cells/*.py``. Input projections and every weight gradient stay single large matrix
products in ``recurrence.py`` (the weight gradients on the library's ``matmul``, the same
kernel over all steps' rows where the CPU has AVX-512: there torch's BLAS may take its
AVX2 path at half the machine's rate, as MKL does on AMD processors), except that for a
narrow LSTM (``I + H ≤ 512``, 4 rows a thread, ``rnnkit.cells.lstm.input_in_loop``) the
loop also multiplies each step's inputs
(``x_t W_ihᵀ`` beside ``h_{t-1} W_hhᵀ``; backward ``d_x_t = d_gates_t W_ih``), which is
faster there than one product of all steps' rows before and after it. This module only
replaces the two loops over time and fills the same buffers (``ForwardRecord`` and
``Sweep``), so either loop's forward pairs with either loop's backward.

Sequences are independent, so each thread runs the whole loop over its own block of rows
(no synchronisation per step). Rows that have finished stop costing: at step t only rows
``0 .. act_t − 1`` are computed, ``act_t − 1`` being the last row with a real step at or
after t (``run_recurrence`` sorts rows by their last real step, like packed sequences, and
may pack the step buffers to those rows: ``recurrence.Packing``); a hole inside that range
still holds the state by selection, as in the PyTorch loop.

Availability: CPU tensors, float32 and float64 (a layer with float16/bfloat16 weights
computes in float32 on the CPU and so runs here too: ``rnnkit.cells.amp``), when a C++
compiler is present (``$CXX``, else ``c++``; the cache is ``$RNNKIT_CACHE``, else
``~/.cache/rnnkit``). If the build or the load fails, one warning line is logged and
``recurrence.py`` uses its PyTorch loop, which stays the oracle (``RNNKIT_NATIVE=0`` or
``use_native(False)`` selects it explicitly); a failed build is remembered in the cache
and not retried by later processes.
The library is named by a hash of the sources, the compiler flags and the torch version;
beside it, a ``.log`` keeps the compiler command and output of its build.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import sys
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from rnnkit import messages
from rnnkit.data.locks import lock as lock_file

__all__ = ["available", "build", "library", "own_matmul", "supports", "use_native"]

_state: dict[str, object] = {"loaded": None, "failed": False}
_lock = threading.Lock()  # one load per process: a namespace registers only once
_enabled = os.environ.get("RNNKIT_NATIVE", "1").strip().lower() not in ("0", "false", "no", "off")

#: The C++ sources (``loop.cpp`` and its headers), shipped in the package so that an
#: installed wheel builds them on first use like a source checkout.
CSRC = Path(__file__).resolve().parents[1] / "csrc"  # rnnkit/csrc


def _sources() -> list[Path]:
    """Every file the build reads (``loop.cpp`` includes the headers)."""
    return sorted(p for p in CSRC.iterdir() if p.suffix in (".cpp", ".h"))


def _flags() -> list[str]:
    flags = ["-O3", "-std=c++20", "-fPIC", "-shared", "-fopenmp"]
    flags += ["-fno-math-errno", "-fno-trapping-math", "-Wall", "-Wextra"]
    if platform.machine() in ("x86_64", "AMD64"):
        capability = torch.backends.cpu.get_cpu_capability()
        if capability == "AVX512":  # AVX-512 (F, BW, CD, DQ, VL): 16 floats an instruction
            flags.append("-march=x86-64-v4")
        elif capability == "AVX2":
            flags.append("-march=x86-64-v3")  # AVX2 + FMA: the gate loops vectorise
    return flags


def _first_error(output: str) -> str:
    """The compiler's first error, ``file:line:column: error: …``, naming the real source
    (the build compiles the package's own files, never a copy); else its last lines."""
    for line in output.splitlines():
        if ": error: " in line or ": fatal error: " in line:
            return line.strip()
    return " | ".join(output.strip().splitlines()[-3:])


def _cpp_extension() -> Any:
    """``torch.utils.cpp_extension``, imported without its one warning about CUDA's
    toolkit: a CUDA build of torch on a machine without a GPU logs "No CUDA runtime is
    found" when the module is first imported, about a toolkit the CPU loop never uses.
    The logger's level is restored at once."""
    logger = logging.getLogger("torch.utils.cpp_extension")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        from torch.utils import cpp_extension
    finally:
        logger.setLevel(level)
    return cpp_extension


# The build is one compiler command run here rather than torch.utils.cpp_extension.load:
# load() needs ninja (not a dependency of rnnkit), builds a Python extension module
# (Python headers, libtorch_python; the loop only registers torch operators, loaded with
# torch.ops.load_library), and guards concurrent builds with a lock file that a killed
# build leaves behind, so that later processes wait on it forever; the flock of _load is
# released by the kernel. The include paths and the C++ ABI flag are torch's own.
def _compile(csrc: Path, out: Path, log: Path) -> None:
    """Compile ``csrc/loop.cpp`` into the shared library ``out``; the command and the
    compiler's output go to ``log``. Raises RuntimeError with the first error."""
    cpp_extension = _cpp_extension()

    torch_lib = Path(torch.__file__).resolve().parent / "lib"
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    cxx = os.environ.get("CXX", "c++")
    cmd = [cxx, *_flags(), f"-D_GLIBCXX_USE_CXX11_ABI={abi}"]
    # torch's headers as system headers: the compiler stays quiet about THEIR warnings
    # (-Wextra finds unused parameters in ATen and c10) and reports every one of ours.
    for include in cpp_extension.include_paths():
        cmd += ["-isystem", include]
    cmd += [str(csrc / "loop.cpp"), "-o", str(out), f"-L{torch_lib}", f"-Wl,-rpath,{torch_lib}"]
    cmd += ["-lc10", "-ltorch_cpu"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    output = (proc.stdout + proc.stderr).strip()
    log.write_text(" ".join(cmd) + "\n" + output + "\n")
    if proc.returncode != 0:
        error = _first_error(output) or f"{cxx} exited with {proc.returncode}"
        raise RuntimeError(f"{error} (the compiler's output: {log})")


def _build(target: Path) -> None:
    # Compiled next to the target (the same file system), then renamed: atomic, so a
    # concurrent reader sees all of the library or none of it.
    out = target.with_name(f"{target.stem}.{os.getpid()}.tmp")
    try:
        _compile(CSRC, out, target.with_suffix(".log"))
        os.replace(out, target)
    finally:
        out.unlink(missing_ok=True)


def _cache_dir() -> Path:
    """``$RNNKIT_CACHE``, else ``$XDG_CACHE_HOME/rnnkit``, else ``~/.cache/rnnkit``."""
    if os.environ.get("RNNKIT_CACHE"):
        return Path(os.environ["RNNKIT_CACHE"])
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "rnnkit"


def _paths() -> tuple[Path, Path]:
    """The library these sources, these flags and this torch build into, and the marker a
    failed build with this compiler leaves."""
    key = hashlib.sha256()
    for path in _sources():
        key.update(f"{path.name}\0".encode() + path.read_bytes() + b"\0")
    key.update("\0".join([*_flags(), torch.__version__, sys.platform]).encode())
    digest = key.hexdigest()[:16]
    cache = _cache_dir()
    # A failed build is not retried by later processes with the same compiler (a missing
    # compiler would otherwise cost every process a failed run); another $CXX tries again.
    cxx_tag = hashlib.sha256(os.environ.get("CXX", "c++").encode()).hexdigest()[:8]
    return cache / f"rnnkit_native_{digest}.so", cache / f"rnnkit_native_{digest}_{cxx_tag}.failed"


def _load() -> bool:
    target, failed = _paths()
    cache = target.parent
    cache.mkdir(parents=True, exist_ok=True)
    if not target.exists():
        with open(target.with_suffix(".lock"), "w") as lock:
            lock_file(lock.fileno())  # one process builds, the others wait
            if failed.exists():
                raise RuntimeError(f"{failed.read_text().strip()} (delete {failed} to retry)")
            if not target.exists():
                try:
                    cxx = os.environ.get("CXX", "c++")
                    if shutil.which(cxx) is None:
                        raise RuntimeError(f"no C++ compiler: {cxx} not found")
                    # The first use must not look hung: say what the wait is, and where.
                    messages.info(f"building the compiled time loop (once, ~30 s) into {cache}…")
                    _build(target)
                except Exception as exc:
                    failed.write_text(str(exc))
                    raise
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.ops.load_library(str(target))
    return True


def build() -> Path:
    """Build (or find) the compiled loop now, retrying a build that failed before; return
    the library's path. Raises RuntimeError saying why it cannot be built.

    ``rnnkit build-native`` calls it, e.g. right after installing, so that the first
    training does not wait for the compiler.
    """
    target, failed = _paths()
    failed.unlink(missing_ok=True)  # asked for explicitly: try again
    if _state["loaded"] is None:
        with _lock:
            _load()
            _state["loaded"], _state["failed"] = torch.ops.rnnkit_native, False
    return target


def library() -> object | None:
    """``torch.ops.rnnkit_native`` (built on first use), or None where unavailable."""
    if not _enabled or _state["failed"]:
        return None
    if _state["loaded"] is None:
        with _lock:
            if _state["loaded"] is None and not _state["failed"]:
                try:
                    _load()
                    _state["loaded"] = torch.ops.rnnkit_native
                except Exception as exc:  # any build or load failure: the PyTorch loop
                    _state["failed"] = True
                    messages.warning(
                        f"compiled time loop unavailable ({exc}); using the PyTorch loop"
                    )
    return _state["loaded"]


def own_matmul() -> bool:
    """Whether the compiled library's ``matmul`` runs its own kernel for large float32
    products (built for AVX-512), where torch's BLAS may take a slower path (MKL's AVX2
    path on AMD processors); False without the library. Elsewhere ``matmul`` is torch's
    product and there is nothing to gain by calling it."""
    lib: Any = library()
    if lib is None:
        return False
    if "own_matmul" not in _state:  # asked once: a layer asks at every call
        _state["own_matmul"] = bool(lib.own_matmul())
    return bool(_state["own_matmul"])


def supports(*tensors: Tensor | None) -> bool:
    """Whether the compiled loop handles these tensors (CPU, float32/float64)."""
    return all(
        t is None or (t.device.type == "cpu" and t.dtype in (torch.float32, torch.float64))
        for t in tensors
    )


def available() -> bool:
    """Whether the compiled loop is enabled and built (builds it if needed)."""
    return library() is not None


@contextlib.contextmanager
def use_native(enabled: bool) -> Iterator[None]:
    """Select the compiled loop (True) or the PyTorch loop (False) inside the block.

    >>> with use_native(False):
    ...     pass
    """
    global _enabled
    before = _enabled
    _enabled = bool(enabled)
    try:
        yield
    finally:
        _enabled = before
