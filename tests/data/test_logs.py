"""Log lines to sessions: session ids by regex, events as Drain3 templates."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

from rnnkit.data import logs as logs_module
from rnnkit.data.events import Session
from rnnkit.data.logs import LogSessionizer, sessions_from_logs
from rnnkit.errors import ConfigError, DataError

# HDFS-style lines (the Loghub benchmark's classic): a block id is the session.
HDFS = "".join(
    line + "\n"
    for line in [
        "081109 203518 143 INFO dfs.DataNode$DataXceiver: Receiving block "
        "blk_-1608999687919862906 src: /10.250.19.102:54106 dest: /10.250.19.102:50010",
        "081109 203518 35 INFO dfs.FSNamesystem: BLOCK* NameSystem.allocateBlock: "
        "/mnt/hadoop/job_200811092030_0001/job.jar. blk_-1608999687919862906",
        "081109 203519 143 INFO dfs.DataNode$DataXceiver: Receiving block "
        "blk_7503483334202473044 src: /10.251.215.16:55695 dest: /10.251.215.16:50010",
        "081109 203519 145 INFO dfs.DataNode$PacketResponder: PacketResponder 1 for block "
        "blk_-1608999687919862906 terminating",
        "081109 203520 142 INFO dfs.DataNode: heartbeat sent to namenode",
        "081109 203521 145 INFO dfs.DataNode$PacketResponder: PacketResponder 0 for block "
        "blk_7503483334202473044 terminating",
        "081109 203521 19 WARN dfs.DataNode$DataXceiver: writeBlock blk_7503483334202473044 "
        "received exception java.io.IOException: Connection reset by peer",
    ]
)

RECEIVING = (
    "<NUM> <NUM> <NUM> INFO dfs.DataNode$DataXceiver: Receiving block <SESSION> "
    "src: /<IP> dest: /<IP>"
)
RESPONDER = (
    "<NUM> <NUM> <NUM> INFO dfs.DataNode$PacketResponder: PacketResponder <NUM> "
    "for block <SESSION> terminating"
)


def test_hdfs_block_sessions(tmp_path: Path) -> None:
    path = tmp_path / "hdfs.log"
    path.write_text(HDFS)
    sessions, stats = sessions_from_logs(path, r"(?P<session>blk_-?\d+)", label=0)
    assert sessions == [
        Session(
            "blk_-1608999687919862906",
            [
                RECEIVING,
                "<NUM> <NUM> <NUM> INFO dfs.FSNamesystem: BLOCK* NameSystem.allocateBlock: "
                "/mnt/hadoop/job_200811092030_0001/job.jar. <SESSION>",
                RESPONDER,
            ],
            0,
        ),
        Session(
            "blk_7503483334202473044",
            [
                RECEIVING,
                RESPONDER,
                "<NUM> <NUM> <NUM> WARN dfs.DataNode$DataXceiver: writeBlock <SESSION> received "
                "exception java.io.IOException: Connection reset by peer",
            ],
            0,
        ),
    ]
    assert (stats.lines, stats.used, stats.no_session) == (7, 6, 1)
    assert (stats.templates, stats.sessions, stats.too_long) == (4, 2, 0)


def test_templates_are_final_not_as_first_mined() -> None:
    # After the first line alone Drain's template is the line itself; the event of that
    # line must still be the template it ends in.
    sessions, stats = sessions_from_logs(
        ["u1: login alice ok", "u2: login bob ok", "u1: logout"], r"^(\w+):", masks=()
    )
    assert [s.events for s in sessions] == [
        ["<SESSION>: login <*> ok", "<SESSION>: logout"],
        ["<SESSION>: login <*> ok"],
    ]
    assert stats.templates == 2


def test_session_id_never_splits_a_template() -> None:
    # Alphabetic ids are not numbers: without masking them each would be its own template.
    sessions, _ = sessions_from_logs(
        ["session=alpha start", "session=beta start"], r"session=(\w+)", masks=()
    )
    assert [s.events for s in sessions] == [["session=<SESSION> start"]] * 2


def test_first_group_is_used_when_no_group_is_named() -> None:
    sessions, _ = sessions_from_logs(["[7] (x) open"], r"\[(\d+)\] \((\w)\)")
    assert sessions[0].session == "7"


def test_named_group_wins_over_first_group() -> None:
    sessions, _ = sessions_from_logs(["host a req 9 open"], r"host (\w) req (?P<session>\d+)")
    assert sessions[0].session == "9"


def test_lines_without_session_are_skipped_and_counted() -> None:
    sessionizer = LogSessionizer(r"id=(\d*)")
    sessionizer.add_lines(["id=1 a", "nothing here", "id= empty id", "", "id=1 b"])
    assert sessionizer.stats.no_session == 3  # no match, empty group, blank line
    assert [s.session for s in sessionizer.sessions()] == ["1"]
    assert sessionizer.stats.used == 2


def test_several_files_share_sessions_and_templates(tmp_path: Path) -> None:
    (tmp_path / "app.log.1").write_text("req=a start job 1\nreq=b start job 2\n")
    (tmp_path / "app.log").write_text("req=a start job 3\nreq=a done\n")
    sessionizer = LogSessionizer(r"req=(\w+)")
    sessionizer.add_file(tmp_path / "app.log.1")
    sessionizer.add_file(tmp_path / "app.log")
    assert [(s.session, s.events) for s in sessionizer.sessions(label=1)] == [
        ("a", ["req=<SESSION> start job <NUM>"] * 2 + ["req=<SESSION> done"]),
        ("b", ["req=<SESSION> start job <NUM>"]),
    ]
    assert sessionizer.stats.lines == 4


def test_invalid_utf8_is_replaced_not_fatal(tmp_path: Path) -> None:
    path = tmp_path / "a.log"
    path.write_bytes(b"req=a caf\xe9 open\n")
    sessions, _ = sessions_from_logs(path, r"req=(\w+)")
    assert sessions[0].events == ["req=<SESSION> caf\ufffd open"]


def test_overlong_lines_are_skipped_and_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(logs_module, "MAX_LINE_CHARS", 50)
    path = tmp_path / "a.log"
    path.write_text("req=a short\nreq=b " + "x" * 200 + "\nreq=c also short\n")
    sessions, stats = sessions_from_logs(path, r"req=(\w+)")
    assert [s.session for s in sessions] == ["a", "c"]
    assert (stats.lines, stats.too_long) == (3, 1)


def test_no_line_with_a_session_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "a.log"
    path.write_text("one\ntwo\n")
    with pytest.raises(DataError) as info:
        sessions_from_logs(path, r"req=(\w+)")
    assert (
        str(info.value)
        == f"{path}: no line matches the session pattern 'req=(\\w+)' (2 lines read)"
    )


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        (
            r"req=(\w+",
            r"--session-pattern 'req=(\w+' is not a valid regex: missing ), unterminated",
        ),
    ],
)
def test_bad_session_pattern_is_a_config_error(pattern: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        LogSessionizer(pattern, option_names=True)  # as `rnnkit sessions` makes it
    assert str(info.value).startswith(message)
    with pytest.raises(ConfigError) as info:
        LogSessionizer(pattern)  # from Python: the argument
    assert str(info.value).startswith(f"session_pattern={pattern!r} is not a valid regex: ")


def test_bad_options_are_config_errors() -> None:
    with pytest.raises(ConfigError, match=r"similarity must be in \[0, 1\], got 1.5"):
        LogSessionizer("(x)", similarity=1.5)
    with pytest.raises(ConfigError, match="depth must be at least 3, got 2"):
        LogSessionizer("(x)", depth=2)
    with pytest.raises(ConfigError, match=r"mask '\(' is not a valid regex"):
        LogSessionizer("(x)", masks=[("(", "BAD")])


def test_mining_is_quiet(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)  # a user's INFO logging must not show drain3's chatter
    sessions_from_logs(["a=1 x", "a=2 y"], r"a=(\d)")
    assert capsys.readouterr() == ("", "")
    assert [r for r in caplog.records if r.name.startswith("drain3")] == []


def test_a_pattern_without_a_group_takes_the_whole_match() -> None:
    sessions, _ = sessions_from_logs(["got blk_-42 ok", "sent blk_7"], r"blk_-?\d+", masks=())
    assert [(s.session, s.events) for s in sessions] == [
        ("blk_-42", ["got <SESSION> ok"]),
        ("blk_7", ["sent <SESSION>"]),
    ]


def test_header_fields_never_reach_templates_and_bad_lines_are_located(tmp_path: Path) -> None:
    # Lines whose dates, pids and levels differ but whose messages are alike: one template.
    fmt = "<Date> <Time> <Pid> <Level> <Component>: <Content>"
    lines = [
        f"0811{d:02d} 2036{d:02d} {100 + d} {lvl} dfs.DataNode: Served block blk_{d} to /10.0.0.{d}"
        for d, lvl in ((1, "INFO"), (2, "WARN"), (3, "INFO"))
    ]
    sessions, stats = sessions_from_logs(lines, r"blk_\d+", log_format=fmt)
    assert {e for s in sessions for e in s.events} == {"Served block <SESSION> to /<IP>"}
    assert stats.templates == 1
    # Without the format the header is mined too: the component is in every template.
    raw, _ = sessions_from_logs(lines, r"blk_\d+")
    assert all("dfs.DataNode:" in e for s in raw for e in s.events)
    path = tmp_path / "app.log"
    path.write_text("\n".join([*lines, "", "a stack trace line"]) + "\n")
    with pytest.raises(DataError) as info:
        sessions_from_logs(path, r"blk_\d+", log_format=fmt)
    assert str(info.value) == (
        f"{path}:5: the line does not match log_format='{fmt}' (starts 'a stack trace line')"
    )
    # A session field that is empty on every line that fits.
    with pytest.raises(DataError, match="the field <Level> is empty on every line"):
        sessions_from_logs(
            ["a  : x"], log_format="<Date> <Level>: <Content>", session_field="Level"
        )


def test_missing_drain3_names_the_extra(monkeypatch):
    """drain3 is an optional dependency (`rnnkit[logs]`): without it, one line says so."""
    for name in ("drain3", "drain3.masking", "drain3.template_miner_config"):
        monkeypatch.setitem(sys.modules, name, None)  # import -> ImportError
    with pytest.raises(ConfigError, match=r"drain3.*pip install 'rnnkit\[logs\]'"):
        LogSessionizer(r"(blk_-?\d+)")


def test_outer_spaces_of_a_message_keep_its_parameter_values() -> None:
    """A message with trailing (or leading) spaces fit no template when its values were
    read back, so every value was null and the params model lost them."""
    lines = [
        "s1 query took 12 ms",
        "s2 query took 3 ms  ",
        "  s3 query took 5 ms",
        "s4 query\ttook 9 ms",
    ]
    sessions, stats = sessions_from_logs(lines, r"(s\d)", params=True)
    assert [s.params for s in sessions] == [[[12.0]], [[3.0]], [[5.0]], [[9.0]]]
    assert stats.unmatched_params == 0


def test_a_lone_carriage_return_stays_inside_its_line(tmp_path: Path) -> None:
    """Lines end at "\\n" (and "\\r\\n") as grep counts them: a progress bar's lone "\\r"
    split a line in two, and the errors named the line after the right one."""
    path = tmp_path / "cr.log"
    path.write_bytes(b"s1 has started\r\ns1 is copying 10%\r20%\rdone\ns2 has started\nnope\n")
    sessions, stats = sessions_from_logs(path, r"(s\d)")
    assert stats.lines == 4 and stats.first_no_session == (str(path), 4)
    assert [len(s.events) for s in sessions] == [2, 1]
    with pytest.raises(DataError, match=rf"{path}:4: the line does not match"):
        sessions_from_logs(path, log_format="<Sid> <Verb> <Content>", session_field="Sid")


def test_known_templates_name_the_lines_that_fit_them_unchanged() -> None:
    """New logs mined alone name their lines by what those lines alone have in common
    (``GET /index``, not the training's ``GET <*>``): every event was unknown to the
    model. With the training's templates, a line that fits one is that event."""
    training = [f"req=r{i} GET /{p} took {i} ms" for i, p in enumerate(["index", "about", "cart"])]
    known = sorted({e for s in sessions_from_logs(training, r"req=(\w+)")[0] for e in s.events})
    assert known == ["req=<SESSION> GET <*> took <NUM> ms"]
    new = ["req=n1 GET /index took 4 ms", "req=n2 GET /index took 9 ms"]
    alone = {e for s in sessions_from_logs(new, r"req=(\w+)")[0] for e in s.events}
    assert alone == {"req=<SESSION> GET /index took <NUM> ms"}
    sessionizer = LogSessionizer(
        r"req=(\w+)",
        params=True,
        templates=[*known, "req=<SESSION> user <*> logged in", "req=<SESSION> user <*> logged out"],
    )
    sessionizer.add_lines([*new, "req=n3 user bob logged out", "req=n3 cache flushed in 3 s"])
    sessions = sessionizer.sessions()
    assert [s.events for s in sessions] == [
        [known[0]],
        [known[0]],
        # a similar known template is never generalised into another ("logged <*>")
        ["req=<SESSION> user <*> logged out", "req=<SESSION> cache flushed in <NUM> s"],
    ]
    assert [s.params for s in sessions] == [[[None, 4.0]], [[None, 9.0]], [[None], [3.0]]]
    assert (sessionizer.stats.known, sessionizer.stats.templates) == (3, 1)


def test_a_time_format_without_a_year_reads_february_29_and_new_year() -> None:
    """syslog's ``%b %d %H:%M:%S``: strptime's year 1900 refused Feb 29, and Dec 31 to
    Jan 1 came out a year backwards."""
    fmt = "<Mon> <Day> <Time> <Sid> <Content>"
    lines = [
        "Dec 31 23:59:59 s1 start 5",
        "Jan  1 00:00:01 s1 step 6",
        "Feb 28 23:59:59 s2 start 7",
        "Feb 29 00:00:01 s2 step 8",
        "Jan  1 00:00:05 s1 step 9",
    ]
    sessions, _ = sessions_from_logs(
        lines,
        log_format=fmt,
        session_field="Sid",
        params=True,
        time_fields=("Mon", "Day", "Time"),
        time_format="%b %d %H:%M:%S",
    )
    assert [[v[0] for v in s.params] for s in sessions] == [[0.0, 2.0, 4.0], [0.0, 2.0]]


def test_a_line_fitting_two_known_templates_gets_one_whatever_their_order() -> None:
    """Drain's match kept the first template it met: a run's vocabulary (most frequent
    first) and its sessions file (first seen first) named the same line differently."""
    templates = [
        "id=<SESSION> disk <*> <*>",
        "id=<SESSION> <*> disk <*>",
        "id=<SESSION> disk full <*>",
    ]
    named = set()
    for order in (templates, templates[::-1], sorted(templates)):
        sessionizer = LogSessionizer(r"id=(\w+)", templates=order)
        sessionizer.add_lines(["id=a disk disk disk", "id=b disk full now", "id=c the disk x"])
        named.add(tuple(tuple(s.events) for s in sessionizer.sessions()))
    # the most specific: fewest <*>, then the first by name
    assert named == {
        (
            ("id=<SESSION> <*> disk <*>",),
            ("id=<SESSION> disk full <*>",),
            ("id=<SESSION> <*> disk <*>",),
        )
    }


def test_year_less_and_day_less_times_step_both_ways_over_their_wrap() -> None:
    """A step back over New Year (lines out of order, a clock step) came out as +366
    days; a time of day alone gave minus a day at midnight."""

    def deltas(lines: list[str], time_format: str) -> list[float]:
        sessions, _ = sessions_from_logs(
            lines, log_format="<A> <B> <C> <Sid> <Content>", session_field="Sid",
            params=True, time_fields=("A", "B", "C"), time_format=time_format,
        )  # fmt: skip
        return [v[0] for v in sessions[0].params]

    year_less = ["Dec 31 23:59:59", "Jan 1 00:00:01", "Dec 31 23:59:58", "Jan 1 00:00:02"]
    fmt = "%b %d %H:%M:%S"
    assert deltas([f"{t} s1 tick" for t in year_less], fmt) == [0.0, 2.0, -3.0, 4.0]
    day_less = ["x y 23:59:59", "x y 00:00:01", "x y 23:59:58"]
    assert deltas([f"{t} s1 tick" for t in day_less], "x y %H:%M:%S") == [0.0, 2.0, -3.0]
    # a weekday without a date gives strptime no date: the time of day
    week_day = ["x Mon 23:59:59", "x Tue 00:00:01"]
    assert deltas([f"{t} s1 tick" for t in week_day], "x %a %H:%M:%S") == [0.0, 2.0]
    # ... a week number and a weekday are a date (of a year-less year)
    weeks = ["10 Mon 00:00:00", "10 Thu 00:00:00", "12 Mon 00:00:00"]
    assert deltas([f"{t} s1 tick" for t in weeks], "%W %a %H:%M:%S") == [0.0, 259200.0, 950400.0]
