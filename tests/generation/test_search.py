"""Free running: greedy, sampling (temperature, top-k, top-p), beam search, stopping, cost."""

from __future__ import annotations

import itertools
import math
from typing import NamedTuple

import pytest
import torch
from torch import Tensor, nn

from rnnkit import LSTM
from rnnkit.generation.search import (
    GenerationResult,
    filter_log_probs,
    generate,
    generate_batch,
    select_state,
)
from rnnkit.models.language_model import LanguageModel
from rnnkit.types import LSTMState

EOS = 0


class TableModel:
    """Log-probs depend only on the last token: ``log table[token]``; counts its calls.

    The state ``(1, 1, B, 1)`` counts the tokens each row has consumed, so a row fed
    after it should have stopped, or a state routed to the wrong row, shows up.
    """

    def __init__(self, table: Tensor) -> None:
        self.log_table = table.log()
        self.vocab_size = table.shape[1]
        self.calls = 0
        self.batch_sizes: list[int] = []
        self.fed: list[list[int]] = []

    def step(self, token: Tensor, state: Tensor | None) -> tuple[Tensor, Tensor]:
        self.calls += 1
        self.batch_sizes.append(token.shape[0])
        self.fed.append(token.tolist())
        if state is None:
            state = torch.zeros(1, 1, token.shape[0], 1)
        assert state.shape[2] == token.shape[0]
        return self.log_table[token], state + 1


class Markov2Model:
    """Log-probs depend on the last two tokens; the state holds the previous one.

    Beam search that reorders states wrongly scores its hypotheses with the wrong
    history, so rescoring the returned ids exposes it.
    """

    def __init__(self, vocab_size: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        # Row V of the first index is "no previous token" (the zero state).
        logits = 2.0 * torch.randn(vocab_size + 1, vocab_size, vocab_size, generator=g)
        self.log_table = torch.log_softmax(logits, dim=-1)
        self.vocab_size = vocab_size
        self.calls = 0

    def step(self, token: Tensor, state: LSTMState | None) -> tuple[Tensor, LSTMState]:
        self.calls += 1
        B = token.shape[0]
        prev = torch.full((B,), self.vocab_size) if state is None else state.h.view(B).long()
        new = token.view(1, 1, B, 1).float()
        return self.log_table[prev, token], LSTMState(new, new.clone())


class Counting:
    """Wraps a model and counts its ``step`` calls and the tokens each one got."""

    def __init__(self, model: LanguageModel) -> None:
        self.model = model
        self.vocab_size = model.vocab_size
        self.batch_sizes: list[int] = []

    @property
    def calls(self) -> int:
        return len(self.batch_sizes)

    def step(self, token: Tensor, state: object) -> tuple[Tensor, object]:
        self.batch_sizes.append(token.shape[0])
        return self.model.step(token, state)


def chain_table(V: int = 6, p: float = 0.7) -> Tensor:
    """Token ``i`` is followed by ``i + 1`` with probability ``p`` (``V − 1`` by eos)."""
    table = torch.full((V, V), (1 - p) / (V - 1))
    for i in range(V):
        table[i, (i + 1) % V] = p
    return table


def fixed_table(probs: list[float]) -> Tensor:
    """The same next-token distribution whatever the last token."""
    row = torch.tensor(probs)
    return row.expand(len(probs), -1).clone()


def tiny_lm(V: int = 7, seed: int = 0) -> LanguageModel:
    torch.manual_seed(seed)
    lm = LanguageModel(nn.Embedding(V, 5), LSTM(5, 12), nn.Linear(12, V))
    with torch.no_grad():
        lm.head.weight.mul_(4.0)  # peaked distributions: greedy paths are unambiguous
    return lm.eval()


def rescore(model: object, prompt: list[int], result: GenerationResult) -> float:
    """Log-probability of ``result`` recomputed one row at a time."""
    log_probs, state = None, None
    for t in prompt:
        log_probs, state = model.step(torch.tensor([t]), state)
    total = 0.0
    drawn = result.ids + ([EOS] if result.finished else [])
    for i, t in enumerate(drawn):
        total += float(log_probs[0, t])
        if i < len(drawn) - 1:
            log_probs, state = model.step(torch.tensor([t]), state)
    return total


# ----------------------------------------------------------------------------- greedy


def test_greedy_follows_the_argmax_chain_and_stops_at_eos() -> None:
    model = TableModel(chain_table(6))
    (out,) = generate(model, [2], max_length=10, eos_id=EOS, strategy="greedy")
    assert out.ids == [3, 4, 5]  # 5 -> 0 is eos: drawn, not returned
    assert out.finished
    assert out.logprob == pytest.approx(4 * math.log(0.7))  # eos's probability counts
    assert out.score == pytest.approx(out.logprob / 4)  # length_penalty 1, 4 tokens drawn


def test_stops_at_the_length_limit() -> None:
    model = TableModel(chain_table(6))
    (out,) = generate(model, [1], max_length=2, eos_id=EOS, strategy="greedy")
    assert out.ids == [2, 3]
    assert not out.finished
    # eos drawn exactly at the limit counts as one of the max_length tokens
    (out,) = generate(model, [3], max_length=3, eos_id=EOS, strategy="greedy")
    assert out.ids == [4, 5] and out.finished


def test_without_eos_only_the_limit_stops() -> None:
    model = TableModel(chain_table(6))
    (out,) = generate(model, [2], max_length=8, strategy="greedy")
    assert out.ids == [3, 4, 5, 0, 1, 2, 3, 4] and not out.finished


def test_greedy_on_a_real_lm_picks_the_argmax_of_the_teacher_forced_run() -> None:
    lm = tiny_lm()
    prompt = [1, 2, 3]
    (out,) = generate(lm, prompt, max_length=8, strategy="greedy")  # no eos: 8 tokens
    assert len(out.ids) == 8
    # One unbroken teacher-forced pass over prompt + output gives the same choices.
    seq = torch.tensor([prompt + out.ids[:-1]])
    with torch.no_grad():
        log_probs = torch.log_softmax(lm(seq).logits[0], dim=-1)[len(prompt) - 1 :]  # (8, V)
    assert log_probs.argmax(-1).tolist() == out.ids
    expected = log_probs.gather(1, torch.tensor(out.ids).view(-1, 1)).sum()
    assert out.logprob == pytest.approx(float(expected), abs=1e-5)


def test_an_initial_state_primes_generation() -> None:
    lm = tiny_lm()
    with torch.no_grad():
        state = lm(torch.tensor([[4, 5]])).state
    (a,) = generate(lm, [1], max_length=5, strategy="greedy", state=state)
    (b,) = generate(lm, [4, 5, 1], max_length=5, strategy="greedy")
    assert a.ids == b.ids and a.logprob == pytest.approx(b.logprob, abs=1e-5)


# -------------------------------------------------------------------------------- cost


@pytest.mark.parametrize("num", [1, 3])
def test_step_calls_are_prompt_plus_drawn_minus_one(num: int) -> None:
    counting = Counting(tiny_lm())
    prompt = [1, 2, 3]
    out = generate(counting, prompt, max_length=7, num=num, generator=torch.Generator())
    assert all(len(r.ids) == 7 for r in out)  # no eos: every row runs to the limit
    # Priming feeds the prompt once (one row), then one call per further token for all
    # rows together: O(n), the prefix is never re-run.
    assert counting.calls == len(prompt) + 7 - 1
    assert counting.batch_sizes == [1] * len(prompt) + [num] * 6


def test_cost_grows_linearly_with_the_length() -> None:
    model = TableModel(chain_table(6))
    for n in (5, 50):
        model.calls = 0
        generate(model, [1, 2], max_length=n, strategy="greedy")
        assert model.calls == 2 + n - 1


def test_a_prime_method_is_used_when_offered() -> None:
    class Primed(TableModel):
        def __init__(self, table: Tensor) -> None:
            super().__init__(table)
            self.primed: list[list[list[int]]] = []

        def prime(self, ids: Tensor, state: None) -> tuple[Tensor, Tensor]:
            self.primed.append(ids.tolist())
            return self.log_table[ids[:, -1]], torch.zeros(1, 1, ids.shape[0], 1)

    model = Primed(chain_table(6))
    (out,) = generate(model, [4, 1], max_length=3, strategy="greedy")
    assert model.primed == [[[4, 1]]]
    assert out.ids == [2, 3, 4] and model.calls == 2


def test_finished_rows_leave_the_batch_and_never_change() -> None:
    # eos has probability 0.3 after every token: rows end at different times.
    model = TableModel(fixed_table([0.3, 0.2, 0.2, 0.2, 0.1]))
    g = torch.Generator().manual_seed(0)
    out = generate(model, [1], max_length=6, eos_id=EOS, num=40, generator=g)
    drawn = [len(r.ids) + r.finished for r in out]
    assert any(r.finished for r in out) and not all(r.finished for r in out)
    assert all(EOS not in r.ids for r in out)
    assert all(r.finished or len(r.ids) == 6 for r in out)
    # Call after drawing token t feeds exactly the rows that drew t without ending.
    sizes = model.batch_sizes[1:]
    assert sizes == [sum(n >= t + 2 for n in drawn) for t in range(len(sizes))]
    assert all(EOS not in fed for fed in model.fed[1:])


# ---------------------------------------------------------------------------- sampling


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


# ------------------------------------------------------------------------------- beam


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


# ---------------------------------------------------------------------------- batches


def test_a_batch_of_prompts_equals_one_prompt_at_a_time() -> None:
    lm = tiny_lm(seed=2)
    prompts = [[1], [2, 3, 4], [5, 6]]  # different lengths: shorter rows hold their state
    for strategy in ("greedy", "beam"):
        batched = generate_batch(
            lm,
            prompts,
            max_length=5,
            eos_id=EOS,
            strategy=strategy,
            beam_size=3,
            num=2 if strategy == "beam" else 1,
        )
        for prompt, results in zip(prompts, batched, strict=True):
            alone = generate(
                lm,
                prompt,
                max_length=5,
                eos_id=EOS,
                strategy=strategy,
                beam_size=3,
                num=2 if strategy == "beam" else 1,
            )
            assert [r.ids for r in results] == [r.ids for r in alone]
            for r, s in zip(results, alone, strict=True):
                assert r.logprob == pytest.approx(s.logprob, abs=1e-5)


class DecoderState(NamedTuple):
    hidden: Tensor  # (1, 1, B, 1): the last token
    memory: Tensor  # (B, V): a per-source bias, batch first (an encoder's summary)


class Decoder:
    """A seq2seq-like decoder whose state mixes batch dims 2 and 0."""

    def __init__(self, V: int) -> None:
        self.log_table = torch.log_softmax(
            torch.randn(V, V, generator=torch.Generator().manual_seed(6)), -1
        )

    def step(self, token: Tensor, state: DecoderState) -> tuple[Tensor, DecoderState]:
        B = token.shape[0]
        assert state.hidden.shape[2] == B and state.memory.shape[0] == B
        log_probs = torch.log_softmax(self.log_table[token] + state.memory, dim=-1)
        return log_probs, DecoderState(token.view(1, 1, B, 1).float(), state.memory)


def test_decoder_states_with_mixed_batch_dims() -> None:
    V, S = 6, 3
    memory = 3.0 * torch.randn(S, V, generator=torch.Generator().manual_seed(7))
    state = DecoderState(torch.zeros(1, 1, S, 1), memory)
    dec = Decoder(V)

    def reorder(s: DecoderState, index: Tensor) -> DecoderState:
        return DecoderState(s.hidden[:, :, index], s.memory[index])

    by_dim = generate_batch(
        dec,
        None,
        bos_id=1,
        eos_id=EOS,
        max_length=5,
        strategy="beam",
        beam_size=3,
        num=2,
        state=state,
        state_batch_dim=(2, 0),
    )
    by_fn = generate_batch(
        dec,
        [[1]] * S,
        bos_id=1,
        eos_id=EOS,
        max_length=5,
        strategy="beam",
        beam_size=3,
        num=2,
        state=state,
        reorder=reorder,
    )
    assert by_dim == by_fn and len(by_dim) == S
    for i in range(S):
        one = select_state(state, torch.tensor([i]), dim=(2, 0))
        alone = generate(
            dec,
            None,
            bos_id=1,
            eos_id=EOS,
            max_length=5,
            strategy="beam",
            beam_size=3,
            num=2,
            state=one,
            state_batch_dim=(2, 0),
        )
        assert [r.ids for r in alone] == [r.ids for r in by_dim[i]]
    greedy = generate_batch(
        dec, None, bos_id=1, eos_id=EOS, max_length=5, state=state, state_batch_dim=(2, 0)
    )
    assert len(greedy) == S and all(len(g) == 1 for g in greedy)


def test_select_state_walks_nested_structures() -> None:
    x = torch.arange(4.0).view(1, 1, 4, 1)
    state = {"lstm": LSTMState(x, -x), "memory": [torch.arange(4), None]}
    out = select_state(state, torch.tensor([3, 3]), dim={"lstm": 2, "memory": 0})
    assert isinstance(out["lstm"], LSTMState)
    assert out["lstm"].c.view(-1).tolist() == [-3.0, -3.0]
    assert out["memory"][0].tolist() == [3, 3] and out["memory"][1] is None
    assert select_state(None, torch.tensor([0])) is None
    with pytest.raises(TypeError, match="state_batch_dim"):
        select_state((x, x), torch.tensor([0]), dim=(2,))


# ------------------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"max_length": 0}, "max_length"),
        ({"max_length": -3}, "max_length"),
        ({"max_length": 2.5}, "max_length"),
        ({"max_length": True}, "max_length"),
        ({"temperature": 0.0}, "temperature"),
        ({"temperature": -1.0}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_k": 0}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"beam_size": 0, "strategy": "beam"}, "beam_size"),
        ({"num": 0}, "num"),
        ({"num": 3, "beam_size": 2, "strategy": "beam"}, "num"),
        ({"strategy": "nucleus"}, "strategy"),
        ({"eos_id": -1}, "eos_id"),
        ({"length_penalty": float("inf")}, "length_penalty"),
    ],
)
def test_bad_arguments_name_themselves(kwargs: dict, name: str) -> None:
    model = TableModel(chain_table(6))
    args = {"max_length": 5, "eos_id": EOS, **kwargs}
    with pytest.raises(ValueError, match=name):
        generate(model, [1], **args)
    assert model.calls == 0  # checked before any work


def test_bad_prompts() -> None:
    model = TableModel(chain_table(6))
    with pytest.raises(ValueError, match="prompt_ids must not be empty"):
        generate(model, [], max_length=3)
    with pytest.raises(ValueError, match="bos_id"):
        generate(model, None, max_length=3)
    with pytest.raises(ValueError, match="prompt_ids"):
        generate(model, [1, 6], max_length=3)  # outside the vocabulary
    with pytest.raises(ValueError, match="prompts"):
        generate_batch(model, [], max_length=3)
    with pytest.raises(ValueError, match="rows"):
        generate_batch(model, [[1], [2]], max_length=3, state=torch.zeros(1, 1, 3, 1))
    with pytest.raises(ValueError, match="state_batch_dim"):
        generate_batch(model, None, bos_id=1, max_length=3, state=torch.zeros(3, 1))
    with pytest.raises(ValueError, match="different lengths"):
        generate_batch(model, [[1], [2, 3]], max_length=3, reorder=lambda s, i: s)
    filter_lp = torch.zeros(1, 3)
    with pytest.raises(ValueError, match="top_k"):
        filter_log_probs(filter_lp, top_k=-2)
