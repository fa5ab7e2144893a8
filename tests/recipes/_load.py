"""Load a recipe's ``prepare.py`` (recipes are scripts, not a package) as a module."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


def load_prepare(recipe: str) -> ModuleType:
    path = RECIPES / recipe / "prepare.py"
    spec = importlib.util.spec_from_file_location(f"recipe_{recipe}_prepare", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
