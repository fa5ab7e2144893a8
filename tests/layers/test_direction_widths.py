"""Directions of different widths: ``RNN``/``LSTM``/``GRU`` with ``hidden_size=(H_f, H_b)``
against the plain-step oracle (outputs, final states and gradients), the state's layout
and the errors."""

from __future__ import annotations

import pytest
import torch

from rnnkit import GRU, LSTM, RNN, LSTMState
from rnnkit.errors import ConfigError
from rnnkit.layers.recurrent import Recurrent
from rnnkit.layers.stacked import Bidirectional

pytestmark = pytest.mark.usefixtures("single_thread", "time_loop")

DT = torch.float64
WIDTHS = (5, 3)


def _inputs(cell_spec, gen, B=3, T=6, I=2):
    x = torch.randn(B, T, I, generator=gen, dtype=DT, requires_grad=True)
    mask = torch.tensor([[1] * 6, [1, 1, 1, 1, 0, 0], [1, 1, 0, 0, 0, 0]], dtype=torch.bool)
    states = []
    for _ in range(cell_spec.num_states):
        s = torch.randn(2, 2, B, max(WIDTHS), generator=gen, dtype=DT)
        s[:, 1, :, WIDTHS[1] :] = 0.0  # the backward direction's units past its width
        states.append(s.requires_grad_())
    return x, mask, states


@pytest.mark.parametrize("window", [None, 100])
def test_directions_of_different_widths_equal_the_oracle(cell_spec, gen, window):
    layer = cell_spec.layer(2, WIDTHS, 2, True)
    assert [c.hidden_size for c in layer.cells()] == [5, 3, 5, 3]
    assert [c.input_size for c in layer.cells()] == [2, 2, 8, 8]  # layer 2 reads H_f + H_b
    x, mask, s0 = _inputs(cell_spec, gen)
    state = cell_spec.pack(tuple(s0))
    out = layer(x, mask=mask, state=state, window=window)
    want_out, want_states = cell_spec.run_layer(layer, x, mask, state)
    assert out.outputs.shape == (3, 6, 8)
    torch.testing.assert_close(out.outputs, want_out, atol=1e-12, rtol=0)
    got_states = cell_spec.unpack(out.state)
    for got, want in zip(got_states, want_states, strict=True):
        assert got.shape == (2, 2, 3, 5)
        torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
        assert not got[:, 1, :, WIDTHS[1] :].any()  # zeros past the backward width
    # gradients: the library's explicit BPTT against autograd through the oracle
    g = torch.Generator().manual_seed(1)
    w_out = torch.randn(out.outputs.shape, generator=g, dtype=DT)
    w_fin = [torch.randn(s.shape, generator=g, dtype=DT) for s in got_states]

    def loss(outputs, finals):
        return (outputs * w_out).sum() + sum(
            (f * w).sum() for f, w in zip(finals, w_fin, strict=True)
        )

    params = [x, *s0, *layer.parameters()]
    got = torch.autograd.grad(loss(out.outputs, got_states), params)
    want = torch.autograd.grad(loss(want_out, want_states), params)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0)


def test_the_audit_shape_and_the_low_level_form_agree(gen):
    for cls in (RNN, LSTM, GRU):
        layer = cls(3, (64, 32), bidirectional=True).double()
        assert layer.hidden_sizes == (64, 32) and layer.output_size == 96
        x = torch.randn(2, 4, 3, generator=gen, dtype=DT)
        lengths = torch.tensor([4, 2])
        out = layer(x, lengths=lengths)
        h = out.state.h if isinstance(out.state, LSTMState) else out.state
        assert out.outputs.shape == (2, 4, 96) and h.shape == (1, 2, 2, 64)
        # the same cells as Bidirectional(Recurrent, Recurrent(reverse=True)), time-first
        f, b = layer.cells()
        low = Bidirectional(Recurrent(f), Recurrent(b, reverse=True), batch_first=False)
        mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.bool)
        low_out, finals = low(x.transpose(0, 1), mask.T)
        torch.testing.assert_close(out.outputs, low_out.transpose(0, 1), atol=1e-12, rtol=0)
        back = finals[1].h if isinstance(finals[1], LSTMState) else finals[1]
        torch.testing.assert_close(h[0, 1, :, :32], back, atol=1e-12, rtol=0)
        # batch-first by default, as the stacks are
        first = Bidirectional(Recurrent(f), Recurrent(b, reverse=True))
        first_out, first_finals = first(x, mask)
        torch.testing.assert_close(first_out, out.outputs, atol=1e-12, rtol=0)
        for a, c in zip(first_finals, finals, strict=True):
            torch.testing.assert_close(a, c, atol=0, rtol=0)
        # put into a stack, a layer reads the stack's own (time-major) tensors
        layer.layers[0] = first
        torch.testing.assert_close(layer(x, lengths=lengths).outputs, out.outputs, atol=0, rtol=0)
        # a call's own layout, whatever the layer's
        torch.testing.assert_close(low(x, mask, time_major=False)[0], first_out, atol=0, rtol=0)
        with pytest.raises(ConfigError, match="time_major must be True or False"):
            low(x, mask, time_major="no")
        # one pickled before the layout was a choice has no batch_first: time-major
        del low.__dict__["batch_first"]
        torch.testing.assert_close(low(x.transpose(0, 1), mask.T)[0], low_out, atol=0, rtol=0)


def test_bad_widths_are_clear_errors():
    with pytest.raises(ValueError, match="needs bidirectional=True"):
        LSTM(3, (4, 2))
    for bad in ((4,), (4, 0), (4, 2, 1), (4.0, 2), "4"):
        with pytest.raises(ValueError, match="hidden_size must be"):
            GRU(3, bad, bidirectional=True)  # type: ignore[arg-type]
    layer = RNN(3, (4, 2), bidirectional=True)
    with pytest.raises(ValueError, match=r"\(4, 2\) units wide: no single hidden_size"):
        _ = layer.hidden_size
    assert RNN(3, (4, 4), bidirectional=True).hidden_size == 4  # equal widths: one H
    assert "(4, 2)" in repr(layer)
    with pytest.raises(ValueError, match=r"\(L, D, B, H\) = \(1, 2, 2, 4\)"):
        layer(torch.zeros(2, 3, 3), state=torch.zeros(1, 2, 2, 2))
    from rnnkit.layers.interop import to_torch

    with pytest.raises(ValueError, match=r"one width; this stack's are \(4, 2\)"):
        to_torch(layer)
