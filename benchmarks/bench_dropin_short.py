"""Short inference calls of a recurrent layer on the CPU: ``torch.nn`` against ``rnnkit.nn``
(the import swapped), side by side.

One call of ``nn.RNN`` / ``nn.GRU`` / ``nn.LSTM`` on ``T`` steps (default 10) under
``torch.no_grad()``, as a model's evaluation or a short decoder prompt makes it. Three
contenders in interleaved rounds (``_common.interleaved``): torch's layer; rnnkit's drop-in
as it runs by default (a call of at most ``SHORT_STEPS`` steps that asks no gradient is
handed to torch's ``forward``, the same function); and rnnkit's drop-in with its own time
loop forced (``use_fused("loop")``), which is how such a call ran before. Ratios are
medians of in-round ratios of times (> 1: slower than ``torch.nn``).

    python benchmarks/bench_dropin_short.py [--steps 10] [--rounds 9] [--threads 2] [--json]
"""

from __future__ import annotations

import argparse
import statistics

import torch
from _common import interleaved, median_ratio, print_rows

from rnnkit import nn as rnnkit_nn
from rnnkit.bptt.fused import use_fused


def measure(kind: str, hidden: int, batch: int, steps: int, rounds: int) -> dict:
    torch.manual_seed(0)
    theirs = getattr(torch.nn, kind)(hidden, hidden)
    ours = getattr(rnnkit_nn, kind)(hidden, hidden)
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(steps, batch, hidden)

    def loop() -> object:
        with use_fused("loop"):
            return ours(x)

    with torch.no_grad():
        times = interleaved(
            {"torch.nn": lambda: theirs(x), "rnnkit.nn": lambda: ours(x), "loop": loop}, rounds
        )
    return {
        "layer": kind,
        "H": hidden,
        "B": batch,
        "T": steps,
        "torch_us": statistics.median(times["torch.nn"]) * 1e6,
        "rnnkit": median_ratio(times, "rnnkit.nn", "torch.nn"),
        "loop": median_ratio(times, "loop", "torch.nn"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = [
        measure(kind, hidden, batch, args.steps, args.rounds)
        for kind in ("RNN", "GRU", "LSTM")
        for hidden in (32, 128)
        for batch in (1, 16)
    ]
    columns = {
        "layer": "{layer}", "H": "{H}", "B": "{B}", "T": "{T}",
        "torch.nn µs/call": "{torch_us:.0f}", "rnnkit.nn": "**{rnnkit:.2f}**",
        "own loop (before)": "{loop:.2f}",
    }  # fmt: skip
    print_rows(rows, columns, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
