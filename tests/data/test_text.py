"""Reading UTF-8 corpora, line splitting and whole-file encoding (speed:
benchmarks/bench_data.py)."""

from __future__ import annotations

import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rnnkit.data.text import (
    build_vocab_from_file,
    encode_corpus,
    encode_text,
    read_lines,
    read_numbered_lines,
    read_text,
)
from rnnkit.data.vocab import Vocabulary
from rnnkit.errors import DataError


def test_read_text_drops_bom_and_normalizes_crlf(tmp_path):
    path = tmp_path / "c.txt"
    path.write_bytes("\ufeffone\r\ntwo é\r\n".encode())
    assert read_text(path) == "one\ntwo é\n"


@pytest.mark.parametrize(
    ("data", "line", "column", "byte"),
    [
        (b"abc\nd\xc3\x28x", 2, 2, "0xc3"),  # a lead byte followed by a non-continuation
        (b"ok\nok\n\nzz\xffz", 4, 3, "0xff"),  # a byte that never starts a character
        (b"\xe2\x82\xacfine\n\xe2\x82", 2, 1, "0xe2"),  # truncated at the end of the file
        (b"\xef\xbb\xbfab\xff\n", 1, 6, "0xff"),  # the byte-order mark counts: the file's bytes
        (b"a\r\nbc\r\n\xe2\x82x", 3, 1, "0xe2"),  # CRLF: lines as the \n count them
        (b"the cat sat\n" * 1500 + b"ab\xff\n", 1501, 3, "0xff"),  # after 16 KB of good lines
    ],
)
def test_invalid_utf8_names_file_line_and_byte(tmp_path, data, line, column, byte):
    path = tmp_path / "bad.txt"
    path.write_bytes(data)
    with pytest.raises(DataError) as info:
        read_text(path)
    err = info.value
    assert (err.path, err.line) == (str(path), line)
    assert str(err) == f"{path}:{line}: invalid UTF-8 at byte {column} of the line (byte {byte})"


def test_missing_empty_and_blank_files(tmp_path):
    with pytest.raises(DataError, match="file not found") as info:
        read_text(tmp_path / "absent.txt")
    assert info.value.path == str(tmp_path / "absent.txt")
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    with pytest.raises(DataError, match="empty corpus"):
        read_text(empty)
    blank = tmp_path / "blank.txt"
    blank.write_text(" \n\t\n\n")
    with pytest.raises(DataError, match="empty corpus"):
        read_lines(blank)
    with pytest.raises(DataError, match="directory"):
        read_text(tmp_path)


def test_read_lines_skips_blank_lines_and_keeps_line_numbers(tmp_path):
    path = tmp_path / "lines.txt"
    path.write_text("the cat\n\n   \nsat\x0bdown\n  on it  \n", encoding="utf-8")
    assert read_lines(path) == ["the cat", "sat\x0bdown", "  on it  "]
    assert read_numbered_lines(path) == [(1, "the cat"), (4, "sat\x0bdown"), (5, "  on it  ")]


def test_encode_text_with_and_without_eos_per_line():
    chars = Vocabulary.from_text("ab\n")
    a, b, nl = chars.stoi["a"], chars.stoi["b"], chars.stoi["\n"]
    assert encode_text("ab\n\nb", chars).tolist() == [a, b, nl, nl, b]
    assert encode_text("ab\n\n  \nb", chars, eos_per_line=True).tolist() == [a, b, 3, b, 3]
    words = Vocabulary(["x", "y"], unit="word")
    assert encode_text("x y\n\nz x\n", words).tolist() == [4, 5, 1, 4]
    assert encode_text("x y\n\nz x\n", words, eos_per_line=True).tolist() == [4, 5, 3, 1, 4, 3]
    assert encode_text("\n\n", words, eos_per_line=True).shape == (0,)
    assert encode_text("\n \n", chars, eos_per_line=True).shape == (0,)


def _generated_corpus(n_chars: int) -> str:
    rng = np.random.default_rng(0)
    alphabet = np.array(list("abcdefghij klmnopqrstuvwxyz\n.,éü😀"))
    return "".join(rng.choice(alphabet, n_chars).tolist())


def test_large_char_corpus_is_counted_and_encoded_exactly(tmp_path):
    text = _generated_corpus(4_000_000)
    path = tmp_path / "big.txt"
    path.write_text(text, encoding="utf-8")

    vocab = build_vocab_from_file(path)
    ids = encode_corpus(path, vocab)
    assert ids.dtype == np.int32 and ids.shape == (len(text),)
    assert Counter(text) == {vocab.itos[i]: n for i, n in Counter(ids.tolist()).items()}
    head = text[:5000] + text[-5000:]
    assert np.concatenate([ids[:5000], ids[-5000:]]).tolist() == vocab.encode(head)
    assert vocab.unk_id not in ids


def test_build_vocab_from_file_words(tmp_path):
    path = tmp_path / "w.txt"
    path.write_text("b a b\nc b a\n", encoding="utf-8")
    vocab = build_vocab_from_file(path, unit="word", min_freq=2)
    assert vocab.itos[4:] == ["b", "a"]
    assert encode_corpus(path, vocab, eos_per_line=True).tolist() == [4, 5, 4, 3, 1, 4, 5, 3]


@settings(max_examples=60, deadline=None)
@given(data=st.binary(max_size=40))
def test_any_bytes_either_decode_exactly_or_fail_at_the_first_bad_byte(data):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "fuzz.txt"
        path.write_bytes(data)
        try:
            expected = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            before = data[: exc.start].split(b"\n")  # the lines before, then the bad line's start
            with pytest.raises(
                DataError, match=f" at byte {len(before[-1]) + 1} of the line "
            ) as info:
                read_text(path)
            assert info.value.line == len(before)
            return
        expected = expected.removeprefix("\ufeff").replace("\r\n", "\n")
        if not expected.strip():
            with pytest.raises(DataError, match="empty corpus"):
                read_text(path)
        else:
            assert read_text(path) == expected


def test_a_device_is_refused_at_once():
    # `--train /dev/zero`: an endless file; refused before any byte is read.
    with pytest.raises(DataError, match=r"^/dev/zero: is a device, not a data file$"):
        read_text("/dev/zero")


def test_the_line_limit_applies_while_reading_an_endless_pipe(tmp_path):
    import os
    import threading

    from rnnkit.data.text import read_numbered_lines

    fifo = tmp_path / "endless"
    os.mkfifo(fifo)
    written = [0]

    def writer() -> None:
        try:
            with open(fifo, "wb") as f:
                for _ in range(400):  # up to 400 MiB without a newline, if nobody stops
                    f.write(b"\0" * (1 << 20))
                    written[0] += 1
        except BrokenPipeError:
            pass  # the reader gave up: what the test wants

    thread = threading.Thread(target=writer)
    thread.start()
    with pytest.raises(DataError, match=r"endless:1: line of more than 4,000 bytes"):
        read_numbered_lines(fifo, max_line_chars=1000)
    thread.join(timeout=60)
    assert written[0] < 4  # stopped after the first MiB, not after 400


def test_a_file_over_max_file_bytes_is_refused(tmp_path, monkeypatch):
    path = tmp_path / "c.txt"
    path.write_bytes(b"ab\n" * 1000)
    monkeypatch.setenv("RNNKIT_MAX_FILE_BYTES", "2999")
    with pytest.raises(DataError, match=r"file of more than 2,999 bytes.*RNNKIT_MAX_FILE_BYTES"):
        read_text(path)
    monkeypatch.setenv("RNNKIT_MAX_FILE_BYTES", "3000")
    assert read_text(path) == "ab\n" * 1000
