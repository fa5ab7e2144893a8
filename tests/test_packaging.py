"""The distribution: `pip wheel .` builds a wheel that installs and runs in a fresh venv.

Offline and fast: the wheel is built without build isolation (the setuptools already
installed) and without dependencies; the fresh venv sees this interpreter's
site-packages through a ``.pth`` line (torch, numpy, ... are not downloaded again), while
rnnkit itself comes from the wheel alone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

import rnnkit
from rnnkit.bptt import native

ROOT = Path(__file__).resolve().parents[1]


def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{argv[:3]} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built from a copy of the sources (the build writes build/ and egg-info)."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(
        ROOT / "src", src / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
    )
    out = tmp_path_factory.mktemp("dist")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--no-index", "-q", "-w", str(out), str(src)],
        cwd=src, env=env,
    )  # fmt: skip
    (whl,) = out.glob("rnnkit-*.whl")
    return whl


def test_wheel_contents(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert wheel.name.startswith(f"rnnkit-{rnnkit.__version__}-")
    assert "rnnkit/py.typed" in names
    # The compiled loop's C++ sources: an installed wheel builds them on first use.
    for source in native._sources():
        assert f"rnnkit/csrc/{source.name}" in names, source.name
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(wheel).read(metadata).decode()
    assert f"Version: {rnnkit.__version__}\n" in text
    requires = [line for line in text.splitlines() if line.startswith("Requires-Dist:")]
    # Ranges, never exact pins; drain3 only in its extra.
    assert any(line.startswith("Requires-Dist: torch<3,>=2.9") for line in requires), requires
    assert not any("==" in line.split(";")[0] for line in requires), requires
    assert any("drain3" in line and 'extra == "logs"' in line for line in requires), requires
    assert any(
        line.startswith("Requires-Dist: tensorboard<3,>=2.14") and 'extra == "tensorboard"' in line
        for line in requires
    ), requires


def test_wheel_installs_and_runs_in_a_fresh_venv(wheel, tmp_path):
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    # The fresh venv sees this interpreter's packages (torch etc.) after its own.
    purelib = Path(
        subprocess.check_output(
            [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], text=True
        ).strip()
    )
    (purelib / "outer.pth").write_text(sysconfig.get_path("purelib") + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    _run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
         "--no-index", "-q", str(wheel)],
        cwd=tmp_path, env=env,
    )  # fmt: skip
    version = _run([str(env_dir / "bin" / "rnnkit"), "--version"], cwd=tmp_path, env=env)
    assert version.strip() == f"rnnkit {rnnkit.__version__}"
    probe = (
        "import importlib.metadata, torch, rnnkit\n"
        f"assert rnnkit.__file__.startswith({str(purelib)!r}), rnnkit.__file__\n"
        "assert importlib.metadata.version('rnnkit') == rnnkit.__version__\n"
        "out = rnnkit.LSTM(3, 4)(torch.zeros(2, 5, 3)).outputs\n"
        "print(tuple(out.shape))\n"
        # the installed sources are the checkout's (the same library name, a hash of
        # them), and the compiled loop is there where the checkout has it
        "print(rnnkit.bptt.native._paths()[0].name, rnnkit.bptt.native.available())\n"
    )
    expected = f"(2, 5, 4)\n{native._paths()[0].name} {native.available()}"
    assert _run([str(python), "-c", probe], cwd=tmp_path, env=env).strip() == expected


def test_the_pre_commit_hook_runs_what_ci_runs_before_the_tests() -> None:
    """`.pre-commit-config.yaml` calls the Makefile's lint and typecheck targets, the ones
    `.ci/run` calls, so the checks are listed in one place."""
    import yaml

    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text(encoding="utf-8"))
    (hook,) = [h for repo in config["repos"] for h in repo["hooks"]]
    assert hook["entry"] == "make lint typecheck" and hook["pass_filenames"] is False
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "make lint typecheck" in ci
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert "\nlint:" in makefile and "\ntypecheck:" in makefile
