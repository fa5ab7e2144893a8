"""``import rnnkit`` changes nothing outside rnnkit; the ``rnnkit`` command tunes its own
process; ``rnnkit.tune_process()`` is the one explicit call; ``import rnnkit`` works
without ``fcntl`` (Windows)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rnnkit import tuning
from rnnkit.data import locks


def _python(code: str, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    out = subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def test_importing_rnnkit_sets_no_environment_variable():
    assert _python("import os, rnnkit; print(os.environ.get('GOMP_SPINCOUNT'))") == "None"
    # "-m rnnkit" among the program's own arguments (`python -m pytest -m rnnkit`, a marker)
    # made the import act as the command: the environment set, Ctrl-C taken over
    code = "import os, signal, rnnkit; print(os.environ.get('GOMP_SPINCOUNT'), " + (
        "signal.getsignal(signal.SIGINT) is signal.default_int_handler)"
    )
    assert _python(code, "-m", "rnnkit") == "None True"


def test_importing_rnnkit_leaves_the_allocator_alone(monkeypatch):
    calls = []
    monkeypatch.setattr(tuning, "keep_freed_memory", lambda: calls.append(1) or True)
    monkeypatch.setattr(tuning, "launched_as_command", lambda: False)
    import importlib

    import rnnkit

    importlib.reload(rnnkit)
    assert calls == []


def test_the_rnnkit_command_tunes_its_own_process_before_torch_loads():
    code = (
        "import sys; sys.argv[0] = '/usr/local/bin/rnnkit'\n"
        "import os, rnnkit; print(os.environ.get('GOMP_SPINCOUNT'))"
    )
    assert _python(code) == "10000"


def test_tune_process_is_one_call_reporting_what_took_effect():
    code = (
        "import os, rnnkit\n"
        "done = rnnkit.tune_process()\n"
        "print(sorted(done.items()), os.environ.get('GOMP_SPINCOUNT'))"
    )
    printed = _python(code)
    # torch is loaded by then: OpenMP's spin count can no longer change, and says so
    assert printed.startswith("[('keep_freed_memory', ") and "('openmp_spin', False)" in printed
    assert printed.endswith("None")


def test_launched_as_command():
    assert tuning.launched_as_command(["/opt/venv/bin/rnnkit", "train"], [])
    assert tuning.launched_as_command(["-m"], ["/usr/bin/python3", "-X", "dev", "-m", "rnnkit"])
    assert not tuning.launched_as_command(["serve.py"], ["python", "serve.py", "-m", "x"])
    assert not tuning.launched_as_command(["-c"], ["python", "-c", "import rnnkit"])
    assert not tuning.launched_as_command(["-m"], ["python", "-m", "pytest", "-m", "rnnkit"])
    assert tuning.launched_as_command(["-m"], ["python", "-Wignore", "-Bm", "rnnkit", "train"])
    assert tuning.launched_as_command(["-m"], ["python", "-mrnnkit", "train"])


def test_import_and_locks_without_fcntl(monkeypatch, tmp_path):
    """As on Windows: no fcntl. The import works; a lock falls back (here: none to take)."""
    assert _python("import sys; sys.modules['fcntl'] = None; import rnnkit; print('ok')") == "ok"
    real = locks._module
    monkeypatch.setattr(locks, "_module", lambda name: None if name == "fcntl" else real(name))
    with open(tmp_path / "f.lock", "w") as f:
        assert locks.lock(f.fileno(), blocking=False) is True


@pytest.mark.skipif(sys.platform == "win32", reason="fcntl's flock")
def test_a_held_lock_is_refused_without_waiting(tmp_path):
    path = tmp_path / "f.lock"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, sys, time; f = open(sys.argv[1], 'w'); "
            "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(30)",
            str(path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with open(path, "w") as f:
            assert locks.lock(f.fileno(), blocking=False) is False
    finally:
        holder.kill()
        holder.wait()
        assert holder.stdout is not None
        holder.stdout.close()
    with open(path, "w") as f:
        assert locks.lock(f.fileno(), blocking=False) is True


def test_the_commands_ctrl_c_while_torch_loads_is_one_line_and_status_130():
    """Ctrl-C in the second or two the command spends importing torch printed a traceback
    from inside torch's import. Here the signal arrives during the import, by itself."""
    code = (
        "import sys; sys.argv[0] = '/usr/local/bin/rnnkit'\n"
        "import os, signal, builtins\n"
        "real = builtins.__import__\n"
        "def importing(name, *a, **k):\n"
        "    if name == 'torch': os.kill(os.getpid(), signal.SIGINT)\n"
        "    return real(name, *a, **k)\n"
        "builtins.__import__ = importing\n"
        "import rnnkit\n"
        "print('not reached')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert (done.returncode, done.stdout, done.stderr) == (130, "", "rnnkit: interrupted\n")


def test_a_program_keeps_its_own_ctrl_c_and_main_gives_pythons_back():
    import signal

    # A program importing rnnkit is not the command: Python's handler stays.
    assert _python("import signal, rnnkit; print(signal.getsignal(signal.SIGINT).__name__)") == (
        "default_int_handler"
    )
    # The command's own handler lasts until main() runs; a user's handler is never taken.
    code = (
        "import sys; sys.argv[0] = '/usr/local/bin/rnnkit'\n"
        "import signal, rnnkit\n"
        "print(signal.getsignal(signal.SIGINT).__name__)\n"
        "from rnnkit.app.cli.main import main\n"
        "main([])\n"
        "print(signal.getsignal(signal.SIGINT).__name__)\n"
    )
    assert _python(code).split() == ["_interrupted_while_loading", "default_int_handler"]

    def mine(signum, frame):
        raise AssertionError("not called")

    before = signal.signal(signal.SIGINT, mine)
    try:
        tuning.interrupt_quietly_while_loading()
        assert signal.getsignal(signal.SIGINT) is mine
        tuning.loaded()
        assert signal.getsignal(signal.SIGINT) is mine
    finally:
        signal.signal(signal.SIGINT, before)
