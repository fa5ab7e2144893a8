"""Which implementation runs a recurrence: the one place the choice is made.

Every path computes the same function; the library's explicit BPTT (the PyTorch loop) is
the definition the others are tested against. In order of precedence, for one direction
of one layer (:func:`route`):

==================  =====================================================================
path                when
==================  =====================================================================
``graph-fused``     a graph is traced (``torch.compile``, ``torch.export``, ONNX) and
                    PyTorch's fused operator computes the function: no mask, full BPTT,
                    an export or no gradient (:func:`rnnkit.bptt.fused.traced_fused_form`)
``graph-op``        a graph is traced by ``torch.compile`` otherwise: the library's loop
                    as one opaque operator (:mod:`rnnkit.bptt.opaque`), for the kernels
                    it knows; a window only without gradients
``graph-steps``     a graph is traced otherwise: the kernel's differentiable step
                    unrolled over time
``fused``           eager, where the fused kernels (cuDNN on a GPU) compute the function
                    (:func:`rnnkit.bptt.fused.wants_fused`: CUDA tensors by default,
                    ``RNNKIT_GPU_PATH`` forces it)
``triton``          eager, where the fused kernels do not but the Triton steps compute
                    the function (:func:`rnnkit.bptt.gpu_route.wants_steps`: CUDA
                    tensors with triton installed by default, ``RNNKIT_GPU_PATH=triton``
                    forces it): masks with holes, the GRU with ``reset="before"``, the
                    ``sigmoid`` cell, recurrent dropout and zoneout
``loop``            eager, everything else: the library's time loop with its explicit
                    BPTT, compiled (:func:`compiled_library`) or in PyTorch
==================  =====================================================================

Inside the loop, :func:`compiled_library` says whether the compiled library (C++,
:mod:`rnnkit.bptt.native`) runs the whole forward and backward, and
:func:`python_step_kernel` which step implementation a loop that stays in Python (the
attention decoder's) calls each step: an LSTM's or a GRU's gate math in Triton launches
where the Triton steps would run (:mod:`rnnkit.bptt.gpu_step_lib`), else an LSTM's in
one compiled call per step where the compiled library handles the tensors.
"""

from __future__ import annotations

from typing import Any, NamedTuple, cast

import torch
from torch import Tensor

from rnnkit.bptt import native
from rnnkit.bptt.fused import traced_fused_form, wants_fused
from rnnkit.bptt.gpu_route import wants_steps
from rnnkit.bptt.gpu_step_lib import triton_step
from rnnkit.bptt.opaque import kernel_name
from rnnkit.bptt.tracing import exporting, tracing, transforming
from rnnkit.cells.kernel import Kernel, StepKernel, Weights
from rnnkit.cells.lstm import LSTMKernel, NativeLSTMStep

__all__ = [
    "Route",
    "compiled_library",
    "python_step_kernel",
    "route",
]

# the paths, as Route.path names them
GRAPH_FUSED, GRAPH_OP, GRAPH_STEPS = "graph-fused", "graph-op", "graph-steps"
FUSED, STEPS, LOOP = "fused", "triton", "loop"


class Route(NamedTuple):
    """The path chosen, and what the fused paths need to run it."""

    path: str
    form: Any = None  # the fused operator's form (graph-fused, fused)
    lengths: Tensor | None = None  # each row's real steps (fused, a prefix mask)


def route(
    kernel: Kernel,
    x: Tensor,
    weights: Weights,
    states0: tuple[Tensor, ...],
    mask: Tensor | None,
    mask3: Tensor | None,
    window: int | None,
    projected: bool,
) -> Route:
    """The path of one direction of one layer (module docstring).

    Args:
        x, states0: in the weights' dtype; ``x (T, B, I)``.
        mask: ``(T, B)`` bool as given, or None; ``mask3``: ``(T, B, 1)`` as
            :func:`rnnkit.bptt.recurrence.clean_padding` leaves it (None: every step
            real), eager only.
        window: None (full BPTT) or τ.  projected: ``x`` is the input product.
    """
    if tracing():
        if transforming():  # torch.func / forward AD: operations every transform knows
            return Route(GRAPH_STEPS)
        # a graph cannot look at a mask's values: the traced fused form takes none
        form = traced_fused_form(kernel, mask, window, projected, (x, *weights, *states0))
        if form is not None:
            return Route(GRAPH_FUSED, form)
        # torch.compile holds the library's loop as one node; an export needs operators
        # torch knows, and a stack's BPTT(τ) spans layers a per-layer node cannot express
        if (
            not exporting()
            and (window is None or not torch.is_grad_enabled())
            and kernel_name(kernel) is not None
        ):
            return Route(GRAPH_OP)
        return Route(GRAPH_STEPS)
    # the mask as given (not a view of it): its reading on the host is kept per tensor
    fused = wants_fused(kernel, x, None if mask3 is None else mask, window, projected)
    if fused is not None:
        return Route(FUSED, fused[0], fused[1])
    if wants_steps(kernel, x, window, projected):
        return Route(STEPS)
    return Route(LOOP)


def compiled_library(kernel: Kernel, *tensors: Tensor | None) -> Any:
    """The compiled loop (:mod:`rnnkit.bptt.native`) if it handles this kernel and these
    tensors, else None (the PyTorch loop).

    Never while tracing (``torch.compile``/``torch.export``): a graph holds the PyTorch
    loop, the same function in operations a graph can represent."""
    if not hasattr(kernel, "native_forward") or not native.supports(*tensors) or tracing():
        return None
    return native.library()


def python_step_kernel(kernel: StepKernel, *tensors: Tensor | None) -> tuple[StepKernel, Any]:
    """The step implementation a loop that stays in Python calls each step, and the
    compiled library where one is used. Where the layer path would run the Triton steps
    (:func:`rnnkit.bptt.gpu_route.wants_steps`: CUDA tensors with triton installed by
    default, ``RNNKIT_GPU_PATH=triton`` forces it), an LSTM's or a GRU's gate math in
    Triton launches (:func:`rnnkit.bptt.gpu_step_lib.triton_step`; no library: torch's
    operations do the rest); else an LSTM's in one compiled call per step
    (:class:`rnnkit.cells.lstm.NativeLSTMStep`) where the library handles the tensors;
    else the kernel's own step.

    Args:
        tensors: the loop's tensors; the first one that is not None stands for the
            device and dtype (the loop runs in one).
    """
    first = next((t for t in tensors if t is not None), None)
    step = triton_step(kernel)  # not None: an LSTM's or a GRU's kernel, each a full Kernel
    full = cast(Kernel, kernel)
    if step is not None and first is not None and wants_steps(full, first, None, False):
        return step, None
    lib = native.library() if native.supports(*tensors) else None
    if lib is not None and isinstance(kernel, LSTMKernel):
        return NativeLSTMStep(lib), lib
    return kernel, lib
