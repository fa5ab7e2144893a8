"""rnnkit vs torch.nn vs a plain autograd loop: training and inference speed, one run.

Every contender computes the same function: the rnnkit layer is ``rnnkit.from_torch`` of
the ``torch.nn`` module, and the plain loop runs the oracle step functions
(``lstm_step``, ``gru_step``) of that rnnkit layer's cell in a Python loop under autograd.
Training = forward + backward (gradients of every parameter and of the input, for a fixed
random gradient of the outputs); inference = forward under ``torch.no_grad()``.

Runs are interleaved (see ``_common.py``) and each ratio is the median of per-round
ratios; ``torch/rnnkit > 1`` means rnnkit is faster. Also measured in the same run: the
variable-length case (lengths uniform in [T/10, T]: rnnkit with ``lengths`` vs
``torch.nn`` on ``pack_padded_sequence`` vs ``torch.nn`` on the padded batch) and the
achieved matrix-product GFLOP/s against the measured float32 ``torch.mm`` ceiling —
twice: against the best of two 3072² products at the start and the end of the run, and
against a 2048² product timed in every round of the training runs beside the layers
(``%round``: the median over rounds of the layer's rate over the product's rate in that
round), which the machine's drift within a run cannot bias.

    python benchmarks/bench_recurrent.py                 # full table (several minutes)
    python benchmarks/bench_recurrent.py --quick         # fewer rounds and sizes
    python benchmarks/bench_recurrent.py --cells lstm --hidden 512 --batch 64 --json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    fastest_product,
    interleaved,
    machine,
    matmul_ceiling,
    median,
    median_ratio,
    round_ceiling,
)

import rnnkit
from rnnkit.cells.gru import gru_step
from rnnkit.cells.lstm import lstm_step
from rnnkit.types import LSTMState

TORCH_CLASSES = {"lstm": nn.LSTM, "gru": nn.GRU}
GATES = {"lstm": 4, "gru": 3}


def plain_loop(
    layer: rnnkit.StackedRecurrent, cell_kind: str
) -> Callable[[torch.Tensor], torch.Tensor]:
    """A Python loop of the oracle step over time, differentiated by autograd."""
    cell: Any = layer.cells()[0]  # an LSTM or a GRU cell: their weights and options

    def run(x: torch.Tensor) -> torch.Tensor:  # x (B, T, I) → outputs (B, T, H)
        B, H = x.shape[0], cell.hidden_size
        w = cell.weights()
        h = x.new_zeros(B, H)
        c = x.new_zeros(B, H)
        outs = []
        for x_t in x.unbind(1):
            if cell_kind == "lstm":
                h, c = lstm_step(x_t, LSTMState(h, c), w)
            else:
                h = gru_step(x_t, h, w, cell.update, cell.reset)
            outs.append(h)
        return torch.stack(outs, dim=1)

    return run


def matmul_flops(cell: str, B: int, T: int, I: int, H: int, training: bool) -> float:
    """Matrix-product flops of one call: forward 2·T·B·G·H·(I + H); backward twice that
    (input/state gradients and weight gradients)."""
    forward = 2.0 * T * B * GATES[cell] * H * (I + H)
    return 3 * forward if training else forward


def bench_config(
    cell: str, H: int, B: int, T: int, I: int, rounds: int, block_s: float, loop: bool, clock: str
) -> dict[str, Any]:
    torch.manual_seed(0)
    tm = TORCH_CLASSES[cell](I, H, batch_first=True)
    km = rnnkit.from_torch(tm)
    assert isinstance(km, rnnkit.StackedRecurrent)
    params = {"torch": list(tm.parameters()), "rnnkit": list(km.parameters())}
    x = torch.randn(B, T, I, requires_grad=True)
    d_out = torch.randn(B, T, H)
    runs: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
        "torch": lambda x: tm(x)[0],
        "rnnkit": lambda x: km(x).outputs,
    }
    if loop:
        runs["loop"] = plain_loop(km, cell)
        params["loop"] = params["rnnkit"]

    def train(name: str) -> Callable[[], object]:
        fn, ps = runs[name], params[name]
        return lambda: torch.autograd.grad(fn(x), [x, *ps], d_out)

    def infer(name: str) -> Callable[[], object]:
        fn = runs[name]

        def go() -> object:
            with torch.no_grad():
                return fn(x)

        return go

    result: dict[str, Any] = {"cell": cell, "H": H, "B": B, "T": T, "I": I}
    for mode, make in (("train", train), ("infer", infer)):
        fns = {n: make(n) for n in runs}
        mm_flops = 0.0
        if mode == "train":  # the ceiling, timed in the same rounds
            fns["mm"], mm_flops = round_ceiling()
        times = interleaved(fns, rounds, block_s, clock=clock)
        entry: dict[str, Any] = {f"{n}_ms": median(times[n]) * 1e3 for n in runs}
        entry["torch/rnnkit"] = median_ratio(times, "torch", "rnnkit")
        if loop:
            entry["loop/rnnkit"] = median_ratio(times, "loop", "rnnkit")
        flops = matmul_flops(cell, B, T, I, H, mode == "train")
        entry["rnnkit_gflops"] = flops / median(times["rnnkit"]) / 1e9
        entry["torch_gflops"] = flops / median(times["torch"]) / 1e9
        if mm_flops:
            # the layer's rate over the product's, within each round
            entry["rnnkit_round_share"] = median(
                [
                    (flops / t) / (mm_flops / m)
                    for t, m in zip(times["rnnkit"], times["mm"], strict=True)
                ]
            )
            entry["mm_round_gflops"] = mm_flops / median(times["mm"]) / 1e9
        entry["tokens_per_s"] = {n: B * T / median(times[n]) for n in runs}
        result[mode] = entry
    return result


def bench_varlen(
    cell: str, H: int, B: int, T: int, I: int, rounds: int, block_s: float, clock: str
) -> dict[str, Any]:
    """Training on lengths uniform in [T/10, T]: cost should follow the real tokens."""
    torch.manual_seed(1)
    tm = TORCH_CLASSES[cell](I, H, batch_first=True)
    km = rnnkit.from_torch(tm)
    x = torch.randn(B, T, I, requires_grad=True)
    lengths = torch.randint(max(T // 10, 1), T + 1, (B,))
    mask = torch.arange(T)[None, :] < lengths[:, None]  # (B, T)
    d_out = torch.randn(B, T, H) * mask[..., None]
    tp, kp = list(tm.parameters()), list(km.parameters())

    def rnnkit_run() -> object:
        out = km(x, lengths=lengths).outputs
        return torch.autograd.grad(out, [x, *kp], d_out)

    def packed_run() -> object:
        packed = nn.utils.rnn.pack_padded_sequence(
            x, lengths, batch_first=True, enforce_sorted=False
        )
        out, _ = nn.utils.rnn.pad_packed_sequence(tm(packed)[0], batch_first=True, total_length=T)
        return torch.autograd.grad(out, [x, *tp], d_out)

    def padded_run() -> object:
        return torch.autograd.grad(tm(x)[0], [x, *tp], d_out)

    times = interleaved(
        {"rnnkit": rnnkit_run, "packed": packed_run, "padded": padded_run},
        rounds,
        block_s,
        clock=clock,
    )
    return {
        "cell": cell,
        "H": H,
        "B": B,
        "T": T,
        "real_tokens": int(lengths.sum()),
        **{f"{n}_ms": median(v) * 1e3 for n, v in times.items()},
        "packed/rnnkit": median_ratio(times, "packed", "rnnkit"),
        "padded/rnnkit": median_ratio(times, "padded", "rnnkit"),
    }


def print_tables(report: dict[str, Any], out) -> None:
    m = report["machine"]
    # The machine's ceiling is the better of the two measurements (start and end of the
    # run): a lower one only says that something else had a core at that moment.
    ceiling = max(report["matmul_gflops"], report.get("matmul_gflops_end", 0.0))
    print(
        f"# {m['cpu']}, {m['cores']} cores, torch {m['torch']} ({m['torch_threads']} threads), "
        f"{m['date']}, load {m['load_1min']}, {m['clock']} clock; "
        f"float32 product ceiling {ceiling:.0f} GFLOP/s "
        f"({report.get('ceiling_product', 'torch.mm')})",
        file=out,
    )
    rows = report["configs"]
    if rows:
        print(
            "\ncell   H   B | train ms: rnnkit  torch   loop | torch/rk loop/rk | "
            "infer ms: rnnkit  torch   loop | torch/rk loop/rk | "
            "train GFLOP/s rk (%ceil %round) torch",
            file=out,
        )
        for r in rows:
            cells = []
            for mode in ("train", "infer"):
                e = r[mode]
                loop_ms, loop_ratio = (
                    e.get("loop_ms", float("nan")),
                    e.get("loop/rnnkit", float("nan")),
                )
                cells.append(
                    f"{e['rnnkit_ms']:14.2f} {e['torch_ms']:6.2f} {loop_ms:6.2f}"
                    f" | {e['torch/rnnkit']:8.2f} {loop_ratio:7.2f}"
                )
            tr = r["train"]
            print(
                f"{r['cell']:5s} {r['H']:3d} {r['B']:3d} |{cells[0]} |{cells[1]} | "
                f"{tr['rnnkit_gflops']:6.1f} ({100 * tr['rnnkit_gflops'] / ceiling:3.0f}% "
                f"{100 * tr.get('rnnkit_round_share', float('nan')):3.0f}%) "
                f"{tr['torch_gflops']:6.1f}",
                file=out,
            )
    if report["varlen"]:
        print(
            "\nvariable lengths (training), lengths ~ U[T/10, T]\n"
            "cell   H   B  tokens | ms: rnnkit packed padded | packed/rk padded/rk",
            file=out,
        )
        for r in report["varlen"]:
            print(
                f"{r['cell']:5s} {r['H']:3d} {r['B']:3d} {r['real_tokens']:7d} | "
                f"{r['rnnkit_ms']:10.2f} {r['packed_ms']:6.2f} {r['padded_ms']:6.2f} | "
                f"{r['packed/rnnkit']:9.2f} {r['padded/rnnkit']:9.2f}",
                file=out,
            )


def ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cells", default="lstm,gru", help="comma-separated: lstm, gru")
    p.add_argument("--hidden", type=ints, default=None, help="H values (default 128,256,512)")
    p.add_argument("--batch", type=ints, default=None, help="B values (default 16,64)")
    p.add_argument("--seq", type=int, default=100, help="T (default 100)")
    p.add_argument("--input-size", type=int, default=None, help="I (default: I = H)")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 15)")
    p.add_argument("--block", type=float, default=0.15, help="seconds per timed block")
    p.add_argument("--quick", action="store_true", help="5 rounds, H 128,512, no plain loop")
    p.add_argument("--no-loop", action="store_true", help="skip the plain autograd loop")
    p.add_argument("--no-fixed", action="store_true", help="skip the fixed-length table")
    p.add_argument("--no-varlen", action="store_true", help="skip the variable-length table")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    p.add_argument(
        "--cpu-time",
        action="store_true",
        help="one thread, timed by its CPU time (steadier on a shared machine)",
    )
    p.add_argument("--json", action="store_true", help="JSON on stdout (table on stderr)")
    args = p.parse_args(argv)
    clock = "wall"
    if args.cpu_time:
        if args.threads not in (None, 1):
            p.error("--cpu-time measures one thread: leave --threads out")
        args.threads, clock = 1, "thread"
    if args.threads:
        torch.set_num_threads(args.threads)
    cells = [c for c in args.cells.split(",") if c]
    for c in cells:
        if c not in TORCH_CLASSES:
            p.error(f"--cells: unknown cell {c!r} (choose from lstm, gru)")
    hidden = args.hidden or ([128, 512] if args.quick else [128, 256, 512])
    batch = args.batch or [16, 64]
    rounds = args.rounds or (5 if args.quick else 15)
    loop = not (args.no_loop or args.quick)
    table_out = sys.stderr if args.json else sys.stdout

    report: dict[str, Any] = {
        "machine": {**machine(), "clock": clock},
        "matmul_gflops": matmul_ceiling(),
        "ceiling_product": fastest_product(),
        "configs": [],
        "varlen": [],
    }
    for cell in cells:
        for H in hidden:
            for B in batch:
                I = args.input_size or H
                if not args.no_fixed:
                    r = bench_config(cell, H, B, args.seq, I, rounds, args.block, loop, clock)
                    report["configs"].append(r)
                    print(
                        f"{cell} H={H} B={B}: train {r['train']['torch/rnnkit']:.2f} "
                        f"infer {r['infer']['torch/rnnkit']:.2f}",
                        file=sys.stderr,
                    )
                if not args.no_varlen:
                    v = bench_varlen(cell, H, B, args.seq, I, rounds, args.block, clock)
                    report["varlen"].append(v)
                    print(
                        f"{cell} H={H} B={B} varlen: packed/rk {v['packed/rnnkit']:.2f} "
                        f"padded/rk {v['padded/rnnkit']:.2f}",
                        file=sys.stderr,
                    )
    report["matmul_gflops_end"] = matmul_ceiling()
    print_tables(report, table_out)
    if args.json:
        json.dump(report, sys.stdout, indent=1)
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
