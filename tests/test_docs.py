"""The documentation site builds without a warning (``mkdocs build --strict``).

Strict mode fails on a broken link or anchor between pages, a page missing from the
navigation, and a docstring the API reference cannot parse. Skipped where the ``docs``
extra is not installed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_site_builds_strictly(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs", reason="the docs extra is not installed")
    pytest.importorskip("mkdocstrings_handlers.python", reason="the docs extra is not installed")
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # Every API page was generated and holds the documentation of its modules.
    cells = (site / "api" / "cells" / "index.html").read_text(encoding="utf-8")
    assert "rnnkit.cells.gru" in cells and "reset_after" in cells
    assert (site / "math" / "index.html").is_file()
