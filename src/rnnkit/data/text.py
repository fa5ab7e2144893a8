"""Plain-text corpora: read UTF-8 strictly, split lines, and encode whole files to id arrays.

Every problem with a file (missing, unreadable, not UTF-8, empty) is a ``DataError`` naming
the file; invalid UTF-8 also names the line of the first bad byte and the byte in that line,
which is what a user needs to find it (``sed -n LINEp`` / a hex editor).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from os import PathLike

import numpy as np

from rnnkit.data.limits import MAX_FILE_BYTES, MAX_LINE_CHARS, Limit
from rnnkit.data.utf8 import decode_utf8
from rnnkit.data.vocab import EOS_ID, UNK_ID, Vocabulary, count_tokens
from rnnkit.errors import DataError

__all__ = [
    "build_vocab_from_file",
    "checked_lines",
    "encode_corpus",
    "encode_text",
    "read_lines",
    "read_numbered_lines",
    "read_text",
]

PathLikeStr = str | PathLike[str]


def _read_bounded(
    path: PathLikeStr, max_line_chars: int | None, size_limit: Limit = MAX_FILE_BYTES
) -> bytes:
    """The bytes of a data file, read in 1 MiB chunks with the limits applied as they come:
    at most :data:`~rnnkit.data.limits.MAX_FILE_BYTES` in all, and, for a line-oriented
    format (``max_line_chars`` given), no line of more than 4 bytes per allowed character
    (UTF-8's widest), so ``--train /dev/zero`` or an endless pipe fails at once, not after
    gigabytes. A device node is refused outright (a FIFO is fine: ``<(zcat c.gz)``).
    ``size_limit``: the limit of the whole file (a regular file over it is refused from
    its size, before a byte is read)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise DataError("file not found", path) from None
    except OSError as exc:
        raise DataError(f"cannot read: {exc.strerror or exc}", path) from None
    if stat.S_ISDIR(mode):
        raise DataError("is a directory, not a text file", path)
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        raise DataError("is a device, not a data file", path)
    file_limit = size_limit.value()
    if stat.S_ISREG(mode) and os.stat(path).st_size > file_limit:
        found = f"file of more than {file_limit:,} bytes"
        raise DataError(size_limit.exceeded(found, file_limit), path)
    line_limit = None if max_line_chars is None else MAX_LINE_CHARS.value(max_line_chars)
    chunks: list[bytes] = []
    total, line_bytes, line = 0, 0, 1
    try:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                total += len(chunk)
                if total > file_limit:
                    found = f"file of more than {file_limit:,} bytes"
                    raise DataError(size_limit.exceeded(found, file_limit), path)
                if line_limit is not None:
                    # parts[0] goes on with the current line; each later part is a line.
                    parts = chunk.split(b"\n")
                    for i, part in enumerate(parts):
                        length = len(part) + (line_bytes if i == 0 else 0)
                        if length > 4 * line_limit:
                            found = f"line of more than {4 * line_limit:,} bytes"
                            raise DataError(
                                MAX_LINE_CHARS.exceeded(found, line_limit), path, line + i
                            )
                    line += len(parts) - 1
                    line_bytes = len(parts[-1]) + (line_bytes if len(parts) == 1 else 0)
                chunks.append(chunk)
    except OSError as exc:
        raise DataError(f"cannot read: {exc.strerror or exc}", path) from None
    return b"".join(chunks)


def read_text(
    path: PathLikeStr, *, max_line_chars: int | None = None, size_limit: Limit = MAX_FILE_BYTES
) -> str:
    """Read a UTF-8 text file strictly.

    A leading byte-order mark is dropped and ``"\\r\\n"`` becomes ``"\\n"`` (line numbers are
    unchanged), so a corpus saved on Windows trains the same model.

    Args:
        path: the file.
        max_line_chars: for a line-oriented format, the longest line; checked while
            reading (a plain-text corpus has no line limit).
        size_limit: the limit of the whole file (:data:`~rnnkit.data.limits.MAX_FILE_BYTES`;
            a language-model corpus: :data:`~rnnkit.data.limits.MAX_CORPUS_BYTES`).

    Raises:
        DataError: ``file not found``, unreadable, a device, over
            :data:`~rnnkit.data.limits.MAX_FILE_BYTES`, invalid UTF-8 (the line and the byte
            in it of the first bad byte: :mod:`rnnkit.data.utf8`), or empty /
            whitespace-only.

    >>> import tempfile, pathlib
    >>> with tempfile.TemporaryDirectory() as d:
    ...     p = pathlib.Path(d) / "c.txt"
    ...     _ = p.write_bytes(b"ok\\nbad \\xff here\\n")
    ...     read_text(p)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    rnnkit.errors.DataError: ...c.txt:2: invalid UTF-8 at byte 5 of the line (byte 0xff)
    """
    raw = _read_bounded(path, max_line_chars, size_limit)
    text = decode_utf8(raw, path)
    del raw  # the bytes are dead weight from here on; a 100 MB corpus would hold them twice
    if text.startswith("\ufeff"):
        text = text[1:]
    if "\r\n" in text:
        text = text.replace("\r\n", "\n")
    if not text:
        raise DataError("empty corpus: the file holds no text", path)
    if text.isspace():
        raise DataError("empty corpus: the file holds only whitespace", path)
    return text


def read_numbered_lines(
    path: PathLikeStr, *, max_line_chars: int | None = None
) -> list[tuple[int, str]]:
    """The non-blank lines of a UTF-8 file with their 1-based line numbers (for error messages
    of line-oriented readers).

    Args:
        path: the file.
        max_line_chars: longest line accepted (default
            :data:`~rnnkit.data.limits.MAX_LINE_CHARS`, 1,048,576); a longer one is a
            ``DataError`` naming its line.

    Returns:
        ``[(line_number, line), ...]``, lines without their newline; lines holding only
        whitespace are skipped.

    >>> import tempfile, pathlib
    >>> with tempfile.TemporaryDirectory() as d:
    ...     p = pathlib.Path(d) / "c.txt"
    ...     _ = p.write_text("a b\\n\\n  \\nc\\n")
    ...     read_numbered_lines(p)
    [(1, 'a b'), (4, 'c')]
    """
    limit = MAX_LINE_CHARS.value(max_line_chars)
    lines = checked_lines(read_text(path, max_line_chars=limit), path, limit)
    return [(number, line) for number, line in lines if line.strip()]


def checked_lines(
    text: str, path: PathLikeStr | None = None, max_line_chars: int | None = None
) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` of every line of ``text``, blank ones included, refusing a
    line over ``max_line_chars`` (:data:`~rnnkit.data.limits.MAX_LINE_CHARS`).

    A line of a line-oriented format is one example or token; one of millions of
    characters is a corrupt or hostile file, and would become a sequence that no model
    can hold in memory.

    >>> list(checked_lines("ab\\n\\nabcdef", "x.tsv", max_line_chars=4))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    rnnkit.errors.DataError: x.tsv:3: line of 6 characters, over the limit of 4 characters ...
    """
    limit = MAX_LINE_CHARS.value(max_line_chars)
    lines = text.split("\n")  # not splitlines(): see _numbered_lines
    check = len(text) > limit  # a text shorter than the limit cannot hold a long line
    for number, line in enumerate(lines, start=1):
        if check and len(line) > limit:
            found = f"line of {len(line):,} characters"
            raise DataError(MAX_LINE_CHARS.exceeded(found, limit), path, number)
        yield number, line


def read_lines(path: PathLikeStr, *, max_line_chars: int | None = None) -> list[str]:
    """The non-blank lines of a UTF-8 file (sentence-per-line data), without newlines.

    >>> import tempfile, pathlib
    >>> with tempfile.TemporaryDirectory() as d:
    ...     p = pathlib.Path(d) / "c.txt"
    ...     _ = p.write_text("first line\\n\\nsecond\\n")
    ...     read_lines(p)
    ['first line', 'second']
    """
    text = read_text(path)
    return [line for _, line in checked_lines(text, path, max_line_chars) if line.strip()]


def _numbered_lines(text: str) -> Iterator[tuple[int, str]]:
    # split("\n"), not splitlines(): the latter also breaks on \x0b, \x1c, \u2028 ... which
    # would put line numbers out of step with what an editor shows.
    for number, line in enumerate(text.split("\n"), start=1):
        if line.strip():
            yield number, line


def encode_text(
    text: str, vocab: Vocabulary, *, eos_per_line: bool = False, dtype: type = np.int32
) -> np.ndarray:
    """Encode a whole text to one id stream.

    Args:
        text: the corpus.
        vocab: the vocabulary (its ``unit`` decides characters or words).
        eos_per_line: if true, every non-blank line becomes its tokens followed by ``</s>``
            (id 3) and blank lines vanish; for char unit the newline itself is replaced by
            ``</s>``. Use it for sentence-per-line word corpora (PTB style), where splitting on
            whitespace would otherwise erase the sentence ends. If false the text is encoded
            as is (for char unit, ``"\\n"`` is an ordinary character).
        dtype: integer dtype of the result.

    Returns:
        ``(N,)`` ids.

    >>> v = Vocabulary(["a", "b"], unit="word")
    >>> encode_text("a b\\n\\nb c\\n", v, eos_per_line=True)
    array([4, 5, 3, 5, 1, 3], dtype=int32)
    >>> encode_text("ab\\n\\nb\\n", Vocabulary(["a", "b"]), eos_per_line=True)
    array([4, 5, 3, 5, 3], dtype=int32)
    """
    if not eos_per_line:
        return vocab.encode_array(text, dtype=dtype)
    if vocab.unit == "char":
        kept = "\n".join(line for _, line in _numbered_lines(text))
        if not kept:
            return np.zeros(0, dtype=dtype)
        return vocab._encode_chars(kept + "\n", dtype=dtype, newline_id=EOS_ID)
    stoi = vocab.stoi

    def ids() -> Iterator[int]:
        for _, line in _numbered_lines(text):
            for word in line.split():
                yield stoi.get(word, UNK_ID)
            yield EOS_ID

    return np.fromiter(ids(), dtype=dtype)


def encode_corpus(
    path: PathLikeStr, vocab: Vocabulary, *, eos_per_line: bool = False, dtype: type = np.int32
) -> np.ndarray:
    """Read a UTF-8 file (:func:`read_text`) and encode it to one id stream
    (:func:`encode_text`).

    Takes a path only (text goes to :func:`encode_text`): a ``str`` is never guessed to be
    either a file name or a corpus. For char unit the file goes through numpy on code points
    in bounded chunks, so memory is about the text plus 4 bytes per character of ``int32``
    ids.

    >>> import tempfile, pathlib
    >>> with tempfile.TemporaryDirectory() as d:
    ...     p = pathlib.Path(d) / "c.txt"
    ...     _ = p.write_text("abba")
    ...     encode_corpus(p, Vocabulary(["a", "b"]))
    array([4, 5, 5, 4], dtype=int32)
    """
    return encode_text(read_text(path), vocab, eos_per_line=eos_per_line, dtype=dtype)


def build_vocab_from_file(
    path: PathLikeStr,
    unit: str = "char",
    min_freq: int = 1,
    max_size: int | None = None,
    *,
    max_vocab: int | None = None,
) -> Vocabulary:
    """Build a vocabulary from a UTF-8 file's token counts.

    Characters are counted with one ``numpy.bincount`` over code points per chunk, words with
    a ``Counter`` over ``str.split()``.

    Args:
        path: the corpus file.
        unit: ``"char"`` or ``"word"``.
        min_freq: smallest count kept.
        max_size: largest vocabulary size, specials included (the rarest tokens go).
        max_vocab: without ``max_size``, more distinct tokens than this is a ``DataError``
            naming the file (default 1,000,000; see :mod:`rnnkit.data.limits`).

    >>> import tempfile, pathlib
    >>> with tempfile.TemporaryDirectory() as d:
    ...     p = pathlib.Path(d) / "c.txt"
    ...     _ = p.write_text("the cat the end", encoding="utf-8")
    ...     build_vocab_from_file(p, unit="word").itos[4:]
    ['the', 'cat', 'end']
    """
    text = read_text(path)
    return Vocabulary.from_counts(
        count_tokens(text, unit), unit, min_freq, max_size, max_vocab=max_vocab, source=path
    )
