"""What the tests of the fused path and of a stack's single step share: one call of a
stack on a forced path (its outputs, final states and every gradient of a fixed scalar),
and the forms the fused kernels compute. Importable from any test: this directory is on
the path for the root conftest."""

from __future__ import annotations

import torch

import rnnkit
from rnnkit.bptt.fused import use_fused
from rnnkit.types import LSTMState

#: The forms PyTorch's fused kernels compute: (test id, layer class, its options).
FORMS = [
    ("lstm", rnnkit.LSTM, {}),
    ("gru_keep_after", rnnkit.GRU, {"update": "keep", "reset": "after"}),
    ("gru_candidate_after", rnnkit.GRU, {"update": "candidate", "reset": "after"}),
    ("rnn_tanh", rnnkit.RNN, {"nonlinearity": "tanh"}),
    ("rnn_relu", rnnkit.RNN, {"nonlinearity": "relu"}),
]


def outputs_and_grads(layer, x, state, path: str, seed: int = 5, **kwargs) -> list[torch.Tensor]:
    """Outputs, final states and every gradient (input, initial state, parameters) of
    ``sum(t · w)`` over the outputs and final states, ``w`` fixed random weights, with
    ``layer(x, state=state, **kwargs)`` run on ``path``. ``seed`` is set just before the
    call: the dropout between layers draws the same masks on every path."""
    layer.zero_grad()
    x = x.detach().clone().requires_grad_()
    parts = [] if state is None else list(state) if isinstance(state, LSTMState) else [state]
    parts = [p.detach().clone().requires_grad_() for p in parts]
    s0 = LSTMState(*parts) if isinstance(state, LSTMState) else parts[0] if parts else None
    torch.manual_seed(seed)
    with use_fused(path):
        out = layer(x, state=s0, **kwargs)
    finals = list(out.state) if isinstance(out.state, LSTMState) else [out.state]
    gen = torch.Generator().manual_seed(11)
    # drawn on the CPU (a CPU generator), then moved: the CUDA tier's outputs are on a GPU
    weights = [
        torch.randn(t.shape, dtype=t.dtype, generator=gen).to(t.device)
        for t in [out.outputs, *finals]
    ]
    loss = sum((t * w).sum() for t, w in zip([out.outputs, *finals], weights, strict=True))
    loss.backward()
    grads = [x.grad, *(p.grad for p in parts), *(p.grad for p in layer.parameters())]
    # copies: a later `layer.cuda()` moves each parameter's .grad in place (Module._apply),
    # which would carry the caller's CPU results to the GPU with it
    grads = [None if g is None else g.clone() for g in grads]
    return [out.outputs.detach(), *(f.detach() for f in finals), *grads]
