"""The one atomic writer and the guarded reads (``rnnkit.data.files``): modes follow the
umask, non-regular files are never replaced nor waited on, every write failure is one
``WriteError`` line with the old file intact."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import subprocess
from pathlib import Path

import pytest
from safetensors import SafetensorError
from safetensors.numpy import save_file

from rnnkit.data.files import (
    append_line,
    atomic_write,
    atomic_write_bytes,
    fingerprint,
    read_run_file,
    require_regular_file,
)
from rnnkit.errors import DataError, WriteError


@contextlib.contextmanager
def umask(value: int):
    old = os.umask(value)
    try:
        yield
    finally:
        os.umask(old)


@pytest.mark.parametrize(("mask", "mode"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_files_get_the_mode_the_umask_gives(tmp_path, mask, mode):
    with umask(mask):
        atomic_write_bytes(tmp_path / "a.json", b"{}")
        atomic_write(tmp_path / "w.safetensors", write_path=lambda tmp: save_file({}, tmp))
        append_line(tmp_path / "m.jsonl", "{}")
        # The same as a plain open() would give: the reference.
        (tmp_path / "plain").write_bytes(b"")
    for name in ("a.json", "w.safetensors", "m.jsonl", "plain"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == mode, name


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads /proc")
def test_reading_the_umask_never_changes_it(tmp_path, monkeypatch):
    """The mode of a saved file came from setting the umask to 0o022 and back: for that
    instant every thread of the user's program created files with 0o022 (a worker's
    private files came out readable by others)."""
    calls = []
    real = os.umask
    monkeypatch.setattr(os, "umask", lambda m: calls.append(m) or real(m))
    with umask(0o077):
        calls.clear()
        atomic_write(tmp_path / "w.safetensors", write_path=lambda tmp: save_file({}, tmp))
        made = list(calls)
    assert made == []  # read from /proc/self/status, never set
    assert stat.S_IMODE((tmp_path / "w.safetensors").stat().st_mode) == 0o600


def test_a_device_node_is_never_replaced():
    with pytest.raises(WriteError, match=r"^/dev/null: is a character device, not a regular"):
        atomic_write_bytes("/dev/null", b"x")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_a_fifo_a_directory_and_a_symlink_to_a_device_are_refused(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "dir").mkdir()
    (tmp_path / "link").symlink_to("/dev/null")
    for name, kind in (("fifo", "FIFO"), ("dir", "directory"), ("link", "character device")):
        with pytest.raises(WriteError, match=f"is a {kind}, not a regular file"):
            atomic_write_bytes(tmp_path / name, b"x")
    assert stat.S_ISFIFO(fifo.stat().st_mode) and (tmp_path / "dir").is_dir()
    assert (tmp_path / "link").is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir", "fifo", "link"]


@pytest.mark.parametrize(
    "error",
    [OSError(errno.ENOSPC, "No space left on device"), SafetensorError("I/O error: disk full")],
    ids=["OSError", "SafetensorError"],
)
def test_any_write_failure_is_one_write_error_and_the_old_file_stays(tmp_path, error):
    path = tmp_path / "w.safetensors"
    atomic_write_bytes(path, b"old")

    def fail(tmp: str) -> None:
        Path(tmp).write_bytes(b"half")
        raise error

    with pytest.raises(WriteError) as info:
        atomic_write(path, write_path=fail)
    assert str(info.value).startswith(f"{path}: cannot write: ")
    assert "\n" not in str(info.value)
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["w.safetensors"]


def test_a_fifo_is_refused_at_once_not_waited_on(tmp_path):
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)  # open() for reading would block until a writer comes: forever
    with pytest.raises(DataError, match=r"config\.json: is a FIFO, not a regular file"):
        read_run_file(fifo)
    with pytest.raises(DataError, match="is a character device"):
        require_regular_file("/dev/zero")
    (tmp_path / "summary.json").mkdir()  # os.open reads a directory; fdopen did not
    with pytest.raises(DataError, match=r"summary\.json: is a directory, not a regular file$"):
        read_run_file(tmp_path / "summary.json")


def test_a_run_file_over_the_cap_is_refused_without_reading_it_whole(tmp_path):
    path = tmp_path / "summary.json"
    path.write_bytes(b" " * 101)
    assert read_run_file(path, max_bytes=101) == b" " * 101
    with pytest.raises(DataError, match="larger than 100 bytes"):
        read_run_file(path, max_bytes=100)


def test_fingerprint_is_path_size_and_sha256(tmp_path):
    import hashlib

    path = tmp_path / "corpus.txt"
    path.write_bytes(b"the cat\n" * 3)
    got = fingerprint(path)
    assert got == {
        "path": str(path.resolve()),
        "size": 24,
        "sha256": hashlib.sha256(b"the cat\n" * 3).hexdigest(),
    }


@pytest.fixture
def tiny_disk(tmp_path):
    """A real 200 KiB tmpfs (needs root and mount); skipped where it cannot be mounted."""
    where = tmp_path / "disk"
    where.mkdir()
    try:
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=200k", "tmpfs", str(where)],
            check=True,
            capture_output=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"cannot mount a small tmpfs here ({exc.__class__.__name__})")
    yield where
    subprocess.run(["umount", str(where)], check=False, timeout=30)


def test_a_really_full_disk_is_one_write_error_and_the_old_file_stays(tiny_disk):
    path = tiny_disk / "model.safetensors"
    atomic_write_bytes(path, b"old weights")
    with pytest.raises(WriteError, match=r"model\.safetensors: cannot write: No space left"):
        atomic_write_bytes(path, b"x" * (400 << 10))
    assert path.read_bytes() == b"old weights"
    assert [p.name for p in tiny_disk.iterdir()] == ["model.safetensors"]


def test_an_append_that_fails_part_way_leaves_whole_records(tmp_path, monkeypatch):
    # A full disk left half a record; after space returned, the next record was joined
    # onto it: one corrupt line, one event lost.
    from rnnkit.training.run_files import read_metrics

    path = tmp_path / "metrics.jsonl"
    append_line(path, '{"event": "valid", "step": 1}')
    before = path.read_bytes()
    real_write = os.write

    def disk_full(fd, data):
        real_write(fd, data[: len(data) // 2])  # part of the line reaches the disk
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", disk_full)
    with pytest.raises(WriteError, match=r"metrics.jsonl: cannot write: No space left on device"):
        append_line(path, '{"event": "valid", "step": 2}')
    assert path.read_bytes() == before  # cut back to the last whole record
    monkeypatch.setattr(os, "write", real_write)
    append_line(path, '{"event": "valid", "step": 3}')
    events, bad = read_metrics(tmp_path)
    assert [e["step"] for e in events] == [1, 3] and bad == 0


def test_an_append_after_a_partial_last_line_starts_a_new_line(tmp_path):
    # A machine crash in mid-write can still leave a partial line: it stays one bad line.
    from rnnkit.training.run_files import read_metrics

    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"event": "valid", "step": 1}\n{"event": "va')
    append_line(path, '{"event": "valid", "step": 2}')
    events, bad = read_metrics(tmp_path)
    assert [e["step"] for e in events] == [1, 2] and bad == 1


def test_a_long_legal_name_is_written(tmp_path):
    """A 251-byte name (the limit is 255) was refused, "File name too long": the hidden
    temporary name beside it was 14 bytes longer."""
    from rnnkit.data.files import atomic_write_bytes

    name = "é" * 120 + "x" * 11  # 251 bytes
    atomic_write_bytes(tmp_path / name, b"page")
    assert [p.name for p in tmp_path.iterdir()] == [name]
    assert (tmp_path / name).read_bytes() == b"page"
