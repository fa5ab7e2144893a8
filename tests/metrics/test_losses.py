"""``sequence_cross_entropy``: the masked reductions of docs/math.md, "Losses", with
hand-computed values (the worked examples there), padding that never matters, and clear errors."""

from __future__ import annotations

import math

import pytest
import torch

from rnnkit import sequence_cross_entropy
from rnnkit.metrics.losses import training_loss

pytestmark = pytest.mark.usefixtures("single_thread")

DT = torch.float64


def logits_for(probs: list[list[list[float]]]) -> torch.Tensor:
    """Logits whose softmax is exactly ``probs`` (each row sums to 1): log-probabilities."""
    return torch.tensor(probs, dtype=DT).log()


def test_spec_6_deep_example():
    """−ln 0.7 three times and −ln 0.1: total ≈ 3.37 nats."""
    p = [[[0.7, 0.2, 0.1]] * 3 + [[0.7, 0.2, 0.1]]]
    logits = logits_for(p)
    targets = torch.tensor([[0, 0, 0, 2]])
    total = sequence_cross_entropy(logits, targets, reduction="sum")
    assert total.item() == pytest.approx(3 * -math.log(0.7) + -math.log(0.1), abs=1e-12)
    assert round(total.item(), 2) == 3.37
    assert round(-math.log(0.7), 3) == 0.357 and round(-math.log(0.1), 3) == 2.303
    mean = sequence_cross_entropy(logits, targets)
    assert mean.item() == pytest.approx(total.item() / 4, abs=1e-12)


def test_four_steps_at_one_half():
    logits = torch.zeros(1, 4, 2, dtype=DT)
    targets = torch.tensor([[0, 1, 1, 0]])
    assert sequence_cross_entropy(logits, targets, reduction="sum").item() == pytest.approx(
        4 * math.log(2), abs=1e-12
    )
    assert round(4 * math.log(2), 3) == 2.773
    assert sequence_cross_entropy(logits, targets).item() == pytest.approx(math.log(2), abs=1e-12)


def test_token_sequence_and_sum_reductions_by_hand():
    # row 0: one valid step at p = 0.5; row 1: three valid steps at p = 0.25, 0.5, 0.125
    # (uniform over 8 classes); row 2: no valid step
    logits = torch.zeros(3, 3, 8, dtype=DT)
    logits[0, 0] = torch.tensor([0.5, 0.5] + [0.0] * 6, dtype=DT).clamp_min(1e-300).log()
    logits[1, 0] = torch.tensor([0.25] * 4 + [0.0] * 4, dtype=DT).clamp_min(1e-300).log()
    logits[1, 1] = torch.tensor([0.5, 0.5] + [0.0] * 6, dtype=DT).clamp_min(1e-300).log()
    targets = torch.tensor([[1, 7, 7], [3, 0, 5], [2, 2, 2]])
    mask = torch.tensor([[1, 0, 0], [1, 1, 1], [0, 0, 0]], dtype=torch.bool)
    ln2 = math.log(2)
    l0, l1 = [ln2], [2 * ln2, ln2, 3 * ln2]
    s = sum(l0) + sum(l1)
    assert sequence_cross_entropy(logits, targets, mask, "sum").item() == pytest.approx(s)
    assert sequence_cross_entropy(logits, targets, mask, "token").item() == pytest.approx(s / 4)
    # mean within each sequence first, then over the sequences that have a valid step
    want = (sum(l0) / 1 + sum(l1) / 3) / 2
    got = sequence_cross_entropy(logits, targets, mask, "sequence").item()
    assert got == pytest.approx(want, abs=1e-12)
    assert want != pytest.approx(s / 4)  # the two means really differ here


def test_token_is_default_and_none_mask_means_all_valid(gen):
    logits = torch.randn(2, 5, 4, generator=gen, dtype=DT)
    targets = torch.randint(0, 4, (2, 5), generator=gen)
    want = torch.nn.functional.cross_entropy(logits.reshape(10, 4), targets.reshape(10))
    torch.testing.assert_close(sequence_cross_entropy(logits, targets), want)
    ones = torch.ones(2, 5, dtype=torch.bool)
    torch.testing.assert_close(sequence_cross_entropy(logits, targets, ones, "token"), want)


def test_padding_never_matters(gen):
    """Out-of-range targets, NaN and huge logits at padded steps change nothing, and the
    padded logits get zero gradient."""
    B, T, V = 3, 4, 5
    logits = torch.randn(B, T, V, generator=gen, dtype=DT)
    targets = torch.randint(0, V, (B, T), generator=gen)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [0, 1, 0, 1]], dtype=torch.bool)
    dirty_logits = torch.where(mask[..., None], logits, float("nan"))
    dirty_logits[1, 3] = 1e30
    dirty_targets = torch.where(mask, targets, torch.tensor(-100))
    dirty_targets[1, 2] = 999
    for reduction in ("token", "sequence", "sum"):
        clean = sequence_cross_entropy(logits, targets, mask, reduction)
        z = dirty_logits.clone().requires_grad_()
        dirty = sequence_cross_entropy(z, dirty_targets, mask, reduction)
        assert torch.isfinite(dirty)
        torch.testing.assert_close(dirty, clean, atol=1e-12, rtol=0)
        dirty.backward()
        assert torch.isfinite(z.grad).all()
        assert torch.count_nonzero(z.grad[~mask]) == 0


def test_token_gradient_is_softmax_minus_onehot_over_count(gen):
    B, T, V = 2, 3, 4
    logits = torch.randn(B, T, V, generator=gen, dtype=DT, requires_grad=True)
    targets = torch.randint(0, V, (B, T), generator=gen)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    sequence_cross_entropy(logits, targets, mask).backward()
    onehot = torch.nn.functional.one_hot(targets, V).to(DT)
    want = (logits.detach().softmax(-1) - onehot) * mask[..., None] / 3
    torch.testing.assert_close(logits.grad, want, atol=1e-12, rtol=0)


@pytest.mark.parametrize("reduction", ["token", "sequence", "sum"])
def test_no_valid_position_is_an_error(reduction):
    logits = torch.zeros(2, 3, 4)
    targets = torch.zeros(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="no valid position"):
        sequence_cross_entropy(logits, targets, torch.zeros(2, 3, dtype=torch.bool), reduction)


def test_argument_errors():
    logits = torch.zeros(2, 3, 4)
    targets = torch.zeros(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match=r"reduction must be one of .*'mean'"):
        sequence_cross_entropy(logits, targets, reduction="mean")
    with pytest.raises(ValueError, match=r"logits must have shape \(B, T, V\), got \(6, 4\)"):
        sequence_cross_entropy(logits.view(6, 4), targets)
    with pytest.raises(
        ValueError, match=r"targets must have shape \(B, T\) = \(2, 3\), got \(3, 2\)"
    ):
        sequence_cross_entropy(logits, targets.T)
    with pytest.raises(ValueError, match=r"mask must have shape \(B, T\) = \(2, 3\), got \(2, 2\)"):
        sequence_cross_entropy(logits, targets, torch.ones(2, 2, dtype=torch.bool))
    with pytest.raises(TypeError, match=r"targets must hold integer class ids.*float32"):
        sequence_cross_entropy(logits, targets.float())
    bad = targets.clone()
    bad[1, 2] = 4
    with pytest.raises(ValueError, match=r"targets at valid positions must lie in \[0, 4\)"):
        sequence_cross_entropy(logits, bad)
    bad[1, 2] = -1
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        sequence_cross_entropy(logits, bad)


def test_training_loss_reductions_by_hand():
    """Row 0: two tokens at p = 1/2; row 1: one token at p = 1/4 (and one padded step).
    token: (ln 2 + ln 2 + ln 4) / 3; sequence: (ln 2 + ln 4) / 2; nats always ln 2·4."""
    probs = torch.tensor(
        [
            [[0.5, 0.5 / 3, 0.5 / 3, 0.5 / 3], [0.5, 0.5 / 3, 0.5 / 3, 0.5 / 3]],
            [[0.25, 0.25, 0.25, 0.25], [0.9, 0.1 / 3, 0.1 / 3, 0.1 / 3]],
        ],
        dtype=torch.float64,
    )
    targets = torch.zeros(2, 2, dtype=torch.long)
    mask = torch.tensor([[True, True], [True, False]])
    ln2 = math.log(2)
    for reduction, want in (("token", 4 * ln2 / 3), ("sequence", 1.5 * ln2)):
        loss, nats, tokens = training_loss(probs.log(), targets, mask, reduction)
        assert float(loss) == pytest.approx(want, rel=1e-12)
        assert nats == pytest.approx(4 * ln2, rel=1e-12) and tokens == 3
