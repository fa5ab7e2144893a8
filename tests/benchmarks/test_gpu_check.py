"""The prepared GPU check (benchmarks/gpu_check.py) runs its CPU form: it cannot rot
between the sessions that have a GPU, and its correctness check compares the compiled
loop with the PyTorch-loop oracle on every cell form."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import gpu_check

FUSED_FORMS = {"rnn_tanh", "rnn_relu", "lstm", "gru_candidate_after", "gru_keep_after"}


@pytest.mark.usefixtures("single_thread")
@pytest.mark.parametrize("path", ["auto", "fused"])
def test_cpu_form_of_the_gpu_check(tmp_path: Path, path: str) -> None:
    out = tmp_path / "check.json"
    argv = ["--device", "cpu", "--quick", "--no-speed", "--path", path, "--out", str(out)]
    status = gpu_check.main(argv)
    result = json.loads(out.read_text())
    assert status == 0, result
    forms = {(c["form"], c["mask"], c["dtype"]) for c in result["correctness"]}
    assert len(forms) == 2 * 2 * len(gpu_check.FORMS)
    for check in result["correctness"]:
        tol = 1e-10 if check["dtype"] == "float64" else 2e-5
        assert check["max_rel_err"] <= tol, check
        # On the CPU "auto" never takes the fused kernels; "fused" takes them for every
        # layer whose function is theirs: lengths, not holes (2 layers x 2 directions,
        # nothing between them: the whole stack in one call).
        fused = path == "fused" and check["mask"] == "lengths" and check["form"] in FUSED_FORMS
        assert check["fused_calls"] == (1 if fused else 0), check


@pytest.mark.slow
def test_cpu_form_of_the_triton_rows(tmp_path: Path) -> None:
    """``--path triton``: every layer on the Triton steps, here in Triton's interpreter (a
    process of its own: the variable is read when the kernels are imported), for two
    forms (``--forms``: the Triton steps' own tests hold every form to the explicit
    BPTT; this one checks the script's path through them)."""
    import os
    import subprocess

    pytest.importorskip("triton")
    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "check.json"
    forms = ["lstm", "gru_keep_before"]
    argv = ["--device", "cpu", "--quick", "--no-speed", "--path", "triton", "--out", str(out),
            "--forms", ",".join(forms)]  # fmt: skip
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(root / "src"), env.get("PYTHONPATH", "")])
    run = subprocess.run(
        [sys.executable, str(root / "benchmarks/gpu_check.py"), *argv], env=env, check=False
    )
    result = json.loads(out.read_text())
    assert run.returncode == 0, result
    assert len(result["correctness"]) == 2 * 2 * len(forms)
    assert {check["form"] for check in result["correctness"]} == set(forms)
    for check in result["correctness"]:
        assert check["path"] == "triton" and check["ok"], check
        assert (check["fused_calls"], check["steps_calls"]) == (0, 4), check


def test_an_unknown_form_is_named(capsys) -> None:
    with pytest.raises(SystemExit):
        gpu_check.main(["--device", "cpu", "--forms", "lstm,gru_sideways"])
    assert "--forms: no form gru_sideways" in capsys.readouterr().err


def test_without_cuda_it_says_so(capsys) -> None:
    if gpu_check.torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert gpu_check.main(["--device", "cuda"]) == 2
    assert "no CUDA device here" in capsys.readouterr().err


@pytest.mark.usefixtures("single_thread")
def test_the_suite_script_parses_and_its_tables_read_the_check(tmp_path: Path) -> None:
    import subprocess

    import gpu_tables

    root = Path(__file__).resolve().parents[2]
    assert subprocess.run(["sh", "-n", str(root / "benchmarks/gpu_suite.sh")]).returncode == 0
    gpu_check.main(
        ["--device", "cpu", "--quick", "--no-speed", "--out", str(tmp_path / "gpu_check.json")]
    )
    lines = gpu_tables.correctness_table(json.loads((tmp_path / "gpu_check.json").read_text()))
    assert len(lines) == 2 + 2 * 2 * len(gpu_check.FORMS)
    assert all(line.endswith("| yes |") for line in lines[2:])
    row = {
        "cell": "lstm",
        "H": 8,
        "B": 2,
        "T": 3,
        "train_torch_ms": 2.0,
        "train_rnnkit_ms": 1.0,
        "train_loop_ms": 4.0,
        "train_holes_ms": 8.0,
        "infer_torch_ms": 1.0,
        "infer_rnnkit_ms": 1.0,
        "infer_loop_ms": 2.0,
        "train_torch_over_rnnkit": 2.0,
        "infer_torch_over_rnnkit": 1.0,
        "train_torch_over_loop": 0.5,
        "infer_torch_over_loop": 0.5,
        "train_torch_over_holes": 0.25,
    }
    assert gpu_tables.speed_table({"speed": [row]})[2].startswith(
        "| lstm | 8 | 2 | 3 | 2.00 | 1.00 | 2.00 | 0.50 | 0.25 |"
    )
    # the windowed BPTT(τ)'s column: its ratio where the row measured it, else "–"
    header = [c.strip() for c in gpu_tables.speed_table({})[0].split("|")]
    at = header.index("window ratio")
    windowed = {**row, "window": 20, "train_torch_over_window": 0.75}
    cells = [c.strip() for c in gpu_tables.speed_table({"speed": [row, windowed]})[2].split("|")]
    assert cells[at] == "–"
    cells = [c.strip() for c in gpu_tables.speed_table({"speed": [row, windowed]})[3].split("|")]
    assert cells[at] == "0.75"
    # the Triton steps in CUDA graphs: torch.nn's time over theirs, where measured
    at = header.index("graphs ratio")
    graphed = {**row, "train_torch_over_graphs": 1.25}
    table = gpu_tables.speed_table({"speed": [row, graphed]})
    assert [[c.strip() for c in line.split("|")][at] for line in table[2:]] == ["–", "1.25"]
    assert len(table[1].split("|")) == len(table[0].split("|"))
    # the drop-in (rnnkit.nn) against torch's layer, training and inference, where measured
    dropin = {**row, "train_torch_over_dropin": 0.98, "infer_torch_over_dropin": 1.02}
    table = gpu_tables.speed_table({"speed": [row, dropin]})
    at = [i for i, c in enumerate(header) if c == "drop-in ratio"]
    assert len(at) == 2
    assert [[c.strip() for c in table[3].split("|")][i] for i in at] == ["0.98", "1.02"]
    assert [[c.strip() for c in table[2].split("|")][i] for i in at] == ["–", "–"]
    # what the second-derivative node costs a training call, where measured
    at = header.index("2nd-order node cost")
    costed = {**row, "train_node_cost": 1.03}
    table = gpu_tables.speed_table({"speed": [row, costed]})
    assert [[c.strip() for c in line.split("|")][at] for line in table[2:]] == ["–", "1.03"]
    assert gpu_tables.main([str(tmp_path)]) == 0


def test_the_suite_collects_every_gpu_test_file_and_no_other() -> None:
    """The suite runs pytest on the files that hold gpu-marked tests only (collecting all of
    tests/ imports test-only packages a GPU machine may lack): its selection, run as the
    script runs it, is every such file."""
    import re
    import subprocess

    root = Path(__file__).resolve().parents[2]
    script = (root / "benchmarks/gpu_suite.sh").read_text(encoding="utf-8")
    line = next(x for x in script.splitlines() if x.startswith("gpu_files=$("))
    selection = line[len("gpu_files=$(") : -1]
    run = subprocess.run(["sh", "-c", selection], cwd=root, capture_output=True, text=True)
    got = set(run.stdout.split())
    want = {
        str(p.relative_to(root))
        for p in (root / "tests").rglob("test_*.py")
        if re.search(r"\bmark\.gpu\b", p.read_text(encoding="utf-8"))
    }
    assert want and got == want
    assert re.search(r"-m gpu .*\n.*\$gpu_files", script)


def test_the_correctness_rows_run_without_tf32(monkeypatch) -> None:
    """cuDNN's recurrent kernels use TF32 by default (``torch.backends.cudnn.allow_tf32``),
    whose error is far outside the float32 rows' 2e-5: the device's runs turn it off."""
    import torch

    seen: list[tuple[str, bool]] = []
    real = gpu_check._run

    def recorded(layer, x, mask, state, device, dtype):
        seen.append((device, torch.backends.cudnn.allow_tf32))
        return real(layer, x, mask, state, device, dtype)

    monkeypatch.setattr(gpu_check, "_run", recorded)
    monkeypatch.setattr(gpu_check, "FORMS", gpu_check.FORMS[:1])
    assert torch.backends.cudnn.allow_tf32  # torch's default, which the check must not keep
    rows = gpu_check.correctness("cpu", (2, 3, 2, 2))
    assert all(r["ok"] for r in rows)
    # the oracle first, then each dtype's run on the device: TF32 off in the latter only
    assert seen[:3] == [("cpu", True), ("cpu", False), ("cpu", False)]
    assert torch.backends.cudnn.allow_tf32


def test_the_triton_rows_need_triton_to_run_on_the_gpu(monkeypatch) -> None:
    """triton installed but failing its first-use probe on the GPU (a driver it does not
    support, say): the check runs without the Triton rows rather than raising there."""
    import torch

    from rnnkit.bptt import gpu_route

    monkeypatch.setattr(gpu_route, "triton_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(gpu_route, "_runs_on", lambda device: "RuntimeError: no driver")
    assert not gpu_check._with_steps("cuda")
    monkeypatch.setattr(gpu_route, "_runs_on", lambda device: None)
    assert gpu_check._with_steps("cuda")
    assert not gpu_check._with_steps("cpu")


def _untimed(monkeypatch) -> list[str]:
    """``gpu_check._timed`` replaced by one untimed call of each contender (1 ms each);
    returns the list the contenders' names are appended to."""
    ran: list[str] = []

    def once(fn, device, rounds, block_s=0.2):
        ran.append(fn.__name__)
        fn()
        return [1e-3]

    monkeypatch.setattr(gpu_check, "_timed", once)
    return ran


def test_a_speed_row_runs_every_contender_on_the_cpu(monkeypatch) -> None:
    """The speed rows run only where a GPU is lent: each contender of one row (the window,
    the CUDA-graph and the drop-in columns included) is run here once, untimed, so that
    none can rot between GPU runs."""
    ran = _untimed(monkeypatch)
    row = gpu_check._speed_row("lstm", 4, 2, 3, "cpu", 1, window=2, graphs=True, dropin=True)
    assert {"train_dropin", "infer_dropin", "train_window", "train_holes"} <= set(ran)
    assert "without_second_order_node" in ran
    assert row["train_torch_over_dropin"] == row["infer_torch_over_dropin"] == 1.0
    assert row["train_node_cost"] == 1.0
    assert row["train_torch_over_window"] == 1.0


def test_a_step_row_runs_every_contender_on_the_cpu(monkeypatch) -> None:
    """The single-step rows run only where a GPU is lent: each contender runs here once,
    untimed, and the table reads the row."""
    import gpu_tables

    ran = _untimed(monkeypatch)
    row = gpu_check._step_row("gru", 2, 4, 3, "cpu", 1)
    assert ran == ["torch_steps", "rnnkit_steps", "fused_steps", "dropin_steps"]
    assert row["step_torch_us"] == pytest.approx(1e3 / gpu_check.STEPS)
    assert row["step_torch_over_rnnkit"] == row["step_torch_over_dropin"] == 1.0
    table = gpu_tables.steps_table({"steps": [row]})
    assert table[2] == "| gru | 2 | 4 | 3 | 50 | 1.00 | 1.00 | 1.00 |"
    assert len(table[1].split("|")) == len(table[0].split("|"))


def test_a_stack_row_runs_both_contenders_and_counts_the_calls(monkeypatch) -> None:
    """The stack rows run only where a GPU is lent: here each contender runs once,
    untimed, on the fused path forced (PyTorch's CPU kernels in cuDNN's place), and the
    calls counted are the route's: one for the stack, one a layer with dropout drawn."""
    import gpu_tables

    from rnnkit.bptt.fused import use_fused

    ran = _untimed(monkeypatch)
    with use_fused("fused"):
        rows = [
            gpu_check._stack_row("gru", bi, p, 4, 3, 5, "cpu", 1)
            for bi, p in ((False, 0.0), (True, 0.3))
        ]
    assert ran == ["torch_train", "rnnkit_train"] * 2
    assert [r["calls"] for r in rows] == [1, 2]
    table = gpu_tables.stacks_table({"stacks": rows})
    assert table[3] == "| gru | 2 | 0.3 | 4 | 3 | 5 | 1.00 | 1.00 | 2 |"
    assert len(table[1].split("|")) == len(table[0].split("|"))


def test_a_run_stopped_in_the_speed_grid_keeps_its_finished_rows(tmp_path, monkeypatch) -> None:
    """The suite stops the check at its time limit: the result file holds the correctness
    rows, the short sections and every speed row finished before the stop."""
    _untimed(monkeypatch)
    real = gpu_check._speed_row
    calls: list[tuple] = []

    def stopped_at_the_second(*args, **kwargs):
        calls.append(args)
        if len(calls) == 2:
            raise KeyboardInterrupt  # as the suite's `timeout` stops the process
        return real(*args, **kwargs)

    monkeypatch.setattr(gpu_check, "_speed_row", stopped_at_the_second)
    out = tmp_path / "check.json"
    with pytest.raises(KeyboardInterrupt):
        gpu_check.main(["--device", "cpu", "--quick", "--out", str(out)])
    result = json.loads(out.read_text())
    assert len(result["correctness"]) == 2 * 2 * len(gpu_check.FORMS)
    assert len(result["steps"]) == 2 and len(result["stacks"]) == 8
    assert [(r["cell"], r["H"]) for r in result["speed"]] == [("lstm", 16)]
    assert not list(tmp_path.glob("*.part"))


def test_the_check_keeps_its_tensors_where_it_says(tmp_path, monkeypatch) -> None:
    """Every row of the check run once on a stand-in device (``tests/device_placement.py``;
    the CPU reference layers stay on the host): nothing made on the host meets the
    device, and nothing on the device is read as numpy."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from device_placement import DEVICE, DevicePlacement

    _untimed(monkeypatch)
    out = tmp_path / "check.json"
    with DevicePlacement(parameters=False) as placed:
        status = gpu_check.main(["--device", str(DEVICE), "--quick", "--out", str(out)])
    assert status == 0
    result = json.loads(out.read_text())
    assert len(result["speed"]) == 3 and len(result["stacks"]) == 8
    assert not placed.violations, dict(placed.violations)
