"""The repository stands alone: no tracked file points outside it.

Code, docstrings, ``--help`` texts, the HTML report, tests and documentation explain
themselves or cite ``docs/`` and the literature; none of them may send the reader to a
file beside the checkout or to an entry of a project tracker, which a user of the package
does not have.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Each pattern is written so that it does not match its own source text.
FORBIDDEN: dict[str, re.Pattern[str]] = {
    "a path into the parent directory's shared folder": re.compile(r"\.\./shar(?:e)d\b"),
    "the outside specification": re.compile(r"\bSP(?:E)C\b"),
    "the outside design notes": re.compile(r"\bDESIG(?:N)\.md\b"),
    "the outside API notes": re.compile(r"\bAP(?:I)\.md\b"),
    "the outside source material": re.compile(r"\bsee(?:d)s\b", re.I),
    "an outside source document": re.compile(r"\bsee(?:d)s?[ /_]?0\d\d\b", re.I),
    "a tracker entry": re.compile(r"\bissues? #?\d", re.I),
}


def tracked_files() -> list[Path]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the tracked files are unknown")
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode("utf-8")
    return [ROOT / name for name in listed.split("\0") if name]


def test_patterns_catch_what_they_forbid() -> None:
    """The patterns themselves work (so that the scan below can fail)."""
    bad = [
        "see " + "../" + "shared/notes.md",
        "(" + "SP" + "EC §3)",
        "house style: " + "DESIGN" + ".md",
        "the contract of " + "API" + ".md",
        "the " + "se" + "eds",
        "Se" + "ed 003's example",
        "see " + "is" + "sue 8",
        "Is" + "sue 6's goal",
        "is" + "sues #12",
    ]
    for text in bad:
        assert any(p.search(text) for p in FORBIDDEN.values()), text
    fine = ["SPECIALS", "ALL_SPECS", "--seed 0", "a random seed", "the issue is", "tissue 3"]
    for text in fine:
        assert not any(p.search(text) for p in FORBIDDEN.values()), text


def test_no_tracked_file_points_outside_the_repository() -> None:
    found = []
    for path in tracked_files():
        if not path.is_file():
            continue  # deleted in the working tree, not yet committed
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # binary
        for number, line in enumerate(text.splitlines(), 1):
            for what, pattern in FORBIDDEN.items():
                if pattern.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{number}: {what}: {line.strip()}")
    assert not found, "\n".join(found)
