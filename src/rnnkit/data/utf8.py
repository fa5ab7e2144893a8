"""Strict UTF-8 decoding with the one error every reader gives for bytes that are not UTF-8.

``path:line: invalid UTF-8 at byte N of the line (byte 0xff)``: the line (1-based) and the
byte within it (1-based, counted in the file's own bytes, a byte-order mark included) of
the first byte that does not decode, and that byte. The same words for a whole file and
for a file read line by line, so ``sed -n 'LINEp' FILE | head -c N`` shows the same place
whichever reader found it.
"""

from __future__ import annotations

from os import PathLike

from rnnkit.errors import DataError

__all__ = ["decode_utf8", "invalid_utf8"]


def invalid_utf8(
    raw: bytes, start: int, path: str | PathLike[str] | None = None, line: int | None = None
) -> DataError:
    """The error for the undecodable byte ``raw[start]``.

    Args:
        raw: the bytes decoded: one line when ``line`` is given, else a whole file.
        start: the index of the first bad byte in ``raw`` (``UnicodeDecodeError.start``).
        path: the file, for the message.
        line: the 1-based line ``raw`` is; None: ``raw`` is a whole file and the line is
            counted from its ``\\n`` (a ``\\r\\n`` file numbers the same; as every
            whole-file reader and the JSON and TOML parsers number lines).

    >>> str(invalid_utf8(b"ok\\nbad \\xff", 7, "c.txt"))
    'c.txt:2: invalid UTF-8 at byte 5 of the line (byte 0xff)'
    >>> str(invalid_utf8(b"\\xe2\\x82", 0, "in.jsonl", 9))
    'in.jsonl:9: invalid UTF-8 at byte 1 of the line (byte 0xe2)'
    """
    line_start = 0
    if line is None:
        line = raw.count(b"\n", 0, start) + 1
        line_start = raw.rfind(b"\n", 0, start) + 1
    byte = start - line_start + 1
    message = f"invalid UTF-8 at byte {byte} of the line (byte 0x{raw[start]:02x})"
    return DataError(message, path, line)


def decode_utf8(
    raw: bytes, path: str | PathLike[str] | None = None, line: int | None = None
) -> str:
    """``raw`` decoded as strict UTF-8; bytes that are not UTF-8 are :func:`invalid_utf8`.

    A leading byte-order mark is decoded (``"\\ufeff"``), not dropped: the caller drops it
    from the first line, and the byte positions of the error stay those of the file
    (``utf-8-sig`` would number them from after the mark).

    Args:
        raw: one line (``line`` given) or a whole file (``line`` None).
        path, line: where ``raw`` is, for the error (see :func:`invalid_utf8`).

    Raises:
        DataError: ``path:line: invalid UTF-8 at byte N of the line (byte 0x..)``.

    >>> decode_utf8("naïve".encode())
    'naïve'
    >>> decode_utf8(b"a\\r\\nb \\xc3(", "t.txt")
    Traceback (most recent call last):
    ...
    rnnkit.errors.DataError: t.txt:2: invalid UTF-8 at byte 3 of the line (byte 0xc3)
    """
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise invalid_utf8(raw, exc.start, path, line) from None
