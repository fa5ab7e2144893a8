"""Beam search: better than greedy, width one is greedy, exact stopping, per-beam states."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from step_models import (
    EOS,
    Counting,
    Markov2Model,
    TableModel,
    rescore,
    tiny_lm,
)

from rnnkit.generation.options import GenerationResult
from rnnkit.generation.search import generate, generate_batch


def test_beam_finds_the_likelier_sequence_greedy_misses() -> None:
    # From bos (3): 1 (0.5) or 2 (0.4); after 1 nothing is likely (eos 0.34); after 2,
    # eos 0.9. Greedy takes 1 then eos: 0.17; the best sequence is 2 then eos: 0.36.
    table = torch.tensor(
        [
            [0.25, 0.25, 0.25, 0.25],
            [0.34, 0.33, 0.33, 0.0],
            [0.9, 0.05, 0.05, 0.0],
            [0.1, 0.5, 0.4, 0.0],
        ]
    )
    model = TableModel(table)
    (greedy,) = generate(model, None, bos_id=3, max_length=5, eos_id=EOS, strategy="greedy")
    assert greedy.ids == [1] and greedy.logprob == pytest.approx(math.log(0.17))
    beams = generate(
        model,
        None,
        bos_id=3,
        max_length=5,
        eos_id=EOS,
        strategy="beam",
        beam_size=2,
        num=2,
        length_penalty=0.0,
    )
    assert [b.ids for b in beams] == [[2], [1]]
    assert beams[0].logprob == pytest.approx(math.log(0.36)) and beams[0].finished


# Exact stopping under length normalisation (alpha > 0, early_stopping=False) may go on
# past greedy's eos and find a better-scored longer hypothesis: that is its purpose.
@pytest.mark.parametrize(
    ("alpha", "early_stopping"), [(0.0, True), (0.7, True), (1.0, True), (0.0, False)]
)
def test_beam_width_one_is_greedy(alpha: float, early_stopping: bool) -> None:
    lm = Counting(tiny_lm(seed=1))
    prompts = [[1], [2, 3], [4, 4, 5]]
    beams = generate_batch(
        lm,
        prompts,
        max_length=6,
        eos_id=EOS,
        strategy="beam",
        beam_size=1,
        length_penalty=alpha,
        early_stopping=early_stopping,
    )
    for prompt, (beam,) in zip(prompts, beams, strict=True):
        (greedy,) = generate(lm.model, prompt, max_length=6, eos_id=EOS, strategy="greedy")
        assert beam.ids == greedy.ids and beam.finished == greedy.finished
        assert beam.logprob == pytest.approx(greedy.logprob, abs=1e-5)
    assert lm.calls <= 3 + 5  # one batched call per token, after the longest prompt


def brute_force(model: Markov2Model, prompt: list[int], max_length: int, alpha: float):
    """Every sequence the search could return, scored exactly."""
    V = model.vocab_size
    results = []
    for n in range(1, max_length + 1):
        for body in itertools.product(range(1, V), repeat=n - 1):
            for last, finished in ((EOS, True), *((t, False) for t in range(1, V))):
                if not finished and n < max_length:
                    continue
                ids = [*body] if finished else [*body, last]
                r = GenerationResult(ids, 0.0, finished, 0.0)
                lp = rescore(model, prompt, r)
                results.append(GenerationResult(ids, lp, finished, lp / n**alpha))
    return sorted(results, key=lambda r: r.score, reverse=True)


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.5])
def test_a_wide_exact_beam_equals_exhaustive_search(alpha: float) -> None:
    model = Markov2Model(4, seed=int(alpha * 10))
    prompt = [2, 1]
    beams = generate(
        model,
        prompt,
        max_length=4,
        eos_id=EOS,
        strategy="beam",
        beam_size=64,
        num=5,
        length_penalty=alpha,
        early_stopping=False,
    )
    best = brute_force(model, prompt, 4, alpha)[:5]
    assert [(b.ids, b.finished) for b in beams] == [(r.ids, r.finished) for r in best]
    for b, r in zip(beams, best, strict=True):
        assert b.score == pytest.approx(r.score, abs=1e-5)


@pytest.mark.parametrize("early_stopping", [True, False])
def test_beam_hypotheses_carry_their_own_state(early_stopping: bool) -> None:
    model = Markov2Model(5, seed=4)
    out = generate_batch(
        model,
        [[1], [3, 2]],
        max_length=6,
        eos_id=EOS,
        strategy="beam",
        beam_size=3,
        num=3,
        early_stopping=early_stopping,
    )
    for prompt, hyps in zip([[1], [3, 2]], out, strict=True):
        assert 1 <= len(hyps) <= 3
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
        for h in hyps:
            assert h.logprob == pytest.approx(rescore(model, prompt, h), abs=1e-5)
            assert h.score == pytest.approx(h.logprob / (len(h.ids) + h.finished))


def test_exact_stopping_never_does_worse_than_early_stopping() -> None:
    model = Markov2Model(5, seed=5)
    kw = dict(max_length=6, eos_id=EOS, strategy="beam", beam_size=2, length_penalty=1.0)
    (early,) = generate(model, [1], early_stopping=True, **kw)
    (exact,) = generate(model, [1], early_stopping=False, **kw)
    assert exact.score >= early.score - 1e-6


def test_exact_stopping_finds_a_longer_hypothesis_under_normalisation() -> None:
    # From bos (3): eos 0.7, or 1 (0.29) then the near-certain chain 1 2 4 5 eos.
    # Per token, the long sequence wins (-1.278 / 5 > -0.357 / 1), but it starts worse
    # than the short one ends: only a search that bounds what live hypotheses can still
    # reach (dividing by max_length) goes on to find it.
    table = torch.full((6, 6), 0.002)
    for src, dst in ((1, 2), (2, 4), (4, 5), (5, EOS), (0, 1)):
        table[src, dst] = 0.99
    table[3] = torch.tensor([0.7, 0.29, 0.0025, 0.0025, 0.0025, 0.0025])
    model = TableModel(table)
    kw = dict(bos_id=3, max_length=6, eos_id=EOS, strategy="beam", beam_size=1)
    (early,) = generate(model, None, early_stopping=True, **kw)
    assert early.ids == [] and early.finished
    (exact,) = generate(model, None, early_stopping=False, **kw)
    assert exact.ids == [1, 2, 4, 5] and exact.finished
    assert exact.score == pytest.approx((math.log(0.29) + 4 * math.log(0.99)) / 5)
    (raw,) = generate(model, None, early_stopping=False, length_penalty=0.0, **kw)
    assert raw.ids == []  # without normalisation the short one is best
