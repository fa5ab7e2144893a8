"""Sampling: temperature, top-k, top-p, reproducibility, the model's own log-probability."""

from __future__ import annotations

import math

import pytest
import torch
from step_models import (
    EOS,
    TableModel,
    fixed_table,
    tiny_lm,
)
from torch import Tensor

from rnnkit.generation.options import GenerationResult
from rnnkit.generation.sampling import filter_log_probs
from rnnkit.generation.search import generate

PROBS = [0.3, 0.25, 0.2, 0.1, 0.08, 0.07]


def token_counts(out: list[GenerationResult], V: int) -> Tensor:
    ids = torch.tensor([t for r in out for t in r.ids])
    return torch.bincount(ids, minlength=V).float()


def test_top_k_never_leaves_the_k_best() -> None:
    model = TableModel(fixed_table(PROBS))
    g = torch.Generator().manual_seed(1)
    out = generate(model, [0], max_length=3, num=1000, top_k=3, generator=g)
    counts = token_counts(out, 6)
    assert counts[3:].sum() == 0
    freq = counts[:3] / counts.sum()
    expected = torch.tensor(PROBS[:3]) / sum(PROBS[:3])
    assert torch.allclose(freq, expected, atol=0.04)


@pytest.mark.parametrize(("top_p", "nucleus"), [(0.5, 2), (0.6, 3), (0.01, 1)])
def test_top_p_never_leaves_the_nucleus(top_p: float, nucleus: int) -> None:
    model = TableModel(fixed_table(PROBS))
    g = torch.Generator().manual_seed(2)
    out = generate(model, [0], max_length=3, num=1000, top_p=top_p, generator=g)
    counts = token_counts(out, 6)
    assert counts[nucleus:].sum() == 0
    assert (counts[:nucleus] > 0).all()


def test_filter_keeps_the_smallest_set_reaching_p_wherever_the_tokens_sit() -> None:
    perm = torch.tensor([4, 0, 5, 2, 1, 3])
    lp = torch.tensor(PROBS)[perm].log().view(1, -1)
    kept = filter_log_probs(lp, top_p=0.6).exp()[0]
    assert set(torch.nonzero(kept).view(-1).tolist()) == {1, 3, 4}  # PROBS 0.3, 0.25, 0.2
    assert float(kept.sum()) == pytest.approx(1.0)
    assert torch.equal(filter_log_probs(lp, top_p=1.0).exp() > 0, torch.ones(1, 6, dtype=bool))
    both = filter_log_probs(lp, top_k=4, top_p=0.9).exp()[0]  # 0.9 of the renormalised top 4
    assert set(torch.nonzero(both).view(-1).tolist()) == {1, 3, 4, 5}


def test_temperature_shapes_the_distribution() -> None:
    lp = torch.tensor([PROBS]).log()
    assert torch.allclose(filter_log_probs(lp, temperature=1.0).exp(), torch.tensor([PROBS]))
    cold = filter_log_probs(lp, temperature=1e-3).exp()
    assert float(cold[0, 0]) == pytest.approx(1.0)
    hot = filter_log_probs(lp, temperature=1e3).exp()
    assert torch.allclose(hot, torch.full((1, 6), 1 / 6), atol=1e-3)


def test_a_tiny_temperature_samples_what_greedy_picks() -> None:
    lm = tiny_lm()
    (greedy,) = generate(lm, [1], max_length=6, eos_id=EOS, strategy="greedy")
    cold = generate(
        lm,
        [1],
        max_length=6,
        eos_id=EOS,
        num=3,
        temperature=1e-4,
        generator=torch.Generator().manual_seed(0),
    )
    assert all(r.ids == greedy.ids for r in cold)


def test_same_seed_same_samples_other_seed_other_samples() -> None:
    lm = tiny_lm(seed=3)
    with torch.no_grad():
        lm.head.weight.div_(4.0)  # a flat distribution: many possible samples

    def draw(seed: int) -> list[GenerationResult]:
        g = torch.Generator().manual_seed(seed)
        return generate(lm, [1], max_length=10, num=4, generator=g)

    a, b, c = draw(7), draw(7), draw(8)
    assert a == b
    assert [r.ids for r in a] != [r.ids for r in c]
    assert len({tuple(r.ids) for r in a}) > 1  # the rows of one batch differ too


def test_sampled_logprob_is_under_the_model_not_the_filtered_distribution() -> None:
    model = TableModel(fixed_table(PROBS))
    g = torch.Generator().manual_seed(3)
    for r in generate(model, [0], max_length=4, num=20, top_k=2, temperature=0.5, generator=g):
        assert r.logprob == pytest.approx(sum(math.log(PROBS[t]) for t in r.ids))


@pytest.mark.parametrize("temperature", [1e-45, 5e-324, 1e-300])
def test_a_temperature_near_zero_is_greedy_not_nan(temperature: float) -> None:
    # logits / 1e-45 overflowed float32 to inf, and softmax made NaN: multinomial failed.
    lp = torch.tensor([PROBS, PROBS[::-1]]).log()
    kept = filter_log_probs(lp, temperature=temperature).exp()
    assert torch.equal(kept, torch.eye(6)[[0, 5]])
    (greedy,) = generate(tiny_lm(), [1], max_length=6, eos_id=EOS, strategy="greedy")
    cold = generate(tiny_lm(), [1], max_length=6, eos_id=EOS, num=2, temperature=temperature,
                    generator=torch.Generator().manual_seed(0))  # fmt: skip
    assert all(r.ids == greedy.ids for r in cold)


def test_the_float64_computation_equals_the_softmax_of_scaled_logits() -> None:
    lp = torch.randn(3, 7, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    for temperature in (0.05, 0.7, 3.0):
        expected = torch.softmax(lp / temperature, dim=-1).float()
        got = filter_log_probs(lp.float(), temperature=temperature).exp()
        assert torch.allclose(got, expected, atol=1e-6)
