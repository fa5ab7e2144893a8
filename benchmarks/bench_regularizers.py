"""What each regularizer of the recurrent layers costs in a training step.

One training step of a stacked LSTM (``rnnkit.LSTM``; ``--cell gru``: ``rnnkit.GRU`` with
``reset="after"``; train mode: forward, a loss on every output, backward through time)
with each regularizer alone, AWD-style combined, layer normalisation alone and with the
in-loop regularizers, and none, timed in interleaved rounds (``_common.interleaved``);
the ratio to the plain layer is the median over rounds of the ratio within a round. On
the CPU the layer runs the compiled loop where it is built (``--loop pytorch``: the
PyTorch loop). ``--only`` times the named rows (and ``none``); the layer-normalised GRU
has no ``recurrent_dropout`` row (it refuses that option).

    python benchmarks/bench_regularizers.py [--cell lstm|gru] [--hidden 256] [--steps 64] \\
        [--batch 32] [--layers 2] [--threads 1] [--rounds 15] [--loop compiled|pytorch] \\
        [--only ROW ...] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import interleaved, machine, median_ratio

import rnnkit
from rnnkit.bptt import native

OPTIONS: dict[str, dict[str, Any]] = {
    "none": {},
    "input_dropout 0.3": {"input_dropout": 0.3},
    "locked_dropout 0.3": {"locked_dropout": 0.3},
    "output_dropout 0.4": {"output_dropout": 0.4},
    "weight_drop 0.5": {"weight_drop": 0.5},
    "recurrent_dropout 0.25": {"recurrent_dropout": 0.25},
    "zoneout 0.1": {"zoneout": 0.1},
    "layer_norm": {"layer_norm": True},
    "layer_norm + recurrent_dropout 0.25": {"layer_norm": True, "recurrent_dropout": 0.25},
    "layer_norm + zoneout 0.1": {"layer_norm": True, "zoneout": 0.1},
    "AWD-style (input, locked, output, weight drop)": {
        "input_dropout": 0.3,
        "locked_dropout": 0.25,
        "output_dropout": 0.4,
        "weight_drop": 0.5,
    },
}


def step_of(options: dict[str, Any], args: argparse.Namespace) -> Callable[[], None]:
    """A closure running one training step of a fresh layer with ``options``."""
    torch.manual_seed(0)
    make = rnnkit.LSTM if args.cell == "lstm" else rnnkit.GRU
    # the GRU form with a compiled loop
    extra: dict[str, Any] = {"reset": "after"} if args.cell == "gru" else {}
    layer = make(args.hidden, args.hidden, num_layers=args.layers, **extra, **options)
    layer.train()
    x = torch.randn(args.steps, args.batch, args.hidden)

    def step() -> None:
        layer.zero_grad(set_to_none=True)
        out = layer(x)[0]
        out.square().mean().backward()

    return step


def applies(options: dict[str, Any], cell: str) -> bool:
    """Whether a row's options build a layer of this cell (the layer-normalised GRU
    refuses ``recurrent_dropout``)."""
    return cell == "lstm" or not (options.get("layer_norm") and "recurrent_dropout" in options)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--cell", choices=("lstm", "gru"), default="lstm")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--loop", choices=("compiled", "pytorch"), default="compiled")
    p.add_argument("--only", nargs="+", metavar="ROW", help="time these rows and none")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    unknown = set(args.only or ()) - set(OPTIONS)
    if unknown:
        p.error(f"--only: no row named {sorted(unknown)[0]!r} (rows: {', '.join(OPTIONS)})")
    torch.set_num_threads(args.threads)
    rows_of = {
        name: opts
        for name, opts in OPTIONS.items()
        if applies(opts, args.cell) and (not args.only or name == "none" or name in args.only)
    }
    with native.use_native(args.loop == "compiled"):
        fns = {name: step_of(opts, args) for name, opts in rows_of.items()}
        times = interleaved(fns, rounds=args.rounds, block_s=0.3)
    rows = [
        {
            "option": name,
            "ms_per_step": round(1e3 * sorted(t)[len(t) // 2], 2),
            "ratio_to_none": round(median_ratio(times, name, "none"), 3),
        }
        for name, t in times.items()
    ]
    record = {"machine": machine(), "loop": args.loop, "config": vars(args), "rows": rows}
    if args.json:
        print(json.dumps(record))
        return 0
    m = record["machine"]
    print(f"{m['cpu']}, torch {m['torch']}, {args.threads} thread(s), {m['date']}, ", end="")
    print(f"load {m['load_1min']}")
    print(
        f"{args.cell.upper()} {args.layers}×{args.hidden}, T={args.steps}, B={args.batch}, "
        f"{args.loop} loop, {args.rounds} interleaved rounds\n"
    )
    print("| option | ms per training step | × the plain layer |\n|---|---:|---:|")
    for r in rows:
        print(f"| {r['option']} | {r['ms_per_step']} | {r['ratio_to_none']:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
