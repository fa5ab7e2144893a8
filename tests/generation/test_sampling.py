"""Sampling: temperature, top-k, top-p, reproducibility, the model's own log-probability."""

from __future__ import annotations

import math

import pytest
import torch
from op_counts import OpCounts
from step_models import (
    EOS,
    TableModel,
    fixed_table,
    tiny_lm,
)
from torch import Tensor

from rnnkit.generation.options import GenerationResult
from rnnkit.generation.sampling import _draw, filter_log_probs
from rnnkit.generation.search import generate
from rnnkit.models.language_model import LanguageModel
from rnnkit.types import LSTMState

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


def _nucleus_by_hand(p_row: list[float], top_p: float) -> int:
    """The oracle: how many of the most probable tokens the nucleus holds, from exact
    sums (each float an integer multiple of 2⁻¹⁴⁹, summed as Python integers)."""
    scale = 2**149
    limit = top_p * scale  # exact: a double times a power of two
    total, n = 0, 0
    for x in sorted(p_row, reverse=True):
        if n and total >= limit:
            break
        num, den = x.as_integer_ratio()
        total += num * (scale // den)
        n += 1
    return n


@pytest.mark.parametrize("refused", [False, True], ids=["cumsum", "fixed-point"])
def test_the_nucleus_is_the_exact_sums(refused: bool, monkeypatch) -> None:
    # 50,000 tokens: float32 sums of their probabilities are off by more than the tail
    # tokens' own probabilities (on this draw, at 0.99, float32 probabilities summed in
    # float32 ended one row of 32 a token off).
    # Where torch refuses a floating-point cumsum (a GPU under
    # torch.use_deterministic_algorithms(True)) the sums are integers.
    from rnnkit.generation import sampling

    gen = torch.Generator().manual_seed(0)
    lp = torch.log_softmax(3 * torch.randn(32, 50_000, generator=gen), dim=-1)
    if refused:
        monkeypatch.setattr(sampling, "_cumsum_refused", lambda t: True)
        real = torch.Tensor.cumsum

        def integer_only(t, *args, **kwargs):
            assert not t.is_floating_point(), "a floating-point cumsum"
            return real(t, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, "cumsum", integer_only)
    probs = torch.log_softmax(lp.double(), -1).exp()  # what the filter sums
    for top_p in (0.9, 0.99):
        kept = (filter_log_probs(lp, top_p=top_p).exp() > 0).sum(-1).tolist()
        want = [_nucleus_by_hand(probs[r].double().tolist(), top_p) for r in range(32)]
        assert kept == want, top_p


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_top_p_samples_under_deterministic_algorithms() -> None:
    lp = torch.log_softmax(torch.randn(4, 100, generator=torch.Generator().manual_seed(1)), -1)
    torch.use_deterministic_algorithms(True)
    try:
        got = filter_log_probs(lp.cuda(), top_p=0.7)
    finally:
        torch.use_deterministic_algorithms(False)
    torch.testing.assert_close(got.cpu(), filter_log_probs(lp, top_p=0.7), rtol=0, atol=1e-6)


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


def random_log_probs(seed: int, rows: int, V: int) -> Tensor:
    """Float32 log-probabilities of every scale, a quarter of the columns at ``-inf``
    (forbidden tokens) in every other draw."""
    g = torch.Generator().manual_seed(seed)
    scale = 10.0 ** float(torch.randint(-3, 3, (), generator=g))
    lp = torch.log_softmax(torch.randn(rows, V, generator=g) * scale, dim=-1)
    if seed % 2:
        lp[:, torch.randint(0, V, (max(1, V // 4),), generator=g)] = -math.inf
        lp[:, 0] = 0.5  # at least one column stays finite
    return lp


def test_at_temperature_one_the_filter_is_the_shifted_formula_to_the_last_bit() -> None:
    # At T = 1 the shift by the maximum is left to log_softmax, which makes it itself.
    for seed in range(300):
        lp = random_log_probs(seed, 1 + seed % 4, 1 + (seed * 37) % 300)
        x = lp.double()
        oracle = torch.log_softmax(x - x.amax(dim=-1, keepdim=True), dim=-1).float()
        assert torch.equal(filter_log_probs(lp), oracle), seed


def test_the_draw_is_multinomials_own() -> None:
    # The same index as torch.multinomial(probs, 1) from the same generator state, and
    # the generator left in the same state: the same samples, draw after draw.
    for seed in range(200):
        probs = filter_log_probs(random_log_probs(seed, 1 + seed % 5, 2 + seed % 150)).exp()
        ours, theirs = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
        for _ in range(3):
            index, _ = _draw(probs, ours)
            assert torch.equal(index, torch.multinomial(probs, 1, generator=theirs)), seed
        assert torch.equal(ours.get_state(), theirs.get_state())


def plain_sampling(
    model: LanguageModel,
    prompt: int,
    *,
    num: int,
    max_length: int,
    eos_id: int | None,
    forbid: tuple[int, ...],
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    seed: int,
) -> list[tuple[list[int], float]]:
    """The sampling loop written plainly, as it was before its bookkeeping was cut: the
    forbidden columns filled, the float64 distribution from the maximum, top-k and top-p
    spelled out, ``torch.multinomial``; a row leaves the batch when it draws ``eos_id``."""
    g = torch.Generator().manual_seed(seed)
    log_probs, state = model.step(torch.tensor([prompt]), None)  # primed once, then copied
    log_probs = log_probs.expand(num, -1)
    state = LSTMState(*(s.index_select(2, torch.zeros(num, dtype=torch.long)) for s in state))
    rows = list(range(num))  # batch row -> output row
    ids: list[list[int]] = [[] for _ in range(num)]
    logprob = [0.0] * num
    for t in range(max_length):
        lp = log_probs.clone()
        lp[:, list(forbid)] = -math.inf
        x = lp.double()
        scores = torch.log_softmax((x - x.amax(-1, keepdim=True)) / temperature, -1).float()
        if top_k is not None:
            kth = scores.topk(top_k, dim=-1).indices
            keep = torch.zeros_like(scores, dtype=torch.bool).scatter(-1, kth, True)
            scores = torch.log_softmax(scores.masked_fill(~keep, -math.inf), -1)
        if top_p is not None:
            probs, order = scores.exp().sort(dim=-1, descending=True)
            drop = (probs.cumsum(-1) - probs) >= top_p
            drop[:, 0] = False
            drop = torch.zeros_like(drop).scatter(-1, order, drop)
            scores = torch.log_softmax(scores.masked_fill(drop, -math.inf), -1)
        token = torch.multinomial(scores.exp(), 1, generator=g).view(-1)
        live = []
        for b, (r, k) in enumerate(zip(rows, token.tolist(), strict=True)):
            logprob[r] += float(log_probs[b, k])
            if k == eos_id:
                continue
            ids[r].append(k)
            live.append(b)
        if t == max_length - 1 or not live:
            break
        keep_rows = torch.tensor(live)
        rows = [rows[b] for b in live]
        state = LSTMState(*(s.index_select(2, keep_rows) for s in state))
        log_probs, state = model.step(token[keep_rows], state)
    return list(zip(ids, logprob, strict=True))


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"temperature": 0.6},
        {"temperature": 1.7, "top_k": 3},
        {"top_p": 0.8},
        {"forbid": (1, 2), "eos_id": EOS},
        {"forbid": (2,), "temperature": 0.8, "top_k": 4, "top_p": 0.9, "eos_id": EOS},
    ],
)
@pytest.mark.parametrize("num", [1, 5])
def test_samples_are_those_of_the_plain_multinomial_loop(options, num: int) -> None:
    # The same tokens and the same log-probabilities, to the last bit, as the loop that
    # samples with torch.multinomial from the distribution computed step by step.
    lm = tiny_lm(seed=2)
    with torch.no_grad():
        lm.head.weight.div_(4.0)  # flat distributions: many possible samples
    full = {"eos_id": None, "forbid": (), "temperature": 1.0, "top_k": None, "top_p": None}
    full.update(options)
    for seed in range(4):
        g = torch.Generator().manual_seed(seed)
        got = generate(lm, [4], max_length=12, num=num, generator=g, **full)
        want = plain_sampling(lm, 4, num=num, max_length=12, seed=seed, **full)
        assert [(r.ids, r.logprob) for r in got] == want, seed
        assert all(r.finished == (len(r.ids) < 12) for r in got if options.get("eos_id") is None)


def test_a_distribution_holding_nan_is_named() -> None:
    # multinomial refused it inside torch; the draw reads the NaN with the tokens
    table = torch.full((4, 4), 1 / 3)
    table[:, 3] = 0.0  # token 3 is never drawn: only a prompt reaches its row
    table[3, 1] = math.nan
    chain = TableModel(table)
    message = "^the model's log-probabilities hold NaN at generated token 1: nothing can"
    with pytest.raises(ValueError, match=message):
        generate(chain, [3], max_length=3, generator=torch.Generator().manual_seed(0))
    fine = generate(chain, [0], max_length=3, num=2, generator=torch.Generator().manual_seed(0))
    assert all(len(r.ids) == 3 for r in fine)


# ATen operations per sampling step outside the model's step, without eos: the float64
# copy with the forbidden columns (add), log_softmax, the float32 copy, exp, the draw
# (empty_like, exponential_, div, max), the model's log-probability of it (gather), views.
# It was 16.5: the fill, amax, sub, div, and an end test (ne, sum, a read) with no end.
SAMPLING_OPS = 13


def test_a_sampling_step_dispatches_no_more_than_pinned() -> None:
    lm = tiny_lm()
    forbid = (1, 2)
    with OpCounts(LanguageModel) as counts:
        generate(lm, [4], max_length=20, num=3, forbid=forbid, eos_id=None,
                 generator=torch.Generator().manual_seed(0))  # fmt: skip
    assert counts.per_step() - counts.model_per_step() <= SAMPLING_OPS, counts.by_name()
