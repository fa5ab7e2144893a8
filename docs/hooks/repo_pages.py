"""mkdocs hook: pages generated from READMEs that live beside what they describe.

``benchmarks/README.md`` (what each benchmark measures, how to run it, the latest figures
with machine, load and date) becomes the page ``benchmarks.md``, and each
``recipes/<name>/README.md`` (a published result reproduced from the command line: the
figure reached, the published one, the time, the machine) the page ``recipes/<name>.md``.
One source each: the READMEs are what a reader of the repository sees next to the code,
the pages what a reader of the site sees, and they cannot drift apart.

Links are rewritten for the page's place in the site: a link to a page of ``docs/``
points to that page; a link to any other file of the repository (a script, a data
folder) becomes its path as code, since the site does not serve the repository's files.
The other way round, a page of ``docs/`` links to the README itself (so the link
resolves in the repository too), and the site turns it into a link to the page made
from it.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
_LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")


def _rewrite(text: str, source: Path, page: str) -> str:
    """``text`` of the README at ``source`` with its links fitted to the site page ``page``."""

    def fix(match: re.Match[str]) -> str:
        label, target = match.group(1), match.group(2)
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            return match.group(0)  # a web address or an anchor of the same page
        path, _, anchor = target.partition("#")
        repo_path = posixpath.normpath(
            posixpath.join(source.parent.relative_to(ROOT).as_posix(), path)
        )
        if repo_path.startswith("docs/") and repo_path.endswith(".md"):
            link = posixpath.relpath(repo_path[len("docs/") :], posixpath.dirname(page) or ".")
            return f"[{label}]({link}{'#' + anchor if anchor else ''})"
        if label.strip("`") in (path, repo_path):
            return f"`{repo_path}`"
        return f"{label} (`{repo_path}`)"

    return _LINK.sub(fix, text)


def pages() -> dict[str, str]:
    """``{path under docs/: Markdown}`` of the pages made from the repository's READMEs."""
    out = {}
    readme = ROOT / "benchmarks" / "README.md"
    out["benchmarks.md"] = _rewrite(readme.read_text(encoding="utf-8"), readme, "benchmarks.md")
    for readme in sorted((ROOT / "recipes").glob("*/README.md")):
        page = f"recipes/{readme.parent.name}.md"
        out[page] = _rewrite(readme.read_text(encoding="utf-8"), readme, page)
    return out


def _site_page(readme: str) -> str | None:
    """The site page made from the README at repository path ``readme``, if any."""
    if readme == "benchmarks/README.md":
        return "benchmarks.md"
    match = re.fullmatch(r"recipes/([^/]+)/README\.md", readme)
    return f"recipes/{match.group(1)}.md" if match else None


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    """In a page of ``docs/``, a link to a README shown on the site goes to its page."""
    here = posixpath.dirname(page.file.src_uri)

    def fix(match: re.Match[str]) -> str:
        path, _, anchor = match.group(2).partition("#")
        target = _site_page(posixpath.normpath(posixpath.join("docs", here, path)))
        if target is None:
            return match.group(0)
        link = posixpath.relpath(target, here or ".")
        return f"[{match.group(1)}]({link}{'#' + anchor if anchor else ''})"

    return _LINK.sub(fix, markdown)


def on_files(files: Files, config: Any) -> Files:
    for path, content in pages().items():
        files.append(File.generated(config, path, content=content))
    return files
