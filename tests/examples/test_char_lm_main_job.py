"""examples/char_lm/main_job.py (what ``make run`` runs): the command its last line tells
the user to run next is one they can paste."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[2] / "examples" / "char_lm" / "main_job.py"
spec = importlib.util.spec_from_file_location("char_lm_main_job", PATH)
assert spec is not None and spec.loader is not None
main_job = importlib.util.module_from_spec(spec)
spec.loader.exec_module(main_job)


@pytest.mark.parametrize("on_path", [False, True])
def test_the_evaluate_hint_names_the_rnnkit_a_user_can_run(tmp_path, monkeypatch, on_path):
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "rnnkit").write_text("#!/bin/sh\n", encoding="utf-8")
    monkeypatch.setattr(sys, "executable", str(bin_dir / "python"))
    monkeypatch.chdir(tmp_path)
    found = str(bin_dir / "rnnkit") if on_path else None
    monkeypatch.setattr(shutil, "which", lambda name: found)
    # `make run` installs into .venv, not on PATH: the hint is the path from here
    assert main_job._rnnkit_command() == ("rnnkit" if on_path else ".venv/bin/rnnkit")
