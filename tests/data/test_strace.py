"""strace output to sessions: handwritten traces of every output form, then real strace."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rnnkit.data import strace as strace_module
from rnnkit.data.events import Session
from rnnkit.data.strace import parse_strace
from rnnkit.errors import ConfigError, DataError

# strace -f -tt -o FILE: every line prefixed by the pid; the parent blocks in wait4 while
# the child runs, and the child's clone result arrives via <... resumed>.
FOLLOW_FORKS_TO_FILE = """\
4001  10:20:30.000001 execve("/usr/bin/sh", ["sh", "-c", "cat /missing"], 0x7ffc /* 20 vars */) = 0
4001  10:20:30.000100 openat(AT_FDCWD, "/etc/ld.so.cache", O_RDONLY|O_CLOEXEC) = 3
4001  10:20:30.000200 read(3, "x) = 5 is in a string", 832) = 832
4001  10:20:30.000300 clone(child_stack=NULL, flags=CLONE_CHILD_SETTID|SIGCHLD <unfinished ...>
4002  10:20:30.000400 execve("/usr/bin/cat", ["cat", "/missing"], 0x5600 /* 20 vars */) = 0
4001  10:20:30.000410 <... clone resumed>, child_tidptr=0x7f00) = 4002
4001  10:20:30.000500 wait4(-1,  <unfinished ...>
4002  10:20:30.000600 openat(AT_FDCWD, "/missing", O_RDONLY) = -1 ENOENT (No such file or directory)
4002  10:20:30.000700 write(2, "cat: /missing: No such file or directory\\n", 41) = 41
4002  10:20:30.000800 exit_group(1)     = ?
4002  10:20:30.000900 +++ exited with 1 +++
4001  10:20:30.001000 <... wait4 resumed>[{WIFEXITED(s) && WEXITSTATUS(s) == 1}], 0, NULL) = 4002
4001  10:20:30.001100 --- SIGCHLD {si_signo=SIGCHLD, si_code=CLD_EXITED, si_pid=4002} ---
4001  10:20:30.001200 exit_group(1)     = ?
4001  10:20:30.001300 +++ exited with 1 +++
"""

# strace -f to the terminal: no prefix while one process is traced, "[pid N]" while
# several are; the program's own output is interleaved, splitting a call in two.
FOLLOW_FORKS_TO_TERMINAL = """\
execve("./server", ["./server"], 0x7ffd /* 35 vars */) = 0
clone(child_stack=NULL, flags=CLONE_CHILD_CLEARTID|SIGCHLDstrace: Process 3380 attached
, child_tidptr=0x7f06aa3cbe50) = 3380
[pid  3380] write(1, "hello\\n", 6hello
) = 6
[pid  3339] wait4(3380,  <unfinished ...>
[pid  3380] kill(3380, SIGSEGV)         = 0
[pid  3380] --- SIGSEGV {si_signo=SIGSEGV, si_code=SI_USER, si_pid=3380, si_uid=0} ---
[pid  3380] +++ killed by SIGSEGV (core dumped) +++
<... wait4 resumed>[{WIFSIGNALED(s) && WTERMSIG(s) == SIGSEGV && WCOREDUMP(s)}], 0, NULL) = 3380
--- SIGCHLD {si_signo=SIGCHLD, si_code=CLD_DUMPED, si_pid=3380, si_uid=0, si_status=SIGSEGV} ---
this line is the program's own output
exit_group(0)                           = ?
+++ exited with 0 +++
"""


def trace_file(tmp_path: Path, text: str, name: str = "trace.txt") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def by_id(sessions: list[Session]) -> dict[str, list[str]]:
    return {session.session: session.events for session in sessions}


def test_follow_forks_to_file(tmp_path: Path) -> None:
    path = trace_file(tmp_path, FOLLOW_FORKS_TO_FILE)
    sessions, stats = parse_strace(path)
    assert by_id(sessions) == {
        f"{path}:4001": [
            "execve:ok",
            "openat:ok",
            "read:ok",
            "clone:ok",
            "wait4:ok",
            "SIGCHLD",
            "exit_group:noreturn",
        ],
        f"{path}:4002": ["execve:ok", "openat:ENOENT", "write:ok", "exit_group:noreturn"],
    }
    assert (stats.lines, stats.events, stats.skipped) == (15, 11, 0)


def test_without_result_events_are_bare_names(tmp_path: Path) -> None:
    path = trace_file(tmp_path, FOLLOW_FORKS_TO_FILE)
    sessions, _ = parse_strace(path, with_result=False, name="run")
    assert by_id(sessions)["run:4002"] == ["execve", "openat", "write", "exit_group"]


def test_per_file_is_one_session_in_time_order(tmp_path: Path) -> None:
    path = trace_file(tmp_path, FOLLOW_FORKS_TO_FILE)
    sessions, _ = parse_strace(path, per="file", label=1)
    assert sessions == [
        Session(
            str(path),
            [
                "execve:ok",
                "openat:ok",
                "read:ok",
                "clone:ok",  # placed where the call started, completed when it resumed
                "execve:ok",
                "wait4:ok",
                "openat:ENOENT",
                "write:ok",
                "exit_group:noreturn",
                "SIGCHLD",
                "exit_group:noreturn",
            ],
            label=1,
        )
    ]


def test_follow_forks_to_terminal_attributes_unprefixed_lines(tmp_path: Path) -> None:
    sessions, stats = parse_strace(FOLLOW_FORKS_TO_TERMINAL.splitlines(), name="srv")
    # The unprefixed lines before the fork and after the child's death are the root's.
    assert by_id(sessions) == {
        "srv:3339": ["execve:ok", "clone:ok", "wait4:ok", "SIGCHLD", "exit_group:noreturn"],
        "srv:3380": ["write:ok", "kill:ok", "SIGSEGV", "killed:SIGSEGV"],
    }
    # The split clone and write calls were rejoined; only the program's line is skipped.
    assert stats.skipped == 1
    assert stats.first_skipped == [("srv", 12)]


def test_single_process_timestamps_and_decorations() -> None:
    lines = [
        # -ttt -T -i -y
        '1795987656.716096 [00007f3bc2916011] openat(AT_FDCWD</tmp>, "/nope", O_RDONLY) '
        "= -1 ENOENT (No such file or directory) <0.000045>",
        '1795987656.716100 [00007f3bc2916011] read(3</etc/hosts>, "", 1) = 0 <0.000010>',
        # -r relative timestamps, right-aligned
        "     0.000477 mmap(NULL, 8192, PROT_READ, MAP_PRIVATE, -1, 0) = 0x7f9890a6e000",
        # -t seconds
        "10:20:30 select(4, [3], NULL, NULL, {tv_sec=1}) = 0 (Timeout)",
        "10:20:31 read(0, 0x7ffd, 10) = ? ERESTARTSYS (To be restarted if SA_RESTART is set)",
        "10:20:31 --- SIGINT {si_signo=SIGINT, si_code=SI_KERNEL} ---",
        "10:20:32 ioctl(1, 0x5401, 0x7ffd) = -1 (errno 515)",
        "10:20:32 syscall_0x1b5(0x1, 0x2) = -1 ENOSYS (Function not implemented)",
        "10:20:33 exit_group(130) = ?",
        "10:20:33 [????????????????] +++ exited with 130 +++",
    ]
    sessions, stats = parse_strace(lines)
    assert sessions == [
        Session(
            "strace",
            [
                "openat:ENOENT",
                "read:ok",
                "mmap:ok",
                "select:ok",
                "read:ERESTARTSYS",
                "SIGINT",
                "ioctl:errno515",
                "syscall_0x1b5:ENOSYS",
                "exit_group:noreturn",
            ],
        )
    ]
    assert stats.skipped == 0


def test_without_follow_forks_a_clone_does_not_rename_the_session() -> None:
    # strace without -f sees the parent's clone but never the child.
    lines = ["clone(child_stack=NULL, flags=SIGCHLD) = 55", "wait4(-1, NULL, 0, NULL) = 55"]
    sessions, _ = parse_strace(lines, name="sh")
    assert sessions == [Session("sh", ["clone:ok", "wait4:ok"])]


def test_unfinished_call_that_never_resumes_has_no_return() -> None:
    lines = [
        "[pid 10] futex(0x7f, FUTEX_WAIT, 0, NULL <unfinished ...>",
        "[pid 11] exit_group(0) = ?",
        "[pid 10] <... futex resumed>) = ? <unavailable>",
        "[pid 11] +++ exited with 0 +++",
        "[pid 12] nanosleep({tv_sec=5}, <unfinished ...>",
        "[pid 12] +++ killed by SIGKILL +++",
    ]
    sessions, _ = parse_strace(lines, name="t")
    assert by_id(sessions) == {
        "t:10": ["futex:noreturn"],
        "t:11": ["exit_group:noreturn"],
        "t:12": ["nanosleep:noreturn", "killed:SIGKILL"],
    }


def test_resumed_without_start_still_counts() -> None:
    # strace -p attaching to a process blocked in a call shows only its end.
    lines = ['<... read resumed>"abc", 3) = 3', 'write(1, "abc", 3) = 3']
    sessions, _ = parse_strace(lines)
    assert sessions[0].events == ["read:ok", "write:ok"]


def test_per_pid_file_of_ff_takes_its_pid_from_the_name(tmp_path: Path) -> None:
    path = trace_file(
        tmp_path,
        'openat(AT_FDCWD, "/x", O_RDONLY) = 3\nclose(3) = 0\n+++ exited with 0 +++\n',
        name="out.777",
    )
    sessions, _ = parse_strace(path, name="out")
    assert sessions == [Session("out:777", ["openat:ok", "close:ok"])]


def test_unparseable_lines_are_counted_with_their_numbers() -> None:
    lines = [
        'openat(AT_FDCWD, "/x", O_RDONLY) = 3',
        "garbage",
        "",
        "strace: Process 12 detached",
        "read(3, truncated by a crash",
    ]
    sessions, stats = parse_strace(lines, name="t")
    assert sessions == [Session("t", ["openat:ok"])]
    assert (stats.lines, stats.skipped, stats.first_skipped) == (4, 2, [("t", 2), ("t", 5)])


def test_overlong_lines_are_skipped_and_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(strace_module, "MAX_LINE_CHARS", 40)
    path = trace_file(
        tmp_path, 'close(3) = 0\nwrite(1, "' + "x" * 100 + '", 100) = 100\nclose(4) = 0\n'
    )
    sessions, stats = parse_strace(path, name="t")
    assert sessions == [Session("t", ["close:ok", "close:ok"])]
    assert (stats.lines, stats.skipped, stats.first_skipped) == (3, 1, [("t", 2)])
    sessions, stats = parse_strace(path.read_text().splitlines(), name="t")
    assert (len(sessions[0].events), stats.skipped) == (2, 1)


def test_not_strace_output_names_the_file(tmp_path: Path) -> None:
    path = trace_file(tmp_path, "hello world\nthis is a README\n")
    with pytest.raises(DataError) as info:
        parse_strace(path)
    assert str(info.value) == (
        f"{path}: not strace output: none of its 2 lines parses "
        "(expected lines like 'openat(...) = 3')"
    )


def test_empty_and_note_only_inputs_are_errors(tmp_path: Path) -> None:
    empty = trace_file(tmp_path, "\n\n", name="empty.txt")
    with pytest.raises(DataError, match=r"empty\.txt: no strace output \(the input is empty\)$"):
        parse_strace(empty)
    notes = trace_file(tmp_path, "strace: Process 5 attached\n", name="notes.txt")
    with pytest.raises(DataError, match=r"notes\.txt: strace output without any system call$"):
        parse_strace(notes)


def test_a_reused_pid_after_its_process_exited_is_a_new_session() -> None:
    """Process 300 forks 301, 301 exits, 300 forks a new 301: two processes, which were
    one session whose events went on after its exit_group."""
    lines = [
        "300   clone(child_stack=NULL, flags=SIGCHLD) = 301",
        "301   getpid() = 301",
        "301   exit_group(0) = ?",
        "301   +++ exited with 0 +++",
        "300   clone(child_stack=NULL, flags=SIGCHLD) = 301",
        "301   getuid() = 0",
        "301   exit_group(1) = ?",
        "301   +++ killed by SIGKILL +++",
        "300   clone(child_stack=NULL, flags=SIGCHLD <unfinished ...>",
        "301   geteuid() = 0",
        "300   <... clone resumed>) = 301",
        "300   exit_group(0) = ?",
        "300   +++ exited with 0 +++",
    ]
    sessions, _ = parse_strace(lines, name="t")
    assert sessions == [
        Session("t:300", ["clone:ok", "clone:ok", "clone:ok", "exit_group:noreturn"]),
        Session("t:301", ["getpid:ok", "exit_group:noreturn"]),
        Session("t:301#2", ["getuid:ok", "exit_group:noreturn", "killed:SIGKILL"]),
        # the child's first line before its parent's clone returned
        Session("t:301#3", ["geteuid:ok"]),
    ]


def test_a_reused_pid_of_an_unprefixed_trace_is_a_new_session() -> None:
    """A -ff file of a pid used three times, and two traces appended (-A) without -f:
    one session, its events going on after exit_group."""
    per_pid = ["getpid() = 5", "exit_group(0) = ?", "+++ exited with 0 +++", "getuid() = 0",
               "+++ exited with 1 +++", "getgid() = 0"]  # fmt: skip
    sessions, _ = parse_strace(per_pid, name="t")
    assert sessions == [
        Session("t", ["getpid:ok", "exit_group:noreturn"]),
        Session("t#2", ["getuid:ok"]),
        Session("t#3", ["getgid:ok"]),
    ]


def test_appended_traces_of_a_forking_program_are_one_session_each() -> None:
    """Two runs appended (strace -A, no -f) of a program that forks: the first run's
    child, never traced, was taken for the one process left, and took the second run's
    first lines; a terminal trace whose root is printed [pid 200] only later took the
    first run's process into pid 200's session."""
    run = [
        "getppid() = 1",
        "clone(child_stack=NULL, flags=SIGCHLD) = {c}",
        "wait4({c}, NULL, 0, NULL) = {c}",
        "exit_group(0) = ?",
        "+++ exited with 0 +++",
    ]
    lines = [line.format(c=c) for c in (101, 201) for line in run]  # fmt: skip
    sessions, _ = parse_strace(lines, name="t", with_result=False)
    assert sessions == [
        Session("t", ["getppid", "clone", "wait4", "exit_group"]),
        Session("t#2", ["getppid", "clone", "wait4", "exit_group"]),
    ]
    terminal = [
        "getppid() = 5", "exit_group(0) = ?", "+++ exited with 0 +++",
        "getpid() = 200", "clone(child_stack=NULL, flags=SIGCHLD) = 201",
        "[pid 201] getuid() = 0", "[pid 200] wait4(-1, NULL, 0, NULL) = 201",
        "[pid 201] +++ exited with 0 +++", "exit_group(0) = ?", "+++ exited with 0 +++",
    ]  # fmt: skip
    sessions, _ = parse_strace(terminal, name="t", with_result=False)
    assert sessions == [
        Session("t:root", ["getppid", "exit_group"]),
        Session("t:200", ["getpid", "clone", "wait4", "exit_group"]),
        Session("t:201", ["getuid"]),
    ]


def test_a_forked_child_goes_on_after_its_parent_exits_under_follow_forks() -> None:
    """strace -f to a terminal of a daemon: the parent forks and exits, the child's lines
    then come unprefixed; a child that had made no call yet was taken for a new trace
    appended (``root#2``)."""
    lines = [
        "getpid() = 200", "clone(child_stack=NULL, flags=SIGCHLD) = 201",
        "[pid 200] exit_group(0) = ?", "[pid 200] +++ exited with 0 +++",
        "setsid() = 201", "getuid() = 0", "exit_group(0) = ?", "+++ exited with 0 +++",
    ]  # fmt: skip
    sessions, _ = parse_strace(lines, name="t", with_result=False)
    assert sessions == [
        Session("t:200", ["getpid", "clone", "exit_group"]),
        Session("t:201", ["setsid", "getuid", "exit_group"]),
    ]


def test_a_thread_that_execs_hands_its_call_to_its_process() -> None:
    """``+++ superseded by execve in pid 202 +++``: thread 202 is gone and its execve
    resumes as process 201; the lines after were put into the exited root's session."""
    lines = [
        "getpid() = 200",
        "clone(child_stack=NULL, flags=SIGCHLD) = 201",
        "[pid 200] exit_group(0) = ?",
        "[pid 200] +++ exited with 0 +++",
        "[pid 201] clone3({flags=CLONE_VM|CLONE_THREAD}, 88) = 202",
        '[pid 202] execve("/bin/true", ["/bin/true"], 0x7ffd /* 35 vars */ <unfinished ...>',
        "[pid 201] futex(0x7f81, FUTEX_WAIT, 202, NULL <unfinished ...>",
        "[pid 201] <... futex resumed>) = ?",
        "+++ superseded by execve in pid 202 +++",
        "<... execve resumed>) = 0",
        "brk(NULL) = 0x55d67a006000",
        "exit_group(0) = ?",
        "+++ exited with 0 +++",
    ]
    sessions, _ = parse_strace(lines, name="t", with_result=False)
    assert sessions == [
        Session("t:200", ["getpid", "clone", "exit_group"]),
        Session("t:201", ["clone3", "futex", "brk", "exit_group"]),
        Session("t:202", ["execve"]),
    ]


def test_an_unknown_root_then_a_prefixed_trace_appended_are_two_processes() -> None:
    """A trace without -f (its root's pid never printed), then one with -f -o appended:
    the second run's root took the first's session."""
    lines = [
        "getppid() = 1", "exit_group(0) = ?", "+++ exited with 0 +++",
        "300   getpid() = 300", "300   clone(child_stack=NULL, flags=SIGCHLD) = 301",
        "301   getuid() = 0", "300   exit_group(0) = ?", "300   +++ exited with 0 +++",
    ]  # fmt: skip
    sessions, _ = parse_strace(lines, name="t", with_result=False)
    assert sessions == [
        Session("t:root", ["getppid", "exit_group"]),
        Session("t:300", ["getpid", "clone", "exit_group"]),
        Session("t:301", ["getuid"]),
    ]


def test_an_earlier_traces_untraced_child_never_takes_a_later_traces_lines() -> None:
    """Three traces appended: a forking program without -f (its child 101 never traced),
    a -f trace, then one more: the third run's lines went to pid 101."""
    lines = [
        "getppid() = 100", "clone(child_stack=NULL, flags=SIGCHLD) = 101",
        "wait4(101, NULL, 0, NULL) = 101", "exit_group(0) = ?", "+++ exited with 0 +++",
        "300 getppid() = 1", "300 exit_group(0) = ?", "300 +++ exited with 0 +++",
        "getgid() = 0", "exit_group(0) = ?", "+++ exited with 0 +++",
    ]  # fmt: skip
    sessions, _ = parse_strace(lines, name="t", with_result=False)
    assert sessions == [
        Session("t:root", ["getppid", "clone", "wait4", "exit_group"]),
        Session("t:300", ["getppid", "exit_group"]),
        Session("t:root#3", ["getgid", "exit_group"]),
    ]


def test_a_lone_carriage_return_ends_no_line(tmp_path: Path) -> None:
    """A traced program's progress output ("10%\r20%\r") split strace's line, and the
    lines after it were counted one too many."""
    path = tmp_path / "t.strace"
    path.write_bytes(b'write(1, "a", 1) = 1 10%\r20%\r\nclose(3) = 0\r\ngarbage\n')
    sessions, stats = parse_strace(path, name="t")
    assert sessions == [Session("t", ["write:ok", "close:ok"])]
    assert (stats.lines, stats.first_skipped) == (3, [("t", 3)])


def test_an_open_stream_is_read_in_bounded_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    """Standard input (``rnnkit sessions --from strace -``): a line over the limit is
    skipped and counted, never read whole; errors name the stream."""
    import io

    monkeypatch.setattr(strace_module, "MAX_LINE_CHARS", 40)
    stream = io.StringIO('close(3) = 0\nwrite(1, "' + "x" * 100 + '", 100) = 100\nclose(4) = 0\n')
    sessions, stats = parse_strace(stream, name="<stdin>")
    assert sessions == [Session("<stdin>", ["close:ok", "close:ok"])]
    assert stats.first_skipped == [("<stdin>", 2)]
    with pytest.raises(DataError, match=r"^<stdin>: no strace output"):
        parse_strace(io.StringIO(""), name="<stdin>")


def test_bad_per_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="per must be 'pid' or 'file', got 'thread'"):
        parse_strace(["close(3) = 0"], per="thread")  # type: ignore[arg-type]


def _strace_or_skip() -> str:
    strace = shutil.which("strace")
    if strace is None:
        pytest.skip("strace is not installed (apt-get install strace to run this test)")
    return strace


def _run_strace(strace: str, args: list[str], code: str, cwd: Path) -> None:
    # -S -I: no site-packages or user paths, so the traced startup stays short.
    result = subprocess.run(
        [strace, *args, sys.executable, "-S", "-I", "-c", code],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if result.returncode != 0 and "ptrace" in result.stderr:
        # Containers without CAP_SYS_PTRACE have strace but cannot trace.
        pytest.skip(f"strace cannot trace here: {result.stderr.strip().splitlines()[0]}")
    assert result.returncode == 0, result.stderr


PROGRAM = """
import os
try:
    open("/nonexistent-rnnkit/missing")
except FileNotFoundError:
    pass
pid = os.fork()
if pid == 0:
    os._exit(3)
os.waitpid(pid, 0)
"""


def test_real_strace_follow_forks(tmp_path: Path) -> None:
    strace = _strace_or_skip()
    out = tmp_path / "trace.txt"
    _run_strace(strace, ["-f", "-o", str(out)], PROGRAM, tmp_path)
    sessions, stats = parse_strace(out)
    assert stats.skipped == 0
    assert len(sessions) == 2
    parent, child = sessions
    assert parent.events[0] == "execve:ok"
    assert "openat:ENOENT" in parent.events
    spawn = next(e for e in parent.events if e.split(":")[0] in ("clone", "clone3", "fork"))
    assert spawn.endswith(":ok")
    assert "wait4:ok" in parent.events
    assert parent.events[-1] == "exit_group:noreturn"
    assert child.events[-1] == "exit_group:noreturn"
    assert parent.session.rsplit(":", 1)[0] == str(out)


def test_real_strace_per_process_files(tmp_path: Path) -> None:
    strace = _strace_or_skip()
    _run_strace(strace, ["-ff", "-tt", "-o", str(tmp_path / "t")], PROGRAM, tmp_path)
    files = sorted(tmp_path.glob("t.*"), key=lambda p: int(p.suffix[1:]))
    assert len(files) == 2
    parent, child = (parse_strace(f, name="t")[0] for f in files)
    assert [s.session for s in parent + child] == [f"t:{f.suffix[1:]}" for f in files]
    assert "openat:ENOENT" in parent[0].events
    assert child[0].events[-1] == "exit_group:noreturn"
    assert os.path.getsize(files[1]) < os.path.getsize(files[0])
