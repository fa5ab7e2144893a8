"""Shared parts of the fuzz tests: settings, input strategies, and the outcome check.

The contract every reader is held to: given any input it returns a
result or raises an :class:`~rnnkit.errors.RnnkitError` whose message is one line naming
the file; any other exception, a hang or unbounded memory is a bug.

``RNNKIT_FUZZ_EXAMPLES=N`` runs N examples per test (a random seed each) instead of the small
deterministic CI run; ``RNNKIT_FUZZ_SEED`` fixes the seed of such a long run.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from rnnkit.errors import RnnkitError

_LONG = os.environ.get("RNNKIT_FUZZ_EXAMPLES")
#: A long run (RNNKIT_FUZZ_EXAMPLES set): every example takes every path
LONG_RUN = _LONG is not None

#: Examples per test: small and derandomized in CI (fast, never flaky), many and random
#: in a long run.
EXAMPLES = int(_LONG) if _LONG else 60

FUZZ = settings(
    max_examples=EXAMPLES,
    # Hangs are caught by time_limit (a real interrupt); hypothesis' deadline only
    # measures after the fact and would flake on a loaded machine.
    deadline=None,
    derandomize=_LONG is None,
    database=None,  # no .hypothesis/ folder in the working tree
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.function_scoped_fixture,
        HealthCheck.data_too_large,
    ],
)

#: Seconds one example may take before it counts as a hang.
EXAMPLE_SECONDS = 20.0


class Hang(BaseException):
    """Raised into a reader that ran past EXAMPLE_SECONDS (BaseException: not swallowed)."""


@contextlib.contextmanager
def time_limit(seconds: float = EXAMPLE_SECONDS) -> Iterator[None]:
    """Interrupt the block with :class:`Hang` after ``seconds`` (main thread, Unix)."""

    def on_alarm(signum: int, frame: Any) -> None:
        raise Hang(f"no answer after {seconds} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def outcome(call: Callable[[], Any], *, names: str | os.PathLike[str] | None) -> Any:
    """Run ``call``: return its result, or the ``RnnkitError`` it raised, checked.

    Args:
        call: the reader on one input.
        names: what an error message must name (the file), or None.

    Any other exception propagates and fails the test, with the input that caused it.
    """
    with time_limit():
        try:
            return call()
        except RnnkitError as exc:
            check_message(exc, names)
            return exc


def check_message(exc: BaseException, names: str | os.PathLike[str] | None) -> None:
    message = str(exc)
    assert message.strip(), f"{type(exc).__name__} with an empty message"
    assert "\n" not in message and "\r" not in message, f"multi-line message: {message!r}"
    assert "Traceback" not in message, message
    if names is not None:
        assert str(names) in message, f"message does not name {names}: {message!r}"


# ---- inputs ----------------------------------------------------------------------------

#: Characters that break naive line readers: tab, newlines, NUL, BOM, NEL, line/paragraph
#: separators, a lone CR, replacement character, an astral character.
SPECIAL_CHARS = '\t\n\r\x00\ufeff\x85\u2028\u2029\x0b\x0c\x1c\ufffd\U0001f600 #-.:[]{}"\\'

_chars = st.one_of(
    st.characters(codec="utf-8"),  # any encodable code point (no lone surrogates)
    st.sampled_from(SPECIAL_CHARS),
)
any_text = st.text(_chars, max_size=300)
line_text = st.text(st.characters(codec="utf-8", exclude_characters="\n"), max_size=40)


@st.composite
def huge_line(draw: st.DrawFn, max_chars: int = 3 * 2**20) -> str:
    """One line of a repeated piece, up to ``max_chars`` characters (cheap to build)."""
    piece = draw(st.text(_chars, min_size=1, max_size=8))
    return piece * draw(st.integers(1, max(1, max_chars // len(piece))))


def tabbed_lines(fields: int) -> st.SearchStrategy[str]:
    """Lines of roughly ``fields`` tab-separated fields, with blank lines and stray tabs."""
    field = st.one_of(line_text.map(lambda s: s.replace("\t", "")), st.sampled_from(["", " "]))
    line = st.lists(field, min_size=0, max_size=fields + 2).map("\t".join)
    return st.lists(st.one_of(line, st.just("")), max_size=12).map("\n".join)


def file_bytes(structured: st.SearchStrategy[str]) -> st.SearchStrategy[bytes]:
    """Raw bytes, random text, or ``structured`` text, optionally with a BOM / CRLF."""
    text = st.one_of(any_text, structured)
    encoded = st.tuples(text, st.booleans(), st.booleans()).map(
        lambda t: ("\ufeff" if t[1] else "") + (t[0].replace("\n", "\r\n") if t[2] else t[0])
    )
    return st.one_of(
        st.binary(max_size=300),
        encoded.map(lambda s: s.encode("utf-8")),
        # Valid text with one broken byte sequence spliced in.
        st.tuples(structured, st.binary(min_size=1, max_size=4)).map(
            lambda t: t[0].encode("utf-8") + b"\xff" + t[1] + b"\n" + t[0].encode("utf-8")
        ),
    )


def write(tmp: Path, name: str, data: bytes | str) -> Path:
    """Write one fuzz input file (replacing the previous example's)."""
    path = tmp / name
    if isinstance(data, str):
        data = data.encode("utf-8")
    path.write_bytes(data)
    return path
