"""Mixed precision for training: which autocast dtype and whether a ``GradScaler``.

``precision="bf16"`` / ``"fp16"`` runs the forward and the loss under ``torch.autocast``;
float16 also needs a ``torch.amp.GradScaler`` (on every device: the underflow of float16
gradients is a property of the format, not of CUDA). What the loop does when the scaled
gradients overflow is in :mod:`rnnkit.training.nonfinite`.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any

import torch

from rnnkit.errors import ConfigError
from rnnkit.training.options import PRECISIONS, given

__all__ = ["autocast_setup"]

_AMP_DTYPES = dict(zip(PRECISIONS, (None, torch.bfloat16, torch.float16), strict=True))


def autocast_setup(
    precision: str, device: torch.device, argument: str = "precision"
) -> tuple[torch.dtype | None, torch.amp.GradScaler | None]:
    """``(autocast dtype or None, GradScaler or None)`` for ``precision`` on ``device``.

    fp32: no autocast. bf16: autocast, no scaler (bfloat16 has float32's exponent range).
    fp16: autocast and a ``GradScaler`` for the device. A precision the device's autocast
    does not support is a ``ConfigError`` naming ``argument``: ``TrainOptions``' field
    (the default) or the command line's ``--precision``.

    >>> autocast_setup("bf16", torch.device("cpu"))
    (torch.bfloat16, None)
    """
    if precision not in _AMP_DTYPES:
        raise ConfigError(f"{argument} must be one of {', '.join(_AMP_DTYPES)}, got {precision!r}")
    dtype = _AMP_DTYPES[precision]
    if dtype is None:
        return None, None
    kind = device.type
    unsupported = ConfigError(
        f"{given(argument, precision)}: torch {torch.__version__} has no {precision} autocast "
        f"on {kind} (use {given(argument, 'fp32')})"
    )
    if not torch.amp.is_autocast_available(kind):
        raise unsupported
    if kind == "cuda" and dtype == torch.bfloat16 and not _computes_bf16(device):
        raise ConfigError(
            f"{given(argument, 'bf16')}: this GPU has no bfloat16 (use {given(argument, 'fp16')})"
        )
    # torch says "not supported" by a warning and runs without autocast: make that an error.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.autocast(kind, dtype=dtype):
            enabled = torch.is_autocast_enabled(kind)
    if caught or not enabled:
        raise unsupported
    scaler = torch.amp.GradScaler(kind) if dtype == torch.float16 else None
    return dtype, scaler


def _computes_bf16(device: torch.device) -> bool:
    """Whether the GPU ``device`` has bfloat16 arithmetic: compute capability 8.0 on (or
    ROCm). ``torch.cuda.is_bf16_supported()`` is not that question: it asks the current
    device, and by default (``including_emulation=True``) says True wherever a bfloat16
    tensor can be made, so a T4 or V100 passed and trained in emulated bfloat16."""
    if not torch.cuda.is_available():
        return False
    if torch.version.hip:
        return True
    return torch.cuda.get_device_capability(device)[0] >= 8


def autocast(
    device: torch.device, dtype: torch.dtype | None
) -> contextlib.AbstractContextManager[Any]:
    """``torch.autocast`` in ``dtype`` on ``device``'s kind, or nothing when ``dtype`` is None.

    >>> with autocast(torch.device("cpu"), torch.bfloat16):
    ...     (torch.ones(2, 2) @ torch.ones(2, 2)).dtype
    torch.bfloat16
    """
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)
