"""The `rnnkit` entry point itself: --version and the command list."""

from __future__ import annotations

import importlib.metadata

import pytest

import rnnkit
from rnnkit.app.cli.main import SUBCOMMANDS, main


def test_version_is_the_package_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"rnnkit {rnnkit.__version__}"


def test_one_version_source():
    """The installed distribution's version is read from rnnkit.__version__ (pyproject's
    dynamic version), so the two cannot differ."""
    assert importlib.metadata.version("rnnkit") == rnnkit.__version__


def test_no_command_lists_the_commands(capsys):
    assert main([]) == 2  # a usage error, like any other
    captured = capsys.readouterr()
    assert captured.out == ""
    for name in SUBCOMMANDS:  # module names; the command is spelled with "-"
        assert f"\n    {name.replace('_', '-')}" in captured.err
    assert "train a model" in captured.err
    assert (
        captured.err.splitlines()[-1]
        == "rnnkit: error: no command given (one of the commands above)"
    )


def _subparsers():
    from rnnkit.app.cli.main import build_parser

    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    return action.choices


def test_every_command_takes_quiet_and_verbose_counted():
    commands = _subparsers()
    assert {name.replace("-", "_") for name in commands} == set(SUBCOMMANDS)
    for name, sub in commands.items():
        text = sub.format_help()
        assert "-q, --quiet" in text and "-v, --verbose" in text, name
        options = {a.dest: a for a in sub._actions}
        for dest in ("quiet", "verbose"):  # one definition each, counted
            assert type(options[dest]).__name__ == "_CountAction", (name, dest)


@pytest.mark.parametrize(
    ("flags", "level", "quiet"),
    [([], "INFO", False), (["-q"], "WARNING", True), (["--quiet"], "WARNING", True),
     (["-qq"], "ERROR", True), (["-v"], "DEBUG", False), (["-vv"], "DEBUG", False),
     (["-q", "-v"], "INFO", False), (["-qqv"], "WARNING", True)],
)  # fmt: skip
def test_the_level_is_verbose_minus_quiet_and_restored_after(monkeypatch, flags, level, quiet):
    from rnnkit import messages
    from rnnkit.app.cli import report

    seen = {}

    def fake_run(args):
        seen["level"], seen["quiet"] = messages.level_name(), args.quiet
        return 0

    monkeypatch.setattr(report, "run", fake_run)
    assert main(["report", "--checkpoint", "nowhere", *flags]) == 0
    assert seen == {"level": level, "quiet": quiet}
    assert messages.level_name() == "INFO"  # as it was before main()


def test_train_uses_the_tasks_own_defaults_unless_given():
    """The command line's defaults of a task are ``TASK_DEFAULTS`` over ``TrainConfig``'s
    (regress: --lr 0.005); an option typed at the global default value stays as typed,
    and ``--help`` names the exception."""
    from rnnkit.app.cli.main import build_parser, explicit_options
    from rnnkit.app.cli.train import config_from_args

    def config(*argv: str):
        full = ["train", "--train", "x.jsonl", "--out", "r", *argv]
        args = build_parser().parse_args(full)
        args.explicit = explicit_options(full)
        return config_from_args(args)

    assert config("--task", "regress").lr == 0.005
    assert config("--task", "regress", "--lr", "0.002").lr == 0.002
    assert config("--task", "tag").lr == 0.002
    help_text = build_parser()._subparsers._group_actions[0].choices["train"].format_help()
    assert "learning rate (default 0.002; regress: 0.005)" in " ".join(help_text.split())
    # a switch a task turns on: its default shown as on, and its opposite offered
    assert (
        config("--task", "tag").char_rnn and not config("--task", "tag", "--no-char-rnn").char_rnn
    )
    assert "have too (tag: on) [tasks: tag]" in " ".join(help_text.split())
    assert "--no-char-rnn turn --char-rnn off (on by default for tag)" in " ".join(
        help_text.split()
    )


@pytest.mark.parametrize(
    ("exc", "line"),
    [
        (FileNotFoundError(2, "No such file or directory", "in.txt"), "in.txt: file not found"),
        (IsADirectoryError(21, "Is a directory", "d"), "d: is a directory, not a file"),
        (PermissionError(13, "Permission denied", "ro/x"), "ro/x: permission denied"),
        (OSError(28, "No space left on device", "o.jsonl"), "o.jsonl: No space left on device"),
        (OSError(5, "Input/output error"), "Input/output error"),
    ],
)
def test_an_os_error_is_one_line_naming_its_file(monkeypatch, capsys, exc, line):
    """An OSError escaping a command printed Python's ``[Errno 2] No such file or
    directory: 'in.txt'``; it reads as rnnkit's own messages: the file, then what is wrong."""
    from rnnkit.app.cli import report

    def failing_run(args):
        raise exc

    monkeypatch.setattr(report, "run", failing_run)
    assert main(["report", "--checkpoint", "nowhere"]) == 2
    assert capsys.readouterr().err == f"rnnkit report: error: {line}\n"


@pytest.mark.parametrize(
    ("command", "argv", "hint"),
    [
        ("train", ["--train", "t.txt", "--out", "r"], "use smaller sizes (--hidden, --embedding"),
        ("evaluate", ["--checkpoint", "r", "--data", "d"], "or give a smaller --batch-size"),
        ("report", ["--checkpoint", "r"], "free memory (the run's model and data need it)"),
    ],
)  # fmt: skip
def test_out_of_memory_advice_is_the_commands_own(monkeypatch, capsys, command, argv, hint):
    """``evaluate`` and ``report`` out of memory were told to use a smaller --hidden,
    which they do not take: the run's sizes are the run's."""
    import importlib

    module = importlib.import_module(f"rnnkit.app.cli.{command}")

    def failing_run(args):
        raise MemoryError

    monkeypatch.setattr(module, "run", failing_run)
    assert main([command, *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"rnnkit {command}: error: out of memory (") and hint in err, err


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["train", "--train", "x", "--hiden", "8"], "--hiden 8 (did you mean --hidden?)"),
        (["generate", "--checkpoint", "x", "--temprature=1"],
         "--temprature=1 (did you mean --temperature?)"),
        (["evaluate", "--checkpoint", "x", "--data", "y", "--zzz"], "--zzz"),  # nothing close
    ],
)  # fmt: skip
def test_a_mistyped_option_is_told_the_option_it_is_close_to(capsys, argv, said):
    # as a configuration file's unknown key is ("hiden: unknown option (did you mean ...)")
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and err.endswith(f"unrecognized arguments: {said}"), err
    assert "\n" not in err


def test_a_required_option_mistyped_is_told_too(capsys):
    # argparse says the required option is missing before it names the unknown one
    with pytest.raises(SystemExit):
        main(["evaluate", "--checkpont", "x", "--data", "y"])
    assert capsys.readouterr().err.strip() == (
        "rnnkit evaluate: error: the following arguments are required: --checkpoint "
        "(--checkpont: did you mean --checkpoint?)"
    )


def test_an_unknown_option_is_named_by_its_commands_parser(capsys):
    """`rnnkit score ... --json` said `rnnkit: error: ...`, as if `rnnkit` itself had
    refused it; the line now names the command, as a missing or invalid option's does."""
    for name, sub in _subparsers().items():
        argv = [name]
        for action in sub._actions:
            if action.required:  # given, so that the unknown option is what is wrong
                value = next(iter(action.choices)) if action.choices else "x"
                argv += [action.option_strings[0], value] if action.option_strings else [value]
        with pytest.raises(SystemExit) as exc:
            main([*argv, "--no-such-option", "1"])
        assert exc.value.code == 2, name
        err = capsys.readouterr().err.strip()
        assert err == f"rnnkit {name}: error: unrecognized arguments: --no-such-option 1", name
    with pytest.raises(SystemExit):
        main(["--no-such-option"])
    assert (
        capsys.readouterr().err.strip() == "rnnkit: error: unrecognized arguments: --no-such-option"
    )


def test_closed_streams_and_an_ascii_terminal_are_no_traceback(tmp_path):
    """``>&-`` and ``<&-`` gave AttributeError tracebacks ('NoneType' object has no
    attribute 'flush'), and ``PYTHONIOENCODING=ascii`` a UnicodeEncodeError once the work
    was done. Closed streams read and write nothing; what ASCII cannot hold is written as
    JSON's escapes, so JSON lines stay JSON."""
    import json
    import os
    import subprocess
    import sys

    log = tmp_path / "app.log"
    log.write_text("x req=é1 opened\nx req=é2 opened\n", encoding="utf-8")
    argv = [sys.executable, "-m", "rnnkit", "sessions", "--from", "log", str(log),
            "--session-pattern", "req=(\\S+)", "--out"]  # fmt: skip
    env = {**os.environ, "PYTHONIOENCODING": "ascii"}
    done = subprocess.run([*argv, "-"], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert [json.loads(line)["session"] for line in done.stdout.splitlines()] == ["é1", "é2"]

    def close_stdin_and_stdout() -> None:
        os.close(0)
        os.close(1)

    out = tmp_path / "o.jsonl"
    closed = subprocess.run(
        [*argv, str(out)], stderr=subprocess.PIPE, text=True, preexec_fn=close_stdin_and_stdout
    )
    assert closed.returncode == 0 and "Traceback" not in closed.stderr, closed.stderr
    assert out.read_text(encoding="utf-8").count("\n") == 2


def test_sigterm_while_a_file_is_written_leaves_no_half_written_file(tmp_path):
    """SIGTERM or SIGHUP (``timeout``, a service stop, a closed terminal) killed a command
    in the middle of its atomic write, leaving the hidden temporary file; now the file is
    removed first, and the process still dies by the signal. (The signal is sent by the process
    itself at the write's fsync, where the window is.)"""
    import signal
    import subprocess
    import sys

    log = tmp_path / "app.log"
    log.write_text("".join(f"x req={i % 50} opened\n" for i in range(500)))
    out = tmp_path / "o" / "s.jsonl"
    for sig in (signal.SIGTERM, signal.SIGHUP):
        code = (
            "import os, signal, sys\n"
            "real = os.fsync\n"
            f"def fsync(fd):\n    os.kill(os.getpid(), {int(sig)}); return real(fd)\n"
            "os.fsync = fsync\n"
            "from rnnkit.app.cli.main import main\n"
            f"sys.exit(main(['sessions', '--from', 'log', {str(log)!r}, '--session-pattern',"
            f" 'req=(\\\\d+)', '--out', {str(out)!r}]))\n"
        )
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert done.returncode == -sig, done.stderr  # killed by it, as its parent expects
        assert "Traceback" not in done.stderr
        assert sorted(p.name for p in out.parent.iterdir()) == [], list(out.parent.iterdir())


def test_main_in_a_program_leaves_its_streams_as_they_were(monkeypatch):
    """The command's own stream settings (escapes where ASCII cannot hold a character,
    devnull for a closed stream) are undone when main() returns to a calling program."""
    import io
    import sys

    ascii_out = io.TextIOWrapper(io.BytesIO(), encoding="ascii")
    monkeypatch.setattr(sys, "stdout", ascii_out)
    monkeypatch.setattr(sys, "stdin", None)
    assert main([]) == 2  # no command: the list, on stderr
    assert ascii_out.errors == "strict" and sys.stdin is None
