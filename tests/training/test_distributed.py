"""Data-parallel training over 2 gloo processes equals one process on the global batch."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rnnkit.app.cli.main import main
from rnnkit.training.distributed import DistContext

TORCHRUN = Path(sys.executable).with_name("torchrun")


def _corpus(tmp_path: Path) -> Path:
    words = "the cat sat on a mat with the hat and the bat".split()
    lines = [" ".join(words[(i * 7 + j) % len(words)] for j in range(9)) for i in range(300)]
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def _weights(run: Path) -> dict[str, torch.Tensor]:
    (snap,) = glob.glob(str(run / "snapshots" / "*" / "model.safetensors"))
    return load_file(snap)


def _common(corpus: Path, out: Path) -> list[str]:
    return [
        "train",
        "--train",
        str(corpus),
        "--out",
        str(out),
        "--hidden",
        "16",
        "--embedding",
        "8",
        "--batch-size",
        "8",
        "--bptt",
        "segment:16",
        "--dropout",  # no random masks: one process and two draw them differently
        "0",
        "--locked-dropout",
        "0",
        "--output-dropout",
        "0",
        "--quiet",
    ]


def _torchrun(args: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [str(TORCHRUN), "--standalone", "--nproc-per-node", "2", "-m", "rnnkit", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240)


@pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun is not installed beside python")
def test_two_gloo_processes_equal_one_process_and_resume_across_sizes(tmp_path):
    corpus = _corpus(tmp_path)
    two = _torchrun([*_common(corpus, tmp_path / "two"), "--steps", "6"])
    assert two.returncode == 0, two.stderr[-2000:]
    assert two.stdout.count("trained 6 steps") == 1  # only rank 0 reports
    assert main([*_common(corpus, tmp_path / "one"), "--steps", "6"]) == 0
    a, b = _weights(tmp_path / "two"), _weights(tmp_path / "one")
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-6)

    # Resume the 2-process run in ONE process: the carried stream state and the data
    # position are those of the global batch, so it continues like the straight run.
    assert main([*_common(corpus, tmp_path / "two"), "--resume", "--steps", "10"]) == 0
    assert main([*_common(corpus, tmp_path / "straight"), "--steps", "10"]) == 0
    a, b = _weights(tmp_path / "two"), _weights(tmp_path / "straight")
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun is not installed beside python")
def test_global_batch_must_split_evenly(tmp_path):
    corpus = _corpus(tmp_path)
    args = _common(corpus, tmp_path / "odd")
    args[args.index("--batch-size") + 1] = "5"
    res = _torchrun([*args, "--steps", "2"])
    assert res.returncode != 0
    assert "--batch-size 5 is the global batch" in res.stderr


def test_single_process_context_is_identity():
    ctx = DistContext()
    t = torch.arange(6.0).view(1, 1, 6, 1)
    assert not ctx.enabled and ctx.is_main
    assert ctx.rows(t, dim=2) is t and ctx.gather_rows(t, dim=2) is t
    assert ctx.all_sum(1.5, 2) == [1.5, 2]


def test_with_cuda_each_process_takes_its_local_gpu_and_nccl_reduces_there(monkeypatch):
    """Under torchrun with ``--device cuda`` each process sets its device to LOCAL_RANK
    before joining (NCCL refuses two ranks on one GPU) and the collectives' own tensors
    live there (NCCL reduces CUDA tensors only). The process group and the GPU are stand-ins
    here: what is asked of them is recorded."""
    from rnnkit.training import distributed

    calls: list[tuple[str, object]] = []
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(distributed.dist, "is_available", lambda: True)
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(("set_device", d)))
    monkeypatch.setattr(
        distributed.dist,
        "init_process_group",
        lambda backend: calls.append(("init", backend)),
    )
    monkeypatch.setattr(distributed.dist, "get_rank", lambda: 1)
    monkeypatch.setattr(distributed.dist, "get_world_size", lambda: 2)
    ctx = distributed.init_distributed("cuda")
    assert calls == [("set_device", 1), ("init", "nccl")]
    assert (ctx.rank, ctx.world_size, ctx.local_rank, ctx.device) == (1, 2, 1, "cuda:1")
    assert distributed.init_distributed("cpu").device == "cpu"
    seen: list[torch.device] = []
    monkeypatch.setattr(distributed.dist, "all_reduce", lambda t: seen.append(t.device))
    # the sum's tensor is made on ctx.device ("meta" stands in for a GPU: no values needed)
    meta = DistContext(0, 2, 0, "meta")
    with pytest.raises((NotImplementedError, RuntimeError)):  # .tolist() of meta: after it
        meta.all_sum(1.0)
    assert seen == [torch.device("meta")]
