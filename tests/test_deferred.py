"""Deferred checks and figures: one read, the first failed check's own error, nothing
lost; and the losses computed without host reads equal the eager ones."""

from __future__ import annotations

import pytest
import torch

from rnnkit import deferred as deferred_module
from rnnkit.deferred import Deferred, active, active_for, count_of, deferring, figure_of
from rnnkit.metrics.losses import sequence_cross_entropy, training_loss
from rnnkit.models.language_model import check_token_ids


@pytest.fixture(autouse=True)
def as_on_a_gpu(monkeypatch):
    """The deferred computations run where a read waits (a GPU): these CPU tensors are
    treated so, as on a device."""
    monkeypatch.setattr(deferred_module, "waits", lambda tensor: True)


def test_on_the_cpu_checks_and_losses_compute_as_ever_only_figures_wait(monkeypatch) -> None:
    monkeypatch.setattr(deferred_module, "waits", lambda tensor: tensor.device.type != "cpu")
    logits, targets, mask = _batch(4)
    bad = targets.clone()
    bad[0, 0] = 9
    with deferring() as d:
        assert active_for(logits) is None and active() is d
        with pytest.raises(ValueError, match="targets at valid positions"):
            sequence_cross_entropy(logits, bad, mask)  # at once, as outside
        with pytest.raises(ValueError, match="got 9 at"):
            check_token_ids(bad.clamp(min=0), 7, "inputs")
        _, nats, tokens = training_loss(logits, targets, mask)
        assert isinstance(nats, torch.Tensor) and isinstance(tokens, torch.Tensor)


def test_read_returns_the_values_in_order_and_clears_the_checks() -> None:
    d = Deferred()
    d.check(torch.tensor(False), lambda: ValueError("no"))
    assert d.read(torch.tensor(1.5), 2, torch.tensor(7, dtype=torch.long)) == [1.5, 2.0, 7.0]
    assert d.read() == []


def test_fetch_returns_host_copies_of_any_shape_and_dtype_and_clears_the_checks() -> None:
    d = Deferred()
    d.check(torch.tensor(False), lambda: ValueError("no"))
    ids = torch.tensor([[3, 1], [2, 7]])
    values = [torch.tensor(2.5, dtype=torch.float64), ids, torch.tensor([True, False]),
              torch.zeros(0, 3), torch.tensor([1.25], dtype=torch.float16)]  # fmt: skip
    got = d.fetch(*values)
    for want, host in zip(values, got, strict=True):
        assert host.dtype == want.dtype and host.shape == want.shape and host.equal(want)
    ids[0, 0] = 9  # a copy, not the tensor itself
    assert got[1][0, 0] == 3
    d.check(torch.tensor(True), lambda: ValueError("failed"))
    with pytest.raises(ValueError, match="failed"):
        d.fetch(torch.tensor(1.0))
    assert d.fetch() == []


def test_the_first_failed_check_in_recorded_order_raises_its_own_error() -> None:
    d = Deferred()
    d.check(torch.tensor(False), lambda: ValueError("first, passed"))
    d.check(torch.tensor(True), lambda: ValueError("second, failed"))
    d.check(torch.tensor(True), lambda: TypeError("third, failed"))
    with pytest.raises(ValueError, match="second, failed"):
        d.read(torch.tensor(1.0))
    assert d.read() == []  # the failed step's checks are gone


def test_a_check_left_unread_is_read_when_the_block_ends() -> None:
    with pytest.raises(ValueError, match="left"), deferring() as d:
        d.check(torch.tensor(True), lambda: ValueError("left"))


def test_an_error_inside_the_block_is_not_replaced_by_the_checks() -> None:
    with pytest.raises(KeyError), deferring() as d:
        d.check(torch.tensor(True), lambda: ValueError("pending"))
        raise KeyError("inner")


def test_figures_are_numbers_outside_and_tensors_inside() -> None:
    t = torch.tensor(3.0, requires_grad=True) * 2
    assert active() is None
    assert figure_of(t) == 6.0 and isinstance(figure_of(t), float)
    assert count_of(torch.tensor(4)) == 4 and isinstance(count_of(torch.tensor(4)), int)
    with deferring() as d:
        assert active() is d
        f = figure_of(t)
        assert isinstance(f, torch.Tensor) and not f.requires_grad
    assert active() is None


def _batch(seed: int = 0, V: int = 7):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(3, 5, V, dtype=torch.float64, generator=g)
    targets = torch.randint(0, V, (3, 5), generator=g)
    mask = torch.tensor(
        [[1, 1, 1, 0, 0], [1, 0, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool
    )  # padding and a hole
    logits[~mask] = float("nan")  # padding that must not reach value or gradient
    targets[~mask] = -100  # out of range where padded: never a target
    return logits, targets, mask


@pytest.mark.parametrize("reduction", ["token", "sequence", "sum"])
def test_deferred_cross_entropy_equals_the_eager_one_value_and_gradient(reduction: str) -> None:
    logits, targets, mask = _batch()
    a = logits.clone().requires_grad_()
    eager = sequence_cross_entropy(a, targets, mask, reduction)
    eager.backward()
    b = logits.clone().requires_grad_()
    with deferring():
        late = sequence_cross_entropy(b, targets, mask, reduction)
    late.backward()
    torch.testing.assert_close(late, eager, rtol=1e-14, atol=0)
    assert torch.isfinite(b.grad).all()  # NaN padding: zero gradient, not NaN × 0
    torch.testing.assert_close(b.grad, torch.nan_to_num(a.grad, nan=0.0), rtol=1e-14, atol=0)
    assert (b.grad[~mask] == 0).all()


def test_training_loss_figures_are_the_eager_ones_read_later() -> None:
    logits, targets, mask = _batch(1)
    for reduction in ("token", "sequence"):
        loss, nats, tokens = training_loss(logits, targets, mask, reduction)
        with deferring() as d:
            loss2, nats2, tokens2 = training_loss(logits, targets, mask, reduction)
            assert isinstance(nats2, torch.Tensor) and isinstance(tokens2, torch.Tensor)
            read = d.read(loss2, nats2, tokens2)
        assert read[0] == pytest.approx(float(loss), rel=1e-14)
        assert read[1] == pytest.approx(nats, rel=1e-14) and read[2] == tokens == 11


def _message(fn) -> str:
    with pytest.raises(ValueError) as info:
        fn()
    return str(info.value)


def test_a_bad_target_or_an_empty_mask_raises_the_eager_message_at_the_read() -> None:
    logits, targets, mask = _batch(2)
    bad = targets.clone()
    bad[1, 2] = 7  # a valid position, class id = V
    eager = _message(lambda: sequence_cross_entropy(logits, bad, mask))
    with deferring() as d:
        loss = sequence_cross_entropy(logits, bad, mask)  # no error yet
        assert torch.isfinite(loss)  # computed on clamped targets meanwhile
        assert _message(lambda: d.read(loss)) == eager
    none = torch.zeros_like(mask)
    eager = _message(lambda: sequence_cross_entropy(logits, targets, none))
    with deferring() as d:
        sequence_cross_entropy(logits, targets, none)
        assert _message(d.read) == eager


def test_token_ids_out_of_range_are_clamped_meanwhile_and_refused_at_the_read() -> None:
    ids = torch.tensor([[1, 2, 9], [0, -1, 3]])
    eager = _message(lambda: check_token_ids(ids, 5))
    assert "got 9 at (0, 2)" in eager
    with deferring() as d:
        safe = check_token_ids(ids, 5)
        assert safe.tolist() == [[1, 2, 4], [0, 0, 3]]  # an embedding can look these up
        assert _message(d.read) == eager
    good = torch.tensor([[1, 2]])
    assert check_token_ids(good, 5) is good


@pytest.mark.parametrize("reduction", ["token", "sequence", "sum"])
def test_without_a_mask_the_deferred_loss_is_the_eager_one_and_counts_on_the_host(
    reduction: str,
) -> None:
    logits, targets, _ = _batch(3)
    logits = torch.nan_to_num(logits)  # every position real here
    targets = targets.clamp(min=0)
    eager, nats, tokens = training_loss(logits, targets, None, reduction)
    with deferring() as d:
        late, late_nats, late_tokens = training_loss(logits, targets, None, reduction)
        assert late_tokens == 15 and isinstance(late_tokens, int)  # the shape's: no read
        (read_nats,) = d.read(late_nats)
    torch.testing.assert_close(late, eager, rtol=1e-14, atol=0)
    assert read_nats == pytest.approx(nats, rel=1e-14) and tokens == 15
    bad = targets.clone()
    bad[2, 4] = 7
    message = _message(lambda: sequence_cross_entropy(logits, bad, None))
    with deferring() as d:
        sequence_cross_entropy(logits, bad, None)
        assert _message(d.read) == message
