"""Lines of a binary stream, split and decoded one by one: against Python's own text stream
(``newline=""``), which splits the same lines but reports a bad byte lines too early."""

from __future__ import annotations

import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rnnkit.data.limits import MAX_JSON_LINE_BYTES, MAX_LINE_CHARS
from rnnkit.data.lines import (
    invalid_utf8_in_text_stream,
    split_lines,
    text_lines,
    text_stream_start,
)
from rnnkit.errors import DataError

PIECES = [b"a", b"bc", b"\n", b"\r", b"\r\n", "é€𝄞\ufeff".encode(), "€".encode(), "\ufeff".encode()]


def python_lines(raw: bytes) -> list[str]:
    """The oracle: the lines of Python's universal-newline text stream."""
    return list(io.TextIOWrapper(io.BytesIO(raw), encoding="utf-8", newline=""))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=40), st.integers(1, 12))
def test_lines_are_those_of_a_text_stream(pieces, max_bytes):
    # Small bounds make many cut reads: a \r\n and a character split between two reads
    # must come back whole.
    raw = b"".join(pieces)
    expected = python_lines(raw)
    longest = max((len(line.rstrip("\r\n").encode()) for line in expected), default=0)
    got = list(split_lines(io.BytesIO(raw), None if longest > max_bytes else max_bytes))
    assert [line.decode() for line in got] == expected
    texts = [t for _, t in text_lines(io.BytesIO(raw), "f", MAX_JSON_LINE_BYTES)]
    # a byte-order mark is dropped at the start of the file only
    assert texts == [
        line.removeprefix("\ufeff") if n == 0 else line for n, line in enumerate(expected)
    ]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=40), st.integers(1, 6))
def test_a_line_over_the_bound_is_refused_at_its_own_number(pieces, most):
    raw = b"".join(pieces)
    lines = python_lines(raw)
    over = [n for n, line in enumerate(lines, 1) if len(line.rstrip("\r\n").encode()) > most]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RNNKIT_MAX_JSON_LINE_BYTES", str(most))
        if not over:
            assert len(list(text_lines(io.BytesIO(raw), "f", MAX_JSON_LINE_BYTES))) == len(lines)
            return
        with pytest.raises(DataError, match="line too long") as info:
            list(text_lines(io.BytesIO(raw), "f", MAX_JSON_LINE_BYTES))
    assert info.value.line == over[0]


@pytest.mark.parametrize(
    ("raw", "where"),
    [
        # more than 8 KB of good lines before the bad one: a text stream said line 1,446
        (b"the cat sat on a mat\n" * 1500 + b"ab\xff\n", "1501: invalid UTF-8 at byte 3"),
        (b"the cat sat on a mat\r\n" * 1500 + b"ab\xff\r\n", "1501: invalid UTF-8 at byte 3"),
        (b"one\rtwo\r" * 1000 + b"\xff", "2001: invalid UTF-8 at byte 1"),  # lone \r ends
        # a byte-order mark is dropped, and counted: the bytes are the file's
        (b"\xef\xbb\xbfab\xff\n", "1: invalid UTF-8 at byte 6"),
        (b"\xef\xbb\xbfok\nx\xc3(\n", "2: invalid UTF-8 at byte 2"),
    ],
)
def test_invalid_utf8_is_named_at_its_own_line(raw, where):
    with pytest.raises(DataError) as info:
        list(text_lines(io.BytesIO(raw), "in.txt", MAX_LINE_CHARS))
    value = "0xc3" if b"\xc3" in raw else "0xff"
    assert str(info.value) == f"in.txt:{where} of the line (byte {value})"


def test_a_character_across_the_text_streams_chunk_is_read_whole():
    # "€" (3 bytes) straddles byte 8,192, where a text stream's decoder cuts its chunks.
    raw = b"a" * 8189 + b"\n" + "x€y\n".encode() * 3
    assert raw.index("€".encode()) < 8192 < raw.index("€".encode()) + 3
    got = [t for _, t in text_lines(io.BytesIO(raw), "f", MAX_LINE_CHARS)]
    assert got == python_lines(raw)
    with pytest.raises(DataError, match=r"^f:5: invalid UTF-8 at byte 2 of the line"):
        list(text_lines(io.BytesIO(raw + b"z\xff\n"), "f", MAX_LINE_CHARS))


def test_the_character_limit_counts_characters_not_bytes(monkeypatch):
    monkeypatch.setenv("RNNKIT_MAX_LINE_CHARS", "3")
    ok = "€€€\n".encode()  # 3 characters, 9 bytes
    assert [t for _, t in text_lines(io.BytesIO(ok), "f", MAX_LINE_CHARS)] == ["€€€\n"]
    with pytest.raises(DataError, match=r"^f:2: line too long, over the limit of 3 characters"):
        list(text_lines(io.BytesIO(ok + "€€€€\n".encode()), "f", MAX_LINE_CHARS))


def test_a_file_over_its_limit_is_refused_as_it_is_read():
    with pytest.raises(DataError, match=r"^f: file of more than 10 bytes"):
        list(text_lines(io.BytesIO(b"abcd\n" * 3), "f", MAX_LINE_CHARS, file_limit=10))
    assert len(list(text_lines(io.BytesIO(b"abcd\n" * 2), "f", MAX_LINE_CHARS, file_limit=10))) == 2


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.sampled_from([*PIECES, b"x" * 3000]), max_size=30),
    st.sampled_from([b"\xff", b"\xc3(", b"\xe2\x82"]),
    st.lists(st.sampled_from(PIECES), max_size=5),
)
def test_a_text_streams_decoding_error_is_the_binary_readers(before, bad, after):
    # The oracle: text_lines on the same bytes. The text stream raises lines (up to 8 KB)
    # before the bad one; its bytes are read again from its buffer.
    raw = b"".join(before) + bad + b"".join(after)
    with pytest.raises(DataError) as expected:
        list(text_lines(io.BytesIO(raw), "in.txt", MAX_LINE_CHARS))
    text = io.TextIOWrapper(io.BytesIO(raw), encoding="utf-8", newline="")
    start = text_stream_start(text)
    line = 1
    with pytest.raises(UnicodeDecodeError) as info:
        while text.readline():
            line += 1
    got = invalid_utf8_in_text_stream(text, info.value, "in.txt", line, start, 2**20)
    assert str(got) == str(expected.value)
    assert line <= got.line  # type: ignore[operator]


def test_a_binary_stream_or_a_pipe_has_no_start_to_read_again_from():
    assert text_stream_start(io.BytesIO(b"x")) is None
    assert text_stream_start(io.StringIO("x")) is None  # no bytes under it
    text = io.TextIOWrapper(io.BytesIO(b"ab\ncd\n"), encoding="utf-8")
    text.readline()
    assert text_stream_start(text) == 3
    next(text)
    assert text_stream_start(text) is None  # tell() is disabled by next()
