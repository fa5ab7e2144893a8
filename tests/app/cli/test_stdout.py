"""``write_stdout``: every byte of a document, however the stream takes them, or an error
naming standard output."""

from __future__ import annotations

import errno
import io

import pytest

from rnnkit.app.cli.stdout import write_stdout


class _Partial(io.RawIOBase):
    """A stream that takes at most ``step`` bytes a write, and fails past ``limit``."""

    def __init__(self, step: int, limit: int) -> None:
        self.data, self.step, self.limit = bytearray(), step, limit

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        if len(self.data) >= self.limit:
            raise OSError(errno.EFBIG, "File too large")
        taken = bytes(b[: min(self.step, self.limit - len(self.data))])
        self.data += taken
        return len(taken)


def _stdout(monkeypatch, raw: _Partial) -> None:
    monkeypatch.setattr("sys.stdout", io.TextIOWrapper(io.BufferedWriter(raw, 4)))


def test_a_stream_that_takes_a_part_at_a_time_gets_every_byte(monkeypatch):
    raw = _Partial(step=7, limit=10**6)
    _stdout(monkeypatch, raw)
    write_stdout(b"x" * 1000)
    assert bytes(raw.data) == b"x" * 1000


def test_past_its_limit_the_error_names_standard_output(monkeypatch):
    _stdout(monkeypatch, _Partial(step=10**6, limit=100))
    with pytest.raises(OSError, match="File too large") as info:
        write_stdout(b"x" * 1000)
    assert info.value.filename == "standard output" and info.value.errno == errno.EFBIG


def test_a_text_only_stdout_gets_the_text(monkeypatch):
    """main() under ``redirect_stdout(io.StringIO())``: no ``.buffer`` (AttributeError)."""
    text = io.StringIO()
    monkeypatch.setattr("sys.stdout", text)
    write_stdout("é\n".encode())
    assert text.getvalue() == "é\n"
