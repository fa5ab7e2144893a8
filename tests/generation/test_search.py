"""The entry points: greedy search, priming, stopping, cost, batches of prompts, bad prompts."""

from __future__ import annotations

import math

import pytest
import torch
from step_models import (
    EOS,
    Counting,
    TableModel,
    chain_table,
    fixed_table,
    tiny_lm,
)
from torch import Tensor

from rnnkit.generation.sampling import filter_log_probs
from rnnkit.generation.search import generate, generate_batch

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


def test_greedy_keeps_ended_rows_until_a_quarter_has_ended() -> None:
    # The argmax chain k -> k+1, 5 -> </s>: a row primed with k ends after 6 - k draws.
    prompts = [[1], [1], [1], [2], [3], [4], [5], [5]]
    model = TableModel(chain_table(6))
    out = generate_batch(model, prompts, max_length=10, eos_id=EOS, strategy="greedy")
    for prompt, (result,) in zip(prompts, out, strict=True):
        (alone,) = generate(
            TableModel(chain_table(6)), prompt, max_length=10, eos_id=EOS, strategy="greedy"
        )
        assert result == alone  # ids, log-probability, finished and score
    # Priming 8 rows; after draw 1 two of 8 have ended (a quarter): out; after draw 2 one
    # of 6 (kept, it draws on unrecorded); after draw 3 two of 6: out; after draw 4 one
    # of 4: out; after draw 5 none is left.
    assert model.batch_sizes == [8, 6, 6, 4, 3]


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


# ------------------------------------------------------------------------------ errors


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


# ----------------------------------------------------------------------- device reads


@pytest.mark.parametrize("strategy", ["greedy", "sample", "beam"])
def test_on_a_device_whose_reads_wait_the_steps_read_no_token_check(monkeypatch, strategy):
    """Where a host read waits for the device (a GPU; emulated here), a search reads the
    model's check of each step's token ids (rnnkit's language model checks their range)
    once at the end, not inside every step: the ids it draws are in range by
    construction. The same results as with the CPU's direct checks; a bad id given to the
    model is still refused."""
    from torch.overrides import TorchFunctionMode

    from host_syncs import READS
    from rnnkit import deferred
    from rnnkit.models import LanguageModel, ModelSpec, build_lm

    inside = {"step": False, "steps": 0, "reads": 0}

    class Reads(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if inside["step"] and getattr(func, "__name__", "") in READS:
                inside["reads"] += 1
            return func(*args, **(kwargs or {}))

    step = LanguageModel.step

    def counted(self, *args, **kwargs):
        inside["step"], inside["steps"] = True, inside["steps"] + 1
        try:
            return step(self, *args, **kwargs)
        finally:
            inside["step"] = False

    torch.manual_seed(0)
    model = build_lm(ModelSpec(hidden=8, embedding=4), 7).eval()
    with torch.no_grad():  # the end (EOS) never drawn: every sequence runs to max_length
        model.head.bias[EOS] = -50.0
    monkeypatch.setattr(LanguageModel, "step", counted)

    def search() -> list:
        generator = torch.Generator().manual_seed(1)
        return generate_batch(
            model, [[4], [5, 6]], max_length=12, eos_id=EOS, strategy=strategy,
            beam_size=2, num=2 if strategy != "beam" else 1, generator=generator,
        )  # fmt: skip

    with Reads():
        direct = search()
    assert inside["reads"] == inside["steps"] > 10  # on the CPU: the check reads the ids
    monkeypatch.setattr(deferred, "waits", lambda tensor: True)
    inside.update(steps=0, reads=0)
    with Reads():
        emulated = search()
    assert [[r.ids for r in row] for row in emulated] == [[r.ids for r in row] for row in direct]
    assert inside["steps"] > 10 and inside["reads"] == 0
    with pytest.raises(ValueError, match="token ids in"), deferred.deferring():
        model.step(torch.tensor([7 + 7]))
