"""Files on disk: the one atomic writer of rnnkit, and guarded reads of run files.

Every file rnnkit writes (run-directory files, reports, session files, vocabularies) goes
through :func:`atomic_write`: the content is written to a temporary name in the same
folder, flushed, fsynced and renamed over the destination, so a reader (or a crash) sees
the old file or the new one, never half of one. The temporary file is created with mode
``0o666`` and the process umask applied, exactly as a plain ``open(path, "w")`` would:
under the usual umask 022 every file of a run is 0644, readable by the other users who
share it (``tempfile.mkstemp`` would give 0600).

Two refusals protect what is already there:

* the destination must be a regular file or a new path: a device node, a FIFO, a socket
  or a directory is never replaced (``report --out /dev/sda`` is an error, not a lost
  device);
* a write that fails, whatever the library that raised it (``OSError`` from ``open`` and
  ``write``, ``SafetensorError`` from safetensors), becomes one :class:`WriteError` naming
  the file, and the previous file is left as it was.

Reads of run files go through :func:`read_run_file`: a regular file only (a FIFO as
``config.json`` would block forever), at most ``max_bytes`` (a run file is never large,
except weights, which safetensors maps rather than reads).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import stat
from collections.abc import Callable
from os import PathLike
from pathlib import Path
from typing import IO

from safetensors import SafetensorError

from rnnkit.errors import DataError, WriteError

__all__ = [
    "MAX_RUN_FILE_BYTES",
    "append_line",
    "atomic_write",
    "atomic_write_bytes",
    "check_replaceable",
    "check_writable_target",
    "fingerprint",
    "read_run_file",
    "require_regular_file",
    "sha256_file",
]

# The JSON files of a run (config, summary, state, thresholds, vocabularies) are
# kilobytes to a few megabytes; 256 MiB is far above any of them and far below trouble.
MAX_RUN_FILE_BYTES = 256 << 20

PathLikeStr = str | PathLike[str]


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "directory"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISSOCK, "socket"),
    ):
        if test(mode):
            return name
    return "special file"


def check_writable_target(path: PathLikeStr) -> None:
    """``path`` must be new or a regular file (through symlinks): nothing else is replaced.

    >>> check_writable_target("/dev/null")
    Traceback (most recent call last):
    ...
    rnnkit.errors.WriteError: /dev/null: is a character device, not a regular file; \
refusing to replace it
    """
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise WriteError(f"{path}: cannot write: {exc.strerror or exc}") from None
    if not stat.S_ISREG(mode):
        raise WriteError(f"{path}: is a {_kind(mode)}, not a regular file; refusing to replace it")


def check_replaceable(path: PathLikeStr, is_ours: Callable[[bytes], bool], what: str) -> None:
    """``path`` may be replaced by a command's output: new, empty, or already ``what`` (its
    first 4 KiB pass ``is_ours``); anything else is a user's file, which an output path
    given by mistake (``report --out notes.txt``) would destroy.

    >>> import tempfile
    >>> notes = Path(tempfile.mkdtemp()) / "notes.txt"
    >>> _ = notes.write_text("my notes")
    >>> check_replaceable(notes, lambda head: head.startswith(b"<!DOCTYPE"), "a report")
    ... # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    rnnkit.errors.WriteError: .../notes.txt: exists and is not a report; refusing to \
replace it (remove it, or choose another path)
    """
    check_writable_target(path)
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise WriteError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if head and not is_ours(head):
        raise WriteError(
            f"{path}: exists and is not {what}; refusing to replace it (remove it, or choose "
            "another path)"
        )


def _umask() -> int:
    """The process's umask, read without changing it where the system tells it (Linux:
    ``/proc/self/status``): setting it to read it, even for an instant, changes it for
    every thread of the user's program (a file another thread creates meanwhile gets the
    wrong mode)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # elsewhere the only way to read it: set, then put it back
    os.umask(mask)
    return mask


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def atomic_write(
    path: PathLikeStr,
    write: Callable[[IO[bytes]], object] | None = None,
    *,
    write_path: Callable[[str], object] | None = None,
) -> None:
    """Create or replace ``path`` atomically with what ``write`` puts into a binary file
    (or what ``write_path`` writes to a file name, for libraries that take a name, such
    as ``safetensors.torch.save_file``).

    Raises:
        WriteError: ``path`` is not a regular file, or the write failed (disk full,
            permissions, read-only file system, ...); the old file is unchanged and no
            temporary file is left.
    """
    if (write is None) == (write_path is None):
        raise TypeError("give exactly one of write and write_path")
    path = Path(path)
    check_writable_target(path)
    # the name's head, not all of it: ".NAME.xxxxxxxx.tmp" is 14 bytes longer than NAME,
    # and a legal 251-byte NAME was refused ("File name too long")
    head = os.fsdecode(os.fsencode(path.name)[:200])
    tmp = path.parent / f".{head}.{secrets.token_hex(4)}.tmp"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # 0o666 minus the umask, as open() gives; O_EXCL never follows a planted symlink.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "wb") as f:
            if write is not None:
                write(f)
                f.flush()
                os.fsync(f.fileno())
        if write_path is not None:
            write_path(str(tmp))
            # The library may have replaced our file by one of its own (safetensors
            # writes 0600): the mode a plain open() gives, and the data on disk.
            with open(tmp, "rb+") as f:
                os.fchmod(f.fileno(), 0o666 & ~_umask())
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except (OSError, SafetensorError) as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise WriteError(f"{path}: cannot write: {_reason(exc)}") from None
    except BaseException:
        # Never leave a half-written temporary file behind, even on Ctrl-C.
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def append_line(path: PathLikeStr, line: str) -> None:
    """Append one line to a log file (``metrics.jsonl``): the one file of a run that grows
    instead of being replaced. The line is appended whole or not at all: a write that
    fails part way (a full disk) is cut back to the file's previous end before the
    :class:`WriteError` naming the file, so the next record, once there is space again,
    starts on a line of its own. A file that ends in a partial line anyway (a crash of the
    machine in mid-write) gets a newline first: that line stays one bad line, and the
    next record is not joined onto it.
    """
    path = Path(path)
    check_writable_target(path)
    data = (line.rstrip("\n") + "\n").encode("utf-8")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o666)
    except OSError as exc:
        raise WriteError(f"{path}: cannot write: {_reason(exc)}") from None
    try:
        start = os.fstat(fd).st_size
        if start and os.pread(fd, 1, start - 1) != b"\n":
            data = b"\n" + data
        try:
            done = 0
            while done < len(data):  # os.write may write less than asked
                done += os.write(fd, data[done:])
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)  # back to whole records
            raise
    except OSError as exc:
        raise WriteError(f"{path}: cannot write: {_reason(exc)}") from None
    finally:
        os.close(fd)


def atomic_write_bytes(path: PathLikeStr, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (see :func:`atomic_write`).

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "a.txt"
    >>> atomic_write_bytes(p, b"hi")
    >>> p.read_bytes()
    b'hi'
    """
    atomic_write(path, lambda f: f.write(data))


def _open_regular(path: Path) -> IO[bytes]:
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; refused right after.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise DataError("file not found", path) from None
    except IsADirectoryError:
        raise DataError("is a directory, not a file", path) from None
    except OSError as exc:
        raise DataError(f"cannot read: {exc.strerror or exc}", path) from None
    # Checked before fdopen, which refuses a directory with its own "[Errno 21] ...: <fd>".
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise DataError(f"is a {_kind(mode)}, not a regular file", path)
    return os.fdopen(fd, "rb")


def require_regular_file(path: PathLikeStr) -> None:
    """``path`` exists and is a regular file (a FIFO or a device is refused at once).

    >>> require_regular_file("/dev/zero")
    Traceback (most recent call last):
    ...
    rnnkit.errors.DataError: /dev/zero: is a character device, not a regular file
    """
    _open_regular(Path(path)).close()


def read_run_file(path: PathLikeStr, max_bytes: int = MAX_RUN_FILE_BYTES) -> bytes:
    """The bytes of a run file: a regular file of at most ``max_bytes``.

    Raises:
        DataError: missing, not a regular file, larger than ``max_bytes``, unreadable.
    """
    path = Path(path)
    with _open_regular(path) as f:
        try:
            data = f.read(max_bytes + 1)
        except OSError as exc:
            raise DataError(f"cannot read: {exc.strerror or exc}", path) from None
    if len(data) > max_bytes:
        raise DataError(f"larger than {max_bytes:,} bytes: not a file rnnkit wrote", path)
    return data


def sha256_file(path: PathLikeStr) -> str:
    """The SHA-256 of a file, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fingerprint(path: PathLikeStr) -> dict[str, object]:
    """What identifies a data file: its absolute path, size and SHA-256.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "a.txt"
    >>> _ = p.write_bytes(b"abc")
    >>> f = fingerprint(p)
    >>> f["size"], f["sha256"][:12]
    (3, 'ba7816bf8f01')
    """
    path = Path(path)
    try:
        size = path.stat().st_size
        digest = sha256_file(path)
    except OSError as exc:
        raise DataError(f"cannot read: {exc.strerror or exc}", path) from None
    return {"path": str(path.resolve()), "size": size, "sha256": digest}
