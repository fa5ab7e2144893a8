"""Backpropagation through time: the loop over T steps and its explicit backward.

* ``recurrence``: the forward pass over a batch of sequences (masks, packing of finished
  rows, document resets) and the backward sweep (full, truncated in segments, windows
  across a stack), returning the gradients to autograd as one node;
* ``recompute``: the forward pass kept at checkpoints only and recomputed in the backward,
  for sequences too long to keep every step;
* ``native``: the same loop compiled from ``rnnkit/csrc`` (built on first use), dispatched
  to where it supports the cell and the options, the Python loop otherwise;
* ``tracing``: the check that refuses graph tracing of the explicit backward.
"""

from rnnkit.bptt.native import available, build, library, supports, use_native
from rnnkit.bptt.recompute import run_recomputed
from rnnkit.bptt.recurrence import (
    ForwardRecord,
    Grads,
    Packing,
    Sweep,
    WindowUnit,
    backward_sweep,
    clean_padding,
    forward_pass,
    incoming_states,
    make_packing,
    reorder,
    run_recurrence,
    unpack_record,
    weight_grads,
    windowed_sweep,
)
from rnnkit.bptt.tracing import TracingError, check_tracer, tracing

__all__ = [
    "ForwardRecord",
    "Grads",
    "Packing",
    "Sweep",
    "TracingError",
    "WindowUnit",
    "available",
    "backward_sweep",
    "build",
    "check_tracer",
    "clean_padding",
    "forward_pass",
    "incoming_states",
    "library",
    "make_packing",
    "reorder",
    "run_recomputed",
    "run_recurrence",
    "supports",
    "tracing",
    "unpack_record",
    "use_native",
    "weight_grads",
    "windowed_sweep",
]
