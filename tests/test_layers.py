"""Imports go only down the layers: the ``[tool.importlinter]`` contract of pyproject.toml.

The first test runs the contract on the package as it is. The others run it on a copy of
the package with one thing broken — an upward import, a module without a layer — and
check that the contract then fails, naming what is wrong (a check that cannot fail would
prove nothing).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip(
    "importlinter", reason="import-linter (the dev extra, Python >= 3.11) is not installed"
)

ROOT = Path(__file__).resolve().parents[1]
# In a child process: the linter configures logging (and so would silence rnnkit's own
# logger here), and there ``rnnkit`` is the package under ``src`` given, checkout or copy.
LINT = (
    "import sys; from importlinter.cli import lint_imports; "
    "sys.exit(lint_imports(config_filename='pyproject.toml', no_cache=True, no_logo=True))"
)


def _lint(root: Path) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, "-c", LINT],
        cwd=root,
        env={"PYTHONPATH": str(root / "src"), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.returncode, done.stdout + done.stderr


def test_imports_only_go_down_the_layers() -> None:
    code, out = _lint(ROOT)
    assert code == 0, out
    assert "2 kept, 0 broken" in out


def _copy(tmp_path: Path) -> Path:
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    shutil.copytree(
        ROOT / "src" / "rnnkit",
        tmp_path / "src" / "rnnkit",
        ignore=shutil.ignore_patterns("__pycache__", "csrc", "*.so"),
    )
    return tmp_path / "src" / "rnnkit"


def test_an_upward_import_breaks_the_contract(tmp_path: Path) -> None:
    package = _copy(tmp_path)
    code, out = _lint(tmp_path)
    assert code == 0, out  # the copy as it is keeps the contract
    builders = package / "models" / "builders.py"
    # A model builder reading the command line's configuration: models below config.
    builders.write_text(builders.read_text() + "\nfrom rnnkit.app.config import TrainConfig\n")
    code, out = _lint(tmp_path)
    assert code == 1, out
    assert "1 kept, 1 broken" in out
    assert "rnnkit.models.builders -> rnnkit.app.config" in out


def test_an_upward_import_inside_the_application_breaks_its_contract(tmp_path: Path) -> None:
    package = _copy(tmp_path)
    config = package / "app" / "config" / "model.py"
    # The configuration reading a task: config is the application's lowest part.
    config.write_text(config.read_text() + "\nimport rnnkit.app.tasks.lm\n")
    code, out = _lint(tmp_path)
    assert code == 1, out
    assert "1 kept, 1 broken" in out
    assert "rnnkit.app.config.model -> rnnkit.app.tasks.lm" in out


def test_a_module_without_a_layer_breaks_the_contract(tmp_path: Path) -> None:
    package = _copy(tmp_path)
    (package / "newcomer.py").write_text('"""Not placed in any layer."""\n')
    code, out = _lint(tmp_path)
    assert code == 1, out
    assert "rnnkit.newcomer" in out
