"""Timing helpers for the benchmarks: interleaved runs, medians, the matmul ceiling.

On a shared 2-core machine the load drifts by tens of percent within seconds, so the
contenders are timed in interleaved rounds (A, B, C, A, B, C, … in a fresh random order
each round) and each ratio is the median over rounds of the ratio WITHIN a round: drift
slower than a round cancels.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

import rnnkit

# The benchmarks train as the rnnkit command does: with its process settings (rnnkit.tuning).
rnnkit.tune_process()

__all__ = [
    "fastest_product",
    "interleaved",
    "machine",
    "matmul_ceiling",
    "median_ratio",
    "round_ceiling",
]


# Wall-clock by default. On a loaded machine with one torch thread, the CPU time of the
# calling thread (time.thread_time) leaves out the time the scheduler gave to others.
CLOCK: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "thread": time.thread_time}


def _block(fn: Callable[[], object], n: int, clock: Callable[[], float]) -> float:
    t0 = clock()
    for _ in range(n):
        fn()
    return (clock() - t0) / n


def best_time(fn: Callable[[], object], repeats: int) -> float:
    """The shortest wall-clock time of ``repeats`` calls of ``fn`` (seconds)."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def interleaved(
    fns: Mapping[str, Callable[[], object]],
    rounds: int,
    block_s: float = 0.15,
    seed: int = 0,
    clock: str = "wall",
) -> dict[str, list[float]]:
    """Seconds per call of each function, one entry per round.

    Each round times every function over a block of ``n`` calls (``n`` chosen once so a
    block takes about ``block_s``), in a random order.
    """
    tick = CLOCK[clock]
    rng = random.Random(seed)
    reps: dict[str, int] = {}
    for name, fn in fns.items():
        fn()  # warm up: allocator, oneDNN primitive caches, lazy init
        fn()
        one = _block(fn, 1, time.perf_counter)
        reps[name] = max(1, round(block_s / max(one, 1e-6)))
    times: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for _ in range(rounds):
        rng.shuffle(names)
        for name in names:
            times[name].append(_block(fns[name], reps[name], tick))
    return times


def median_ratio(times: dict[str, list[float]], num: str, den: str) -> float:
    """Median over rounds of ``times[num] / times[den]`` (> 1: ``den`` is faster)."""
    return statistics.median(a / b for a, b in zip(times[num], times[den], strict=True))


def _products(n: int) -> dict[str, Callable[[], object]]:
    """The float32 ``n × n`` products torch offers on the CPU: its BLAS (``torch.mm``)
    and, where torch was built with it, oneDNN's (the one its ``nn.LSTM`` runs on)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    out = torch.empty(n, n)
    products: dict[str, Callable[[], object]] = {"torch.mm": lambda: torch.mm(a, b, out=out)}
    if torch.backends.mkldnn.is_available():
        try:
            linear = torch.ops.mkldnn._linear_pointwise
            linear(a, b, None, "none", [], "")
            products["oneDNN"] = lambda: linear(a, b, None, "none", [], "")
        except (RuntimeError, AttributeError):  # a torch without it
            pass
    return products


@functools.cache
def fastest_product(n: int = 2048, rounds: int = 3) -> str:
    """The faster of torch's float32 products (``_products``) on this machine, by name;
    decided once per process, so that every ceiling of a run is the same product.

    The two differ by more than 2× on some machines: MKL (torch's BLAS) takes its AVX2
    path on AMD processors, where oneDNN uses AVX-512 (measured on a Zen 5 core: 90
    against 200 GFLOP/s). A ceiling from the slower one would flatter every layer.
    """
    products = _products(n)
    best = {}
    for name, fn in products.items():
        fn()
        best[name] = min(_block(fn, 1, time.perf_counter) for _ in range(rounds))
    return min(best, key=best.__getitem__)


def matmul_ceiling(n: int = 3072, rounds: int = 7) -> float:
    """Measured float32 GFLOP/s of the fastest product for ``n × n`` matrices (best of
    ``rounds``)."""
    fn = _products(n)[fastest_product()]
    fn()
    best = min(_block(fn, 1, time.perf_counter) for _ in range(rounds))
    return 2 * n**3 / best / 1e9


def round_ceiling(n: int = 2048) -> tuple[Callable[[], object], float]:
    """The fastest float32 product (``fastest_product``) of ``n × n`` matrices to time
    among the contenders of ``interleaved`` (the ceiling in each round), and its flops.

    The machine's product rate moves by ±15 % within seconds here (57–81 GFLOP/s on one
    thread); a ceiling measured only at the start and the end of a run misjudges a
    layer timed in between. 2048² runs at the 3072² rate on average and takes a fifth.
    """
    return _products(n)[fastest_product()], 2.0 * n**3


def machine() -> dict[str, object]:
    """Machine, torch version, thread count and date for the record.

    The CPU's name comes with its family and model and the widest vectors torch uses on
    it: machines that share a name here ("AMD EPYC") differed by 2× in what one core
    multiplies (AVX-512 at half or full width)."""
    model = platform.processor() or platform.machine()
    ids: dict[str, str] = {}
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("Model name", "CPU family", "Model"):
                ids[key.strip()] = value.strip()
        model = ids.get("Model name", model)
    except OSError:
        pass
    details = [f"family {ids['CPU family']}, model {ids['Model']}"] if len(ids) == 3 else []
    details.append(torch.backends.cpu.get_cpu_capability())
    model = f"{model} ({'; '.join(details)})"
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = float("nan")
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "load_1min": round(load, 2),
    }


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def print_rows(rows: list[dict[str, Any]], columns: dict[str, str], as_json: bool) -> None:
    """The machine and a markdown table of ``rows`` on stderr: ``columns`` maps each
    heading to the format of its cells (``"{H}"``, ``"**{rnnkit:.2f}**"``, filled from a
    row); with ``as_json`` the rows as one JSON list on stdout."""
    print(machine(), file=sys.stderr)
    print("| " + " | ".join(columns) + " |\n" + "|---" * len(columns) + "|", file=sys.stderr)
    for row in rows:
        print("| " + " | ".join(f.format(**row) for f in columns.values()) + " |", file=sys.stderr)
    if as_json:
        print(json.dumps(rows))
