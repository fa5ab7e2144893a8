"""Figures and checks of a training step (or a search) read from the device once, not one
by one.

On a GPU every host read of a device value (``float(t)``, ``bool(t.any())``, ``t[mask]``)
waits for all the work queued before it: the processor then idles while Python queues the
next kernels, and the GPU idles while Python waits. A training step that reads its loss,
its token count, its input checks and its gradient norm one after another pays that
round trip for each. Inside :func:`deferring` the losses and input checks of rnnkit's
models leave their figures (``LossOutput.nats``, ``.tokens``) as 0-dimensional tensors
and their checks as flags on the device; :meth:`Deferred.read` then fetches every flag
and figure in one transfer and raises the first failed check's error, with the same
message it would have raised at once. The Trainer runs each step so: one host read per
step, as in a plain PyTorch loop that prints ``loss.item()``. So does a search of
:mod:`rnnkit.generation` (``generate``, ``generate_batch``): the language model checks the
ids of every step, which the search drew in range, and they are read once at its end.
So do the validation metrics of the lm, classify (text), tag, regress and seq2seq tasks, once
per evaluation: their sums and every batch's predictions come back together
(:meth:`Deferred.fetch`).

It sits below the models, the losses and generation, which all read it. Outside
:func:`deferring` (every other call from user code), nothing changes: checks raise at
once and figures are Python numbers. On the CPU, where a read costs nothing, the checks
and losses compute as they always did (:func:`active_for`); only the figures wait.

>>> import torch
>>> with deferring() as deferred:
...     deferred.check(torch.tensor(False), lambda: ValueError("never raised"))
...     deferred.read(torch.tensor(2.5), 3)
[2.5, 3.0]
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar

import torch
from torch import Tensor

__all__ = [
    "Deferred",
    "active",
    "active_for",
    "count_of",
    "deferring",
    "figure_of",
    "read_tensors",
    "read_values",
    "waits",
]


class Deferred:
    """The pending checks of one step: ``(flag, error)`` pairs, a flag a bool tensor that
    is True when the check failed, ``error()`` the exception to raise then (built only on
    failure, so it may read the device to name the offending value)."""

    def __init__(self) -> None:
        self._checks: list[tuple[Tensor, Callable[[], Exception]]] = []

    def check(self, failed: Tensor, error: Callable[[], Exception]) -> None:
        """Record a check whose verdict ``failed`` (a 0-dim bool tensor) stays on the
        device until :meth:`read`."""
        self._checks.append((failed.detach().reshape(()), error))

    def read(self, *values: Tensor | float) -> list[float]:
        """One host read: every pending check (the first failed one raises its error,
        in the order recorded) and ``values`` (0-dim tensors or numbers), returned as
        floats in order. The checks are cleared."""
        checks, self._checks = self._checks, []
        tensors = [flag for flag, _ in checks] + [v for v in values if isinstance(v, Tensor)]
        read = read_values(tensors)
        _raise_first_failed(checks, read)
        rest = iter(read[len(checks) :])
        return [next(rest) if isinstance(v, Tensor) else float(v) for v in values]

    def fetch(self, *tensors: Tensor) -> list[Tensor]:
        """One host read, as :meth:`read`, of the pending checks and ``tensors`` of any
        shape and dtype (an evaluation's predictions beside its sums), returned as host
        copies of the same shapes and dtypes, in order. The checks are cleared."""
        checks, self._checks = self._checks, []
        host = read_tensors([flag for flag, _ in checks] + list(tensors))
        _raise_first_failed(checks, host)
        return host[len(checks) :]


def _raise_first_failed(checks: list[tuple[Tensor, Callable[[], Exception]]], read: list) -> None:
    """Raise the error of the first check whose flag (``read``'s first values, in the
    order of ``checks``) says it failed."""
    for (_, error), flag in zip(checks, read, strict=False):
        if bool(flag):
            raise error()


def _by_device(tensors: list[Tensor]) -> list[list[int]]:
    """The indices of ``tensors``, grouped by device (one transfer each)."""
    groups: dict[torch.device, list[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault(t.device, []).append(i)
    return list(groups.values())


def read_values(tensors: list[Tensor]) -> list[float]:
    """The values of 0-dim tensors as floats, one transfer per device (float64 holds every count
    and bool exactly, and a float32 figure unchanged)."""
    out: list[float] = [0.0] * len(tensors)
    for indices in _by_device(tensors):
        stacked = torch.stack([tensors[i].detach().reshape(()).double() for i in indices])
        for i, v in zip(indices, stacked.tolist(), strict=True):
            out[i] = v
    return out


def read_tensors(tensors: list[Tensor]) -> list[Tensor]:
    """Host copies of ``tensors`` (any shapes and dtypes, values unchanged), one transfer
    per device: their bytes side by side in one buffer.

    >>> [t.tolist() for t in read_tensors([torch.tensor(True), torch.tensor([2.5, 3.0])])]
    [True, [2.5, 3.0]]
    """
    out: list[Tensor] = [torch.empty(0)] * len(tensors)
    for indices in _by_device(tensors):
        parts = [tensors[i].detach().contiguous().reshape(-1).view(torch.uint8) for i in indices]
        host = (torch.cat(parts) if len(parts) > 1 else parts[0]).cpu()
        start = 0
        for i, part in zip(indices, parts, strict=True):
            end = start + part.numel()
            # cloned: a view of the buffer at an odd offset cannot be read as a wider dtype
            out[i] = host[start:end].clone().view(tensors[i].dtype).reshape(tensors[i].shape)
            start = end
    return out


_active: ContextVar[Deferred | None] = ContextVar("rnnkit_deferred", default=None)


@contextlib.contextmanager
def deferring() -> Iterator[Deferred]:
    """Within the block (this thread or task only), rnnkit's losses and input checks
    defer their host reads to the returned :class:`Deferred`. Checks left unread at the
    end of the block are read then, so that no failed check is lost."""
    deferred = Deferred()
    token = _active.set(deferred)
    try:
        yield deferred
    finally:
        _active.reset(token)
    deferred.read()  # only when the block ended normally


def active() -> Deferred | None:
    """The :class:`Deferred` of the enclosing :func:`deferring` block, or None."""
    return _active.get()


def waits(tensor: Tensor) -> bool:
    """Whether reading ``tensor`` on the host waits for a device (a GPU's queue); on the
    CPU a read costs nothing."""
    return tensor.device.type not in ("cpu", "meta")


def active_for(tensor: Tensor) -> Deferred | None:
    """The enclosing :class:`Deferred` where a check or loss on ``tensor`` should leave
    its reads to it: inside :func:`deferring`, and where a read :func:`waits`. On the CPU
    the direct computation (reading as it goes) is the faster one, so it is kept there."""
    deferred = _active.get()
    return deferred if deferred is not None and waits(tensor) else None


def figure_of(x: Tensor) -> float | Tensor:
    """A detached figure: a 0-dim tensor while deferring, else a Python float."""
    return x.detach() if _active.get() is not None else float(x.detach())


def count_of(x: Tensor) -> int | Tensor:
    """A count: a 0-dim tensor while deferring, else a Python int."""
    return x.detach() if _active.get() is not None else int(x.detach())
