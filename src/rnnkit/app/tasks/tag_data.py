"""A tagging run's data: the vocabulary key of a word, the words, tags and (``--char-rnn``)
characters of a run (:class:`TagData`, kept in ``vocab.json``, ``labels.json`` and
``chars.json``), sentences encoded as id arrays (:func:`encode_tagged`) and a batch's
inputs on the device."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from rnnkit.app.config import TrainConfig
from rnnkit.bptt.mask_facts import move_mask
from rnnkit.data.batching import to_device
from rnnkit.data.labelled import LabelSet
from rnnkit.data.tagged import TaggedSentence
from rnnkit.data.vocab import PAD_ID, UNK_ID, Vocabulary

__all__ = [
    "MAX_WORD_CHARS",
    "EncodedTags",
    "TagData",
    "encode_tagged",
    "unknown_words",
    "word_key",
]

# Words longer than this keep their first 2/3 and last 1/3 of characters: prefixes (a
# quote, a digit, "#") and suffixes (morphology) carry the signal, and compute stays
# bounded for long string literals and comments.
MAX_WORD_CHARS = 24
_WHITESPACE = re.compile(r"\s")


def word_key(token: str) -> str:
    """The vocabulary key of a token: whitespace inside it (CoNLL-U allows words with
    spaces) becomes ``␣``, so every word is one whitespace-free vocabulary entry.

    >>> word_key("New York")
    'New␣York'
    """
    return _WHITESPACE.sub("\u2423", token)


def unknown_words(vocab: Vocabulary, tokens: list[str]) -> int:
    """How many of ``tokens`` the tagger reads as the unknown word (a word spelled like
    ``<pad>``, ``<s>`` or ``</s>`` included), a literal ``<unk>`` left out.

    >>> unknown_words(Vocabulary(["the"], unit="word"), ["the", "<pad>", "<unk>", "cat"])
    2
    """
    return sum(vocab.text_id(k) == UNK_ID and k != "<unk>" for k in map(word_key, tokens))


def _clip_word(token: str) -> str:
    if len(token) <= MAX_WORD_CHARS:
        return token
    head = 2 * MAX_WORD_CHARS // 3
    return token[:head] + token[-(MAX_WORD_CHARS - head) :]


@dataclass
class TagData:
    """The vocabularies of a tagging run."""

    vocab: Vocabulary  # words (unit "word", keys from word_key)
    tags: LabelSet
    chars: Vocabulary | None = None  # characters of the words (with --char-rnn)

    @classmethod
    def from_sentences(cls, sentences: list[TaggedSentence], cfg: TrainConfig) -> TagData:
        words = Counter(word_key(t) for s in sentences for t in s.tokens)
        vocab = Vocabulary.from_counts(words, unit="word", min_freq=cfg.min_freq, source=cfg.train)
        tags = LabelSet.from_data(t for s in sentences for t in s.tags)
        chars = None
        if cfg.char_rnn:
            counts = Counter(c for s in sentences for t in s.tokens for c in _clip_word(t))
            chars = Vocabulary.from_counts(counts, unit="char")
        return cls(vocab, tags, chars)

    def save(self, out: Path) -> None:
        self.vocab.save(out / "vocab.json")
        self.tags.save(out / "labels.json")
        if self.chars is not None:
            self.chars.save(out / "chars.json")

    @classmethod
    def load(cls, run_dir: Path, char_rnn: bool) -> TagData:
        chars = Vocabulary.load(run_dir / "chars.json") if char_rnn else None
        return cls(
            Vocabulary.load(run_dir / "vocab.json"), LabelSet.load(run_dir / "labels.json"), chars
        )


@dataclass
class EncodedTags:
    """Sentences as id arrays. ``tags`` holds ``len(tag set)`` for a tag the model does not
    know (never a target); ``chars[i]`` is ``(n_words, max_chars)`` with 0 padding."""

    sentences: list[TaggedSentence]
    words: list[np.ndarray]
    tags: list[np.ndarray]
    oov: list[np.ndarray]
    chars: list[np.ndarray] | None


def encode_tagged(
    sentences: list[TaggedSentence], data: TagData, max_len: int | None = None
) -> EncodedTags:
    """Encode sentences, cutting those longer than ``max_len`` into pieces (training)."""
    if max_len is not None:
        pieces = []
        for s in sentences:
            for lo in range(0, len(s.tokens), max_len):
                pieces.append(
                    TaggedSentence(s.tokens[lo : lo + max_len], s.tags[lo : lo + max_len], s.line)
                )
        sentences = pieces
    text_id, unknown_tag = data.vocab.text_id, len(data.tags)
    words, tags, oov, chars = [], [], [], []
    for s in sentences:
        # a word spelled <pad>, <s> or </s> is an unknown word, never padding (id 0)
        w = np.array([text_id(word_key(t)) for t in s.tokens], dtype=np.int64)
        words.append(w)
        oov.append(w == UNK_ID)
        g = data.tags.get
        tags.append(
            np.array([unknown_tag if g(t) is None else g(t) for t in s.tags], dtype=np.int64)
        )
        if data.chars is not None:
            clipped = [_clip_word(t) for t in s.tokens]
            arr = np.full((len(clipped), max(len(t) for t in clipped)), PAD_ID, dtype=np.int64)
            for i, t in enumerate(clipped):
                arr[i, : len(t)] = data.chars.encode(t)
            chars.append(arr)
    return EncodedTags(sentences, words, tags, oov, chars if data.chars is not None else None)


def char_batch(enc: EncodedTags, indices: Tensor, T: int) -> Tensor:
    """The characters ``(B, T, C)`` of the sentences ``indices`` (0-padded), ``T`` words
    wide."""
    assert enc.chars is not None
    arrays = [enc.chars[i] for i in indices.tolist()]
    width = max(a.shape[1] for a in arrays)
    out = np.full((len(arrays), T, width), PAD_ID, dtype=np.int64)  # (B, T, C)
    for row, a in enumerate(arrays):
        out[row, : a.shape[0], : a.shape[1]] = a
    return torch.from_numpy(out)


def _inputs(
    enc: EncodedTags, batch: Any, device: torch.device
) -> tuple[Tensor, Tensor, Tensor | None]:
    words, mask = to_device(batch.inputs, device), move_mask(batch.mask, device)
    chars = None
    if enc.chars is not None:
        # with its host copy kept: the character RNN's mask is made from it there
        chars = move_mask(char_batch(enc, batch.indices, words.shape[1]), device)
    return words, mask, chars
