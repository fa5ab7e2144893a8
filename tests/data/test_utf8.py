"""The one error for bytes that are not UTF-8: the line and the byte in it, checked against
Python's own decoder and a count by hand."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rnnkit.data.utf8 import decode_utf8, invalid_utf8
from rnnkit.errors import DataError

# Bytes that make lines, valid characters of 1 to 4 bytes, their pieces, and bytes that
# never start a character.
PIECES = [b"a", b"\n", b"\r\n", "é".encode(), "€".encode(), "𝄞".encode(), b"\xc3", b"\xff"]


@pytest.mark.parametrize(
    ("raw", "line", "message"),
    [
        (b"\xff", None, "f:1: invalid UTF-8 at byte 1 of the line (byte 0xff)"),
        (b"ok\nok\nab\xc3(", None, "f:3: invalid UTF-8 at byte 3 of the line (byte 0xc3)"),
        (b"a\r\n\xe2\x82", None, "f:2: invalid UTF-8 at byte 1 of the line (byte 0xe2)"),
        (b"\xef\xbb\xbf\xc3\xa9\xff", None, "f:1: invalid UTF-8 at byte 6 of the line (byte 0xff)"),
        (b"abc\xff\n", 1501, "f:1501: invalid UTF-8 at byte 4 of the line (byte 0xff)"),
    ],
)  # fmt: skip
def test_the_error_names_line_byte_and_value(raw, line, message):
    with pytest.raises(DataError) as info:
        decode_utf8(raw, "f", line)
    assert str(info.value) == message
    assert "\n" not in str(info.value)


def test_valid_text_and_its_byte_order_mark_are_kept():
    assert decode_utf8("\ufeffa\r\n𝄞".encode(), "f") == "\ufeffa\r\n𝄞"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=30))
def test_whole_file_error_is_where_the_decoder_stops(pieces):
    raw = b"".join(pieces)
    try:
        expected = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        lines = raw[: exc.start].split(b"\n")  # the lines before, then the bad line's start
        with pytest.raises(DataError) as info:
            decode_utf8(raw, "f")
        assert (info.value.path, info.value.line) == ("f", len(lines))
        assert info.value.message == (
            f"invalid UTF-8 at byte {len(lines[-1]) + 1} of the line (byte 0x{raw[exc.start]:02x})"
        )
        assert str(invalid_utf8(raw, exc.start, "f")) == str(info.value)
        return
    assert decode_utf8(raw, "f") == expected
