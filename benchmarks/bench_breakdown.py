"""Where one training call of a recurrent layer spends its time (one thread, CPU time).

One call is what ``bench_recurrent`` times: ``rnnkit.from_torch(nn.LSTM(I, H,
batch_first=True))`` on ``x (B, T, I)``, then ``torch.autograd.grad`` of its outputs with
respect to ``x`` and every parameter. Four contenders are timed in the same interleaved
rounds:

- ``call``: the call itself;
- ``timed``: the same call with each of the compiled library's operators timed inside it
  (the forward loop, the backward loop, the weight-gradient products): their share of
  ``timed``, applied to ``call``, says how long each took and what is left — Python,
  autograd, the copies between the batch-first and time-major layouts, allocation;
- ``cached``: the same call with every operator returning its first result at once: the
  cost of everything around the operators alone, with warm caches (in a real call the
  operators stream megabytes through the caches in between, and the rest runs slower);
- ``mm``: the machine's fastest float32 product (``_common.fastest_product``), the
  ceiling; the layer's share of it is taken within each round.

``--time-major`` times the layer built with ``batch_first=False`` on ``x (T, B, I)``:
the difference in ``rest`` is what the transposing copies of the batch-first layout cost.

Usage: ``python benchmarks/bench_breakdown.py [--cell lstm|gru] [--hidden 128]
[--batch 16,64] [--seq 100] [--time-major] [--rounds 15]``. Needs the compiled library.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import torch
from _common import interleaved, machine, round_ceiling
from bench_recurrent import GATES, TORCH_CLASSES, matmul_flops

import rnnkit
from rnnkit.bptt import native


class _Operators:
    """The compiled library, each operator timed (``cache=False``) or answering with its
    first result for the same arguments' shapes (``cache=True``)."""

    def __init__(self, lib: Any, cache: bool) -> None:
        self._lib, self._cache = lib, cache
        self.seconds: dict[str, float] = {}
        self._results: dict[tuple, Any] = {}

    def __getattr__(self, name: str) -> Callable[..., Any]:
        op = getattr(self._lib, name)

        def run(*args: Any) -> Any:
            if self._cache:
                key = (name, *(tuple(a.shape) if isinstance(a, torch.Tensor) else a for a in args))
                if key not in self._results:
                    self._results[key] = op(*args)
                return self._results[key]
            t0 = time.thread_time()
            out = op(*args)
            self.seconds[name] = self.seconds.get(name, 0.0) + time.thread_time() - t0
            return out

        return run


@contextlib.contextmanager
def _library_switch(lib: Any) -> Iterator[dict[str, Any]]:
    """Patch ``native.library`` so that each contender chooses what the layer calls."""
    chosen: dict[str, Any] = {"lib": lib}
    with mock.patch.object(native, "library", lambda: chosen["lib"]):
        yield chosen


def breakdown(
    cell: str, H: int, B: int, T: int, I: int, rounds: int, block_s: float, batch_first: bool
) -> dict[str, Any]:
    torch.manual_seed(0)
    layer = rnnkit.from_torch(TORCH_CLASSES[cell](I, H, batch_first=batch_first))
    params = list(layer.parameters())
    lead = (B, T) if batch_first else (T, B)
    x = torch.randn(*lead, I, requires_grad=True)
    d_out = torch.randn(*lead, H)

    def call() -> object:
        return torch.autograd.grad(layer(x).outputs, [x, *params], d_out)

    lib = native.library()
    timed, cached = _Operators(lib, cache=False), _Operators(lib, cache=True)
    calls = {"timed": 0}
    with _library_switch(lib) as chosen:

        def using(ops: Any, counter: str | None = None) -> Callable[[], object]:
            def go() -> object:
                chosen["lib"] = ops
                try:
                    if counter:
                        calls[counter] += 1
                    return call()
                finally:
                    chosen["lib"] = lib

            return go

        mm, mm_flops = round_ceiling()
        fns = {
            "call": call,
            "timed": using(timed, "timed"),
            "cached": using(cached),
            "mm": mm,
        }
        times = interleaved(fns, rounds, block_s, clock="thread")
    flops = matmul_flops(cell, B, T, I, H, training=True)
    med = {name: statistics.median(v) for name, v in times.items()}
    # Each operator's share of the timed call (summed over every timed call, the warm-up
    # included on both sides), applied to the untimed call's median.
    timed_total = med["timed"] * calls["timed"]  # ≈: the median stands for each call
    shares = {name: s / timed_total for name, s in timed.seconds.items()}
    parts = {name: share * med["call"] for name, share in shares.items()}
    share = statistics.median(
        (flops / t) / (mm_flops / m) for t, m in zip(times["call"], times["mm"], strict=True)
    )
    return {
        "cell": cell,
        "H": H,
        "B": B,
        "T": T,
        "I": I,
        "layout": "batch-first" if batch_first else "time-major",
        "call_ms": med["call"] * 1e3,
        "parts_ms": {name: s * 1e3 for name, s in sorted(parts.items())},
        "rest_ms": (med["call"] - sum(parts.values())) * 1e3,
        "around_ops_ms": med["cached"] * 1e3,
        "gflops": flops / med["call"] / 1e9,
        "ceiling_gflops": mm_flops / med["mm"] / 1e9,
        "round_share": share,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cell", default="lstm", choices=sorted(GATES))
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--batch", default="16,64", help="comma-separated B values")
    p.add_argument("--seq", type=int, default=100)
    p.add_argument("--input-size", type=int, default=None, help="I (default: I = H)")
    p.add_argument("--time-major", action="store_true", help="batch_first=False, x (T, B, I)")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--block", type=float, default=0.15, help="seconds per timed block")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    if native.library() is None:
        p.error("the compiled library is unavailable here: nothing to break down")
    info = machine()
    print(
        f"# {info['cpu']}, torch {info['torch']}, 1 thread, CPU time of the thread, "
        f"{info['date']}, load {info['load_1min']:.2f}"
    )
    for B in (int(b) for b in args.batch.split(",") if b):
        r = breakdown(
            args.cell, args.hidden, B, args.seq, args.input_size or args.hidden, args.rounds,
            args.block, not args.time_major,
        )  # fmt: skip
        ops = ", ".join(f"{name} {ms:.2f}" for name, ms in r["parts_ms"].items())
        print(
            f"{r['cell']} H={r['H']} B={r['B']} T={r['T']} I={r['I']} {r['layout']}: "
            f"call {r['call_ms']:.2f} ms "
            f"= {ops}, rest {r['rest_ms']:.2f} (around the operators alone, warm: "
            f"{r['around_ops_ms']:.2f}) | {r['gflops']:.0f} GFLOP/s, "
            f"{100 * r['round_share']:.0f}% of the product in the same rounds "
            f"({r['ceiling_gflops']:.0f} GFLOP/s)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
