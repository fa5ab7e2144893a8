"""Fuzz the strace and log readers (``rnnkit sessions --from strace|log``).

Both skip what they cannot parse and count it, so any input gives sessions or a one-line
``DataError`` ("not strace output", "no line matches") naming the file.
"""

from __future__ import annotations

from pathlib import Path

from fuzzkit import FUZZ, file_bytes, huge_line, line_text, outcome, write
from hypothesis import given
from hypothesis import strategies as st

from rnnkit.data.events import Session
from rnnkit.data.logs import sessions_from_logs
from rnnkit.data.strace import parse_strace
from rnnkit.errors import RnnkitError

_NAMES = st.sampled_from(["openat", "read", "clone", "exit_group", "x", "_", "9a"])
_RETURNS = st.sampled_from(["0", "3", "-1 ENOENT (No such file)", "?", "0x7f", "-1", "", "= 5"])
_PREFIXES = st.sampled_from(["", "101  ", "[pid 102] ", "12:00:01.5 ", "[00007f] ", "  "])


@st.composite
def strace_line(draw: st.DrawFn) -> str:
    """A line shaped like strace's, with random parts."""
    prefix, name = draw(_PREFIXES), draw(_NAMES)
    args = draw(line_text).replace("\n", "")
    kind = draw(st.integers(0, 6))
    if kind == 0:
        return f"{prefix}{name}({args}) = {draw(_RETURNS)}"
    if kind == 1:
        return f"{prefix}{name}({args} <unfinished ...>"
    if kind == 2:
        return f"{prefix}<... {name} resumed>{args}) = {draw(_RETURNS)}"
    if kind == 3:
        return f"{prefix}--- SIG{draw(st.sampled_from(['CHLD', 'SEGV', '']))} {{{args}}} ---"
    if kind == 4:
        return f"{prefix}+++ {draw(st.sampled_from(['exited with 0', 'killed by SIGKILL']))} +++"
    if kind == 5:
        return f"strace: Process {draw(st.integers(0, 10**30))} attached"
    return args


strace_text = st.lists(strace_line(), max_size=15).map("\n".join)


@FUZZ
@given(
    data=file_bytes(strace_text),
    name=st.sampled_from(["trace.txt", "trace.1234"]),
    per=st.sampled_from(["pid", "file"]),
    with_result=st.booleans(),
)
def test_strace_file_parses_or_names_the_file(
    tmp_path: Path, data: bytes, name: str, per: str, with_result: bool
):
    path = write(tmp_path, name, data)
    result = outcome(
        lambda: parse_strace(path, per=per, with_result=with_result, label=0),  # type: ignore[arg-type]
        names=path,
    )
    if isinstance(result, RnnkitError):
        return
    sessions, stats = result
    assert sessions and all(isinstance(s, Session) and s.events for s in sessions)
    assert stats.events == sum(len(s.events) for s in sessions) or per == "file"
    assert 0 <= stats.skipped < stats.lines


@FUZZ
@given(lines=st.lists(st.one_of(strace_line(), huge_line(max_chars=3 * 2**20)), max_size=4))
def test_strace_lines_with_huge_ones(lines: list[str]):
    outcome(lambda: parse_strace(lines), names=None)


_PATTERNS = [r"req=(\w+)", r"conn (?P<session>\d+)", r"(\S+)", r"()", r"(.*)"]


@FUZZ
@given(
    data=file_bytes(st.lists(line_text, max_size=12).map("\n".join)),
    pattern=st.sampled_from(_PATTERNS),
)
def test_log_file_gives_sessions_or_names_the_file(tmp_path: Path, data: bytes, pattern: str):
    path = write(tmp_path, "app.log", data)
    result = outcome(lambda: sessions_from_logs(path, pattern), names=path)
    if not isinstance(result, RnnkitError):
        sessions, stats = result
        assert sessions and all(s.events for s in sessions)
        assert stats.used == sum(len(s.events) for s in sessions)


@FUZZ
@given(line=huge_line(max_chars=3 * 2**20))
def test_huge_log_line_is_skipped_or_mined(tmp_path: Path, line: str):
    path = write(tmp_path, "big.log", "req=a start\n" + line + "\nreq=a end\n")
    result = outcome(lambda: sessions_from_logs(path, r"req=(\w+)"), names=path)
    assert not isinstance(result, RnnkitError)
