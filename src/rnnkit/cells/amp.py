"""Mixed precision: under ``torch.autocast`` the recurrence runs in its weights' dtype.

``rnnkit train --precision bf16|fp16`` runs forward and loss under ``torch.autocast``
(``training/loop.py``). Autocast would compute the matrix products of a cell step in
bfloat16/float16 and leave the gate math in float32, so a step would mix dtypes, and
the time loop's buffers, its compiled loop (float32/float64 only) and its hand-written
backward would meet tensors they were not written for. Instead the time loop
(``recurrence.py``) and the single-step cells run with autocast switched OFF, in the
dtype of their weights (float32 for a float32 model): a float16/bfloat16 input or state
coming from an autocast product upstream is cast up first (and a float32 one down to
float16/bfloat16 weights, as autocast casts it for torch's layers). The products around the
recurrence (the output layer, attention, projections) still run in the autocast dtype.

Why float32 (``benchmarks/bench_precision.py``; the figures are in docs/reliability.md):
the state passes T times through the same product, so its rounding compounds. A bfloat16
loop's outputs are ~4e-3 off and its gradients ~1e-2 (float32: 1e-7 and 3e-7). Its speed
gain is uneven: slower than the compiled float32 loop on narrow layers, faster only on
wide ones and one thread (docs/reliability.md has the measured figures). A bfloat16 loop
would also give up the compiled loop's skipping of finished rows.

A model whose weights are themselves float16/bfloat16 (``model.to(torch.bfloat16)``,
``.half()``) computes its recurrence in float32 too (:func:`computes_in_float32`: on the
CPU always, on a GPU wherever cuDNN does not take the weights' dtype): the layer casts
its weights, input and state up once per call and its outputs and final state back, so
the compiled loop (the Triton steps on a GPU) runs, and the results carry one rounding
to the weights' dtype instead of T compounded ones.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import Tensor

from rnnkit.types import LSTMState

__all__ = [
    "autocast_devices_on",
    "autocast_off",
    "autocast_reconciles",
    "cell_step_in_weights_dtype",
    "computes_in_float32",
    "float32",
    "low_precision_to",
    "without_autocast",
]

_F = TypeVar("_F", bound=Callable[..., Any])
# Device types whose autocast state is checked (those this torch build knows).
_AUTOCAST_DEVICES = tuple(
    d for d in ("cpu", "cuda", "xpu", "mps") if torch.amp.is_autocast_available(d)
)
# One look at the thread's dispatch keys: whether autocast is on for any device (a layer
# asks at every call; asking each device costs ten times more).
_any_autocast: Callable[[], bool] = getattr(torch._C, "_is_any_autocast_enabled", lambda: True)


def autocast_devices_on() -> list[str]:
    """The device types on which autocast is enabled in this thread now.

    >>> with torch.autocast("cpu", dtype=torch.bfloat16):
    ...     autocast_devices_on()
    ['cpu']
    """
    if not _any_autocast():
        return []
    return [d for d in _AUTOCAST_DEVICES if torch.is_autocast_enabled(d)]


@contextlib.contextmanager
def autocast_off(devices: list[str]):
    """Switch autocast off on ``devices`` (:func:`autocast_devices_on`) for the block."""
    with contextlib.ExitStack() as stack:
        for d in devices:
            stack.enter_context(torch.autocast(d, enabled=False))
        yield


def without_autocast(fn: _F) -> _F:
    """Decorator: run ``fn`` with autocast switched off wherever it is on."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        on = autocast_devices_on()
        if not on:
            return fn(*args, **kwargs)
        with autocast_off(on):
            return fn(*args, **kwargs)

    return run  # type: ignore[return-value]


_LOW = (torch.float16, torch.bfloat16)


def autocast_reconciles(got: torch.dtype, weights: torch.dtype) -> bool:
    """Whether, under autocast, a tensor of dtype ``got`` is cast to weights of dtype
    ``weights``: a float16/bfloat16 one (an autocast product) to any floating weights, and
    a float32 one to float16/bfloat16 weights (autocast casts float32 down, as torch's
    layers do there). A float64 tensor or float64 weights beside float32 are not: there
    torch's layers fail too.

    >>> autocast_reconciles(torch.float32, torch.bfloat16)
    True
    >>> autocast_reconciles(torch.float64, torch.float32)
    False
    """
    if got == weights:
        return True
    return got in _LOW or (got == torch.float32 and weights in _LOW)


def low_precision_to(value: Any, dtype: torch.dtype) -> Any:
    """``value`` (a tensor, an ``LSTMState`` or None) with the tensors that autocast
    reconciles with weights of ``dtype`` (:func:`autocast_reconciles`: float16/bfloat16
    ones, and float32 ones for float16/bfloat16 weights) cast to ``dtype``; anything else
    is returned as it is.

    >>> low_precision_to(torch.ones(1, dtype=torch.bfloat16), torch.float32).dtype
    torch.float32
    >>> low_precision_to(torch.ones(1), torch.bfloat16).dtype
    torch.bfloat16
    """
    if isinstance(value, LSTMState):
        return LSTMState(low_precision_to(value.h, dtype), low_precision_to(value.c, dtype))
    if (
        isinstance(value, Tensor)
        and value.is_floating_point()
        and value.dtype != dtype
        and autocast_reconciles(value.dtype, dtype)
    ):
        return value.to(dtype)
    return value


def cell_step_in_weights_dtype(forward: _F) -> _F:
    """Decorator for a cell's ``forward(x, state)``: under autocast, cast ``x`` and state
    to the weights' dtype where autocast casts them (:func:`low_precision_to`) and run
    the step with autocast off — the same arithmetic as the time loop. Outside autocast
    nothing changes (a dtype mismatch stays the cell's ``TypeError``)."""

    @functools.wraps(forward)
    def run(self: Any, x: Any, state: Any = None) -> Any:
        on = autocast_devices_on()
        if not on:
            return forward(self, x, state)
        dtype = self.weight_ih.dtype
        x, state = low_precision_to(x, dtype), low_precision_to(state, dtype)
        with autocast_off(on):
            return forward(self, x, state)

    return run  # type: ignore[return-value]


def computes_in_float32(weight: Tensor, fused: bool = False) -> bool:
    """Whether a time loop over float16/bfloat16 weights like ``weight`` computes in
    float32 (module docstring: weights, input and state cast up once per call, the
    outputs rounded once to the weights' dtype). On the CPU always: its kernels are
    float32 and float64. On a GPU wherever no kernel takes the weights' own dtype: the
    Triton steps take float32 and float64 only (a float16 layer would fall to the PyTorch
    loop, its state rounded at every step), and cuDNN takes float16, not bfloat16.
    ``fused``: the layer would run PyTorch's fused kernel (cuDNN), which keeps float16.

    >>> bf16, f16 = torch.ones(1, dtype=torch.bfloat16), torch.ones(1, dtype=torch.float16)
    >>> computes_in_float32(bf16), computes_in_float32(torch.ones(1))
    (True, False)
    >>> computes_in_float32(f16.to("meta"), fused=True), computes_in_float32(f16.to("meta"))
    (False, True)
    """
    if weight.dtype not in _LOW:
        return False
    return weight.device.type == "cpu" or weight.dtype == torch.bfloat16 or not fused


def float32(t: Tensor | None) -> Tensor | None:
    """``t`` cast to float32 (a differentiable cast), None kept: the tensors of a call that
    :func:`computes_in_float32` runs in float32.

    >>> float32(torch.ones(1, dtype=torch.bfloat16)).dtype, float32(None)
    (torch.float32, None)
    """
    return None if t is None else t.float()
