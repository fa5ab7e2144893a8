"""A tagging run's data (rnnkit.app.tasks.tag_data), against ids worked out by hand."""

from __future__ import annotations

import numpy as np
import torch

from rnnkit.app.config import TrainConfig
from rnnkit.app.tasks.tag_data import (
    MAX_WORD_CHARS,
    TagData,
    _clip_word,
    _inputs,
    encode_tagged,
    unknown_words,
)
from rnnkit.data.batching import SequenceBatcher
from rnnkit.data.labelled import LabelSet
from rnnkit.data.tagged import TaggedSentence
from rnnkit.data.vocab import Vocabulary

# Specials take ids 0-3 (<pad>, <unk>, <s>, </s>): "the" 4, "dog" 5, "New␣York" 6.
WORDS = Vocabulary(["the", "dog", "New\u2423York"], unit="word")
TAGS = LabelSet(["DET", "NOUN", "PROPN"])  # 0, 1, 2; 3 = a tag the model does not know
CHARS = Vocabulary(["d", "o", "g", "t", "h", "e"], unit="char")  # 4..9


def test_clip_word_keeps_two_thirds_head_and_one_third_tail() -> None:
    word = "abcdefghijklmnopqrstuvwxyz0123"  # 30 characters
    assert MAX_WORD_CHARS == 24
    assert _clip_word(word) == "abcdefghijklmnop" + "wxyz0123"
    assert _clip_word("x" * 24) == "x" * 24


def test_encode_marks_unknown_words_and_unknown_tags() -> None:
    data = TagData(WORDS, TAGS)
    sentence = TaggedSentence(["the", "cat", "New York"], ["DET", "NOUN", "X"], line=7)
    enc = encode_tagged([sentence], data)
    np.testing.assert_array_equal(enc.words[0], [4, 1, 6])
    np.testing.assert_array_equal(enc.oov[0], [False, True, False])
    np.testing.assert_array_equal(enc.tags[0], [0, 1, 3])
    assert enc.chars is None and enc.sentences == [sentence]


def test_words_spelled_like_specials_are_unknown_words_never_padding() -> None:
    """A word ``<pad>`` was id 0, the padding the model masks out; ``<s>``/``</s>`` were
    the boundaries. Each is an unknown word (id 1, out of vocabulary); a literal
    ``<unk>`` is the unknown word too, and not counted by predict."""
    data = TagData(WORDS, TAGS)
    tokens = ["the", "<pad>", "<s>", "</s>", "<unk>", "dog"]
    enc = encode_tagged([TaggedSentence(tokens, ["DET"] * 6, line=1)], data)
    np.testing.assert_array_equal(enc.words[0], [4, 1, 1, 1, 1, 5])
    np.testing.assert_array_equal(enc.oov[0], [False, True, True, True, True, False])
    assert unknown_words(WORDS, tokens) == 3
    assert unknown_words(WORDS, ["the", "cat", "New York"]) == 1


def test_max_len_cuts_sentences_into_pieces() -> None:
    data = TagData(WORDS, TAGS)
    sentence = TaggedSentence(["the", "dog", "the", "dog", "the"], ["DET", "NOUN"] * 2 + ["DET"], 3)
    enc = encode_tagged([sentence], data, max_len=2)
    assert [s.tokens for s in enc.sentences] == [["the", "dog"], ["the", "dog"], ["the"]]
    assert {s.line for s in enc.sentences} == {3}
    assert [w.tolist() for w in enc.words] == [[4, 5], [4, 5], [4]]


def test_characters_are_padded_per_sentence_and_per_batch() -> None:
    data = TagData(WORDS, TAGS, CHARS)
    enc = encode_tagged(
        [TaggedSentence(["dog", "the"], ["NOUN", "DET"]), TaggedSentence(["do"], ["NOUN"])], data
    )
    assert enc.chars is not None
    np.testing.assert_array_equal(enc.chars[0], [[4, 5, 6], [7, 8, 9]])
    np.testing.assert_array_equal(enc.chars[1], [[4, 5]])
    (batch,) = SequenceBatcher(enc.words, enc.tags, batch_size=2, shuffle=False)
    words, mask, chars = _inputs(enc, batch, torch.device("cpu"))
    rows = batch.indices.tolist()  # the batcher may order sentences by length
    expected_words = {0: [5, 4], 1: [1, 0]}  # "do" is no word of the vocabulary
    expected_chars = {0: [[4, 5, 6], [7, 8, 9]], 1: [[4, 5, 0], [0, 0, 0]]}
    assert words.tolist() == [expected_words[i] for i in rows]
    assert mask.tolist() == [[True, i == 0] for i in rows]
    assert chars is not None and chars.shape == (2, 2, 3)  # (B, T, longest word)
    assert chars.tolist() == [expected_chars[i] for i in rows]


def test_vocabularies_from_sentences_and_back(tmp_path) -> None:
    cfg = TrainConfig(task="tag", train="train.tsv", char_rnn=True, min_freq=2)
    sentences = [
        TaggedSentence(["the", "dog"], ["DET", "NOUN"]),
        TaggedSentence(["the", "cat"], ["DET", "NOUN"]),
        TaggedSentence(["New York"], ["PROPN"]),
    ]
    data = TagData.from_sentences(sentences, cfg)
    assert data.vocab.itos[4:] == ["the"]  # min_freq 2 keeps only "the"
    assert data.tags.labels == ["DET", "NOUN", "PROPN"]
    assert data.chars is not None and set(data.chars.itos[4:]) == set("thedogcatNewYork ")
    data.save(tmp_path)
    back = TagData.load(tmp_path, char_rnn=True)
    assert back.vocab.itos == data.vocab.itos and back.tags == data.tags
    assert back.chars is not None and back.chars.itos == data.chars.itos
    assert TagData.load(tmp_path, char_rnn=False).chars is None
