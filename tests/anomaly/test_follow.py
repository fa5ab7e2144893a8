"""Following a growing input: a file being written, a pipe, overlong lines, log rotation."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from rnnkit.anomaly.follow import OVERLONG, follow_lines
from rnnkit.data.events import MAX_LINE_BYTES
from rnnkit.errors import DataError


def test_follow_a_growing_file(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_bytes(b'{"n": 1}\n{"n": 2')  # the second line is still being written

    def writer() -> None:
        time.sleep(0.15)
        with open(path, "ab") as f:
            f.write(b'}\n\n{"n": 3}\n')

    thread = threading.Thread(target=writer)
    thread.start()
    lines = [line for batch in follow_lines(str(path), poll=0.02, until_idle=0.5) for line in batch]
    thread.join()
    assert lines == [(1, b'{"n": 1}'), (2, b'{"n": 2}'), (4, b'{"n": 3}')]


def test_follow_a_pipe_until_its_writer_closes(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)

    def writer() -> None:
        with open(fifo, "wb") as f:
            f.write(b'{"a": 1}\n')
            f.flush()
            time.sleep(0.1)
            f.write(b'{"b": 2}')  # the last line has no newline

    thread = threading.Thread(target=writer)
    thread.start()
    batches = list(follow_lines(str(fifo), poll=0.02))
    thread.join()
    assert [line for batch in batches for line in batch] == [(1, b'{"a": 1}'), (2, b'{"b": 2}')]
    assert [] in batches  # the wait between the writes was reported (idle checks)


def test_overlong_line_is_reported_and_skipped(tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    with open(path, "wb") as f:
        f.write(b"x" * (MAX_LINE_BYTES + 10) + b"\n" + b'{"ok": 1}\n')
    lines = [line for batch in follow_lines(str(path), follow=False) for line in batch]
    assert lines[0] == (1, OVERLONG) and lines[1] == (2, b'{"ok": 1}')


def _lines_until(gen, count: int, limit: int = 200) -> list[tuple[int, bytes]]:
    """Drive a follow_lines generator (no threads: file operations happen between calls)
    until ``count`` lines have come, or ``limit`` idle polls have passed."""
    got: list[tuple[int, bytes]] = []
    for _ in range(limit):
        got += next(gen)
        if len(got) >= count:
            break
    return got


def test_follow_by_name_across_a_rename_rotation(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_bytes(b'{"n": 1}\n{"n": 2}\n')
    gen = follow_lines(str(path), poll=0.001)
    assert _lines_until(gen, 2) == [(1, b'{"n": 1}'), (2, b'{"n": 2}')]
    # logrotate without copytruncate: the writer still has the old file open and ends
    # its last line there after the rename; then a new file takes the name.
    os.rename(path, tmp_path / "events.jsonl.1")
    with open(tmp_path / "events.jsonl.1", "ab") as f:
        f.write(b'{"n": 3}\n{"n": 4')
    path.write_bytes(b'{"m": 1}\n{"m": 2}\n')
    got = _lines_until(gen, 4)
    # Nothing lost, nothing spliced: the old file to its end, then the new from its start.
    assert got == [(3, b'{"n": 3}'), (4, b'{"n": 4'), (1, b'{"m": 1}'), (2, b'{"m": 2}')]
    with open(path, "ab") as f:
        f.write(b'{"m": 3}\n')
    assert _lines_until(gen, 1) == [(3, b'{"m": 3}')]
    gen.close()


def test_follow_a_file_truncated_and_regrown_within_one_poll(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_bytes(b'{"n": 1}\n{"n": 2}\n')
    gen = follow_lines(str(path), poll=0.001)
    assert len(_lines_until(gen, 2)) == 2
    # copytruncate, then the writer logs more than before before we look again: the
    # file is longer than our offset, and reading on from it would splice mid-line.
    new = [f'{{"session": "s", "events": ["e{i}"]}}'.encode() for i in range(6)]
    with open(path, "r+b") as f:
        f.truncate(0)
        f.write(b"\n".join(new) + b"\n")
    got = _lines_until(gen, 6)
    assert got == list(enumerate(new, start=1))
    gen.close()


def test_a_rewrite_that_ends_as_the_old_content_did_is_noticed(tmp_path: Path) -> None:
    """Rewritten in place and grown past the old offset within one poll, with the same
    last 64 bytes there (sessions of the same events end alike): only the tail was
    compared, and the first new sessions were lost without a word."""

    def line(name: str) -> bytes:
        events = ", ".join(['"open"', *['"read"'] * 5, '"close"'])
        return f'{{"session": "{name}", "events": [{events}], "end": true}}\n'.encode()

    path = tmp_path / "g.log"
    path.write_bytes(line("a1") + line("a2"))
    gen = follow_lines(str(path), poll=0.001)
    assert len(_lines_until(gen, 2)) == 2
    new = [line("b1"), line("b2"), line("b3")]
    with open(path, "r+b") as f:
        f.truncate(0)
        f.write(b"".join(new))
    assert _lines_until(gen, 3) == [(i + 1, text.rstrip(b"\n")) for i, text in enumerate(new)]
    gen.close()


def test_two_rotations_within_one_poll_lose_nothing(tmp_path: Path, caplog) -> None:
    # The file rotated in between (now events.jsonl.1) was never opened: its sessions
    # were lost silently.
    path = tmp_path / "events.jsonl"
    path.write_bytes(b'{"a": 1}\n')
    gen = follow_lines(str(path), poll=0.001)
    assert _lines_until(gen, 1) == [(1, b'{"a": 1}')]
    os.rename(path, tmp_path / "events.jsonl.1")  # first rotation: A → .1
    path.write_bytes(b'{"b": 1}\n{"b": 2}\n')  # B, written and rotated before we look
    os.rename(tmp_path / "events.jsonl.1", tmp_path / "events.jsonl.2")  # A → .2
    os.rename(path, tmp_path / "events.jsonl.1")  # B → .1
    path.write_bytes(b'{"c": 1}\n')  # C
    with caplog.at_level("WARNING", logger="rnnkit"):
        got = _lines_until(gen, 3)
    assert got == [(1, b'{"b": 1}'), (2, b'{"b": 2}'), (1, b'{"c": 1}')]
    assert "rotated 2 times since the last read; reading " in caplog.text
    assert "events.jsonl.1" in caplog.text
    gen.close()


def test_three_rotations_read_the_missed_files_oldest_first(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_bytes(b'{"a": 1}\n')
    gen = follow_lines(str(path), poll=0.001)
    assert len(_lines_until(gen, 1)) == 1
    for letter in (b"b", b"c", b"d"):  # logrotate: shift .K → .K+1, then the file → .1
        for k in (3, 2, 1):
            if (tmp_path / f"events.jsonl.{k}").exists():
                os.rename(tmp_path / f"events.jsonl.{k}", tmp_path / f"events.jsonl.{k + 1}")
        os.rename(path, tmp_path / "events.jsonl.1")
        path.write_bytes(b'{"%s": 1}\n' % letter)
    got = _lines_until(gen, 3)
    assert [line for _, line in got] == [b'{"b": 1}', b'{"c": 1}', b'{"d": 1}']
    gen.close()


def test_a_byte_order_mark_at_the_start_is_not_part_of_the_first_line(tmp_path: Path) -> None:
    # Windows tools write one; the other readers drop it too. Only the file's start: a
    # mark inside the file is content (and a rewritten file starts again at its line 1).
    bom = b"\xef\xbb\xbf"
    path = tmp_path / "events.jsonl"
    path.write_bytes(bom + b'{"n": 1}\n' + bom + b'{"n": 2}\n')
    lines = [line for batch in follow_lines(str(path), follow=False) for line in batch]
    assert lines == [(1, b'{"n": 1}'), (2, bom + b'{"n": 2}')]
    path.write_bytes(bom + b'{"n": 3}')  # one line, no newline
    lines = [line for batch in follow_lines(str(path), follow=False) for line in batch]
    assert lines == [(1, b'{"n": 3}')]


@pytest.mark.parametrize(("make", "words"), [("dir", "is a directory"), (None, "file not found")])
def test_a_directory_or_a_missing_file_is_one_line_naming_it(tmp_path: Path, make, words) -> None:
    # A directory opened (os.open takes one), then the first read said only "Is a directory".
    path = tmp_path / "events.jsonl"
    if make == "dir":
        path.mkdir()
    with pytest.raises(DataError) as info:
        next(follow_lines(str(path), until_idle=0.1))
    assert str(info.value) == f"{path}: {words}" + (", not a data file" if make else "")
