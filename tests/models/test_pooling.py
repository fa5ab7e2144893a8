"""Pooling: padding never takes part (huge values, inf, NaN), and bidirectional ``last``
pooling equals ``[h^f_L; h^b_1]`` computed by running each sequence alone."""

from __future__ import annotations

import pytest
import torch

from rnnkit import GRU, LSTM, RNN
from rnnkit.models.pooling import Pooling, last_pool, max_pool, mean_pool, state_pool
from rnnkit.types import LSTMState

MASK = torch.tensor(
    [
        [1, 1, 1, 1, 1],
        [1, 1, 0, 0, 0],
        [1, 0, 0, 0, 0],
    ],
    dtype=torch.bool,
)


@pytest.fixture(autouse=True, scope="module")
def _one_thread(single_thread):
    # Tiny tensors: a second thread only adds contention on a shared machine.
    yield


@pytest.fixture
def states():
    g = torch.Generator().manual_seed(0)
    return torch.randn(3, 5, 4, generator=g, dtype=torch.float64, requires_grad=True)


def poisoned(h, value):
    """``h`` with every padded position replaced by ``value`` (differentiably for valid ones)."""
    return torch.where(MASK.unsqueeze(-1), h, torch.tensor(value, dtype=h.dtype))


def reference_mean(h):
    return torch.stack([h[i, : int(MASK[i].sum())].mean(0) for i in range(h.shape[0])])


def reference_max(h):
    return torch.stack([h[i, : int(MASK[i].sum())].amax(0) for i in range(h.shape[0])])


@pytest.mark.parametrize("value", [1e30, -1e30, float("inf"), float("-inf"), float("nan")])
@pytest.mark.parametrize(
    ("pool", "reference"), [(mean_pool, reference_mean), (max_pool, reference_max)]
)
def test_padding_never_counts(states, value, pool, reference):
    clean = pool(states, MASK)
    assert torch.equal(clean, reference(states.detach()))
    dirty_input = poisoned(states, value)
    dirty = pool(dirty_input, MASK)
    assert torch.equal(dirty, clean)
    # Nor does it reach the gradient: the gradient is finite, zero at padding.
    (grad,) = torch.autograd.grad(dirty.sum(), states)
    (grad_clean,) = torch.autograd.grad(pool(states, MASK).sum(), states)
    assert torch.isfinite(grad).all()
    assert torch.equal(grad, grad_clean)
    assert (grad[~MASK] == 0).all()


def test_max_pool_all_negative_values_are_not_beaten_by_zero_padding():
    h = -torch.arange(1.0, 11.0).view(1, 5, 2)  # all negative
    mask = torch.tensor([[1, 1, 0, 0, 0]], dtype=torch.bool)
    assert max_pool(h, mask).tolist() == [[-1.0, -2.0]]
    assert max_pool(torch.where(mask[..., None], h, 0.0), mask).tolist() == [[-1.0, -2.0]]


def test_empty_row_and_bad_shapes_are_errors(states):
    empty = MASK.clone()
    empty[2] = False
    for pool in (mean_pool, max_pool, last_pool):
        with pytest.raises(ValueError, match="sequence 2 has no valid step"):
            pool(states, empty)
    with pytest.raises(ValueError, match="mask must have shape"):
        mean_pool(states, MASK[:, :3])
    with pytest.raises(ValueError, match="pooling must be one of"):
        Pooling("sum")


@pytest.mark.parametrize("layer_cls", [RNN, GRU, LSTM])
@pytest.mark.parametrize("num_layers", [1, 2])
def test_bidirectional_last_equals_each_sequence_alone(layer_cls, num_layers):
    torch.manual_seed(3)
    H = 3
    layer = layer_cls(2, H, num_layers=num_layers, bidirectional=True).double()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 5, 2, generator=g, dtype=torch.float64)
    x = torch.where(MASK[..., None], x, 1e6)  # garbage in the padding
    out = layer(x, mask=MASK)
    from_state = Pooling("last", 2)(out.outputs, MASK, out.state)
    from_outputs = last_pool(out.outputs, MASK, num_directions=2)
    for i in range(3):
        n = int(MASK[i].sum())
        alone = layer(x[i : i + 1, :n]).outputs[0]  # (n, 2H), no padding at all
        expected = torch.cat([alone[n - 1, :H], alone[0, H:]])  # [h^f_L; h^b_1]
        torch.testing.assert_close(from_state[i], expected, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(from_outputs[i], expected, rtol=1e-12, atol=1e-12)


def test_unidirectional_last_is_the_last_real_step():
    torch.manual_seed(0)
    layer = GRU(2, 3).double()
    x = torch.randn(3, 5, 2, dtype=torch.float64)
    out = layer(x, mask=MASK)
    pooled = Pooling("last", 1)(out.outputs, MASK)
    for i in range(3):
        n = int(MASK[i].sum())
        torch.testing.assert_close(pooled[i], layer(x[i : i + 1, :n]).outputs[0, -1])
    torch.testing.assert_close(state_pool(out.state), pooled)


def test_state_pool_uses_h_of_an_lstm_state():
    h = torch.arange(8.0).view(2, 1, 2, 2)  # L = 2, D = 1, B = 2, H = 2: top layer used
    assert state_pool(LSTMState(h, torch.full_like(h, 99.0))).tolist() == [[4.0, 5.0], [6.0, 7.0]]


@pytest.mark.parametrize("pooling", ["last", "mean", "max"])
def test_a_classifier_exports_and_equals_eager_on_other_lengths(pooling):
    """The check for a row with no valid step reads the data: a traced graph leaves it
    out (as the layers leave theirs), so a classifier exports, with a dynamic batch."""
    from torch.export import Dim

    from rnnkit.models.classifier import build_classifier
    from rnnkit.models.spec import ModelSpec

    torch.manual_seed(0)
    spec = ModelSpec(hidden=8, embedding=4, bidirectional=True, pooling=pooling)
    model = build_classifier(spec, vocab_size=12, num_classes=3).eval()
    ids = torch.randint(4, 12, (3, 5))
    batch = Dim("B", min=1, max=64)
    program = torch.export.export(
        model, (ids, MASK), dynamic_shapes={"inputs": {0: batch}, "mask": {0: batch}}
    )
    for rows in (1, 7):
        other = torch.randint(4, 12, (rows, 5))
        mask = torch.arange(5) < torch.randint(1, 6, (rows, 1))
        torch.testing.assert_close(program.module()(other, mask), model(other, mask))
