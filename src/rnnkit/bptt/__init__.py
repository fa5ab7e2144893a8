"""Backpropagation through time: the loop over T steps and its explicit backward.

* ``recurrence``: one direction of one layer over time as one autograd node
  (:func:`run_recurrence`), whose backward is the library's explicit BPTT;
* ``dispatch``: which implementation runs it (a graph's fused operator, the opaque
  operator or unrolled steps; PyTorch's fused kernels; the compiled or the PyTorch loop),
  decided in one place;
* ``forward``: the forward pass over a batch of sequences (one input product, then the
  steps; masks, document resets);
* ``backward``: the backward sweep from the last step to the first and the weight
  gradients as one product over all steps;
* ``windowed``: the exact windowed BPTT(τ), lag by lag, of one direction or a stack;
* ``record``: what the forward keeps for the backward, and the packing of finished rows;
* ``regularized``: recurrent dropout and zoneout, a kernel around a cell's kernel whose
  masks are inputs of the time loop (the compiled loop included);
* ``recompute``: the forward pass kept at checkpoints only and recomputed in the backward,
  for sequences too long to keep every step;
* ``native``: the same loop compiled from ``rnnkit/csrc`` (built on first use), dispatched
  to where it supports the cell and the options, the Python loop otherwise;
* ``fused``: PyTorch's fused kernels (cuDNN on a GPU) for the layers whose function is
  theirs, and the choice of path (``use_fused``, ``RNNKIT_GPU_PATH``);
* ``mask_facts``: what those choices ask of a mask (every step real? lengths?), read on
  the host once per mask;
* ``gpu_steps`` (their backward in ``gpu_steps_backward``, what their launches share in
  ``gpu_launch``): on a GPU, the layers the fused kernels cannot run (holes, resets, the
  GRU with ``reset="before"``, the ``sigmoid`` cell, the layer-normalised cells:
  ``gpu_steps_ln``) as one product and one Triton launch per step (``triton_kernels``,
  ``triton_ln_kernels``, triton imported on first use only), and the forward of the
  windowed BPTT(τ) and of the segments' recompute there (``forward_record``);
  ``gpu_route``: whether they run a layer (``wants_steps``: the functions they compute,
  triton importable and running on the device, ``RNNKIT_GPU_PATH``); ``gpu_step_lib``:
  the compiled library's one-step LSTM operators and a GRU's step in Triton
  (``triton_step_kernels``), for the loops that stay in Python; ``gpu_graphs``: opt-in
  CUDA graphs over the Triton steps' loops (``use_cuda_graphs``,
  ``RNNKIT_CUDA_GRAPHS=1``);
* ``opaque``: the time loop as one operator of a compiled graph (``rnnkit::recurrence``,
  ``torch.library.custom_op``), its gradient the explicit BPTT's;
* ``tracing``: the check that refuses graph tracing of the explicit backward;
* ``unrolled``: the loop in plain differentiable steps (what a traced graph holds) and the
  gradients autograd gives through it, for a gradient that is differentiated again.
"""

from rnnkit.bptt.backward import backward_sweep, weight_grads
from rnnkit.bptt.dispatch import Route, compiled_library, python_step_kernel, route
from rnnkit.bptt.forward import forward_pass
from rnnkit.bptt.fused import (
    PATHS,
    cell_step,
    fused_form,
    fused_path_on,
    path_in_force,
    plain_step_call,
    run_fused,
    run_fused_stack,
    step_in_one_call,
    traced_fused_form,
    use_fused,
    wants_fused,
)
from rnnkit.bptt.gpu_graphs import (
    clear_cuda_graphs,
    cuda_graph_stats,
    cuda_graphs_enabled,
    use_cuda_graphs,
)
from rnnkit.bptt.gpu_route import steps_handle, steps_record, triton_available, wants_steps
from rnnkit.bptt.gpu_step_lib import TritonGRUStep, TritonStepLib, triton_step
from rnnkit.bptt.gpu_steps import forward_record, run_steps
from rnnkit.bptt.gpu_steps_ln import run_ln_steps
from rnnkit.bptt.mask_facts import all_real, derive, host_mask, move_mask, prefix_lengths
from rnnkit.bptt.native import available, build, library, own_matmul, supports, use_native
from rnnkit.bptt.opaque import kernel_from_name, kernel_name, run_opaque
from rnnkit.bptt.recompute import run_recomputed
from rnnkit.bptt.record import (
    ForwardRecord,
    Grads,
    Packing,
    Sweep,
    incoming_states,
    make_packing,
    unpack_record,
)
from rnnkit.bptt.recurrence import (
    clean_padding,
    recurrence_gradients,
    run_recurrence,
    takes_projected,
    takes_resets,
)
from rnnkit.bptt.regularized import CompiledRegularized, RegularizedKernel, regularized
from rnnkit.bptt.tracing import (
    TracingError,
    check_tracer,
    exporting,
    tracing,
    transforming,
    vmapping,
)
from rnnkit.bptt.unrolled import differentiable_gradients, replayed_gradients, unrolled
from rnnkit.bptt.windowed import WindowUnit, reorder, windowed_sweep

__all__ = [
    "PATHS",
    "CompiledRegularized",
    "ForwardRecord",
    "Grads",
    "Packing",
    "RegularizedKernel",
    "Route",
    "Sweep",
    "TracingError",
    "TritonGRUStep",
    "TritonStepLib",
    "WindowUnit",
    "all_real",
    "available",
    "backward_sweep",
    "build",
    "cell_step",
    "check_tracer",
    "clean_padding",
    "clear_cuda_graphs",
    "compiled_library",
    "cuda_graph_stats",
    "cuda_graphs_enabled",
    "derive",
    "differentiable_gradients",
    "exporting",
    "forward_pass",
    "forward_record",
    "fused_form",
    "fused_path_on",
    "host_mask",
    "incoming_states",
    "kernel_from_name",
    "kernel_name",
    "library",
    "make_packing",
    "move_mask",
    "own_matmul",
    "path_in_force",
    "plain_step_call",
    "prefix_lengths",
    "python_step_kernel",
    "recurrence_gradients",
    "regularized",
    "reorder",
    "replayed_gradients",
    "route",
    "run_fused",
    "run_fused_stack",
    "run_ln_steps",
    "run_opaque",
    "run_recomputed",
    "run_recurrence",
    "run_steps",
    "step_in_one_call",
    "steps_handle",
    "steps_record",
    "supports",
    "takes_projected",
    "takes_resets",
    "traced_fused_form",
    "tracing",
    "transforming",
    "triton_available",
    "triton_step",
    "unpack_record",
    "unrolled",
    "use_cuda_graphs",
    "use_fused",
    "use_native",
    "vmapping",
    "wants_fused",
    "wants_steps",
    "weight_grads",
    "windowed_sweep",
]
