"""Fuzz the command line: any argv gives exit status 0, 1 or 2 and, on failure, one line on
stderr; never a traceback.

``main()`` runs in-process. Option values are drawn from the hostile (``nan``, ``1e999``,
``-1``, a 30-digit integer, empty, random text) and from paths that exist but are wrong
(a directory, an empty file, invalid UTF-8, a run directory without weights); the working
directory is an empty temporary one, so no value names valid training data and nothing
trains for long.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from fuzzkit import FUZZ, Hang, time_limit
from hypothesis import given
from hypothesis import strategies as st

from rnnkit.app.cli.main import SUBCOMMANDS, build_parser, main
from rnnkit.app.config import TrainConfig
from rnnkit.app.tasks.run_config import save_config


def _actions() -> dict[str, list[argparse.Action]]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {name: [a for a in p._actions if a.option_strings] for name, p in sub.choices.items()}


ACTIONS = _actions()
FILES = ["missing.txt", "dir", "empty.txt", "binary.bin", "junk.json", "run", "-", "/"]
HOSTILE = [
    "0", "-1", "1", "2", "3", "nan", "inf", "-inf", "1e999", "99999999999999999999999999999",
    "", " ", "--", "-x", "segment:0", "window:-1", "segment:999999999999", "full", "linear:0",
    "\x00", "\ufeff", "é", "a\nb", "lstm", "gru", "rnn", "events", "seq2seq", "lm", "0.5",
]  # fmt: skip
values = st.one_of(
    st.sampled_from(HOSTILE),
    st.sampled_from(FILES),
    st.integers(-3, 3).map(str),
    st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=8),
)


def _option(draw: st.DrawFn, action: argparse.Action) -> list[str]:
    option = draw(st.sampled_from(action.option_strings))
    if action.nargs == 0:  # a flag
        return [option]
    if action.choices and draw(st.booleans()):
        return [option, str(draw(st.sampled_from(list(action.choices))))]
    return [option, draw(values)] if draw(st.integers(0, 6)) else [option]


@st.composite
def argvs(draw: st.DrawFn) -> list[str]:
    """A subcommand, usually its required options, then random options and values."""
    command = draw(st.sampled_from([*SUBCOMMANDS, "nope", "--help", ""]))
    argv = [command] if command else []
    actions = ACTIONS.get(command, [])
    if actions and draw(st.integers(0, 4)):  # mostly past argparse, into the subcommand
        for action in actions:
            if action.required:
                argv += _option(draw, action)
    for _ in range(draw(st.integers(0, 6))):
        if actions:
            argv += _option(draw, draw(st.sampled_from(actions)))
    if command == "sessions" and draw(st.booleans()):
        argv.append(draw(st.sampled_from(FILES)))  # its INPUT files
    if draw(st.integers(0, 3)) == 0:
        argv.insert(draw(st.integers(0, len(argv))), draw(values))  # a stray word
    return argv


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dir").mkdir()
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "binary.bin").write_bytes(b"\xff\xfe\x00garbage\x80")
    (tmp_path / "junk.json").write_text("[" * 5000)
    save_config(tmp_path / "run", TrainConfig(train="missing.txt", out="run"))
    monkeypatch.setenv("RNNKIT_REPORT", "0")
    return tmp_path


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        with time_limit():
            code = main(argv)
    except SystemExit as exc:  # argparse: --help (0) or a bad option (2)
        code = exc.code if isinstance(exc.code, int) else 2
    except Hang:
        pytest.fail(f"rnnkit {argv!r} hung")
    out, err = capsys.readouterr()
    return code, out, err


def _check(argv: list[str], code: int, err: str) -> None:
    assert code in (0, 1, 2), (argv, code, err)
    assert "Traceback" not in err, (argv, err)
    if code != 0:
        problems = [line for line in err.splitlines() if "error" in line or "stopped" in line]
        assert len(problems) == 1, (argv, err)
        assert problems[0].startswith("rnnkit"), (argv, err)


@FUZZ
@given(argv=argvs())
def test_any_option_list_exits_cleanly(
    workdir: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
):
    code, _, err = _run(argv, capsys)
    _check(argv, code, err)


@FUZZ
@given(argv=st.lists(st.text(max_size=12), max_size=6))
def test_random_words_exit_cleanly(
    workdir: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
):
    code, _, err = _run(argv, capsys)
    _check(argv, code, err)


@pytest.mark.parametrize(
    "error",
    [
        MemoryError(),
        RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 9 GB"),
    ],
)
def test_out_of_memory_is_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    import rnnkit.app.cli.gradcheck as gradcheck_cli

    def fail(args: argparse.Namespace) -> int:
        raise error

    monkeypatch.setattr(gradcheck_cli, "run", fail)
    code, _, err = _run(["gradcheck", "--cell", "rnn"], capsys)
    assert code == 2 and err.startswith("rnnkit gradcheck: error: out of memory")
    assert err.count("\n") == 1


def test_other_runtime_errors_are_not_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    import rnnkit.app.cli.gradcheck as gradcheck_cli

    def fail(args: argparse.Namespace) -> int:
        raise RuntimeError("a bug")

    monkeypatch.setattr(gradcheck_cli, "run", fail)
    with pytest.raises(RuntimeError, match="a bug"):
        main(["gradcheck", "--cell", "rnn"])
