"""The C++ of the compiled time loop (src/rnnkit/csrc) is formatted by clang-format with
the repository's .clang-format (``make format`` applies it). Skipped where clang-format is
absent, or where its major version differs from the one in constraints.txt (the dev
extra installs it): another version formats some constructs differently."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rnnkit.bptt import native

ROOT = Path(__file__).resolve().parents[1]


def _clang_format() -> str | None:
    beside = Path(sys.executable).parent / "clang-format"  # the dev extra, in this venv
    return str(beside) if beside.is_file() else shutil.which("clang-format")


def test_csrc_is_clang_formatted() -> None:
    tool = _clang_format()
    if tool is None:
        pytest.skip("clang-format not installed (pip install -c constraints.txt -e '.[dev]')")
    pinned = re.search(r"^clang-format==(\d+)\.", (ROOT / "constraints.txt").read_text(), re.M)
    assert pinned, "constraints.txt pins clang-format"
    version = subprocess.run([tool, "--version"], capture_output=True, text=True, check=True)
    found = re.search(r"version (\d+)\.", version.stdout)
    if found is None or found.group(1) != pinned.group(1):
        pytest.skip(f"{version.stdout.strip()} here; the check uses {pinned.group(1)}.x")
    sources = [str(p) for p in native._sources()]
    assert len(sources) >= 2
    proc = subprocess.run(
        [tool, "--dry-run", "--Werror", f"--style=file:{ROOT / '.clang-format'}", *sources],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, f"run `make format`:\n{proc.stderr[:3000]}"
