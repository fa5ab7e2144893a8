"""A data-parallel training script written for ``torch.nn`` runs unchanged with ``from
rnnkit import nn``: ``tests/layers/programs/ddp_accumulation.py`` (two gloo processes
started by ``torch.multiprocessing.spawn``, ``DistributedDataParallel`` over an LSTM
regressor and over a bidirectional GRU fed packed sequences, a ``DistributedSampler``,
gradient accumulation with ``no_sync``) runs as a script, as written and with only its
import line swapped, and the two runs agree in float64."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import rnnkit

PROGRAM = Path(__file__).parent / "programs" / "ddp_accumulation.py"
TORCH_IMPORT = "from torch import nn\n"

pytestmark = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()),
    reason="torch.distributed with gloo is not available",
)


def _run(tmp_path: Path, swapped: bool) -> Path:
    """Runs the program as a script (spawned processes import their parent's main
    module by its path, as they do a user's script) and returns its output folder."""
    source = PROGRAM.read_text()
    assert source.count(TORCH_IMPORT) == 1
    if swapped:
        swap = "from rnnkit import nn  # was: from torch import nn\n"
        source = source.replace(TORCH_IMPORT, swap)
    script = tmp_path / f"ddp_{int(swapped)}.py"
    script.write_text(source)
    out = tmp_path / f"out_{int(swapped)}"
    # the rnnkit under test, for the script and the processes it starts
    here = str(Path(rnnkit.__file__).parents[1])
    path = os.pathsep.join([here, os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    cmd = [sys.executable, "-W", "error", str(script), str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    return out


def test_ddp_with_no_sync_accumulation_trains_as_with_torchs_layers(tmp_path):
    theirs, ours = _run(tmp_path, False), _run(tmp_path, True)
    for rank in (0, 1):
        mine = json.loads((ours / f"rank{rank}.json").read_text())
        reference = json.loads((theirs / f"rank{rank}.json").read_text())
        for model in ("regressor", "classifier"):
            a, b = mine[model], reference[model]
            assert a["lengths"] == b["lengths"]  # the sampler's shares, epoch by epoch
            assert a["losses"] == pytest.approx(b["losses"], rel=1e-9)
            # find_unused_parameters=False: every parameter had a gradient at every step
            # (DDP raises at the next forward otherwise)
            assert len(a["all_grads"]) == 4 and all(a["all_grads"])
    # a micro-batch of one sequence of a single step, on each rank, went through both
    for rank in (0, 1):
        assert [1] in json.loads((ours / f"rank{rank}.json").read_text())["classifier"]["lengths"]
    for model in ("regressor", "classifier"):
        mine = torch.load(ours / f"{model}.pt", weights_only=True)
        reference = torch.load(theirs / f"{model}.pt", weights_only=True)
        assert mine.keys() == reference.keys()
        for key in reference:
            torch.testing.assert_close(mine[key], reference[key], rtol=1e-9, atol=1e-12)
