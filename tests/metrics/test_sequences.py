"""BLEU and character error rate against sacreBLEU (the test extra) and hand-computed
values."""

from __future__ import annotations

import math
import random

import pytest

from rnnkit.metrics.sequences import bleu, character_error_rate, characters

sacrebleu = pytest.importorskip("sacrebleu")


def test_bleu_by_hand():
    # hypothesis "a b c d" against "a b c d e": every n-gram right, brevity exp(1 − 5/4)
    assert bleu([list("abcd")], [list("abcde")]) == pytest.approx(100 * math.exp(-0.25))
    # the k-th zero count of n-grams becomes 1 / (2^k · total n-grams): "a b x y" against
    # "a b c d" has 2 of 4 unigrams, 1 of 3 bigrams, 0 of 2 trigrams, 0 of 1 4-gram
    smoothed = (2 / 4) * (1 / 3) * (1 / (2 * 2)) * (1 / (4 * 1))
    assert bleu([list("abxy")], [list("abcd")]) == pytest.approx(100 * smoothed**0.25)
    # nothing right: 0, as sacreBLEU (the smoothing gave a wholly wrong system 4.06)
    assert bleu([list("abcdef")], [list("uvwxyz")]) == 0.0
    assert sacrebleu.corpus_bleu(["a b c d e f"], [["u v w x y z"]], tokenize="none").score == 0
    assert bleu([[]], [list("ab")]) == 0.0


def random_corpus(rng: random.Random, n: int, alphabet: str) -> tuple[list, list]:
    refs = [[rng.choice(alphabet) for _ in range(rng.randint(1, 12))] for _ in range(n)]
    hyps = []
    for r in refs:
        h = [t if rng.random() < 0.7 else rng.choice(alphabet) for t in r]
        if rng.random() < 0.3:
            h = h[: rng.randint(0, len(h))]
        if rng.random() < 0.3:
            h = h + [rng.choice(alphabet) for _ in range(rng.randint(1, 4))]
        hyps.append(h)
    return hyps, refs


@pytest.mark.parametrize("seed", range(12))
def test_bleu_equals_sacrebleu_on_the_same_tokens(seed):
    rng = random.Random(seed)
    hyps, refs = random_corpus(rng, rng.randint(1, 20), "abcdef" if seed % 2 else "ab")
    want = sacrebleu.corpus_bleu(
        [" ".join(h) for h in hyps], [[" ".join(r) for r in refs]], tokenize="none"
    ).score
    assert bleu(hyps, refs) == pytest.approx(want, abs=1e-9)


def test_bleu_of_characters_counts_the_space_as_a_token_as_the_docs_say():
    """A character-level target's BLEU is sacreBLEU's ``tokenize="none"`` on the characters
    with each space written as a placeholder; ``tokenize="char"`` drops the spaces."""
    hyps, refs = ["2024 03 05", "2023-1 2-01", "ab cd ef"], ["2024-03-05", "2023-12-01", "ab cd eg"]

    def spaced(text: str) -> str:
        return " ".join("_" if c == " " else c for c in text)

    want = sacrebleu.corpus_bleu(
        [spaced(h) for h in hyps], [[spaced(r) for r in refs]], tokenize="none"
    ).score
    got = bleu([list(h) for h in hyps], [list(r) for r in refs])
    assert got == pytest.approx(want, abs=1e-9)
    assert sacrebleu.corpus_bleu(hyps, [refs], tokenize="char").score != pytest.approx(got)


def test_character_error_rate_by_hand():
    # "kitten" → "sitting": 3 edits over 7 reference characters; "" vs "ab": 2 over 2
    assert character_error_rate(["kitten", ""], ["sitting", "ab"]) == pytest.approx(5 / 9)
    assert character_error_rate(["same"], ["same"]) == 0.0
    with pytest.raises(ValueError, match="empty references"):
        character_error_rate(["a"], [""])


def test_a_special_symbol_is_one_character_of_the_error_rate():
    # "<unk>" for "a" in "ab": one substitution over two characters (not five insertions)
    assert characters(["<unk>", "b"], "char") == ["<unk>", "b"]
    assert character_error_rate([characters(["<unk>", "b"], "char")], ["ab"]) == 0.5
    # words: "x <unk>" against "x yz": one substitution and one deletion over 4 characters
    hyp = characters(["x", "<unk>"], "word")
    assert hyp == ["x", " ", "<unk>"]
    assert character_error_rate([hyp], [characters(["x", "yz"], "word")]) == pytest.approx(2 / 4)


def test_seq2seq_output_metrics_count_unk_as_one_symbol():
    from rnnkit.app.tasks.seq2seq_decode import output_metrics
    from rnnkit.data.pairs import Pair
    from rnnkit.data.vocab import Vocabulary

    chars = Vocabulary(["a", "b"], unit="char")
    got = output_metrics([["<unk>", "b"], ["a"]], [Pair("s", "ab"), Pair("s", "a")], chars)
    assert got["character_error_rate"] == pytest.approx(1 / 3)  # hand: (1 + 0) / (2 + 1)
    words = Vocabulary(["the", "cat"], unit="word")
    got = output_metrics([["the", "<unk>"]], [Pair("s", "the  dog")], words)
    # "the <unk>" against "the dog" (one space between words): 3 edits over 7 characters
    assert got["character_error_rate"] == pytest.approx(3 / 7)
    assert got["token_error_rate"] == pytest.approx(1 / 2)
