"""One direction of a layer: reverse reading within each sequence's own extent."""

import torch

from rnnkit.cells.rnn import RNNCell
from rnnkit.layers.recurrent import Recurrent


def test_reverse_with_leading_hole_matches_reading_backwards():
    """mask [F, T, T, F]: the backward output at step 1 is h(x2, x1), at step 2 h(x2),
    and the hole at step 0 holds the state reached after step 1."""
    torch.manual_seed(0)
    cell = RNNCell(2, 3).double()
    x = torch.randn(4, 1, 2, dtype=torch.double)
    mask = torch.tensor([[False], [True], [True], [False]])
    out, final = Recurrent(cell, reverse=True)(x, mask)
    h2 = cell(x[2])
    h21 = cell(x[1], h2)
    torch.testing.assert_close(out[2], h2)
    torch.testing.assert_close(out[1], h21)
    torch.testing.assert_close(out[0], h21)
    torch.testing.assert_close(final, h21)
