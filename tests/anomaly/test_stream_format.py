"""The streamed-events line format: the three forms, and bad lines named by file and line."""

from __future__ import annotations

import pytest

from rnnkit.anomaly.follow import OVERLONG
from rnnkit.anomaly.stream_format import StreamItem, parse_stream_line
from rnnkit.errors import DataError


def test_parse_forms() -> None:
    assert parse_stream_line(b'{"session": "a", "event": "x"}') == StreamItem("a", ("x",))
    assert parse_stream_line('{"session": 3, "events": ["x", "y"]}') == StreamItem("3", ("x", "y"))
    assert parse_stream_line('{"session": "a", "end": true}') == StreamItem("a", (), True)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "invalid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"session": "a", "event": "x", "lable": 1}', "unknown key 'lable'"),
        ('{"event": "x"}', "'session' must be"),
        ('{"session": true, "event": "x"}', "'session' must be"),
        ('{"session": "a", "event": ""}', "non-empty string"),
        ('{"session": "a", "event": 5}', "non-empty string"),
        ('{"session": "a", "events": "x"}', "must be a list"),
        ('{"session": "a", "event": "x", "events": ["y"]}', "both"),
        ('{"session": "a", "event": "x", "end": 1}', "'end' must be true or false"),
        ('{"session": "a", "events": []}', 'no "event"'),
    ],
)
def test_bad_lines_name_file_and_line(line: str, message: str) -> None:
    with pytest.raises(DataError, match=message) as info:
        parse_stream_line(line, "events.jsonl", 12)
    assert str(info.value).startswith("events.jsonl:12: ")


def test_bad_bytes_are_data_errors() -> None:
    with pytest.raises(DataError) as info:
        parse_stream_line(b'{"session": "\xff"}', "f", 1)
    assert str(info.value) == "f:1: invalid UTF-8 at byte 14 of the line (byte 0xff)"
    with pytest.raises(DataError, match="line too long, over the limit"):
        parse_stream_line(OVERLONG, "f", 2)
