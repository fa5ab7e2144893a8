"""torch.compile and torch.export with rnnkit.nn in place of torch.nn: compile time and
graph size, side by side.

A word language model as PyTorch's examples write it (Embedding → 2-layer LSTM →
Linear, batch 8, hidden 128), once with ``torch.nn.LSTM`` and once with
``rnnkit.nn.LSTM`` (nothing else changed). For each, in a fresh process (no compile
cache shared between the two; ``TORCHINDUCTOR_FORCE_DISABLE_CACHES=1``):

* ``first_s``: the first call of ``torch.compile(model)`` with its backward (T = 35);
* ``recompile_s``: the first call at another length (T = 20: a recompile);
* ``export_nodes``: the node count of ``torch.export`` of the model in eval mode;
* ``step_ms``: a compiled training step afterwards (median of 5).

Goal: rnnkit's first and recompile times at most 2× torch's.

    python benchmarks/bench_compile.py [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine


def _one(which: str) -> dict[str, float]:
    """The measurements of one contender, in this process."""
    import torch

    import rnnkit

    nn: Any = rnnkit.nn if which == "rnnkit" else torch.nn  # the import a user swaps

    class RNNModel(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = nn.Embedding(1000, 128)
            self.rnn = nn.LSTM(128, 128, 2)
            self.decoder = nn.Linear(128, 1000)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.decoder(self.rnn(self.encoder(ids))[0])

    torch.manual_seed(0)
    model = RNNModel()
    compiled = torch.compile(model)

    def step(T: int) -> None:
        ids = torch.randint(0, 1000, (T, 8))
        out = compiled(ids)
        torch.nn.functional.cross_entropy(out.flatten(0, 1), ids.flatten()).backward()

    t0 = time.perf_counter()
    step(35)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    step(20)
    recompile = time.perf_counter() - t0
    steps = []
    for _ in range(5):
        t0 = time.perf_counter()
        step(35)
        steps.append(time.perf_counter() - t0)
    program = torch.export.export(model.eval(), (torch.randint(0, 1000, (35, 8)),))
    return {
        "first_s": first,
        "recompile_s": recompile,
        "step_ms": statistics.median(steps) * 1e3,
        "export_nodes": len(program.graph.nodes),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true")
    p.add_argument("--one", choices=("torch", "rnnkit"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps(_one(args.one)))
        return 0
    env = {**os.environ, "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1", "PYTHONWARNINGS": "ignore"}
    rows = {}
    for which in ("torch", "rnnkit"):
        out = subprocess.run(
            [sys.executable, __file__, "--one", which],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        )
        rows[which] = json.loads(out.stdout.strip().splitlines()[-1])
    ratio = {k: rows["rnnkit"][k] / rows["torch"][k] for k in ("first_s", "recompile_s")}
    result = {"machine": machine(), "rows": rows, "rnnkit_over_torch": ratio}
    if args.json:
        print(json.dumps(result))
        return 0
    for which, row in rows.items():
        print(
            f"{which:<7} first {row['first_s']:6.1f} s   recompile {row['recompile_s']:6.1f} s   "
            f"step {row['step_ms']:7.1f} ms   export {row['export_nodes']} nodes"
        )
    print(
        f"rnnkit/torch: first {ratio['first_s']:.2f}x, recompile {ratio['recompile_s']:.2f}x "
        f"(goal <= 2)   ({result['machine']['cpu']}, torch {result['machine']['torch']}, "
        f"{result['machine']['date']}, load {result['machine']['load_1min']})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
