"""The documentation runs as written (the runner: ``mdexec.py``; the conventions:
CONTRIBUTING.md, "Documentation that runs").

Every tutorial's commands run once in one directory of the test session (by whichever
of pytest-xdist's workers needs them first: a file lock), at a budget of
``DOCS_EXEC_STEPS`` training steps (default 30), started from one process that imported
torch once (``forkserver.py``); every page's Python blocks run in order,
a page that reads a tutorial's run (``<!-- after: ... -->``) in that directory after the
tutorial, any other page in a directory of its own.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
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
    """The tutorials' directory, one for the whole test session: each tutorial's commands
    run there once, by whichever of the suite's processes (pytest-xdist's workers) needs
    them first; the others wait for it (a file lock) and read what went wrong."""

    def __init__(self, root: Path, shared: Path, server: Path | None) -> None:
        self.root = shared / "work"
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = shared / "lock"
        self.env = shell_env(root / "bin", STEPS, server)

    @contextmanager
    def alone(self) -> Iterator[None]:
        """No other process runs a tutorial or a page in the directory meanwhile."""
        import fcntl  # posix: so is the runner (the module's skip)

        with open(self._lock, "a") as held:
            fcntl.flock(held, fcntl.LOCK_EX)  # released when the file closes
            yield

    def ensure(self, name: str) -> list[str]:
        """Run tutorial ``name`` if it has not run yet; what went wrong (empty: nothing).
        The caller holds :meth:`alone`."""
        outcome = self.root.parent / f"{name}.outcome.json"
        if not outcome.is_file():
            page = read_page(DOCS / name)
            failures = check_tutorial_fences(page) or run_shell(page, self.root, self.env)
            outcome.write_text(json.dumps(failures), encoding="utf-8")
        return json.loads(outcome.read_text(encoding="utf-8"))


def _session_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory of this test session that all its processes share: under
    pytest-xdist each worker's temporary root is a folder of the session's own."""
    base = tmp_path_factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "docs-exec"


@pytest.fixture(scope="module")
def tutorials(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tutorials]:
    root = tmp_path_factory.mktemp("docs-exec")
    # The commands start from one process that imported torch once (forkserver.py); its
    # socket in a short path of its own (a socket's path is at most ~100 bytes).
    with ExitStack() as stack:
        short = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="docs-exec-")))
        server = stack.enter_context(forkserver(short / "fork.sock"))
        yield Tutorials(root, _session_dir(tmp_path_factory), server)


@pytest.mark.parametrize("path", TUTORIALS, ids=_name)
def test_the_commands_of_a_tutorial_run(path: Path, tutorials: Tutorials) -> None:
    page = read_page(path)
    assert page.of("sh"), f"{_name(path)} shows no command to run"
    with tutorials.alone():
        failures = tutorials.ensure(path.name)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("path", PAGES, ids=_name)
def test_the_python_of_a_page_runs(path: Path, tutorials: Tutorials, tmp_path: Path) -> None:
    page: Page = read_page(path)
    if not page.after:
        done = run_python(page, tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
        return
    with tutorials.alone():  # the page reads their runs: none is being written meanwhile
        for name in page.after:
            assert (DOCS / name).is_file(), f"{_name(path)}: <!-- after: {name} --> is no page"
            failures = tutorials.ensure(name)
            assert not failures, f"{name}, which {_name(path)} builds on, fails:\n" + "\n".join(
                failures
            )
        done = run_python(page, tutorials.root)
    assert done.returncode == 0, done.stdout + done.stderr
