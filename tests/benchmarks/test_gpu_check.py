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


@pytest.mark.usefixtures("single_thread")
def test_cpu_form_of_the_gpu_check(tmp_path: Path) -> None:
    out = tmp_path / "check.json"
    status = gpu_check.main(["--device", "cpu", "--quick", "--no-speed", "--out", str(out)])
    result = json.loads(out.read_text())
    assert status == 0, result
    forms = {(c["form"], c["dtype"]) for c in result["correctness"]}
    assert len(forms) == 2 * len(gpu_check.FORMS)
    for check in result["correctness"]:
        tol = 1e-10 if check["dtype"] == "float64" else 2e-5
        assert check["max_rel_err"] <= tol, check


def test_without_cuda_it_says_so(capsys) -> None:
    if gpu_check.torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert gpu_check.main(["--device", "cuda"]) == 2
    assert "no CUDA device here" in capsys.readouterr().err
