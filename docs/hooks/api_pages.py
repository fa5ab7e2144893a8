"""mkdocs hook: the API reference pages, generated from the package tree at build time.

One page per package below ``rnnkit`` (``api/cells.md``, ``api/app.tasks.md``, ...)
renders the docstrings of the package and of each of its modules (mkdocstrings);
``api/modules.md`` does the same for the top-level modules and ``api/rnnkit.md`` for the
public names of ``import rnnkit``. A module added to the package appears without editing
any page; a new package needs its line in the ``nav`` of ``mkdocs.yml`` (``mkdocs build
--strict`` fails until then).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from markdown.extensions import Extension
from markdown.preprocessors import Preprocessor
from mkdocs.structure.files import File, Files

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "rnnkit"
# Entry points and internals with nothing to document for a user of the library.
SKIP = {"__init__", "__main__"}


def _modules(folder: Path) -> list[str]:
    return sorted(p.stem for p in folder.glob("*.py") if p.stem not in SKIP)


def _block(name: str, **options: str) -> str:
    lines = [f"::: {name}"]
    if options:
        lines.append("    options:")
        lines += [f"      {key}: {value}" for key, value in options.items()]
    return "\n".join(lines) + "\n"


def pages() -> dict[str, str]:
    """``{path under docs/: Markdown}`` of every API page."""
    out = {
        "api/rnnkit.md": "# rnnkit\n\nThe names of `import rnnkit`.\n\n"
        + _block("rnnkit", show_root_heading="false", show_submodules="false"),
        "api/modules.md": "# Top-level modules\n\n"
        + "\n".join(_block(f"rnnkit.{m}") for m in _modules(PACKAGE)),
    }
    # Every package below the root, nested ones (rnnkit.app.tasks) on pages of their own.
    for init in sorted(PACKAGE.rglob("__init__.py")):
        sub = init.parent
        if sub == PACKAGE:
            continue
        name = ".".join(("rnnkit", *sub.relative_to(PACKAGE).parts))
        head = _block(name, show_root_heading="false", members="false")
        body = "\n".join(_block(f"{name}.{m}") for m in _modules(sub))
        out[f"api/{name.removeprefix('rnnkit.')}.md"] = f"# {name}\n\n{head}\n{body}"
    return out


def on_files(files: Files, config: Any) -> Files:
    for path, content in pages().items():
        files.append(File.generated(config, path, content=content))
    return files


# ---- doctest examples in docstrings ------------------------------------------------------
# The house style puts a runnable ``>>>`` example straight into a docstring's text (the
# test suite runs it), not under an "Examples:" heading. Markdown would read such a line as
# prose, and its output (``[[0, 1], [2]]``) as reference links. This preprocessor fences
# every run of lines that starts with ``>>>`` (up to the next blank line) as a Python
# console session, outside code that is already fenced or indented.

_FENCES = ("```", "~~~")
# Sphinx roles in docstrings (:class:`~rnnkit.models.length.SequenceLength`) become code:
# ``~`` keeps the last component only, as Sphinx shows it.
_ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|exc|obj):`(~?)([^`]+)`")


def _role_as_code(match: re.Match[str]) -> str:
    name = match.group(2)
    return f"`{name.rsplit('.', 1)[-1] if match.group(1) else name}`"


class _DoctestFences(Preprocessor):
    def run(self, lines: list[str]) -> list[str]:
        out: list[str] = []
        fence: str | None = None  # the fence of the code block we are in, if any
        in_example = False
        for line in lines:
            stripped = line.lstrip()
            if in_example:
                if stripped:
                    out.append(line)
                    continue
                out.append("```")
                in_example = False
            if fence is None and stripped.startswith(_FENCES):
                fence = stripped[:3]
            elif fence is not None and stripped.startswith(fence):
                fence = None
            elif fence is None and line.startswith(">>>"):
                out.append("```pycon")
                in_example = True
            elif fence is None:
                line = _ROLE.sub(_role_as_code, line)
            out.append(line)
        if in_example:
            out.append("```")
        return out


class DoctestExtension(Extension):
    def extendMarkdown(self, md: Any) -> None:  # noqa: N802 (Python-Markdown's name)
        # Before fenced_code (priority 25) reads the fences this adds.
        md.preprocessors.register(_DoctestFences(md), "rnnkit_doctest_fences", 28)


def on_config(config: Any) -> Any:
    config.markdown_extensions.append(DoctestExtension())
    return config
