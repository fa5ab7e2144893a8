"""``rnnkit build-native`` and the first-use build: the message before the build, the
library's path when it is ready, and the fallback (no compiler, failed compiler) in one
line each."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from rnnkit.app.cli.main import main
from rnnkit.bptt import native


def _rnnkit(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rnnkit", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=300,
        check=False,
    )


def test_build_native_reports_the_library(capsys) -> None:
    if not native.available():
        pytest.skip("no C++ compiler here: the fallback tests below cover this machine")
    assert main(["build-native"]) == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith("compiled time loop ready: ")
    path = Path(out.split(": ", 1)[1])
    assert path.is_file() and path.suffix == ".so"


def test_build_native_without_a_compiler_one_line_and_retries(tmp_path: Path) -> None:
    env = {"CXX": "/nonexistent/c++", "RNNKIT_CACHE": str(tmp_path), "RNNKIT_NATIVE": "1"}
    for _ in range(2):  # asked explicitly, a remembered failure is tried again
        proc = _rnnkit(["build-native"], env)
        assert proc.returncode == 1
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1, proc.stderr
        assert "no C++ compiler: /nonexistent/c++ not found" in lines[0]
        assert "will use the PyTorch loop" in lines[0]
        assert "building" not in proc.stderr  # nothing to wait for: no message


def test_first_use_says_it_builds_before_building(tmp_path: Path) -> None:
    """A compiler that fails: the build message (with the cache path) comes first, then
    the one warning, and training falls back to the PyTorch loop."""
    cxx = tmp_path / "fake-c++"
    cxx.write_text("#!/bin/sh\necho 'fake-c++: internal error' >&2\nexit 1\n")
    cxx.chmod(cxx.stat().st_mode | stat.S_IEXEC)
    cache = tmp_path / "cache"
    env = {"CXX": str(cxx), "RNNKIT_CACHE": str(cache), "RNNKIT_NATIVE": "1"}
    code = (
        "import logging, torch; logging.basicConfig(format='%(message)s')\n"
        "from rnnkit import LSTM\nfrom rnnkit.bptt import native\n"
        "y = LSTM(3, 4)(torch.randn(2, 5, 3)).outputs\n"
        "print('available', native.available(), tuple(y.shape))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "available False (2, 5, 4)" in proc.stdout
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 2, proc.stderr
    assert lines[0] == f"rnnkit: building the compiled time loop (once, ~30 s) into {cache}…"
    assert "compiled time loop unavailable" in lines[1] and "fake-c++: internal error" in lines[1]
