"""The event vocabulary: whole events (spaces allowed) as tokens, specials refused."""

from __future__ import annotations

import pytest

from rnnkit.app.tasks.events.data import EventVocabulary
from rnnkit.data.vocab import Vocabulary
from rnnkit.errors import DataError


def test_event_vocabulary_keeps_whole_events() -> None:
    vocab = EventVocabulary.from_sessions([["a b", "c"], ["a b"], ["d"]], min_freq=2)
    assert vocab.itos[4:] == ["a b"]
    assert vocab.encode_events(["a b", "c", "</s>"]) == (pytest.approx([4, 1, 1]), 2)
    with pytest.raises(DataError, match="a special"):
        EventVocabulary(["<unk>"])
    # The file is an ordinary vocabulary file; the plain reader refuses spaces in words.
    text = vocab.to_json()
    assert EventVocabulary.from_json(text) == vocab
    with pytest.raises(DataError, match="whitespace"):
        Vocabulary.from_json(text)
