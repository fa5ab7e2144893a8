"""The repository stands alone: no tracked file points outside it.

Code, docstrings, ``--help`` texts, the HTML report, tests and documentation explain
themselves or cite ``docs/`` and the literature; none of them may send the reader to a
file beside the checkout or to an entry of a project tracker, which a user of the package
does not have. And the whole suite can be collected at once.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import unicodedata
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


# ---- links in the documentation ----------------------------------------------------------

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
CODE_SPAN = re.compile(r"`([^`\n]+)`")
# A code span naming a path inside the repository, e.g. `docs/bptt.md` or `examples/wirings/`.
REPO_PATH = re.compile(r"^(?:docs|examples|benchmarks|src|tests|recipes)/[\w./-]*$")


def documentation() -> list[Path]:
    return [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]


def slug(heading: str) -> str:
    """The anchor Python-Markdown (and so mkdocs) gives a heading."""
    text = unicodedata.normalize("NFKD", re.sub(r"[`*]", "", heading))
    text = re.sub(r"[^\w\s-]", "", text.encode("ascii", "ignore").decode()).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.M)}


def test_slug_is_python_markdowns() -> None:
    assert slug("1. Each step's contribution to the gradient") == (
        "1-each-steps-contribution-to-the-gradient"
    )
    assert slug("Segment truncation (`--bptt segment:K`)") == "segment-truncation-bptt-segmentk"
    assert slug("Sequences, padding and masks") == "sequences-padding-and-masks"


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    """Relative links of ``path`` that name no file (or no heading) inside ``root``, and
    code spans naming a repository path that does not exist."""
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    problems = []
    for match in LINK.finditer(CODE_SPAN.sub("", text)):
        target = match.group(1)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(root)}: ({target})"
        if not resolved.is_relative_to(root):
            problems.append(f"{where} points outside the repository")
        elif not resolved.exists():
            problems.append(f"{where} names no file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            problems.append(f"{where} names no heading of {resolved.relative_to(root)}")
    for match in CODE_SPAN.finditer(text):
        name = match.group(1).split("::")[0]
        if REPO_PATH.match(name) and not (root / name).exists():
            problems.append(f"{path.relative_to(root)}: `{name}` names no file")
    return problems


def test_links_in_the_documentation_resolve() -> None:
    problems = [p for doc in documentation() for p in broken_links(doc)]
    assert not problems, "\n".join(problems)


def test_broken_links_are_found(tmp_path: Path) -> None:
    """The checker sees a missing file, a missing heading and a path outside the root,
    and accepts what exists."""
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "real.md").write_text("# A real page\n\n## Its part\n", encoding="utf-8")
    page = root / "docs" / "page.md"
    page.write_text(
        "[fine](real.md#its-part) [self](#here) `docs/real.md`\n\n# Here\n\n"
        "[a](real.md#no-such-part) [b](nowhere.md) [c](../../outside.md) `docs/gone.md`\n"
        "```\n[in a code block](ignored.md)\n```\n",
        encoding="utf-8",
    )
    problems = broken_links(page, root.resolve())
    assert len(problems) == 4, problems
    assert ["no-such-part" in p for p in problems] == [True, False, False, False]


SECTION_REF = re.compile(r"docs/([\w-]+\.md),?\s+[\"'“]([^\"'”\n]+)[\"'”]")


def test_section_references_name_real_sections() -> None:
    """A docstring or comment citing ``docs/math.md, "Truncation"`` names a heading that
    exists in that page."""
    problems = []
    for path in tracked_files():
        if path.suffix not in (".py", ".md") or not path.is_file():
            continue
        for match in SECTION_REF.finditer(path.read_text(encoding="utf-8")):
            page = ROOT / "docs" / match.group(1)
            if not page.is_file() or slug(match.group(2)) not in anchors(page):
                problems.append(f"{path.relative_to(ROOT)}: {match.group(0)}")
    assert not problems, "\n".join(problems)


def test_test_files_have_names_of_their_own() -> None:
    """The test folders are not packages, so pytest imports each test file under its
    base name: two files of one name stop the whole collection ("import file
    mismatch"), which a run of either folder alone never shows."""
    seen: dict[str, Path] = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        other = seen.setdefault(path.name, path)
        assert other == path, f"{path.relative_to(ROOT)} and {other.relative_to(ROOT)}"
