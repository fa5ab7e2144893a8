"""The documentation runs as written (the runner: ``mdexec.py``; the conventions:
CONTRIBUTING.md, "Documentation that runs").

Every tutorial's commands run in one shared directory, in page order, at a budget of
``DOCS_EXEC_STEPS`` training steps (default 30), started from one process that imported
torch once (``forkserver.py``); every page's Python blocks run in order,
a page that reads a tutorial's run (``<!-- after: ... -->``) in that directory after the
tutorial, any other page in a directory of its own.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from mdexec import (
    Page,
    check_tutorial_fences,
    forkserver,
    read_page,
    run_python,
    run_shell,
    shell_env,
)

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
TUTORIALS = sorted(DOCS.glob("tutorial-*.md"))
PAGES = [p for p in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))] if read_page(p).of("python")]
# The runner runs bash and forks (forkserver.py).
pytestmark = pytest.mark.skipif(os.name != "posix", reason="the runner needs bash and fork")
STEPS = int(os.environ.get("DOCS_EXEC_STEPS", "30"))


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


class Tutorials:
    """The tutorials' shared directory; each tutorial's commands run there at most once."""

    def __init__(self, root: Path, server: Path | None) -> None:
        self.root = root / "work"
        self.root.mkdir()
        self.env = shell_env(root / "bin", STEPS, server)
        self.failures: dict[str, list[str]] = {}

    def ensure(self, name: str) -> list[str]:
        """Run tutorial ``name`` if it has not run yet; what went wrong (empty: nothing)."""
        if name not in self.failures:
            page = read_page(DOCS / name)
            self.failures[name] = check_tutorial_fences(page) or run_shell(
                page, self.root, self.env
            )
        return self.failures[name]


@pytest.fixture(scope="module")
def tutorials(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tutorials]:
    root = tmp_path_factory.mktemp("docs-exec")
    # The commands start from one process that imported torch once (forkserver.py); its
    # socket in a short path of its own (a socket's path is at most ~100 bytes).
    with ExitStack() as stack:
        short = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="docs-exec-")))
        yield Tutorials(root, stack.enter_context(forkserver(short / "fork.sock")))


@pytest.mark.parametrize("path", TUTORIALS, ids=_name)
def test_the_commands_of_a_tutorial_run(path: Path, tutorials: Tutorials) -> None:
    page = read_page(path)
    assert page.of("sh"), f"{_name(path)} shows no command to run"
    failures = tutorials.ensure(path.name)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("path", PAGES, ids=_name)
def test_the_python_of_a_page_runs(path: Path, tutorials: Tutorials, tmp_path: Path) -> None:
    page: Page = read_page(path)
    for name in page.after:
        assert (DOCS / name).is_file(), f"{_name(path)}: <!-- after: {name} --> is no page"
        failures = tutorials.ensure(name)
        assert not failures, f"{name}, which {_name(path)} builds on, fails:\n" + "\n".join(
            failures
        )
    done = run_python(page, tutorials.root if page.after else tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
