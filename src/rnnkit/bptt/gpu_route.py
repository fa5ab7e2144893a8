"""Whether the Triton GPU steps (:mod:`rnnkit.bptt.gpu_steps`) run a layer: the functions
they compute, whether triton imports and runs on the device, and the choice that
``RNNKIT_GPU_PATH`` forces (:func:`rnnkit.bptt.fused.use_fused`).

By default (``"auto"``) the steps run CUDA tensors whose function PyTorch's fused kernels
do not compute, where triton imports and a one-element probe kernel builds and runs on
the device (checked once per device; where it does not, the loop runs, with one warning);
``"triton"`` forces them wherever they compute the function, on any device (the CPU only
in Triton's interpreter, ``TRITON_INTERPRET=1``), and says in one error why they cannot.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import warnings

import torch
from torch import Tensor

from rnnkit.bptt.fused import _path
from rnnkit.bptt.gpu_graphs import capturing as _capturing
from rnnkit.bptt.gpu_steps_ln import LN_KERNELS
from rnnkit.bptt.regularized import RegularizedKernel
from rnnkit.cells.gru import GRUKernel
from rnnkit.cells.kernel import Kernel
from rnnkit.cells.lstm import LSTMKernel
from rnnkit.cells.rnn import RNNKernel
from rnnkit.errors import ConfigError

__all__ = ["steps_handle", "steps_record", "triton_available", "wants_steps"]

_DTYPES = (torch.float32, torch.float64)
_PROBE = "rnnkit.bptt.triton_kernels"  # the kernels module with the first-use probe
_found: dict[str, bool] = {}
_why: dict[str, str | None] = {}  # _runs_on's answers, by device
_warned: set[str] = set()  # the devices _warn_once has warned of


def triton_available() -> bool:
    """Whether triton imports (looked up once)."""
    if "triton" not in _found:
        try:
            importlib.import_module("triton")
            _found["triton"] = True
        except ImportError:
            _found["triton"] = False
    return _found["triton"]


#: Why the probe did not run now (not kept: the next call outside the capture probes).
CAPTURING = "a CUDA graph is being captured on it: call the layer once before capturing"


def _runs_on(device: torch.device) -> str | None:
    """Why Triton's kernels cannot run on ``device``, or None when they can: looked up once
    per device by compiling and launching a one-element kernel (a GPU without a driver
    Triton supports, a missing ``ptxas``, an architecture it does not target all fail
    there, at the first use, rather than inside a layer's call). Not inside a capture of
    the caller's own CUDA graph, where the probe's read would break the capture:
    :data:`CAPTURING` then, and the probe waits for a call outside it."""
    key = str(device)
    if key not in _why and device.type == "cuda" and _capturing(device):
        return CAPTURING
    if key not in _why:
        try:
            k = importlib.import_module(_PROBE)
            out = torch.zeros(1, device=device)
            # Triton launches on the current device: the probe's own (cuda:1 need not be it)
            with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
                k.probe[(1,)](out)
            _why[key] = None if out.item() == 1.0 else "a test kernel ran but wrote nothing"
        except Exception as e:  # any failure to build or launch says the same
            lines = str(e).strip().splitlines() or [""]
            _why[key] = f"{type(e).__name__}: {lines[0]}"
    return _why[key]


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def steps_handle(kernel: Kernel, x: Tensor, window: int | None, projected: bool) -> bool:
    """Whether the Triton steps compute this layer's function: an LSTM, GRU or simple
    cell, or a layer-normalised LSTM or GRU (:mod:`rnnkit.bptt.gpu_steps_ln`), as such or
    with recurrent dropout and zoneout around it
    (:class:`~rnnkit.bptt.regularized.RegularizedKernel`); float32/float64, full BPTT, the
    input itself (not its product). Masks and resets are theirs."""
    if window is not None or projected or x.dtype not in _DTYPES:
        return False
    inner = kernel.inner if isinstance(kernel, RegularizedKernel) else kernel
    return type(inner) in (LSTMKernel, GRUKernel, RNNKernel, *LN_KERNELS)


def wants_steps(kernel: Kernel, x: Tensor, window: int | None, projected: bool) -> bool:
    """Whether the Triton steps run this layer (asked after PyTorch's fused kernels said
    no, :func:`rnnkit.bptt.dispatch.route`): ``"auto"`` for CUDA tensors where triton
    imports and runs on their device (else the loop, with one warning per device);
    ``"triton"`` wherever :func:`steps_handle` says so. The CPU's first test costs
    nothing on the hot path: it returns before looking at anything else."""
    path = _path()
    if path == "auto":
        if not (
            x.device.type == "cuda"
            and steps_handle(kernel, x, window, projected)
            and triton_available()
        ):
            return False
        why = _runs_on(x.device)
        if why is not None and why != CAPTURING:  # a capture: this call only, no warning
            _warn_once(x.device, why)
        return why is None
    if path != "triton" or not steps_handle(kernel, x, window, projected):
        return False
    if not triton_available():
        raise ConfigError(
            "RNNKIT_GPU_PATH=triton needs triton, an optional dependency: pip install 'rnnkit[gpu]'"
        )
    if x.device.type == "cpu" and not _interpreted():
        raise ConfigError(
            "RNNKIT_GPU_PATH=triton on CPU tensors runs only in Triton's interpreter: "
            "set TRITON_INTERPRET=1 before the first use, or use a CUDA device"
        )
    why = _runs_on(x.device)
    if why is not None:
        raise ConfigError(f"RNNKIT_GPU_PATH=triton: triton cannot run on {x.device}: {why}")
    return True


def _warn_once(device: torch.device, why: str) -> None:
    """Say once per device that the layers cuDNN cannot compute run the slower loop."""
    if str(device) not in _warned:
        _warned.add(str(device))
        warnings.warn(
            f"rnnkit: triton is installed but cannot run on {device} ({why}); the layers "
            "cuDNN cannot compute run the PyTorch loop instead (slower). "
            "RNNKIT_GPU_PATH=loop silences this",
            RuntimeWarning,
            stacklevel=4,
        )


_PLAIN = (LSTMKernel, GRUKernel, RNNKernel)


def steps_record(kernel: Kernel, x: Tensor) -> bool:
    """Whether :func:`rnnkit.bptt.gpu_steps.forward_record` runs the forward of
    :func:`rnnkit.bptt.forward.forward_pass` (any window: the record's backward is the
    caller's): :func:`wants_steps`'s rule for a plain LSTM, GRU or simple cell (no
    regularizers, no layer normalisation). The CPU's default returns at its first test."""
    if x.device.type != "cuda" and _path() == "auto":
        return False
    return type(kernel) in _PLAIN and wants_steps(kernel, x, None, False)
