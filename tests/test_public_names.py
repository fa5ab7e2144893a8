"""Every subpackage's public names resolve at the package (``rnnkit.models.LanguageModel``)."""

from __future__ import annotations

import importlib

import pytest

import rnnkit

PACKAGES = (
    "cells",
    "bptt",
    "layers",
    "generation",
    "metrics",
    "models",
    "training",
    "anomaly",
    "data",
    "diagnostics",
    "app.config",
    "app.report",
    "app.tasks",
    "app.cli",
)


@pytest.mark.parametrize("name", PACKAGES)
def test_package_all_resolves(name):
    package = importlib.import_module(f"rnnkit.{name}")
    assert package.__all__, name
    for public in package.__all__:
        assert getattr(package, public) is not None, f"rnnkit.{name}.{public}"


@pytest.mark.parametrize(
    "name", ("cells", "bptt", "layers", "generation", "metrics", "models", "training", "anomaly")
)
def test_package_reexports_each_module_all(name):
    """Nothing a module declares public is missing at its package (the exceptions: names two
    modules define differently, ``CONTEXT_MODES`` of models.conditional and models.seq2seq
    and ``SCHEDULES`` of training.scheduled_sampling and training.schedules)."""
    import pkgutil

    package = importlib.import_module(f"rnnkit.{name}")
    for info in pkgutil.iter_modules(package.__path__):
        if info.name in ("torch_nn", "torch_nn_cells"):  # torch.nn's names: at rnnkit.nn
            continue
        if info.name == "triton_kernels":  # imports triton, an optional dependency; no names
            continue
        module = importlib.import_module(f"rnnkit.{name}.{info.name}")
        for public in getattr(module, "__all__", ()):
            if public in ("CONTEXT_MODES", "SCHEDULES"):
                continue
            assert getattr(package, public) is getattr(module, public), f"{name}.{public}"


def test_readme_names():
    from rnnkit.models import LanguageModel, TiedHead
    from rnnkit.training import Trainer

    assert LanguageModel.__module__ == "rnnkit.models.language_model"
    assert TiedHead.__module__ == "rnnkit.models.heads"
    assert Trainer.__module__ == "rnnkit.training.loop"
    for public in rnnkit.__all__:
        assert hasattr(rnnkit, public), public
