"""Whether rnnkit's code is being traced into a graph, and which tracers it refuses.

``torch.compile``, ``torch.export`` and the ONNX exporter built on it
(``torch.onnx.export(..., dynamo=True)``) trace the recurrence as PyTorch's own fused
operator where that computes the function and no mask is given (``rnnkit.bptt.fused``:
one node per layer and direction), else through its PyTorch loop: the same function as
the compiled C++ loop, written in torch operations a graph can hold (the loop over time
is unrolled, so a graph is specialised to its number of steps). The
run-time shortcuts that look at the data (skipping an all-true mask, sorting rows by
length for the compiled loop, checking lengths) are left out while tracing: a graph
cannot depend on them.

The ``torch.func`` transforms (``grad``, ``vmap``, ``jacrev``, ``jacfwd``, ``jvp``,
``functional_call`` under them: per-example gradients, Hessians, ensembles) and forward-mode
AD (``torch.autograd.forward_ad``) take the same plain operations: the explicit BPTT's
autograd node has no rules for them (no ``vmap`` batching, no forward-mode derivative),
the unrolled steps are ordinary operations that every transform knows.

``torch.jit.trace`` and the TorchScript-based ONNX exporter (``dynamo=False``) cannot see
through the recurrence's custom autograd node: they would record its results as
constants, a graph that ignores its input. They are refused with :class:`TracingError`.
"""

from __future__ import annotations

import torch
from torch.autograd import forward_ad

from rnnkit.errors import RnnkitError

__all__ = ["TracingError", "check_tracer", "exporting", "tracing", "transforming", "vmapping"]


class TracingError(RnnkitError, RuntimeError):
    """A tracer that would record a wrong graph of rnnkit's recurrence."""


def tracing() -> bool:
    """True where the recurrence runs as plain differentiable operations: inside
    ``torch.compile``, ``torch.export`` and the dynamo ONNX exporter, and under a
    ``torch.func`` transform or forward-mode AD (:func:`transforming`).

    >>> tracing()
    False
    """
    return bool(torch.compiler.is_compiling()) or _eager_transform()


def transforming() -> bool:
    """True under a ``torch.func`` transform (``grad``, ``vmap``, ``jacrev``, ``jvp``, ...)
    or inside ``torch.autograd.forward_ad.dual_level()``: no custom autograd node can run
    there, and no value may be read on the host (a batched tensor has none).

    >>> with forward_ad.dual_level():
    ...     transforming()
    True
    """
    if torch.compiler.is_compiling():
        return False  # a graph being traced: its own rules (and dynamo answers for functorch)
    return _eager_transform()


def _eager_transform() -> bool:
    """A ``torch.func`` interpreter or a forward-AD level is active (eager code only)."""
    if torch._C._functorch.peek_interpreter_stack() is not None:
        return True
    return int(forward_ad._current_level) >= 0


def vmapping() -> bool:
    """True inside ``torch.func.vmap`` (at any depth of the transforms), where torch's
    recurrent operators have no batching rule and rnnkit's plain steps do.

    >>> vmapping(), torch.func.vmap(lambda x: torch.tensor(vmapping()) + x)(torch.zeros(1))
    (False, tensor([1.]))
    """
    if not transforming():
        return False
    stack = getattr(torch._C._functorch, "get_interpreter_stack", None)
    if stack is None:  # a torch without it: vmap's rules are torch's
        return False
    vmap = torch._C._functorch.TransformType.Vmap
    return any(i.key() == vmap for i in stack() or ())


def exporting() -> bool:
    """True inside ``torch.export`` (and the ONNX exporter built on it), False under
    ``torch.compile`` and in eager code.

    It reads the flag ``torch.export`` sets rather than asking
    ``torch.compiler.is_exporting()``: inside a graph that ``torch.compile`` traces, torch
    before 2.13 answers that question with True (its tracer treats it like
    ``is_compiling``), which would take every compiled graph for an export.

    >>> exporting()
    False
    """
    flag = getattr(torch.compiler, "_is_exporting_flag", None)
    if isinstance(flag, bool):
        return flag
    return bool(torch.compiler.is_exporting())  # a torch without the flag: its own answer


def check_tracer() -> None:
    """Refuse ``torch.jit.trace`` / ``torch.onnx.export(..., dynamo=False)``.

    >>> check_tracer()  # not tracing: nothing to say
    """
    if torch.jit.is_tracing():
        raise TracingError(
            "rnnkit's recurrence cannot be traced by torch.jit.trace or the TorchScript-based "
            "ONNX exporter (torch.onnx.export(..., dynamo=False)): the graph would hold "
            "constants instead of the time loop; use torch.onnx.export(..., dynamo=True), "
            "torch.export.export or torch.compile"
        )
