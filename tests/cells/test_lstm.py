"""The LSTM cell's fused single step (:func:`rnnkit.cells.lstm.fused_lstm_cell`)."""

from __future__ import annotations

import torch

# Inside a CUDA graph's capture a new tensor's zeros are recorded, not written: the zero
# hidden bias made there must not be kept for the eager calls after the capture.


def test_zero_bias_made_during_a_capture_is_not_kept(monkeypatch):
    from rnnkit.cells import lstm

    monkeypatch.setattr(lstm, "_capturing", lambda t: True)
    bias = torch.randn(16)
    x, h, c = torch.randn(2, 3), torch.randn(2, 4), torch.randn(2, 4)
    w_ih, w_hh = torch.randn(16, 3), torch.randn(16, 4)
    got = lstm.fused_lstm_cell(x, (h, c), w_ih, w_hh, bias)
    assert lstm._zero_bias.get(bias) is None
    want = torch.lstm_cell(x, (h, c), w_ih, w_hh, bias, None)
    torch.testing.assert_close(got, want)
