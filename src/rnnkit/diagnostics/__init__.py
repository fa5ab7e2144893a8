"""Gradient flow through time, the Jacobian bound, gradient checks and training monitors.

Plain data only (tensors, dataclasses, dicts; ``to_dict()`` where a report needs JSON);
nothing here prints, logs or warns.

* ``contributions``: each step's (and each time lag's) share of ∂L/∂W, from the explicit
  BPTT sweep — the shares add up to the total gradient.
* ``jacobian``: ‖∂h_t/∂h_k‖₂ (exact or power iteration) and ``gradient_flow``, everything
  a report draws at once; ``loss_gradients``: ‖∂L/∂h_k‖ for every state; ``bound``: the
  bound (γλ)^{t−k} and the real steps it counts (docs/math.md, "Gradient flow");
  ``recorded``: ``RecordedRun``, one run of a direction that answers several of these.
* ``gradcheck``: the explicit BPTT against central finite differences (float64).
* ``monitor``: gradient-norm history, clipping, vanishing/exploding signals, gate
  saturation and state norms during training.

>>> import torch
>>> from rnnkit import RNNCell
>>> from rnnkit.diagnostics import step_contributions
>>> from rnnkit.layers.recurrent import Recurrent
>>> cell = RNNCell(2, 3)
>>> x = torch.randn(4, 5, 2)
>>> parts = step_contributions(cell, x, loss_fn=lambda h: h.pow(2).sum())
>>> cell.zero_grad()
>>> out, _ = Recurrent(cell)(x.transpose(0, 1))
>>> out.pow(2).sum().backward()
>>> bool(torch.allclose(parts.total()["weight_hh"], cell.weight_hh.grad, atol=1e-6))
True
"""

from rnnkit.diagnostics.bound import (
    DerivativeSize,
    activation_gain,
    jacobian_bound,
    real_steps,
    rnn_jacobian_bound,
    spectral_norm,
    weight_derivative_size,
)
from rnnkit.diagnostics.contributions import (
    Contributions,
    direction_cell,
    lag_contributions,
    step_contributions,
)
from rnnkit.diagnostics.gradcheck import GradcheckResult, GradientError, gradcheck
from rnnkit.diagnostics.jacobian import GradientFlow, gradient_flow, jacobian_norms, step_jacobians
from rnnkit.diagnostics.loss_gradients import state_gradient_norms, state_gradients
from rnnkit.diagnostics.monitor import (
    GradientEvent,
    GradientMonitor,
    LayerStats,
    StepRecord,
    gate_saturation,
    layer_statistics,
)
from rnnkit.diagnostics.recorded import RecordedRun

__all__ = [
    "Contributions",
    "DerivativeSize",
    "GradcheckResult",
    "GradientError",
    "GradientEvent",
    "GradientFlow",
    "GradientMonitor",
    "LayerStats",
    "RecordedRun",
    "StepRecord",
    "activation_gain",
    "direction_cell",
    "gate_saturation",
    "gradcheck",
    "gradient_flow",
    "jacobian_bound",
    "jacobian_norms",
    "lag_contributions",
    "layer_statistics",
    "real_steps",
    "rnn_jacobian_bound",
    "spectral_norm",
    "state_gradient_norms",
    "state_gradients",
    "step_contributions",
    "step_jacobians",
    "weight_derivative_size",
]
