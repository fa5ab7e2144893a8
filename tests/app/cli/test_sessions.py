"""``rnnkit sessions`` end to end: options, files written, one-line errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rnnkit.app.cli.main import main
from rnnkit.data.events import Session, parse_session, read_sessions

TRACE = """\
100   openat(AT_FDCWD, "/etc/hosts", O_RDONLY) = 3
100   clone(child_stack=NULL, flags=SIGCHLD) = 101
101   openat(AT_FDCWD, "/nope", O_RDONLY) = -1 ENOENT (No such file or directory)
101   exit_group(1)                     = ?
101   +++ exited with 1 +++
this line is not strace
100   exit_group(0)                     = ?
100   +++ exited with 0 +++
"""

LOG = """\
2024-05-01 10:00:00,001 INFO req=a1 GET /index 200 in 12 ms
2024-05-01 10:00:00,002 INFO req=b2 GET /about 200 in 7 ms
2024-05-01 10:00:01,000 DEBUG cache warmed
2024-05-01 10:00:01,500 ERROR req=a1 upstream timeout after 3000 ms
"""


def run_sessions(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(["sessions", *argv])
    out, err = capsys.readouterr()
    return status, out, err


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "trace.txt"
    path.write_text(TRACE)
    return path


def test_strace_to_sessions(
    tmp_path: Path, trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "new" / "dir" / "s.jsonl"  # missing directories are created
    status, stdout, stderr = run_sessions(
        capsys, "--from", "strace", str(trace), "--out", str(out), "--label", "0"
    )
    assert (status, stderr) == (0, "")
    assert stdout == (
        f"wrote 2 sessions (5 events) to {out}; skipped 1 unparseable line (first at {trace}:6)\n"
    )
    assert read_sessions(out) == [
        Session(f"{trace}:100", ["openat:ok", "clone:ok", "exit_group:noreturn"], 0),
        Session(f"{trace}:101", ["openat:ENOENT", "exit_group:noreturn"], 0),
    ]


def test_strace_per_file_without_results(
    tmp_path: Path, trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "other.txt"
    other.write_text("close(3) = 0\n")
    out = tmp_path / "s.jsonl"
    status, stdout, _ = run_sessions(
        capsys,
        "--from",
        "strace",
        str(trace),
        str(other),
        "--out",
        str(out),
        "--no-result",
        "--per",
        "file",
        "--quiet",
    )
    assert (status, stdout) == (0, "")
    assert read_sessions(out) == [
        Session(str(trace), ["openat", "clone", "openat", "exit_group", "exit_group"]),
        Session(str(other), ["close"]),
    ]


def test_log_to_sessions(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "app.log"
    log.write_text(LOG)
    out = tmp_path / "s.jsonl"
    status, stdout, stderr = run_sessions(
        capsys,
        "--from",
        "log",
        str(log),
        "--session-pattern",
        r"req=(?P<session>\w+)",
        "--out",
        str(out),
        "--label",
        "1",
    )
    assert (status, stderr) == (0, "")
    assert stdout == (
        f"wrote 2 sessions (3 events) to {out}; 2 templates; skipped 1 line without a session id "
        f"(first at {log}:3)\n"
    )
    get = "<DATE> INFO req=<SESSION> GET <*> <NUM> in <NUM> ms"
    assert read_sessions(out) == [
        Session("a1", [get, "<DATE> ERROR req=<SESSION> upstream timeout after <NUM> ms"], 1),
        Session("b2", [get], 1),
    ]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--from", "log", "{trace}"],
            "--from log needs --session-pattern (a regex; its group is the id)",
        ),
        (
            ["--from", "strace", "{trace}", "--session-pattern", "(x)"],
            "--session-pattern applies to --from log only",
        ),
        (
            ["--from", "log", "{trace}", "--session-pattern", "(x)", "--no-result"],
            "--no-result and --per apply to --from strace only",
        ),
        (
            [
                "--from",
                "log",
                "{readme}",
                "--session-pattern",
                "x",
                "--log-format",
                "<A>: <Content>",
            ],
            "{readme}:1: the line does not match --log-format '<A>: <Content>' "
            "(starts 'just words')",
        ),
        (
            ["--from", "log", "{readme}", "--session-pattern", "x", "--log-format", "<A>"],
            "--log-format '<A>' has no <Content> field (the message to mine)",
        ),
        (
            ["--from", "log", "{readme}", "--log-format", "<A>: <Content>", "--session-field", "B"],
            "--session-field B is not a header field of --log-format (fields: A)",
        ),
        (
            ["--from", "log", "{readme}", "--session-pattern", "(x)", "--session-field", "A"],
            "give --session-pattern or --session-field (one of them)",
        ),
        (
            ["--from", "strace", "{trace}", "--log-format", "<Content>"],
            "--log-format applies to --from log only",
        ),
        (
            ["--from", "log", "{readme}", "--session-pattern", "(x)", "--drain-depth", "2"],
            "--drain-depth must be at least 3, got 2",
        ),
        (
            ["--from", "log", "{trace}", "--session-pattern", "(x)", "--similarity", "2"],
            "--similarity must be in [0, 1], got 2.0",
        ),
        (["--from", "strace", "{trace}", "{trace}"], "INPUT {trace} is given twice"),
        (["--from", "strace", "-", "-"], "INPUT - (standard input) is given twice"),
        (
            ["--from", "strace", "{trace}", "--templates", "{trace}"],
            "--templates applies to --from log only",
        ),
        (
            ["--from", "log", "{readme}", "--session-pattern", "w", "--templates", "{missing}"],
            "{missing}: no such file or run directory",
        ),
        (
            ["--from", "log", "{readme}", "--session-pattern", "w", "--templates", "{dir}"],
            "{dir}: not a run of --task events (no config.json); give its training sessions file",
        ),
        (
            ["--from", "log", "{readme}", "--session-pattern", "w", "--templates", "{readme}"],
            "{readme}:1: ",
        ),
        (["--from", "strace", "{missing}"], "{missing}: no such file"),
        (["--from", "strace", "{dir}"], "{dir}: is a directory, not a file of lines"),
        (["--from", "strace", "{readme}"], "{readme}: not strace output: none of its 1 lines"),
        (
            ["--from", "log", "{readme}", "--session-pattern", r"req=(\d+)"],
            r"{readme}: no line matches the session pattern 'req=(\d+)' (1 line read)",
        ),
        (
            ["--from", "log", "{readme}", "--session-pattern", "x", "--time-field", "A"],
            "--time-field and --time-format apply with --params only",
        ),
        (
            ["--from", "strace", "{trace}", "--params"],
            "--params applies to --from log only",
        ),
        (
            [
                "--from",
                "log",
                "{readme}",
                "--session-pattern",
                "x",
                "--params",
                "--time-field",
                "A",
            ],
            "--time-field names fields of --log-format: give both",
        ),
        (
            [
                "--from",
                "log",
                "{readme}",
                "--session-pattern",
                "w",
                "--params",
                "--log-format",
                "<A> <Content>",
                "--time-field",
                "B",
            ],
            "--time-field B is not a header field of --log-format (fields: A)",
        ),
        (
            [
                "--from",
                "log",
                "{readme}",
                "--session-pattern",
                "w",
                "--params",
                "--log-format",
                "<A> <Content>",
                "--time-field",
                "A",
            ],
            "{readme}:1: the time 'just' (--time-field A) is not ISO 8601 or a number of "
            "seconds (else give --time-format)",
        ),
    ],
)
def test_user_errors_are_one_line_and_exit_2(
    tmp_path: Path,
    trace: Path,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    message: str,
) -> None:
    readme = tmp_path / "README"
    readme.write_text("just words\n")
    names = {"trace": trace, "missing": tmp_path / "absent.txt", "dir": tmp_path, "readme": readme}
    out = tmp_path / "out.jsonl"
    previous = '{"session": "old", "events": ["x"]}\n'  # an earlier output of the command
    out.write_text(previous)
    argv = [arg.format(**names) for arg in argv]
    status, stdout, stderr = run_sessions(capsys, *argv, "--out", str(out), "--overwrite")
    assert (status, stdout) == (2, "")
    assert stderr.startswith(f"rnnkit sessions: error: {message.format(**names)}")
    assert stderr.count("\n") == 1
    assert out.read_text() == previous  # a failed run leaves the old output alone


def test_out_dash_writes_the_sessions_to_stdout(
    tmp_path: Path, trace: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--out -`` is the pipe into ``rnnkit score --data -``: the JSON lines on stdout,
    exactly what the file would hold, the summary on stderr, and no file named ``-``."""
    written = tmp_path / "s.jsonl"
    assert run_sessions(capsys, "--from", "strace", str(trace), "--out", str(written))[0] == 0
    monkeypatch.chdir(tmp_path)
    status, stdout, stderr = run_sessions(
        capsys, "--from", "strace", str(trace), "--out", "-", "--label", "0"
    )
    assert status == 0
    assert [Session(s.session, s.events, 0) for s in read_sessions(written)] == [
        parse_session(line) for line in stdout.splitlines()
    ]
    assert stderr.startswith("wrote 2 sessions (5 events) to stdout; skipped 1 unparseable")
    assert not (tmp_path / "-").exists()
    quiet = run_sessions(capsys, "--from", "strace", str(trace), "--out", "-", "-q")
    assert (quiet[0], quiet[2]) == (0, "")


def test_out_dash_past_a_file_size_limit_is_an_error_not_half_a_file(tmp_path: Path) -> None:
    """One large write to standard output past a file-size limit (or a full disk) wrote a
    part, said "wrote 3001 sessions" and exited 0."""
    import resource

    log = tmp_path / "app.log"
    log.write_text("".join(f"x req={i % 3001} user opened file {i % 97}\n" for i in range(60000)))

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))

    with open(tmp_path / "s.jsonl", "wb") as out:
        done = subprocess.run(
            [sys.executable, "-m", "rnnkit", "sessions", "--from", "log", str(log),
             "--session-pattern", r"req=(\w+)", "--out", "-"],
            stdout=out, stderr=subprocess.PIPE, text=True, preexec_fn=limited,
        )  # fmt: skip
    assert (done.returncode, done.stderr) == (
        2,
        "rnnkit sessions: error: standard output: File too large\n",
    )


def test_out_that_is_an_input_is_refused(trace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, _, stderr = run_sessions(capsys, "--from", "strace", str(trace), "--out", str(trace))
    assert status == 2
    assert stderr == (
        f"rnnkit sessions: error: --out {trace} is also an INPUT; it would be overwritten\n"
    )
    assert trace.read_text() == TRACE


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--from", "strace", "--out", "o"], "the following arguments are required: INPUT"),
        (["--from", "csv", "x", "--out", "o"], "argument --from: invalid choice: 'csv'"),
        (["--from", "strace", "x", "--out", "o", "--label", "2"], "argument --label: invalid"),
    ],
)
def test_bad_options_are_reported_by_argparse(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["sessions", *argv])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_installed_command_runs(tmp_path: Path, trace: Path) -> None:
    # The console script that `pip install` wrote next to this interpreter.
    script = Path(sys.executable).parent / "rnnkit"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "rnnkit"]
    out = tmp_path / "s.jsonl"
    result = subprocess.run(
        [*command, "sessions", "--from", "strace", str(trace), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout.startswith(f"wrote 2 sessions (5 events) to {out}")
    assert [s.session for s in read_sessions(out)] == [f"{trace}:100", f"{trace}:101"]


HDFS_LIKE = "".join(
    line + "\n"
    for line in [
        "081109 203615 148 INFO dfs.DataNode$PacketResponder: Received block blk_-160 of "
        "size 91 from /10.250.19.102",
        "081109 203615 149 INFO dfs.FSNamesystem: BLOCK* NameSystem.allocateBlock: "
        "/user/job_1/part-00 blk_7503",
        "081109 203616 148 INFO dfs.DataNode$PacketResponder: Received block blk_7503 of "
        "size 67 from /10.250.10.6",
        "081109 203617 150 WARN dfs.DataNode: heartbeat lost",
        "",
        "081109 203618 151 INFO dfs.DataNode$PacketResponder: PacketResponder 1 for block "
        "blk_-160 terminating",
    ]
)


def test_log_format_keeps_header_fields_out_of_templates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "hdfs.log"
    log.write_text(HDFS_LIKE)
    out = tmp_path / "s.jsonl"
    fmt = "<Date> <Time> <Pid> <Level> <Component>: <Content>"
    status, stdout, stderr = run_sessions(
        capsys, "--from", "log", str(log), "--out", str(out), "--overwrite", "--log-format", fmt,
        "--session-pattern", r"blk_-?\d+", "--drain-depth", "5", "--drain-max-children", "10",
    )  # fmt: skip
    assert (status, stderr) == (0, "")
    assert f"skipped 2 lines without a session id (first at {log}:4)" in stdout
    received = "Received block <SESSION> of size <NUM> from /<IP>"
    assert read_sessions(out) == [
        Session("blk_-160", [received, "PacketResponder <NUM> for block <SESSION> terminating"]),
        Session(
            "blk_7503",
            ["BLOCK* NameSystem.allocateBlock: /user/job_1/part-<NUM> <SESSION>", received],
        ),
    ]
    # The session as a header field: one session per pid.
    status, _, stderr = run_sessions(
        capsys, "--from", "log", str(log), "--out", str(out), "--overwrite", "--log-format", fmt,
        "--session-field", "Pid",
    )  # fmt: skip
    assert (status, stderr) == (0, "")
    assert [s.session for s in read_sessions(out)] == ["148", "149", "150", "151"]
    assert read_sessions(out)[2].events == ["heartbeat lost"]


def test_out_is_never_a_device_fifo_or_directory(
    tmp_path: Path, trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import os
    import stat

    targets = {"FIFO": tmp_path / "fifo", "directory": tmp_path / "dir"}
    os.mkfifo(targets["FIFO"])
    targets["directory"].mkdir()
    try:  # a copy of /dev/null's node: never a real system device
        os.mknod(tmp_path / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
        targets["character device"] = tmp_path / "null"
    except OSError:
        pass
    for kind, path in targets.items():
        mode = os.lstat(path).st_mode
        status, out, err = run_sessions(capsys, "--from", "strace", str(trace), "--out", str(path))
        assert status == 2 and out == "" and err.count("\n") == 1, err
        assert f"{path}: is a {kind}, not a regular file; refusing to replace it" in err
        assert os.lstat(path).st_mode == mode


def test_log_params_carry_numbers_and_time_deltas(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "app.log"
    log.write_text(LOG)
    out = tmp_path / "s.jsonl"
    status, stdout, stderr = run_sessions(
        capsys, "--from", "log", str(log), "--session-pattern", r"req=(\w+)", "--out", str(out),
        "--overwrite", "--log-format", "<Date> <Time> <Level> <Content>", "--params",
        "--time-field", "Date,Time",
    )  # fmt: skip
    assert (status, stderr) == (0, "")
    assert stdout.endswith("; parameter values of widths [2, 4]\n")
    a1, b2 = read_sessions(out)
    assert a1.events == ["req=<SESSION> GET <*> <NUM> in <NUM> ms",
                         "req=<SESSION> upstream timeout after <NUM> ms"]  # fmt: skip
    # [seconds since the session's previous line, then each slot's number or null]
    assert a1.params == [[0.0, None, 200.0, 12.0], [1.499, 3000.0]]
    assert b2.params == [[0.0, None, 200.0, 7.0]]
    # Without --time-field: the numbers alone; a bad time format is one line with file:line.
    status, _, _ = run_sessions(
        capsys, "--from", "log", str(log), "--session-pattern", r"req=(\w+)", "--out", str(out),
        "--overwrite", "--log-format", "<Date> <Time> <Level> <Content>", "--params",
    )  # fmt: skip
    assert status == 0 and read_sessions(out)[1].params == [[None, 200.0, 7.0]]
    status, _, stderr = run_sessions(
        capsys, "--from", "log", str(log), "--session-pattern", r"req=(\w+)", "--out", str(out),
        "--overwrite", "--log-format", "<Date> <Time> <Level> <Content>", "--params",
        "--time-field", "Time", "--time-format", "%H:%M",
    )  # fmt: skip
    assert status == 2 and stderr == (
        f"rnnkit sessions: error: {log}:1: the time '10:00:00,001' (--time-field Time) is not "
        "--time-format '%H:%M'\n"
    )


def test_out_that_holds_other_data_is_never_replaced(
    tmp_path: Path, trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--out`` naming an existing file that is not a sessions file (a corpus, notes) was
    replaced; now refused before any input is read. A sessions file (a hand-labelled test
    set looks the same as an earlier output) was replaced too: now only with --overwrite."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("a corpus\n")
    status, stdout, stderr = run_sessions(
        capsys, "--from", "strace", str(trace), "--out", str(corpus)
    )
    assert (status, stdout) == (2, "")
    assert stderr == (
        f"rnnkit sessions: error: {corpus}: exists and is not a sessions file (JSON lines); "
        "refusing to replace it (remove it, or choose another path)\n"
    )
    assert corpus.read_text() == "a corpus\n"
    out = tmp_path / "s.jsonl"
    status, _, stderr = run_sessions(
        capsys, "--from", "strace", str(trace), "--out", str(out), "--label", "0"
    )
    assert (status, stderr) == (0, "")
    status, _, stderr = run_sessions(capsys, "--from", "strace", str(trace), "--out", str(out))
    assert (status, stderr) == (2, (
        f"rnnkit sessions: error: {out}: exists (a sessions file); refusing to replace it: "
        "give --overwrite to replace it, or choose another path\n"
    ))  # fmt: skip
    assert {s.label for s in read_sessions(out)} == {0}
    status, _, stderr = run_sessions(
        capsys, "--from", "strace", str(trace), "--out", str(out), "--label", "1", "--overwrite"
    )
    assert (status, stderr) == (0, "")
    assert {s.label for s in read_sessions(out)} == {1}
    status, _, stderr = run_sessions(  # never another file, even with --overwrite
        capsys, "--from", "strace", str(trace), "--out", str(corpus), "--overwrite"
    )
    assert status == 2 and corpus.read_text() == "a corpus\n"
    status, _, stderr = run_sessions(capsys, "--from", "strace", str(trace), "--out", "")
    assert status == 2 and "--out is empty" in stderr


@pytest.mark.parametrize(
    ("option", "value", "least"),
    [("--drain-depth", "0", 3), ("--drain-depth", "-5", 3), ("--drain-max-children", "0", 2)],
)
def test_drain_options_below_their_least_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, value: str, least: int
) -> None:
    """``--drain-depth 0`` was taken as not given (the default, 4); ``-5`` was refused as
    ``depth must be at least 3``, Drain's keyword rather than the option."""
    log = tmp_path / "app.log"
    log.write_text(LOG)
    out = tmp_path / "s.jsonl"
    status, stdout, stderr = run_sessions(
        capsys, "--from", "log", str(log), "--session-pattern", r"req=(\w+)", "--out", str(out),
        option, value,
    )  # fmt: skip
    assert (status, stdout) == (2, "")
    assert stderr == f"rnnkit sessions: error: {option} must be at least {least}, got {value}\n"
    assert not out.exists()


def test_new_logs_are_named_by_the_templates_of_the_training_logs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Mined alone, a new log whose requests all GET /index named them ``GET /index``, an
    event the model never saw (every session flagged); with --templates (the training
    sessions file or the run), a line that fits a training template is that event."""
    from rnnkit.app.config.train import TrainConfig
    from rnnkit.app.tasks.events.data import EventVocabulary
    from rnnkit.app.tasks.run_config import save_config

    train_log, new_log = tmp_path / "train.log", tmp_path / "new.log"
    train_log.write_text(
        "".join(f"req=r{i} GET /{p} took {i} ms\nreq=r{i} closed\n" for i, p in enumerate("abc"))
    )
    new_log.write_text("req=n1 GET /index took 4 ms\nreq=n1 closed\nreq=n2 reset by peer\n")
    train = tmp_path / "train.jsonl"
    pattern = ("--session-pattern", r"req=(\w+)")
    assert (
        run_sessions(capsys, "--from", "log", str(train_log), *pattern, "--out", str(train))[0] == 0
    )
    get = "req=<SESSION> GET <*> took <NUM> ms"
    assert read_sessions(train)[0].events == [get, "req=<SESSION> closed"]
    run = tmp_path / "run"  # what a run of --task events keeps of them: its vocabulary
    run.mkdir()
    EventVocabulary.from_sessions(s.events for s in read_sessions(train)).save(run / "vocab.json")
    save_config(run, TrainConfig(task="events", train=str(train), out=str(run)))
    for templates in (train, run):
        out = tmp_path / "new.jsonl"
        status, stdout, _ = run_sessions(
            capsys, "--from", "log", str(new_log), *pattern, "--templates", str(templates),
            "--out", str(out), "--overwrite",
        )  # fmt: skip
        assert status == 0
        assert "; 2 lines fitting the --templates, 1 new template mined; " in stdout
        assert read_sessions(out) == [
            Session("n1", [get, "req=<SESSION> closed"]),
            Session("n2", ["req=<SESSION> reset by peer"]),
        ]


def test_inputs_from_standard_input_and_a_pipe(
    tmp_path: Path, trace: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``-`` reads standard input and a FIFO (``<(zcat old.log.gz)``) is read as a file:
    both were refused ("not a regular file", "no such file")."""
    import io
    import os
    import threading

    out = tmp_path / "s.jsonl"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(TRACE.encode())))
    assert run_sessions(capsys, "--from", "strace", "-", "--out", str(out), "--overwrite")[0] == 0
    assert [s.session for s in read_sessions(out)] == ["<stdin>:100", "<stdin>:101"]
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(LOG.encode())))
    status, stdout, _ = run_sessions(
        capsys,
        "--from",
        "log",
        "-",
        "--session-pattern",
        r"req=(\w+)",
        "--out",
        str(out),
        "--overwrite",
    )
    assert status == 0 and "(first at <stdin>:3)" in stdout
    assert [s.session for s in read_sessions(out)] == ["a1", "b2"]
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_text(TRACE))
    writer.start()
    try:
        status = run_sessions(
            capsys, "--from", "strace", str(fifo), "--out", str(out), "--overwrite"
        )[0]
    finally:
        writer.join()
    assert status == 0 and [s.session for s in read_sessions(out)] == [f"{fifo}:100", f"{fifo}:101"]


def test_templates_of_a_run_of_another_task_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A word-level language model's vocabulary was taken for templates, each word one."""
    from rnnkit.app.config.train import TrainConfig
    from rnnkit.app.tasks.run_config import save_config
    from rnnkit.data.vocab import Vocabulary

    text = tmp_path / "text.txt"
    text.write_text("the cat\n")
    run = tmp_path / "lm"
    run.mkdir()
    Vocabulary.from_counts({"the": 1, "cat": 1}, unit="word").save(run / "vocab.json")
    save_config(run, TrainConfig(task="lm", train=str(text), out=str(run)))
    log = tmp_path / "a.log"
    log.write_text("req=a the\n")
    status, _, err = run_sessions(
        capsys, "--from", "log", str(log), "--session-pattern", r"req=(\w+)",
        "--templates", str(run), "--out", str(tmp_path / "s.jsonl"),
    )  # fmt: skip
    assert status == 2 and err == (
        f"rnnkit sessions: error: {run}: a run of --task lm, not events; give its training "
        "sessions file\n"
    )


def test_lines_with_an_empty_message_are_skipped_and_counted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A header with nothing after it (the session from --session-field) was an event
    named "", and writing the sessions failed ("events[1] is an empty string")."""
    log = tmp_path / "a.log"
    log.write_text("s1 started\ns1 \ns1 done\n")
    out = tmp_path / "s.jsonl"
    status, stdout, _ = run_sessions(
        capsys, "--from", "log", str(log), "--log-format", "<Sid> <Content>",
        "--session-field", "Sid", "--out", str(out),
    )  # fmt: skip
    assert status == 0 and "and 1 line with an empty message" in stdout
    assert read_sessions(out) == [Session("s1", ["started", "done"])]
