"""Run the code of the documentation as a reader would (CONTRIBUTING.md, "Documentation
that runs").

A page is cut into its fenced blocks (:func:`read_page`); what runs:

* every ```` ```python ```` block of a page, in page order, in one namespace, in one
  Python process started in the page's working directory (:func:`run_python`). A block
  whose first line starts with ``>>>`` runs as a doctest (``...`` in its shown output
  matches anything);
* every ```` ```sh ```` block of a tutorial, with ``bash -e -o pipefail``, in page order,
  in the tutorials' working directory (:func:`run_shell`). An ```` ```output ```` block
  right after it is the command's expected standard output (``...`` matches anything);
  with ``<!-- figures vary -->`` above it, every number counts as the same number.

What a page says to the runner, in HTML comments (invisible on the site):

* ``<!-- after: tutorial-lm.md tutorial-tag.md -->``: the page's code reads the runs
  of these tutorials, so their commands run first, in the same directory;
* ``<!-- skip: why -->`` right above a fence: the block is shown, never run
  (``pip install``, a command that needs a GPU);
* ``<!-- needs: module -->`` right above a fence: the block runs only where ``module``
  imports (an optional extra).

The tutorials' ``rnnkit train`` commands run at a small budget: the ``rnnkit`` on the
``PATH`` of the shell blocks (:func:`shell_env`) appends ``--steps N`` (the last
``--steps`` wins and overrides ``--epochs``) where ``DOCS_EXEC_STEPS=N`` is set, so a
page shows the real command and the test runs it in seconds. With a
:func:`forkserver`, that ``rnnkit`` and ``python`` start from one process that imported
torch once (``forkserver.py``).
"""

from __future__ import annotations

import doctest
import json
import os
import re
import stat
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

FENCE = re.compile(r"^(`{3,})([\w-]*)\s*$")
DIRECTIVE = re.compile(r"^<!--\s*([\w ]+?)\s*(?::\s*(.*?))?\s*-->\s*$")
BLOCK_MARKS = ("skip", "needs", "figures vary")
# A number of a summary line: 3.27, 229,794, 1e-3 (not the digits inside a word).
NUMBER = re.compile(r"(?<![\w.])[-+]?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?(?![\w])")
DRIVER = Path(__file__).with_name("mdexec_driver.py")
FORKSERVER = Path(__file__).with_name("forkserver.py")


class PageError(ValueError):
    """A page the runner cannot read: an unclosed fence, an unknown directive."""


@dataclass(frozen=True)
class Block:
    """One fenced block: its language, its text and the marks written above it."""

    page: Path
    line: int  # 1-based line of the block's first line of code
    lang: str
    text: str
    marks: dict[str, str] = field(default_factory=dict)

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


@dataclass(frozen=True)
class Page:
    path: Path
    blocks: tuple[Block, ...]
    after: tuple[str, ...]  # tutorials whose runs the page's code reads

    def of(self, lang: str) -> list[Block]:
        return [b for b in self.blocks if b.lang == lang]


def read_page(path: Path) -> Page:
    """Cut ``path`` into its fenced blocks, with the directives that concern them."""
    blocks: list[Block] = []
    after: list[str] = []
    marks: dict[str, str] = {}
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        directive = DIRECTIVE.match(line)
        fence = FENCE.match(line)
        if directive:
            name, value = directive.group(1), directive.group(2) or ""
            if name == "after":
                after.extend(value.replace(",", " ").split())
            elif name in BLOCK_MARKS:
                marks[name] = value
            else:
                raise PageError(f"{path}:{i + 1}: unknown directive {name!r}")
        elif fence:
            end = next(
                (j for j in range(i + 1, len(lines)) if lines[j].rstrip() == fence.group(1)),
                None,
            )
            if end is None:
                raise PageError(f"{path}:{i + 1}: the fence is never closed")
            text = "\n".join(lines[i + 1 : end]) + "\n"
            blocks.append(Block(path, i + 2, fence.group(2), text, marks))
            marks = {}
            i = end
        elif line.strip():
            marks = {}  # a mark belongs to the fence right below it (blank lines allowed)
        i += 1
    return Page(path, tuple(blocks), tuple(after))


# ---- Python blocks -----------------------------------------------------------------


def child_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) with the rnnkit this process imported first on
    ``PYTHONPATH``, so the pages run the code under test wherever the child starts."""
    import rnnkit

    env = dict(os.environ if env is None else env)
    source = str(Path(rnnkit.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([source, *filter(None, [env.get("PYTHONPATH")])])
    return env


def run_python(page: Page, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run the page's ``python`` blocks in order in one fresh interpreter in ``cwd``.

    A warning of rnnkit's or of the page's own code is an error (``mdexec_driver``). A
    failing block stops the page; the output names it as ``page:line`` and the traceback
    points into the page.
    """
    blocks = [
        {"line": b.line, "text": b.text, "skip": b.marks.get("skip"), "needs": b.marks.get("needs")}
        for b in page.of("python")
    ]
    spec = cwd / ".mdexec-blocks.json"
    spec.write_text(json.dumps({"page": str(page.path), "blocks": blocks}), encoding="utf-8")
    try:
        return subprocess.run(
            [sys.executable, str(DRIVER), str(spec)],
            cwd=cwd,
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    finally:
        spec.unlink()


# ---- Shell blocks ------------------------------------------------------------------


def shell_env(bin_dir: Path, steps: int | None, server: Path | None = None) -> dict[str, str]:
    """The environment of the shell blocks: ``python`` and ``rnnkit`` are this test's
    interpreter and its rnnkit, and ``rnnkit train`` gets ``--steps steps`` appended
    (none: the page's own budget). With ``server`` (the socket of a running
    ``forkserver.py``), the two commands start from its process, torch imported."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    scripts = {}
    for name in ("python", "rnnkit"):
        if server is not None:
            scripts[name] = (
                f'exec "{sys.executable}" "{FORKSERVER}" --client "{server}" {name} "$@"\n'
            )
    scripts.setdefault("python", f'exec "{sys.executable}" "$@"\n')
    scripts.setdefault(
        "rnnkit",
        # The budget of the doc-execution test: DOCS_EXEC_STEPS=N appends "--steps N".
        'if [ "$1" = train ] && [ -n "$DOCS_EXEC_STEPS" ]; then\n'
        f'  exec "{sys.executable}" -m rnnkit "$@" --steps "$DOCS_EXEC_STEPS"\n'
        "fi\n"
        f'exec "{sys.executable}" -m rnnkit "$@"\n',
    )
    for name, body in scripts.items():
        script = bin_dir / name
        script.write_text("#!/bin/sh\n" + body, encoding="utf-8")
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
    env = child_env()
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env.pop("DOCS_EXEC_STEPS", None)
    if steps is not None:
        env["DOCS_EXEC_STEPS"] = str(steps)
    return env


@contextmanager
def forkserver(path: Path) -> Iterator[Path]:
    """A running ``forkserver.py`` listening on ``path`` (its socket), stopped after."""
    process = subprocess.Popen(
        [sys.executable, str(FORKSERVER), str(path)],
        env=child_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        ready = process.stdout.readline()
        assert ready == "ready\n", f"forkserver.py did not start (exit {process.wait()})"
        yield path
    finally:
        process.terminate()
        process.wait(timeout=60)
        if process.stdout is not None:
            process.stdout.close()


def output_matches(want: str, got: str, figures_vary: bool = False) -> bool:
    """``got`` is the shown output ``want``: line ends ignored, ``...`` matching anything,
    and with ``figures_vary`` every number matching every number.

    >>> output_matches("trained 300 steps in 12 s", "trained 5 steps in 0 s", True)
    True
    >>> output_matches("trained 300 steps", "trained 5 steps")
    False
    >>> output_matches("threads: 1 (...)", "threads: 1 (fixed)\\n")
    True
    """
    if figures_vary:
        want, got = NUMBER.sub("0", want), NUMBER.sub("0", got)
    want = "\n".join(line.rstrip() for line in want.strip("\n").splitlines()) + "\n"
    got = "\n".join(line.rstrip() for line in got.strip("\n").splitlines()) + "\n"
    return doctest.OutputChecker().check_output(want, got, doctest.ELLIPSIS)


def run_shell(page: Page, cwd: Path, env: dict[str, str], timeout: float = 600) -> list[str]:
    """Run the page's ``sh`` blocks in order in ``cwd``; returns what went wrong (the
    first failing block stops the page), each as one message naming ``page:line``."""
    blocks = list(page.blocks)
    for k, block in enumerate(blocks):
        if block.lang != "sh" or "skip" in block.marks:
            continue
        done = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", block.text],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if done.returncode != 0:
            return [
                f"{block.where}: exit status {done.returncode}\n{done.stdout}{done.stderr}".rstrip()
            ]
        shown = blocks[k + 1] if k + 1 < len(blocks) else None
        if (
            shown is not None
            and shown.lang == "output"
            and not output_matches(shown.text, done.stdout, "figures vary" in shown.marks)
        ):
            return [
                f"{shown.where}: the output differs from the page's\n--- shown:\n"
                f"{shown.text}--- printed:\n{done.stdout}"
            ]
    return []


def check_tutorial_fences(page: Page) -> list[str]:
    """A tutorial says what each block is: ``sh`` runs, ``output`` is checked, ``text``
    (data, a file's content) and ``python`` are shown; an untagged block is an error."""
    return [
        f"{b.where}: a tutorial's block needs a language (sh, output, text, python, toml)"
        for b in page.blocks
        if not b.lang
    ] + [
        f"{b.where}: an output block follows a sh block"
        for k, b in enumerate(page.blocks)
        if b.lang == "output" and (k == 0 or page.blocks[k - 1].lang != "sh")
    ]
