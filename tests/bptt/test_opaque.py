"""The opaque operators compiled code calls (rnnkit::recurrence, its backward): their fake
kernels describe what the real ones return, as ``torch.library.opcheck`` checks, for
the time-major view a batch-first layer passes in (compiled training of a batch-first
LSTM failed inductor's stride check)."""

from __future__ import annotations

import pytest
import torch

import rnnkit.bptt.opaque  # noqa: F401  (registers the operators)


@pytest.mark.parametrize("cell", ["lstm", "gru:keep:after", "rnn:tanh"])
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("B", [2, 16])
def test_the_fake_kernels_describe_the_real_ones(cell, batch_first, B):
    """``B = 16``: the LSTM loop of a batch without padding writes its outputs batch-first
    and returned them transposed; compiled code failed its stride check on every batch
    without padding ("expected ... stride 32==512")."""
    torch.manual_seed(0)
    T, I, H = 5, 3, 4
    gates = {"lstm": 4, "gru:keep:after": 3, "rnn:tanh": 1}[cell]
    x = torch.randn(B, T, I).transpose(0, 1) if batch_first else torch.randn(T, B, I)
    w_ih, w_hh, bias = torch.randn(gates * H, I), torch.randn(gates * H, H), torch.randn(gates * H)
    bias_hn = torch.randn(H) if cell.startswith("gru") else None
    states0 = [torch.randn(B, H) for _ in range(2 if cell == "lstm" else 1)]
    forward = (cell, x, w_ih, w_hh, bias, bias_hn, states0, None, -1)
    grads = [torch.randn(T, B, H), *(torch.randn(B, H) for _ in states0)]
    for op, args in (
        (torch.ops.rnnkit.recurrence.default, forward),
        (torch.ops.rnnkit.recurrence_backward.default, (*forward, grads)),
    ):
        result = torch.library.opcheck(op, args, test_utils=("test_faketensor",))
        assert result == {"test_faketensor": "SUCCESS"}, op
