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


def test_readme_pages_rewrite_links_for_the_site() -> None:
    """A README shown as a site page: links to docs/ pages follow the page, links to other
    files of the repository become their path as code, web links and anchors stay."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("repo_pages", ROOT / "docs/hooks/repo_pages.py")
    assert spec is not None and spec.loader is not None
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    source = ROOT / "recipes" / "ptb_lm" / "README.md"
    text = (
        "[the defaults](../../docs/defaults.md#lm) [run.sh](run.sh) "
        "[the script](../../benchmarks/bench_lm.py) [paper](https://arxiv.org/abs/1409.2329) "
        "[below](#results)"
    )
    assert hook._rewrite(text, source, "recipes/ptb_lm.md") == (
        "[the defaults](../defaults.md#lm) `recipes/ptb_lm/run.sh` "
        "the script (`benchmarks/bench_lm.py`) [paper](https://arxiv.org/abs/1409.2329) "
        "[below](#results)"
    )
    # A docs page links to the README (resolving in the repository); the site to its page.
    page = type("Page", (), {"file": type("File", (), {"src_uri": "index.md"})()})()
    markdown = "[B](../benchmarks/README.md) [P](../recipes/ptb_lm/README.md#x) [M](math.md)"
    assert hook.on_page_markdown(markdown, page, None, None) == (
        "[B](benchmarks.md) [P](recipes/ptb_lm.md#x) [M](math.md)"
    )
    pages = hook.pages()
    assert set(pages) >= {"benchmarks.md", "recipes/ptb_lm.md", "recipes/pos_brown.md"}
    assert pages["benchmarks.md"].startswith("# Benchmarks")
