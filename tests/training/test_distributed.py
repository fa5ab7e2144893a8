"""Data-parallel training over 2 gloo processes equals one process on the global batch."""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rnnkit.app.cli.main import main
from rnnkit.errors import ConfigError
from rnnkit.training import distributed
from rnnkit.training.distributed import DistContext, PeerLost, peer_lost

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
    assert two.stdout.count("trained 6 steps on 2 processes") == 1  # only rank 0 reports
    assert json.loads((tmp_path / "two" / "summary.json").read_text())["processes"] == 2
    assert main([*_common(corpus, tmp_path / "one"), "--steps", "6"]) == 0
    assert json.loads((tmp_path / "one" / "summary.json").read_text())["processes"] == 1
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
def test_whole_sequence_batches_resume_on_as_many_kinds_of_processes_said(tmp_path, capsys):
    """``--bptt full`` on 2 processes drops each epoch's last partial batch (300 lines in
    batches of 8: 37 batches, not 38); resumed on one process the snapshot was refused as
    "batcher state has drop_last=True but this batcher has False". Now one line says to
    resume on several processes."""
    corpus = _corpus(tmp_path)
    args = _common(corpus, tmp_path / "full")
    args[args.index("--bptt") + 1] = "full"
    two = _torchrun([*args, "--steps", "2"])
    assert two.returncode == 0, two.stderr[-2000:]
    capsys.readouterr()
    assert main([*args, "--resume", "--steps", "4"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"rnnkit train: error: {tmp_path / 'full'}: this run trained on several processes "
        "with whole-sequence batches (--bptt full or window:K), whose epochs drop their last "
        "partial batch, where one process trains it: resume it on several processes "
        "(torchrun, any number)"
    )


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

    calls: list[tuple[str, object]] = []
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(distributed.dist, "is_available", lambda: True)
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
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


# gloo's words when the other end of a collective was killed (torch 2.x, CPU)
_GLOO_RESET = (
    "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
    "[127.0.0.1]:41603: Connection reset by peer. This is typically caused by a remote "
    "worker hanging or bugs in the application."
)


def test_a_collective_broken_by_a_lost_process_is_one_line():
    lost = peer_lost(RuntimeError(_GLOO_RESET), DistContext(0, 2))
    assert isinstance(lost, PeerLost) and lost.exit_code == 1
    text = str(lost)
    assert "\n" not in text and "process 0 of 2" in text and "--resume" in text
    assert "Read error [127.0.0.1]:41603: Connection reset by peer" in text
    assert "pair.cc" not in text and "typically" not in text
    # one process, or an error of another kind: not a lost process (stays what it is)
    assert peer_lost(RuntimeError(_GLOO_RESET), DistContext()) is None
    assert (
        peer_lost(RuntimeError("mat1 and mat2 shapes cannot be multiplied"), DistContext(0, 2))
        is None
    )
    assert peer_lost(ValueError("gloo"), DistContext(0, 2)) is None


def _workers(parent: int) -> dict[str, int]:
    """RANK -> pid of torchrun's worker processes (children of ``parent``)."""
    found: dict[str, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) != parent:
            continue
        for item in environ:
            if item.startswith(b"RANK="):
                found[item[5:].decode()] = int(entry.name)
    return found


@pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun is not installed beside python")
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs Linux /proc")
def test_a_killed_process_ends_the_run_with_one_line_and_a_resumable_snapshot(tmp_path):
    corpus = _corpus(tmp_path)
    run = tmp_path / "run"
    args = [*_common(corpus, run), "--steps", "100000", "--eval-every", "10"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [str(TORCHRUN), "--standalone", "--nproc-per-node", "2", "-m", "rnnkit", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 60
        while not (run / "latest.json").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert (run / "latest.json").exists(), "no snapshot within 60 s"
        os.kill(_workers(proc.pid)["1"], signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode != 0
    # rank 0 says it once, in words (it was a 40-line traceback of loss.backward)
    said = [ln for ln in err.splitlines() if ln.startswith("rnnkit train: stopped:")]
    assert len(said) == 1 and "process 0 of 2: another process" in said[0], err[-3000:]
    assert "[rank0]:" not in err and "RuntimeError" not in err
    # what the kill left is a run that resumes (here in one process)
    step = json.loads((run / "latest.json").read_text())["step"]
    assert main([*_common(corpus, run), "--resume", "--steps", str(step + 2)]) == 0
    assert json.loads((run / "summary.json").read_text())["steps"] == step + 2


# Rank 1 dies after its 3rd step (SIGKILL); rank 0 gets torchrun's SIGTERM at the worst
# moment: its training has just ended by that death, and its line is not said yet (the
# last thing on the way out of the loop, metrics.csv, sends it).
_SIGTERM_BEFORE_THE_LINE = """
import os, signal, sys
from rnnkit.app.cli.main import main
from rnnkit.training.loop import Trainer
from rnnkit.training.run_log import RunLog

if os.environ["RANK"] == "1":
    after_step = Trainer._after_step
    def dying(self, *args):
        if self.step == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        return after_step(self, *args)
    Trainer._after_step = dying
else:
    csv_on_exit = RunLog.csv_on_exit
    def sigterm_first(self, *exc):
        os.kill(os.getpid(), signal.SIGTERM)
        return csv_on_exit(self, *exc)
    RunLog.csv_on_exit = sigterm_first
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun is not installed beside python")
def test_sigterm_between_a_lost_process_and_the_line_still_lets_the_line_be_said(tmp_path):
    """With SIGTERM's default action there, rank 0 died silently: no line at all (the
    race of the test above, about 1 run in 12 on a loaded machine)."""
    script = tmp_path / "sigterm_before_the_line.py"
    script.write_text(_SIGTERM_BEFORE_THE_LINE)
    corpus, run = _corpus(tmp_path), tmp_path / "run"
    args = [*_common(corpus, run), "--steps", "100", "--eval-every", "2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [str(TORCHRUN), "--standalone", "--nproc-per-node", "2", str(script), *args]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240)
    assert res.returncode != 0
    err = res.stderr
    said = [ln for ln in err.splitlines() if ln.startswith("rnnkit train: stopped:")]
    assert len(said) == 1 and "process 0 of 2: another process" in said[0], err[-3000:]
    assert "continue it with --resume" in said[0]
    assert "[rank0]:" not in err and "RuntimeError" not in err
    # then the SIGTERM held meanwhile ended rank 0, as torchrun asked
    assert re.search(r"rank +: 0 \(local_rank: 0\)\s+exitcode +: -15 ", err), err[-3000:]
    step = json.loads((run / "latest.json").read_text())["step"]
    assert step == 2
    assert main([*_common(corpus, run), "--resume", "--steps", str(step + 2)]) == 0
    assert json.loads((run / "summary.json").read_text())["steps"] == step + 2


@pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun is not installed beside python")
def test_bad_input_under_torchrun_is_said_once(tmp_path):
    res = _torchrun(
        ["train", "--train", str(tmp_path / "missing.txt"), "--out", str(tmp_path / "o")]
    )
    assert res.returncode != 0
    line = f"rnnkit train: error: {tmp_path / 'missing.txt'}: file not found"
    # once on stderr, and as the root cause of torchrun's own report (its error file)
    assert res.stderr.count(line) == 2, res.stderr[-3000:]
    assert f"traceback : {line}" in res.stderr
    assert not (tmp_path / "o").exists()


_ONE_RANK_FAILS = """
import os, sys
from rnnkit.app.cli.main import main

good, bad, run = sys.argv[1:4]
corpus = bad if os.environ["RANK"] == "1" else good  # bad data of one process alone
sys.exit(main(["train", "--train", corpus, "--out", run, "--hidden", "8", "--embedding", "8",
               "--batch-size", "8", "--steps", "500", "--quiet", "--no-report"]))
"""


@pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun is not installed beside python")
def test_an_error_of_one_process_alone_is_the_root_cause_said(tmp_path):
    """Rank 1 fails on its own data; rank 0, in the weights' shape check of
    DistributedDataParallel, gets gloo's "Connection closed by peer". Rank 0 printed that
    as a 30-line traceback and exited at once; torchrun then ended rank 1 within its wait,
    so rank 1's error was never seen (torchrun's root cause: "To enable traceback see")."""
    script = tmp_path / "one_rank_fails.py"
    script.write_text(_ONE_RANK_FAILS)
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"abc\n\xff\xfe\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [str(TORCHRUN), "--standalone", "--nproc-per-node", "2", str(script),
           str(_corpus(tmp_path)), str(bad), str(tmp_path / "r")]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240)
    assert res.returncode != 0
    err = res.stderr
    line = f"rnnkit train: error: {bad}:2: invalid UTF-8 at byte 1 of the line (byte 0xff)"
    # said by rank 1 once, and torchrun's report names it as the root cause
    assert err.count(line) == 2, err[-3000:]
    assert f"traceback : {line}" in err.split("Root Cause")[1]
    stopped = [ln for ln in err.splitlines() if ln.startswith("rnnkit train: stopped:")]
    assert len(stopped) == 1 and "process 0 of 2: another process" in stopped[0], err[-3000:]
    assert "[rank0]:" not in err and "RuntimeError" not in err


@pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun is not installed beside python")
def test_a_task_that_trains_in_one_process_is_refused_under_torchrun(tmp_path):
    data = tmp_path / "train.tsv"
    data.write_text(
        "".join(f"{'ab' if i % 2 else 'ba'}\t{'ab' if i % 2 else 'ba'}x\n" for i in range(40))
    )
    out = tmp_path / "c"
    res = _torchrun(
        ["train", "--task", "classify", "--train", str(data), "--out", str(out), "--steps", "2"]
    )
    assert res.returncode != 0
    # it trained once per process, both writing one run directory (a manifest that no
    # longer matched its files); now refused before anything is written
    assert (
        res.stderr.count("--task classify trains in one process only, and torchrun started 2") == 2
    )
    assert "trained" not in res.stdout and not out.exists()


# Two processes whose clocks disagree about --max-time: rank 0 is out of time after its
# first step, rank 1 never. A short gloo timeout turns a hang into a failure. Then both
# with a budget that does not run out: the reductions the loop makes (DDP's gradient
# buckets are reduced in C++, not through dist.all_reduce) are counted, one a step.
_CLOCKS = """
import datetime, sys
import torch, torch.distributed as dist
from torch import nn
from rnnkit import LSTM
from rnnkit.data.batching import StreamBatcher
from rnnkit.models.language_model import LanguageModel
from rnnkit.training.distributed import init_distributed
from rnnkit.training.loop import Trainer, TrainOptions

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=8))
ctx = init_distributed()
reductions = []
all_reduce = dist.all_reduce
dist.all_reduce = lambda *a, **k: reductions.append(1) or all_reduce(*a, **k)
step = lambda m, b, c: m.loss(b.inputs, b.targets, state=c, starts=b.starts)
for name, max_time, steps in (("clocks", 1e-9 if ctx.rank == 0 else 600.0, 40),
                              ("budget", 600.0, 5)):
    torch.manual_seed(0)
    model = LanguageModel(nn.Embedding(12, 6), LSTM(6, 8), nn.Linear(8, 12))
    ids = torch.randint(0, 12, (400,)).numpy()
    opts = TrainOptions(quiet=True, steps=steps, max_time=max_time)
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1),
                      StreamBatcher(ids, 4, 5), step, opts, out_dir=sys.argv[1] + name,
                      dist_ctx=ctx)
    reductions.clear()
    result = trainer.fit()
    print(f"{name} rank {ctx.rank}: {result.steps} steps, {len(reductions)} reductions, "
          f"{result.stopped}", flush=True)
dist.destroy_process_group()
"""


@pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun is not installed beside python")
def test_max_time_stops_every_process_after_the_same_step(tmp_path):
    script = tmp_path / "clocks.py"
    script.write_text(_CLOCKS)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [str(TORCHRUN), "--standalone", "--nproc-per-node", "2", str(script), str(tmp_path / "r")]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    # rank 0 stopped to save while rank 1 went on to the next step: mismatched collectives
    assert res.returncode == 0, res.stderr[-3000:]
    for rank in (0, 1):
        assert f"clocks rank {rank}: 1 steps, 1 reductions, time budget of" in res.stdout, (
            res.stdout
        )
        # the time flag rides in the step's reduction of loss and tokens: one a step
        assert f"budget rank {rank}: 5 steps, 5 reductions, 5 steps done" in res.stdout


# NCCL errors on a GPU: only a peer's death is PeerLost; a local NCCL failure that hits
# every rank alike (shared memory, invalid usage) stays the error it is.
NCCL_CTX = DistContext(0, 2)
# torch's ProcessGroupNCCL texts (ncclGetErrorString + getNcclErrorDetailStr)
SHM = (
    "NCCL error in: ProcessGroupNCCL.cpp:2042, unhandled system error (run with "
    "NCCL_DEBUG=INFO for details), NCCL version 2.21.5\\nncclSystemError: System call "
    "(e.g. socket, malloc) or external library call failed or device error."
)
REMOTE = (
    "NCCL error in: ProcessGroupNCCL.cpp:2042, remote process exited or there was a "
    "network error, NCCL version 2.21.5\\nncclRemoteError: A call failed possibly due to "
    "a network error or a remote process exiting prematurely."
)


def test_only_a_peers_death_is_peer_lost():
    assert peer_lost(RuntimeError(SHM), NCCL_CTX) is None
    assert isinstance(peer_lost(RuntimeError(REMOTE), NCCL_CTX), PeerLost)


def test_more_processes_than_gpus_is_one_line(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(distributed.dist, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: pytest.fail("set_device(1)"))
    with pytest.raises(ConfigError, match="LOCAL_RANK=1"):
        distributed.init_distributed("cuda")
