"""The thread choice: fake affinity, cgroup quota and load in, the expected count out."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rnnkit import threads
from rnnkit.threads import (
    CpuBudget,
    LoadSampler,
    ThreadGovernor,
    cgroup_quota,
    choose_threads,
    configure_wait_policy,
    threads_override,
)


@pytest.mark.parametrize(
    ("budget", "rows", "expected"),
    [
        (CpuBudget(affinity=2), None, 2),  # idle 2-core machine: both
        (CpuBudget(affinity=2, others=1.0), None, 1),  # one busy competitor: one
        (CpuBudget(affinity=2, others=2.0), None, 1),  # never fewer than one
        (CpuBudget(affinity=2, others=0.3), None, 2),  # a light background: still two
        (CpuBudget(affinity=2, others=0.5), None, 1),  # half a core taken: the straggler
        (CpuBudget(affinity=16, others=3.2), None, 13),  # 12.8 free -> 13
        (CpuBudget(affinity=16, quota=4.0), None, 4),  # the cgroup quota bounds it
        (CpuBudget(affinity=16, quota=1.5), None, 1),  # 1.5 CPUs of quota: one thread
        (CpuBudget(affinity=1, quota=None, others=0.0), None, 1),  # taskset -c 0
        (CpuBudget(affinity=16), 32, 4),  # 32 rows: at most 4 threads of 8 rows
        (CpuBudget(affinity=16), 4, 1),  # a tiny batch: one thread
    ],
)
def test_choose_threads(budget: CpuBudget, rows: int | None, expected: int) -> None:
    assert choose_threads(budget, rows) == expected


def test_budget_free_and_usable() -> None:
    b = CpuBudget(affinity=8, quota=2.5, others=1.0)
    assert b.usable == 2.5
    assert b.free == pytest.approx(1.5)
    assert CpuBudget(affinity=2, others=5.0).free == 0.0


def test_cgroup_v2_quota_takes_the_smallest_ancestor(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cgroup").write_text("0::/a/b\n")
    root = tmp_path / "cg"
    (root / "a" / "b").mkdir(parents=True)
    (root / "cpu.max").write_text("max 100000\n")
    (root / "a" / "cpu.max").write_text("150000 100000\n")
    (root / "a" / "b" / "cpu.max").write_text("300000 100000\n")
    assert cgroup_quota(root, proc) == pytest.approx(1.5)
    (root / "a" / "cpu.max").write_text("max 100000\n")
    assert cgroup_quota(root, proc) == pytest.approx(3.0)
    (root / "a" / "b" / "cpu.max").write_text("max 100000\n")
    assert cgroup_quota(root, proc) is None


def test_cgroup_v1_quota(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cgroup").write_text("4:memory:/x\n2:cpu,cpuacct:/job\n0::/\n")
    d = tmp_path / "cg" / "cpu,cpuacct" / "job"
    d.mkdir(parents=True)
    (d / "cpu.cfs_quota_us").write_text("50000\n")
    (d / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_quota(tmp_path / "cg", proc) == pytest.approx(0.5)
    (d / "cpu.cfs_quota_us").write_text("-1\n")
    assert cgroup_quota(tmp_path / "cg", proc) is None


def test_cgroup_quota_without_cgroups(tmp_path: Path) -> None:
    assert cgroup_quota(tmp_path / "none", tmp_path / "none") is None


def _stat(busy: list[int], idle: list[int]) -> str:
    lines = ["cpu  0 0 0 0 0 0 0 0 0 0"]
    for i, (b, d) in enumerate(zip(busy, idle, strict=True)):
        # user nice system idle iowait irq softirq steal guest guest_nice
        lines.append(f"cpu{i} {b} 0 0 {d} 7 0 0 0 0 0")
    return "\n".join(lines) + "\nintr 1 2 3\n"


def test_busy_seconds_reads_only_our_cpus(tmp_path: Path, monkeypatch) -> None:
    stat = tmp_path / "stat"
    stat.write_text(_stat([100, 250, 999], [10, 10, 10]))
    tick = threads.os.sysconf("SC_CLK_TCK")
    assert threads._busy_seconds({0, 1}, stat) == pytest.approx(350 / tick)
    assert threads._busy_seconds({2}, stat) == pytest.approx(999 / tick)
    assert threads._busy_seconds({0}, tmp_path / "missing") is None


def test_sampler_subtracts_our_own_cpu_time(tmp_path: Path, monkeypatch) -> None:
    """Others = (busy on our CPUs − our process's CPU time) / wall time."""
    stat = tmp_path / "stat"
    tick = threads.os.sysconf("SC_CLK_TCK")
    stat.write_text(_stat([0, 0], [0, 0]))
    clock = iter([10.0, 12.0])  # 2 s of wall time
    cpu = iter([5.0, 6.0])  # we used 1 CPU-second of it
    monkeypatch.setattr(threads, "_affinity", lambda: {0, 1})
    monkeypatch.setattr(threads.time, "perf_counter", lambda: next(clock))
    monkeypatch.setattr(threads.time, "process_time", lambda: next(cpu))
    sampler = LoadSampler(stat)
    stat.write_text(_stat([2 * tick, 1 * tick], [0, 0]))  # 3 CPU-seconds busy in all
    assert sampler.others() == pytest.approx(1.0)  # (3 − 1) / 2


def test_threads_override(monkeypatch) -> None:
    monkeypatch.delenv("RNNKIT_THREADS", raising=False)
    assert threads_override() is None
    assert threads_override(3) == 3
    monkeypatch.setenv("RNNKIT_THREADS", "2")
    assert threads_override() == 2
    assert threads_override(1) == 1  # the option wins over the environment
    monkeypatch.setenv("RNNKIT_THREADS", "auto")
    assert threads_override() is None
    monkeypatch.setenv("RNNKIT_THREADS", "two")
    with pytest.raises(ValueError, match="RNNKIT_THREADS must be a positive integer"):
        threads_override()
    with pytest.raises(ValueError, match="--threads"):
        threads_override("-1")


def test_wait_policy_respects_the_user() -> None:
    env: dict[str, str] = {}
    assert configure_wait_policy(env) is True
    assert env == {"GOMP_SPINCOUNT": threads.SPIN_COUNT}
    env = {"OMP_WAIT_POLICY": "ACTIVE"}
    assert configure_wait_policy(env) is False
    assert env == {"OMP_WAIT_POLICY": "ACTIVE"}
    env = {"GOMP_SPINCOUNT": "infinite"}
    assert configure_wait_policy(env) is False
    assert env == {"GOMP_SPINCOUNT": "infinite"}


def test_governor_fixed_sets_and_restores(monkeypatch) -> None:
    monkeypatch.delenv("RNNKIT_THREADS", raising=False)
    before = torch.get_num_threads()
    gov = ThreadGovernor(threads=2).start()
    assert torch.get_num_threads() == 2
    assert "2 (fixed" in gov.note
    gov.stop()
    assert torch.get_num_threads() == before


def test_governor_follows_the_load(monkeypatch) -> None:
    """Automatic mode: one busy competitor on 2 CPUs -> 1 thread; when it ends -> 2."""
    monkeypatch.delenv("RNNKIT_THREADS", raising=False)
    load = [1.0]
    monkeypatch.setattr(threads, "_affinity", lambda: {0, 1})
    monkeypatch.setattr(threads, "cgroup_quota", lambda: None)
    monkeypatch.setattr(LoadSampler, "others", lambda self: load[0])
    before = torch.get_num_threads()
    gov = ThreadGovernor(rows=64, recheck_s=0.0).start()
    try:
        assert gov.threads == 1 and torch.get_num_threads() == 1
        assert "threads: 1 of 2 CPUs (others busy on 1.0" in gov.note
        load[0] = 0.0
        gov.tick()
        assert gov.threads == 2 and torch.get_num_threads() == 2
    finally:
        gov.stop()
    assert torch.get_num_threads() == before
    assert "changed once with the load, ended at 2" in gov.note  # not "1 times"


def test_governor_bad_environment(monkeypatch) -> None:
    monkeypatch.setenv("RNNKIT_THREADS", "many")
    with pytest.raises(ValueError, match="RNNKIT_THREADS"):
        ThreadGovernor()
