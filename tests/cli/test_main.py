"""The `rnnkit` entry point itself: --version and the command list."""

from __future__ import annotations

import importlib.metadata

import pytest

import rnnkit
from rnnkit.cli.main import SUBCOMMANDS, main


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
