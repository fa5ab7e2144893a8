"""How many threads to compute with: the CPUs this process may use, less what others use.

A parallel region is as slow as its slowest thread. On a 2-core machine where another
program keeps one core busy, a 2-thread training step waits, at every parallel region,
for the thread that shares its core — and while it waits, the idle thread of an OpenMP
team spins and takes CPU from the very thread it waits for: with one competing CPU-bound
process, two threads train the char-LM far slower than one thread does (the figures:
``docs/speed.md``, "Threads on a shared machine"; the benchmark: ``benchmarks/README.md``,
"On a busy machine"). So:

* ``choose_threads`` picks ``n = ⌊free + margin⌋`` threads, clamped to ``[1, usable]``,
  where ``usable = min(|affinity|, cgroup quota)`` and ``free = usable − others``, the
  CPUs other processes kept busy over a short sample of ``/proc/stat`` (this process's
  own CPU time subtracted). A second thread pays only if its core is nearly free: with a
  core half taken, the straggler makes 2 threads no faster than 1, hence the margin of
  0.35 rather than 0.5. The work size bounds it too: each thread gets at least
  ``min_rows`` rows of the batch (thinner per-step products run below the kernel's speed).
* ``ThreadGovernor`` applies the choice at the start of training, looks again every few
  seconds (a program that becomes busy mid-run is seen within one interval) and restores
  the previous count at the end. ``RNNKIT_THREADS=N`` (or ``--threads N``) fixes ``N``.
* ``configure_wait_policy`` shortens how long an idle OpenMP thread spins before it
  sleeps (GNU OpenMP, which torch's CPU build uses: ``GOMP_SPINCOUNT``), unless the user
  set ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT``. It must run before torch loads its
  OpenMP runtime: the ``rnnkit`` command does it first thing (``rnnkit.tuning``);
  importing the library does not.
"""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "CpuBudget",
    "ThreadGovernor",
    "cgroup_quota",
    "choose_threads",
    "configure_wait_policy",
    "read_budget",
    "threads_override",
]

# Spins of an idle GNU OpenMP thread before it sleeps on a futex (libgomp's default is
# 300,000, about a millisecond here; ~10 µs at 10,000). Short enough that a spinning
# thread cannot take much from a straggler; long enough that the back-to-back parallel
# regions of one training step (a few µs apart) still find the team awake.
SPIN_COUNT = "10000"
MARGIN = 0.35  # a second thread pays only when its core is at least ~65 % free
MIN_ROWS = 8  # batch rows per thread, at least
RECHECK_S = 3.0  # seconds between looks at the load during training
STALE_S = 30.0  # an older first sample would average over a load long gone


def configure_wait_policy(environ: dict[str, str] | None = None) -> bool:
    """Set ``GOMP_SPINCOUNT`` unless the user chose a wait policy; True if it was set.

    Without effect once torch (and its OpenMP runtime) is loaded: libgomp reads its
    environment when it loads.
    """
    env = os.environ if environ is None else environ
    if "OMP_WAIT_POLICY" in env or "GOMP_SPINCOUNT" in env:
        return False
    if environ is None and "torch" in sys.modules:
        return False
    env["GOMP_SPINCOUNT"] = SPIN_COUNT
    return True


@dataclass(frozen=True)
class CpuBudget:
    """What this process may use: CPUs in its affinity set, the cgroup quota in CPUs (None:
    no quota) and the CPUs other processes kept busy (average over the last sample)."""

    affinity: int
    quota: float | None = None
    others: float = 0.0

    @property
    def usable(self) -> float:
        return float(self.affinity) if self.quota is None else min(self.affinity, self.quota)

    @property
    def free(self) -> float:
        return max(self.usable - self.others, 0.0)


def choose_threads(budget: CpuBudget, rows: int | None = None, min_rows: int = MIN_ROWS) -> int:
    """Threads for ``budget``: ``⌊free + MARGIN⌋`` in ``[1, ⌊usable⌋]``, and at most
    ``rows // min_rows`` when the batch has ``rows`` rows.

    >>> choose_threads(CpuBudget(affinity=2, others=1.0))
    1
    >>> choose_threads(CpuBudget(affinity=8, quota=2.5, others=0.1))
    2
    """
    n = math.floor(budget.free + MARGIN)
    n = min(n, math.floor(budget.usable + 1e-9))
    if rows is not None:
        n = min(n, rows // max(min_rows, 1))
    return max(n, 1)


def threads_override(value: int | str | None = None, name: str = "--threads") -> int | None:
    """The fixed thread count asked for: ``value`` (the setting ``name``: ``--threads``,
    or ``threads`` from Python), else ``RNNKIT_THREADS``; None (or ``"auto"``/``0``)
    chooses automatically. Raises ValueError naming the setting.
    """
    source = name
    if value is None:
        value, source = os.environ.get("RNNKIT_THREADS"), "RNNKIT_THREADS"
    if value is None or str(value).strip().lower() in ("", "auto", "0"):
        return None
    try:
        n = int(str(value).strip())
    except ValueError:
        raise ValueError(f"{source} must be a positive integer or 'auto', got {value!r}") from None
    if n < 0:
        raise ValueError(f"{source} must be a positive integer or 'auto', got {value!r}")
    if n > max_threads():  # torch.set_num_threads(10**6) ends in std::bad_alloc
        raise ValueError(MAX_THREADS_MESSAGE.format(source=source, value=n, cpus=max_threads()))
    return n


MAX_THREADS_MESSAGE = (
    "{source} must be at most {cpus} (the larger of 256 and this machine's CPUs), got {value}"
)


def max_threads() -> int:
    """The most threads one may ask for: 256, or the machine's CPUs where there are more.
    More threads than CPUs only wait for each other (a few more may serve a test); a
    million ended in ``std::bad_alloc`` inside torch."""
    return max(os.cpu_count() or 1, 256)


def cgroup_quota(
    root: Path = Path("/sys/fs/cgroup"), proc: Path = Path("/proc/self")
) -> float | None:
    """The CPU quota of this process's cgroup in CPUs (quota / period), None if unlimited.

    cgroup v2: ``cpu.max`` (``"max 100000"`` or ``"150000 100000"``) of the process's
    cgroup and its ancestors, the smallest; cgroup v1: ``cpu.cfs_quota_us`` /
    ``cpu.cfs_period_us`` (quota −1: none).
    """
    limits: list[float] = []
    try:
        lines = (proc / "cgroup").read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, rel = parts
        rel_parts = [p for p in rel.split("/") if p]
        if controllers == "":  # v2 unified hierarchy
            bases = [root, root / "unified"]
            for base in bases:
                for depth in range(len(rel_parts), -1, -1):
                    f = base.joinpath(*rel_parts[:depth], "cpu.max")
                    try:
                        quota_text, period_text = f.read_text().split()[:2]
                    except (OSError, ValueError):
                        continue
                    if quota_text != "max" and float(period_text) > 0:
                        limits.append(float(quota_text) / float(period_text))
        elif "cpu" in controllers.split(","):
            for name in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
                for depth in range(len(rel_parts), -1, -1):
                    d = root.joinpath(name, *rel_parts[:depth])
                    try:
                        quota = float((d / "cpu.cfs_quota_us").read_text())
                        period = float((d / "cpu.cfs_period_us").read_text())
                    except (OSError, ValueError):
                        continue
                    if quota > 0 and period > 0:
                        limits.append(quota / period)
    return min(limits) if limits else None


def _affinity() -> set[int]:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return set(range(os.cpu_count() or 1))


def _busy_seconds(cpus: set[int], stat: Path = Path("/proc/stat")) -> float | None:
    """CPU seconds spent busy (all but idle and iowait) so far on ``cpus``; None if unknown."""
    try:
        text = stat.read_text()
    except OSError:
        return None
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    total = 0
    for line in text.splitlines():
        if not line.startswith("cpu") or line.startswith("cpu "):
            continue
        name, *fields = line.split()
        try:
            cpu = int(name[3:])
            values = [int(v) for v in fields]
        except ValueError:
            continue
        if cpu in cpus and len(values) >= 5:
            total += sum(values) - values[3] - values[4]  # minus idle, iowait
    return total / tick


class LoadSampler:
    """Others' CPU use between two calls: busy time on our CPUs minus our own CPU time."""

    def __init__(self, stat: Path = Path("/proc/stat")) -> None:
        self.cpus = _affinity()
        self.stat = stat
        self._last = self._now()
        self.started = self._last[0]

    def _now(self) -> tuple[float, float | None, float]:
        return time.perf_counter(), _busy_seconds(self.cpus, self.stat), time.process_time()

    def others(self) -> float:
        """CPUs other processes kept busy since the previous call (0 when unknown)."""
        now = self._now()
        (w0, b0, p0), (w1, b1, p1) = self._last, now
        self._last, self.started = now, now[0]
        if b0 is None or b1 is None or w1 - w0 <= 0:
            return 0.0
        # /proc/stat counts in ticks (10 ms): short samples are coarse, never negative.
        return max((b1 - b0) - (p1 - p0), 0.0) / (w1 - w0)


# A first sample taken when rnnkit is imported: by the first training step (after the
# data are read and the model built) it usually spans enough time that no wait is needed.
_IMPORT_SAMPLER = LoadSampler()


def read_budget(sample_s: float = 0.2, sampler: LoadSampler | None = None) -> CpuBudget:
    """This process's CPU budget now, others' use averaged over at least ``sample_s``
    seconds (since rnnkit's import when that was up to ``STALE_S`` ago: no wait)."""
    if sampler is None:
        age = time.perf_counter() - _IMPORT_SAMPLER.started
        sampler = _IMPORT_SAMPLER if age <= STALE_S else LoadSampler()
    wait = sample_s - (time.perf_counter() - sampler.started)
    if wait > 0:
        time.sleep(wait)
    return CpuBudget(affinity=len(_affinity()), quota=cgroup_quota(), others=sampler.others())


class ThreadGovernor:
    """Sets torch's thread count for a training run and keeps it fair while it runs.

    ``start()`` picks the count (fixed by ``threads``/``RNNKIT_THREADS``, else from the
    budget), ``tick()`` (once a step) looks again every ``recheck_s`` seconds in automatic
    mode, ``stop()`` restores the count found at ``start()``. ``note`` is one line saying
    what was chosen and why, for the run's summary. ``name`` is how errors and the note
    name ``threads``: ``rnnkit train``'s ``--threads`` or the Python argument.
    """

    def __init__(
        self,
        threads: int | None = None,
        rows: int | None = None,
        recheck_s: float = RECHECK_S,
        name: str = "threads",
    ) -> None:
        self.name = name
        self.fixed = threads_override(threads, name)
        self.rows = rows
        self.recheck_s = recheck_s
        self.threads = 0
        self.changes = 0
        self.note = ""
        self._before = 0
        self._sampler: LoadSampler | None = None
        self._next = 0.0

    def start(self) -> ThreadGovernor:
        import torch

        self._before = torch.get_num_threads()
        if self.fixed is not None:
            self._set(self.fixed)
            self.note = f"threads: {self.fixed} (fixed by {self.name}/RNNKIT_THREADS)"
            return self
        age = time.perf_counter() - _IMPORT_SAMPLER.started
        self._sampler = _IMPORT_SAMPLER if age <= STALE_S else LoadSampler()
        budget = read_budget(sampler=self._sampler)
        self._set(choose_threads(budget, self.rows))
        quota = f", cgroup quota {budget.quota:g}" if budget.quota is not None else ""
        fix = f"{self.name} N" if self.name.startswith("--") else f"{self.name}=N"
        self.note = (
            f"threads: {self.threads} of {budget.affinity} CPUs{quota} "
            f"(others busy on {budget.others:.1f}; re-checked every {self.recheck_s:g} s; "
            f"{fix} to fix)"
        )
        self._next = time.perf_counter() + self.recheck_s
        return self

    def tick(self) -> None:
        if self._sampler is None or time.perf_counter() < self._next:
            return
        budget = CpuBudget(len(_affinity()), cgroup_quota(), self._sampler.others())
        n = choose_threads(budget, self.rows)
        if n != self.threads:
            self._set(n)
            self.changes += 1
        self._next = time.perf_counter() + self.recheck_s

    def stop(self) -> None:
        import torch

        if self._before and torch.get_num_threads() != self._before:
            torch.set_num_threads(self._before)
        if self.changes:
            times = "once" if self.changes == 1 else f"{self.changes} times"
            self.note += f"; changed {times} with the load, ended at {self.threads}"

    def _set(self, n: int) -> None:
        import torch

        if torch.get_num_threads() != n:
            torch.set_num_threads(n)
        self.threads = n
