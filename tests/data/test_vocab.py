"""Vocabulary: specials, ordering, encode/decode, JSON round trip and malformed files."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rnnkit.data.vocab import SPECIALS, Vocabulary, count_tokens
from rnnkit.errors import ConfigError, DataError


def test_specials_come_first_with_fixed_ids():
    v = Vocabulary(["a"])
    assert v.itos[:4] == ["<pad>", "<unk>", "<s>", "</s>"]
    assert (v.pad_id, v.unk_id, v.bos_id, v.eos_id) == (0, 1, 2, 3)
    assert v.stoi["a"] == 4 and len(v) == 5


def test_from_counts_orders_by_count_then_token_and_applies_limits():
    counts = {"b": 3, "a": 3, "c": 5, "d": 1, "e": 2}
    assert Vocabulary.from_counts(counts).itos[4:] == ["c", "a", "b", "e", "d"]
    assert Vocabulary.from_counts(counts, min_freq=2).itos[4:] == ["c", "a", "b", "e"]
    small = Vocabulary.from_counts(counts, max_size=6)
    assert len(small) == 6 and small.itos[4:] == ["c", "a"]
    # Counts of special strings never make a second entry.
    assert Vocabulary.from_counts({"<unk>": 9, "x": 1}, unit="word").itos[4:] == ["x"]


@pytest.mark.parametrize("kwargs", [{"unit": "byte"}, {"min_freq": 0}, {"max_size": 3}], ids=str)
def test_bad_options_are_config_errors(kwargs):
    with pytest.raises(ConfigError):
        Vocabulary.from_counts({"a": 1}, **kwargs)


def test_char_encode_decode_and_unknown_count():
    v = Vocabulary.from_text("abracadabra")
    assert v.itos[4:] == ["a", "b", "r", "c", "d"]
    ids, n_unknown = v.encode_with_unknown("abz!a")
    assert ids == [4, 5, 1, 1, 4] and n_unknown == 2
    assert v.encode("abz!a") == ids
    assert v.decode(ids) == "aba"
    assert v.decode(ids, skip_specials=False) == "ab<unk><unk>a"
    assert v.decode(np.array([2, 4, 5, 3])) == "ab"


def test_words_spelled_like_specials_are_unknown_when_asked():
    """``literal_specials=False`` (a tagger's, a classifier's text): ``<pad>``, ``<s>`` and
    ``</s>`` are unknown words, counted; ``<unk>`` is ``<unk>``, uncounted. The default
    keeps each special's id (a language model's corpus may end its lines with ``</s>``)."""
    v = Vocabulary(["the"], unit="word")
    text = "the <pad> <s> </s> <unk> dog"
    assert v.encode_with_unknown(text) == ([4, 0, 2, 3, 1, 1], 1)
    assert v.encode_with_unknown(text, literal_specials=False) == ([4, 1, 1, 1, 1, 1], 4)
    assert v.encode_array(text).tolist() == [4, 0, 2, 3, 1, 1]
    assert v.encode_array(text, literal_specials=False).tolist() == [4, 1, 1, 1, 1, 1]
    assert [v.text_id(t) for t in text.split()] == [4, 1, 1, 1, 1, 1]
    chars = Vocabulary.from_text("<pad>")  # characters are never a special
    assert chars.encode_array("<pad>", literal_specials=False).tolist() == chars.encode("<pad>")


def test_unknown_count_stops_at_max_tokens():
    v = Vocabulary.from_text("abracadabra")
    assert v.encode_with_unknown("ab!!!!", max_tokens=3) == ([4, 5, 1], 1)
    assert v.encode_with_unknown("ab!", max_tokens=10) == ([4, 5, 1], 1)
    words = Vocabulary(["the"], unit="word")
    assert words.encode_with_unknown("the dog cat", max_tokens=2) == ([4, 1], 1)


def test_word_encode_decode_and_literal_specials():
    v = Vocabulary.from_text("the cat the <unk> hat", unit="word")
    assert v.itos[4:] == ["the", "cat", "hat"]
    assert v.encode("the  dog\n<unk> hat") == [4, 1, 1, 6]
    assert v.encode_with_unknown("the dog <unk>") == ([4, 1, 1], 1)  # literal <unk> not counted
    assert v.decode([4, 5, 0, 6]) == "the cat hat"


def test_encode_array_matches_encode_including_astral_and_unseen_code_points():
    text = "héllo wörld 😀\n\U0010fffd…zz"
    v = Vocabulary.from_text("héllo wörld 😀\n")
    arr = v.encode_array(text)
    assert arr.dtype == np.int32
    assert arr.tolist() == v.encode(text)
    assert arr[-1] == v.unk_id and v.decode(arr) == "héllo wörld 😀\n"
    assert v.encode_array("").shape == (0,)
    assert v.encode_array("ab", dtype=np.int64).dtype == np.int64
    w = Vocabulary(["a", "b"], unit="word")
    assert w.encode_array(" a c b ").tolist() == [4, 1, 5]


def test_count_tokens_chars_and_words():
    text = "aab😀 😀\n"
    assert count_tokens(text) == {"a": 2, "b": 1, "😀": 2, " ": 1, "\n": 1}
    assert count_tokens("x y  x\ny", unit="word") == {"x": 2, "y": 2}


def test_decode_out_of_range_is_a_data_error():
    with pytest.raises(DataError, match="token id 9 out of range"):
        Vocabulary(["a"]).decode([4, 9])


@pytest.mark.parametrize(
    ("tokens", "unit", "message"),
    [
        (["a", "a"], "char", "duplicate"),
        (["<s>"], "word", "special"),
        (["ab"], "char", "one character"),
        (["a b"], "word", "whitespace"),
        ([""], "word", "non-empty"),
    ],
)
def test_invalid_tokens_are_rejected(tokens, unit, message):
    with pytest.raises(DataError, match=message):
        Vocabulary(tokens, unit=unit)


def test_json_and_file_round_trip(tmp_path):
    v = Vocabulary.from_text("zebra 😀 zoo", unit="char")
    assert Vocabulary.from_json(v.to_json()) == v
    path = tmp_path / "vocab.json"
    path.write_text("old contents")
    v.save(path)
    assert Vocabulary.load(path) == v
    assert json.loads(path.read_text(encoding="utf-8"))["tokens"][:4] == list(SPECIALS)
    # The atomic write leaves no temporary file behind.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vocab.json"]
    w = Vocabulary(["x"], unit="word")
    w.save(path)
    assert Vocabulary.load(path) == w and Vocabulary.load(path) != v


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"unit": "char", "tokens": [', "vocabulary JSON"),
        ("[1, 2]", "expected an object"),
        ('{"unit": "byte", "tokens": ["<pad>", "<unk>", "<s>", "</s>"]}', "unit must be"),
        ('{"unit": "char", "tokens": "abc"}', "must be a list"),
        ('{"unit": "char", "tokens": ["a", "<unk>", "<s>", "</s>"]}', "start with the specials"),
        ('{"unit": "char", "tokens": ["<pad>", "<unk>", "<s>", "</s>", "a", "a"]}', "duplicate"),
        ('{"unit": "char", "tokens": ["<pad>", "<unk>", "<s>", "</s>", 5]}', "non-empty string"),
        ('{"format": "other", "unit": "char", "tokens": []}', "format"),
    ],
)
def test_malformed_vocab_file_is_a_data_error_naming_the_file(tmp_path, content, message):
    path = tmp_path / "vocab.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DataError, match=message) as info:
        Vocabulary.load(path)
    assert info.value.path == str(path)
    assert str(info.value).startswith(str(path))


def test_missing_or_non_utf8_vocab_file(tmp_path):
    with pytest.raises(DataError, match="file not found"):
        Vocabulary.load(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_bytes(b'{"unit":\n "\xff"}')
    with pytest.raises(DataError) as info:
        Vocabulary.load(bad)
    assert str(info.value) == f"{bad}:2: invalid UTF-8 at byte 3 of the line (byte 0xff)"
    bad.write_bytes(b'{"unit":\r\n' + b"  \r\n" * 5000 + b' "\xff"}')  # 20 KB before it
    with pytest.raises(DataError, match=r":5002: invalid UTF-8 at byte 3 of the line \("):
        Vocabulary.load(bad)


@settings(max_examples=80, deadline=None)
@given(text=st.text(max_size=60))
def test_arbitrary_vocab_json_is_loaded_or_rejected_with_a_data_error(text):
    try:
        vocab = Vocabulary.from_json(text, path="v.json")
    except DataError as exc:
        assert exc.path == "v.json"
    else:
        assert Vocabulary.from_json(vocab.to_json()) == vocab


@settings(max_examples=60, deadline=None)
@given(text=st.text(max_size=80))
def test_char_encode_array_agrees_with_encode_on_any_text(text):
    vocab = Vocabulary.from_text(text[: len(text) // 2])
    assert vocab.encode_array(text).tolist() == vocab.encode(text)
    assert vocab.decode(vocab.encode(text[: len(text) // 2])) == text[: len(text) // 2]


def test_a_min_freq_that_keeps_no_token_is_refused_naming_the_file():
    """``--min-freq`` above every count made every token ``<unk>``: a model trained to
    predict ``<unk>`` (perplexity 1.25, exit status 0). Now one line with the most frequent
    token and its count; a ``min_freq`` that keeps one token is fine."""
    counts = {"the": 380, "cat": 7}
    with pytest.raises(DataError) as info:
        Vocabulary.from_counts(counts, unit="word", min_freq=381, source="lm.txt")
    assert str(info.value) == (
        "lm.txt: no token is seen at least 381 times (the most frequent, 'the', 380 times): "
        "every token would be <unk>; lower --min-freq"
    )
    assert Vocabulary.from_counts(counts, unit="word", min_freq=380).itos[4:] == ["the"]
    assert len(Vocabulary.from_counts({}, unit="word", min_freq=5)) == 4  # no text: no claim


@pytest.mark.parametrize(
    ("ids", "dtype"), [([4.0, 5.5], "float64"), (["4"], "<U1"), ([4, None], "object")]
)
def test_decode_refuses_ids_that_are_not_integers(ids, dtype):
    # int() took 5.5 as id 5 (a wrong token) and "4" as 4; None failed inside int()
    v = Vocabulary(["a", "b"], unit="word")
    with pytest.raises(DataError, match=f"^token ids must be integers, got dtype {dtype}$"):
        v.decode(ids)
    assert v.decode(np.array([4, 5], dtype=np.uint8)) == "a b" == v.decode([4, 5])
    assert v.decode([]) == ""
