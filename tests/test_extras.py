"""The optional extras are named one way everywhere.

A message of the library that names a missing extra says ``pip install 'rnnkit[X]'``
(which works wherever rnnkit is installed); the pages say the same, or ``'.[X]'`` for
an install from a checkout; every extra named is one of ``pyproject.toml``, and the
README's Install section lists each extra a message names.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10: the same parser, as a package
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
# pip install 'rnnkit[logs]', pip install -c constraints.txt ".[onnx,test-onnx]", ...
INSTALL = re.compile(r"""pip install[^'"\n]*['"]([^'"\s\[]*)\[([\w,-]+)\]['"]""")


def extras() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return set(project["project"]["optional-dependencies"])


def hints(path: Path) -> list[tuple[str, str]]:
    """``(package spelling, extra)`` of every ``pip install`` of an extra in ``path``."""
    text = path.read_text(encoding="utf-8")
    return [(m.group(1), extra) for m in INSTALL.finditer(text) for extra in m.group(2).split(",")]


def test_messages_name_real_extras_as_rnnkit_extra() -> None:
    known = extras()
    named = {}
    for path in sorted((ROOT / "src" / "rnnkit").rglob("*.py")):
        for package, extra in hints(path):
            assert package == "rnnkit", f"{path}: pip install '{package}[{extra}]'"
            assert extra in known, f"{path}: no extra {extra!r} in pyproject.toml"
            named[extra] = path
    assert {"logs", "yaml", "tensorboard"} <= set(named)


def test_pages_name_real_extras_in_the_two_spellings() -> None:
    known = extras()
    pages = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
    for path in pages:
        for package, extra in hints(path):
            assert package in ("rnnkit", "."), f"{path}: pip install '{package}[{extra}]'"
            assert extra in known, f"{path}: no extra {extra!r} in pyproject.toml"


def test_the_readme_install_section_lists_every_feature_extra() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    install = readme.split("## Install", 1)[1].split("\n## ", 1)[0]
    listed = {extra for m in INSTALL.finditer(install) for extra in m.group(2).split(",")}
    named = {extra for p in (ROOT / "src" / "rnnkit").rglob("*.py") for _, extra in hints(p)}
    assert named | {"onnx"} <= listed, sorted(named | {"onnx"} - listed)
