"""Interpolated Kneser-Ney: hand-computed values, exact normalization, agreement with a
direct dictionary implementation of the definition, evaluation (speed:
benchmarks/bench_data.py)."""

from __future__ import annotations

import itertools
import math
import tracemalloc
from collections import Counter, defaultdict

import numpy as np
import pytest
import torch

from rnnkit.errors import CheckpointError, ConfigError, DataError
from rnnkit.models.ngram import NGramModel, _unique_inverse, count_table_size

START = None  # the reference's start padding symbol


def reference_kn(sequences, order, discount, vocab_size):
    """P(w | history) straight from the definition in ngram.py's docstring, with dicts."""
    n, D, V = order, discount, vocab_size
    raw = Counter()  # k-gram tuple -> occurrences ending at a real token (all k <= n)
    for seq in sequences:
        padded = [START] * n + list(seq)
        for i in range(n, len(padded)):
            for k in range(1, n + 1):
                raw[tuple(padded[i - k + 1 : i + 1])] += 1
    left = defaultdict(set)  # k-gram -> distinct tokens seen before it
    for gram in raw:
        if len(gram) >= 2:
            left[gram[1:]].add(gram[0])

    def count(gram):
        if len(gram) == n or gram[0] is START:
            return raw.get(gram, 0)
        return len(left.get(gram, ()))

    totals, types = Counter(), Counter()
    for gram in raw:
        c = count(gram)
        if c:
            totals[gram[:-1]] += c
            types[gram[:-1]] += 1

    def prob(history, w):
        p = (max(count((w,)) - D, 0) + D * types[()] / V) / totals[()]
        for k in range(2, n + 1):
            h = tuple(history[len(history) - k + 1 :])
            if totals[h] > 0:
                p = (max(count((*h, w)) - D, 0) + D * types[h] * p) / totals[h]
        return p

    return prob


def test_bigram_probabilities_by_hand():
    # Stream 0 1 0 1 2, V = 4 (id 3 never seen), D = 1/2.
    # Continuation counts of the unigrams: 0 after {start, 1} = 2, 1 after {0} = 1,
    # 2 after {1} = 1; total 4, 3 types. P_1(w) = (max(c - 1/2, 0) + 1/2 * 3/4) / 4.
    lm = NGramModel(order=2, discount=0.5, vocab_size=4).fit(np.array([0, 1, 0, 1, 2]))
    p1 = [1.875 / 4, 0.875 / 4, 0.875 / 4, 0.375 / 4]
    np.testing.assert_allclose(lm.distribution([3]), p1, rtol=0, atol=1e-15)  # unseen context
    # After 1: raw bigrams (1,0) and (1,2), total 2, 2 types.
    after1 = [(0.5 + 0.5 * 2 * p1[0]) / 2, (0.5 * 2 * p1[1]) / 2, (0.5 + 0.5 * 2 * p1[2]) / 2]
    after1.append(0.5 * 2 * p1[3] / 2)
    np.testing.assert_allclose(lm.distribution([1]), after1, rtol=0, atol=1e-15)
    assert after1[0] == pytest.approx(0.484375)
    # After 0: (0,1) twice, total 2, 1 type. At the start: (start,0) once.
    assert math.exp(lm.logprob([0], 1)) == pytest.approx((1.5 + 0.5 * p1[1]) / 2, abs=1e-15)
    assert math.exp(lm.logprob([], 0)) == pytest.approx(0.5 + 0.5 * p1[0], abs=1e-15)
    assert math.exp(lm.logprob([2, 0], 1)) == pytest.approx(0.8046875, abs=1e-15)  # last n-1


@pytest.mark.parametrize("order", [1, 2, 3, 4])
def test_distributions_sum_to_one_for_every_context(order):
    rng = np.random.default_rng(order)
    V = 5  # id 4 is never seen in training
    train = [rng.integers(0, 4, size=int(n)) for n in rng.integers(1, 12, size=15)]
    for data in (train, np.concatenate(train)):
        lm = NGramModel(order=order, discount=0.6, vocab_size=V).fit(data)
        for length in range(order):  # shorter contexts are sequence starts
            for context in itertools.product(range(V), repeat=length):
                dist = lm.distribution(list(context))
                assert abs(dist.sum() - 1.0) < 1e-9
                assert dist.min() > 0.0


@pytest.mark.parametrize(("order", "discount"), [(1, 0.75), (2, 0.3), (3, 0.75), (4, 1.0)])
def test_matches_a_direct_implementation_of_the_definition(order, discount):
    rng = np.random.default_rng(10 + order)
    V = 6
    train = [rng.integers(0, 5, size=int(n)) for n in rng.integers(1, 15, size=25)]
    lm = NGramModel(order=order, discount=discount, vocab_size=V).fit(train)
    prob = reference_kn([s.tolist() for s in train], order, discount, V)
    contexts = [[]] + [rng.integers(0, V, size=int(k)).tolist() for k in rng.integers(1, 6, 40)]
    for context in contexts:
        history = [START] * order + context
        expected = [prob(history, w) for w in range(V)]
        np.testing.assert_allclose(lm.distribution(context), expected, rtol=1e-12, atol=0)


def test_evaluate_scores_each_token_from_its_own_history():
    rng = np.random.default_rng(0)
    train = rng.integers(0, 7, size=3000)
    lm = NGramModel(order=3, vocab_size=8).fit(train)
    test = [rng.integers(0, 8, size=9), rng.integers(0, 8, size=4)]
    expected = [-lm.logprob(seq[:i].tolist(), int(seq[i])) for seq in test for i in range(len(seq))]
    assert lm.evaluate(test) == pytest.approx(np.mean(expected), abs=1e-12)
    stream = np.concatenate(test)
    expected = [-lm.logprob(stream[:i].tolist(), int(stream[i])) for i in range(len(stream))]
    assert lm.evaluate(stream) == pytest.approx(np.mean(expected), abs=1e-12)
    assert lm.evaluate(torch.from_numpy(stream)) == lm.evaluate(stream)
    assert lm.perplexity(stream) == pytest.approx(math.exp(np.mean(expected)))
    assert lm.logprobs(test).shape == (13,)


def test_a_trigram_model_beats_a_unigram_on_a_patterned_stream():
    pattern = np.tile(np.array([0, 1, 2, 0, 2, 1]), 200)
    uni = NGramModel(order=1, vocab_size=3).fit(pattern)
    tri = NGramModel(order=3, vocab_size=3).fit(pattern)
    assert uni.perplexity(pattern) == pytest.approx(3.0, rel=1e-3)
    assert tri.perplexity(pattern) < 1.3


def test_state_round_trip_reproduces_the_model():
    rng = np.random.default_rng(1)
    lm = NGramModel(order=4, discount=0.7).fit(rng.integers(0, 20, size=2000))
    state = lm.to_state()
    assert all(isinstance(v, np.ndarray) for v in state.values())
    again = NGramModel.from_state(state)
    test = rng.integers(0, 20, size=500)
    assert again.evaluate(test) == lm.evaluate(test)
    assert (again.order, again.discount, again.vocab_size) == (4, 0.7, 20)


def test_bad_arguments_and_inputs():
    with pytest.raises(ConfigError, match="order"):
        NGramModel(order=0)
    with pytest.raises(ConfigError, match="discount"):
        NGramModel(discount=0.0)
    with pytest.raises(ConfigError, match="not fitted"):
        NGramModel().evaluate(np.array([1]))
    with pytest.raises(DataError, match="out of range"):
        NGramModel(vocab_size=3).fit(np.array([1, 3]))
    lm = NGramModel(order=2).fit(np.array([0, 1, 2]))
    with pytest.raises(DataError, match="out of range"):
        lm.logprob([0], 3)
    with pytest.raises(DataError, match="out of range"):
        lm.evaluate(np.array([0, 5]))
    with pytest.raises(DataError, match="1-D"):
        lm.fit(np.zeros((2, 2), dtype=int))
    with pytest.raises(DataError, match="sequence 0 must be 1-D"):
        lm.fit([1, 2, 3])
    with pytest.raises(DataError, match="no tokens"):
        lm.fit([[], []])
    with pytest.raises(DataError, match="negative"):
        lm.fit(np.array([0, -1]))


@pytest.mark.parametrize("order", [1, 2, 4])
def test_distributions_equal_one_distribution_per_context(order):
    rng = np.random.default_rng(order)
    lm = NGramModel(order=order, vocab_size=9).fit(rng.integers(0, 7, size=300))
    contexts = rng.integers(0, 9, size=(12, order - 1))
    for c in range(0, 12, 3):  # contexts that start at the sequence's start: -1 on the left
        contexts[c, : c % order] = -1
    got = lm.distributions(contexts)
    assert got.shape == (12, 9)
    for row, ctx in zip(got, contexts, strict=True):
        np.testing.assert_allclose(row, lm.distribution([int(t) for t in ctx if t >= 0]))
    if order > 1:
        with pytest.raises(DataError, match="out of range"):
            lm.distributions(np.full((1, order - 1), 9))
    with pytest.raises(DataError, match="shape"):
        lm.distributions(np.zeros((2, order), dtype=int))


def test_count_table_size():
    assert count_table_size(10, 5) == 100_000


def test_fit_and_evaluate_on_character_sized_data():
    rng = np.random.default_rng(0)
    # A Markov-ish character stream: 500k tokens, 30 symbols.
    ids = np.cumsum(rng.integers(0, 3, size=600_000)) % 30
    lm = NGramModel(order=5).fit(ids[:500_000])
    nats = lm.evaluate(ids[500_000:])
    assert nats == pytest.approx(math.log(3), abs=0.05)  # the next step is uniform over 3


@pytest.mark.parametrize(
    ("key", "value"),
    [("counts_2", -(2**62)), ("ctx_total_2", float("nan")), ("ctx_types_3", -1), ("keys_1", -5)],
)
def test_a_state_no_fit_can_give_is_refused(key, value):
    # A garbled ngram.safetensors read with --skip-checksums: NaN log-probabilities.
    lm = NGramModel(order=3).fit(np.array([0, 1, 2, 1, 0, 2, 1, 1, 0]))
    state = lm.to_state()
    changed = state[key].copy()
    changed[len(changed) // 2] = value
    with pytest.raises(CheckpointError, match=r"n\.safetensors: invalid n-gram state"):
        NGramModel.from_state(dict(state, **{key: changed}), where="n.safetensors")


@pytest.mark.parametrize("size", [0, 1, 7, 1000])
def test_unique_inverse_is_numpys(size):
    key = np.random.default_rng(size).integers(-50, 50, size=size)
    uniq, inverse = _unique_inverse(key)
    want_uniq, want_inverse = np.unique(key, return_inverse=True)
    assert np.array_equal(uniq, want_uniq) and np.array_equal(inverse, want_inverse)
    assert inverse.dtype == np.int32


def test_fitting_a_corpus_holds_a_few_dozen_bytes_per_token():
    # A 5-gram baseline on a text-sized stream must fit in memory a machine has: the
    # counting keeps two position-sized id arrays alive, not one per order.
    rng = np.random.default_rng(0)
    words = [rng.integers(1, 60, size=int(rng.integers(2, 9))) for _ in range(400)]
    picks = rng.zipf(1.3, size=60_000) % len(words)
    ids = np.concatenate([np.append(words[p], 0) for p in picks])  # ~300k tokens
    tracemalloc.start()
    try:
        NGramModel(order=5).fit(ids)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak / len(ids) < 80, f"{peak / len(ids):.0f} bytes per token"
