"""The events JSON-lines format: reading, validating, streaming and atomic writing."""

from __future__ import annotations

import io
import json
import os
import stat
from pathlib import Path

import pytest

from rnnkit.data import events as events_module
from rnnkit.data.events import (
    Session,
    iter_sessions,
    parse_session,
    read_sessions,
    write_sessions,
)
from rnnkit.errors import DataError


def write_lines(tmp_path: Path, *lines: str, name: str = "s.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def read_error(path: Path) -> str:
    with pytest.raises(DataError) as info:
        read_sessions(path)
    return str(info.value)


def test_reads_sessions_with_and_without_labels(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path,
        '{"session": "a", "events": ["openat:ok", "read:ok"], "label": 0}',
        "",  # blank lines are allowed between records
        '{"session": 42, "events": ["x"], "label": null}',
        '{"label": 1, "events": ["é", "y z"], "session": "b"}',
    )
    assert read_sessions(path) == [
        Session("a", ["openat:ok", "read:ok"], 0),
        Session("42", ["x"], None),
        Session("b", ["é", "y z"], 1),
    ]


def test_write_then_read_round_trips(tmp_path: Path) -> None:
    sessions = [Session("p:1", ["a", "b", "a"], 1), Session("p:2", ["c"]), Session("ü", ["\n"], 0)]
    path = tmp_path / "out.jsonl"
    write_sessions(path, sessions)
    assert read_sessions(path) == sessions
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines[1] == '{"session": "p:2", "events": ["c"]}'  # unlabelled: no label key
    assert json.loads(lines[2]) == {"session": "ü", "events": ["\n"], "label": 0}


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"session": "a", "events": ["x"]', "invalid JSON: Expecting ',' delimiter (column 33)"),
        ("not json", "invalid JSON: Expecting value (column 1)"),
        ('["a", ["x"]]', "expected a JSON object, got a list"),
        ('"a"', "expected a JSON object, got a string"),
        ('{"events": ["x"]}', "missing key 'session'"),
        ('{"session": "a"}', "session 'a': missing key 'events'"),
        (
            '{"session": 1.5, "events": ["x"]}',
            "'session' must be a string or an integer, got a number",
        ),
        (
            '{"session": true, "events": ["x"]}',
            "'session' must be a string or an integer, got a boolean",
        ),
        ('{"session": "", "events": ["x"]}', "'session' is an empty string"),
        ('{"session": "a", "events": "x y"}', "session 'a': 'events' must be a list, got a string"),
        ('{"session": "a", "events": []}', "session 'a' has no events"),
        (
            '{"session": "a", "events": ["x", 3]}',
            "session 'a': events[1] is a number, expected a string (quote numeric events)",
        ),
        ('{"session": "a", "events": ["x", null]}', "session 'a': events[1] is null, expected"),
        ('{"session": "a", "events": ["x", ""]}', "session 'a': events[1] is an empty string"),
        (
            '{"session": "a", "events": ["x"], "label": 2}',
            "session 'a': 'label' must be 0 or 1, got 2",
        ),
        (
            '{"session": "a", "events": ["x"], "label": true}',
            "session 'a': 'label' must be 0 or 1, got true",
        ),
        (
            '{"session": "a", "events": ["x"], "label": "1"}',
            "session 'a': 'label' must be 0 or 1, got \"1\"",
        ),
        ('{"session": "a", "events": ["x"], "lable": 1}', "unknown key 'lable' (expected session"),
        (
            '{"session": "a", "session": "b", "events": ["x"]}',
            "invalid JSON: key 'session' appears twice",
        ),
    ],
)
def test_bad_line_is_reported_with_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    path = write_lines(tmp_path, '{"session": "ok", "events": ["x"]}', line)
    assert read_error(path).startswith(f"{path}:2: {message}")


@pytest.mark.parametrize("line", ["open read close", "s1,open,read", '["open", "read"]', "42"])
def test_a_line_of_another_format_is_told_what_a_session_line_is(tmp_path: Path, line: str):
    # "invalid JSON: Expecting value (column 1)" alone did not say what the file should hold
    error = read_error(write_lines(tmp_path, line))
    assert error.endswith(
        'each line is one session, a JSON object such as {"session": "s1", "events": '
        '["open", "read"]} (rnnkit sessions writes them from strace output or log files)'
    )
    # a broken object is told what is broken, no more
    broken = read_error(write_lines(tmp_path, '{"session": "a", "events": ["x"]'))
    assert broken.endswith("Expecting ',' delimiter (column 33)")


def test_duplicate_session_id_names_both_lines(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path,
        '{"session": "a", "events": ["x"]}',
        '{"session": "b", "events": ["x"]}',
        '{"session": "a", "events": ["y"]}',
    )
    assert read_error(path) == f"{path}:3: duplicate session id 'a' (first at line 1)"


def test_integer_and_string_ids_collide(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path, '{"session": 7, "events": ["x"]}', '{"session": "7", "events": ["x"]}'
    )
    assert read_error(path) == f"{path}:2: duplicate session id '7' (first at line 1)"


def test_empty_file_is_an_error(tmp_path: Path) -> None:
    path = write_lines(tmp_path, "", "  ")
    assert read_error(path) == f"{path}: no sessions (the file is empty)"


def test_deep_nesting_is_reported_not_crashed(tmp_path: Path) -> None:
    path = write_lines(tmp_path, "[" * 200_000 + "]" * 200_000)
    assert read_error(path).startswith(f"{path}:1: JSON nested too deeply, over the limit of 100")


def test_huge_integer_is_reported(tmp_path: Path) -> None:
    path = write_lines(tmp_path, '{"session": ' + "9" * 5000 + ', "events": ["x"]}')
    assert read_error(path) == f"{path}:1: invalid JSON: an integer with too many digits"


def test_overlong_line_is_refused_without_reading_it_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(events_module, "MAX_LINE_BYTES", 2**20)  # 1 MiB keeps the test quick
    path = write_lines(
        tmp_path,
        '{"session": "a", "events": ["x"]}',
        '{"session": "b", "events": ["' + "x" * 2**20 + '"]}',
    )
    assert read_error(path) == (
        f"{path}:2: line too long, over the limit of 1,048,576 bytes (raise it with "
        "RNNKIT_MAX_JSON_LINE_BYTES=N, or max_json_line_bytes=N in Python)"
    )


@pytest.mark.parametrize(
    ("head", "end", "line"),
    [
        (b"", b"\n", 2),
        (b"", b"\r\n", 1502),  # 1,500 lines (over 8 KB) before the bad one
        (b"\xef\xbb\xbf", b"\r\n", 1502),  # the mark is dropped, and line 1 still counts
    ],
)
def test_invalid_utf8_is_reported_with_line(tmp_path: Path, head, end, line) -> None:
    path = tmp_path / "s.jsonl"
    good = [b'{"session": "s%d", "events": ["x"]}' % i for i in range(line - 1)]
    path.write_bytes(head + end.join([*good, b'{"session": "\xff", "events": ["x"]}', b""]))
    assert read_error(path) == f"{path}:{line}: invalid UTF-8 at byte 14 of the line (byte 0xff)"
    path.write_bytes(head + end.join([*good, b""]))
    assert len(read_sessions(path)) == line - 1


@pytest.mark.parametrize(
    ("head", "end", "newline"),
    [(b"", b"\n", None), (b"", b"\r\n", None), (b"\xef\xbb\xbf", b"\r", ""), (b"", b"\n", "")],
)
def test_invalid_utf8_in_a_text_stream_names_the_same_line(
    tmp_path: Path, head: bytes, end: bytes, newline: str | None
) -> None:
    # The oracle: the binary reader's error. A text stream decodes 8 KB ahead; its own
    # UnicodeDecodeError escaped, raw, while line ~1,446 of 1,502 was being read.
    path = tmp_path / "s.jsonl"
    good = [b'{"session": "s%d", "events": ["x"]}' % i for i in range(1501)]
    path.write_bytes(head + end.join([*good, b'{"session": "\xff", "events": ["x"]}', b""]))
    expected = f"{path}:1502: invalid UTF-8 at byte 14 of the line (byte 0xff)"
    if end != b"\r":  # the binary reader ends JSON lines at \n only; a text stream at \r too
        assert read_error(path) == expected
    with open(path, encoding="utf-8", newline=newline) as text:
        with pytest.raises(DataError) as info:
            list(iter_sessions(text))
        assert str(info.value) == expected
        # the bytes were read again from the buffer, which is put back where it was
        assert text.buffer.tell() == path.stat().st_size


def test_invalid_utf8_in_a_text_stream_counts_from_where_it_was_handed_in(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.jsonl"
    # the bad byte beyond the first 8 KB: the caller's own readline decodes only those
    lines = b'{"session": "a", "events": ["x"]}\n' * 300
    path.write_bytes(b"# a header line\n" + lines + b"\xc3(\n")
    with open(path, encoding="utf-8") as text:
        text.readline()  # the caller's own header
        with pytest.raises(DataError, match=r"s\.jsonl:301: invalid UTF-8 at byte 1 of the line"):
            list(iter_sessions(text, unique=False))


def test_invalid_utf8_in_a_text_pipe_names_the_line_being_read() -> None:
    # A pipe cannot be read again: the error says what is true, the line being read
    # (the bad byte is on it or a later one) and the byte.
    read_end, write_end = os.pipe()
    with open(write_end, "wb") as sink:
        sink.write(b'{"session": "a", "events": ["x"]}\n' + b"\xff\n")
    with open(read_end, encoding="utf-8") as text, pytest.raises(DataError) as info:
        list(iter_sessions(text, "live"))
    assert str(info.value) == (
        "live:1: invalid UTF-8 (byte 0xff) on this line or a later one (a text stream "
        "decodes ahead; open the file in binary mode for the exact line)"
    )


def test_byte_order_mark_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"session": "a", "events": ["x"]}\n')
    assert read_sessions(path) == [Session("a", ["x"])]


def test_missing_file_raises_oserror(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_sessions(tmp_path / "absent.jsonl")


def test_iter_sessions_streams_text_with_line_numbers() -> None:
    stream = io.StringIO('{"session": "a", "events": ["x"]}\n\n{"session": "b", "events": ["y"]}')
    got = iter_sessions(stream, "live")
    assert next(got) == (1, Session("a", ["x"]))
    assert next(got) == (3, Session("b", ["y"]))  # last line without newline still counts
    assert list(got) == []


def test_iter_sessions_reports_bad_line_after_yielding_good_ones() -> None:
    stream = io.BytesIO(b'{"session": "a", "events": ["x"]}\n{"session": "b"}\n')
    got = iter_sessions(stream, "live")
    assert next(got)[1].session == "a"
    with pytest.raises(DataError, match=r"^live:2: session 'b': missing key 'events'$"):
        next(got)


def test_iter_sessions_can_allow_repeated_ids() -> None:
    stream = io.StringIO('{"session": "a", "events": ["x"]}\n{"session": "a", "events": ["y"]}\n')
    assert [s.events for _, s in iter_sessions(stream, unique=False)] == [["x"], ["y"]]


def test_parse_session_accepts_one_point_zero_label_as_int() -> None:
    session = parse_session('{"session": "a", "events": ["x"], "label": 1.0}')
    assert session.label == 1
    assert isinstance(session.label, int)


def test_write_refuses_invalid_sessions_and_leaves_file_untouched(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    path.write_text("old\n")
    with pytest.raises(DataError, match=r"out\.jsonl: cannot write session #1: session 'b' has no"):
        write_sessions(path, [Session("a", ["x"]), Session("b", [])])
    with pytest.raises(DataError, match=r"out\.jsonl: duplicate session id 'a'$"):
        write_sessions(path, [Session("a", ["x"]), Session("a", ["y"])])
    with pytest.raises(DataError, match=r"'label' must be 0 or 1, got 5"):
        write_sessions(path, [Session("a", ["x"], 5)])
    assert path.read_text() == "old\n"
    assert os.listdir(tmp_path) == ["out.jsonl"]


def test_write_is_atomic_when_interrupted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "out.jsonl"
    path.write_text("old\n")

    def fail(src: str, dst: str) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(KeyboardInterrupt):
        write_sessions(path, [Session("a", ["x"])])
    assert path.read_text() == "old\n"
    assert os.listdir(tmp_path) == ["out.jsonl"]  # no temp file left behind


def test_written_file_gets_ordinary_permissions(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    old_umask = os.umask(0o022)
    try:
        write_sessions(path, [Session("a", ["x"])])
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_params_round_trip_and_stay_out_of_the_repr(tmp_path: Path) -> None:
    session = Session("a", ["x", "y"], 0, params=[[0.0, 12.5], [0.25, None]])
    path = tmp_path / "p.jsonl"
    write_sessions(path, [session, Session("b", ["x"])])
    back = read_sessions(path)
    assert back[0].params == [[0.0, 12.5], [0.25, None]] and back[1].params is None
    assert back == [session, Session("b", ["x"])]
    assert "params" not in repr(back[1]) and "params=[[0.0, 12.5]" in repr(back[0])
    assert json.loads(path.read_text().splitlines()[0])["params"] == [[0.0, 12.5], [0.25, None]]


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ('{"a": 1}', "'params' must be a list, got an object"),
        ("[[1]]", "'params' has 1 entries for 2 events"),
        ("[[1], 2]", "params[1] is a number, expected a list of numbers"),
        ('[[1], ["7"]]', "params[1][0] is a string, expected a number or null"),
        ("[[true], []]", "params[0][0] is a boolean"),
        ("[[" + "9" * 400 + "], []]", "params[0][0] is not finite"),
    ],
)
def test_bad_params_name_the_line(tmp_path: Path, params: str, message: str) -> None:
    path = write_lines(
        tmp_path,
        '{"session": "ok", "events": ["x"]}',
        '{"session": "s", "events": ["x", "y"], "params": ' + params + "}",
    )
    error = read_error(path)
    assert error.startswith(f"{path}:2: session 's': ") and message in error
