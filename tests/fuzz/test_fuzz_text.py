"""Fuzz the plain-text readers (language-model corpora): any bytes give a result or a
one-line ``DataError`` naming the file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from fuzzkit import FUZZ, any_text, file_bytes, huge_line, outcome, write
from hypothesis import given
from hypothesis import strategies as st

from rnnkit.data.text import build_vocab_from_file, encode_corpus, read_lines, read_text
from rnnkit.data.vocab import Vocabulary
from rnnkit.errors import DataError

corpus = file_bytes(any_text)


@FUZZ
@given(data=corpus, unit=st.sampled_from(["char", "word"]), eos=st.booleans())
def test_text_corpus_reads_or_names_the_file(tmp_path: Path, data: bytes, unit: str, eos: bool):
    path = write(tmp_path, "corpus.txt", data)
    text = outcome(lambda: read_text(path), names=path)
    vocab = outcome(lambda: build_vocab_from_file(path, unit=unit), names=path)
    if isinstance(text, DataError):
        assert isinstance(vocab, DataError) and str(vocab) == str(text)
        return
    assert isinstance(text, str) and text.strip() and not text.startswith("\ufeff")
    assert isinstance(vocab, Vocabulary)
    ids = outcome(lambda: encode_corpus(path, vocab, eos_per_line=eos), names=path)
    assert isinstance(ids, np.ndarray) and ids.dtype == np.int32
    assert ids.size == 0 or (ids.min() >= 0 and ids.max() < len(vocab))
    if unit == "char" and not eos:
        assert vocab.decode(ids) == text  # every character of the corpus is in its vocab
    lines = outcome(lambda: read_lines(path), names=path)
    assert all(line.strip() and "\n" not in line for line in lines)


@FUZZ
@given(line=huge_line(), unit=st.sampled_from(["char", "word"]))
def test_a_huge_single_line_corpus_is_read(tmp_path: Path, line: str, unit: str):
    # A language-model corpus is a document, not a list of lines: no line limit applies.
    path = write(tmp_path, "one-line.txt", line)
    result = outcome(lambda: build_vocab_from_file(path, unit=unit), names=path)
    if not line.strip():
        assert isinstance(result, DataError) and "empty corpus" in str(result)
    else:
        assert isinstance(result, Vocabulary)
