"""Layers whose weights are bfloat16, float16 or float64, on the CPU, against ``torch.nn``.

For each dtype, each layer (``rnnkit.nn.LSTM``/``GRU``, the drop-ins, and
``rnnkit.layers.LSTM``/``GRU``, rnnkit's own layers made by ``from_torch``) and each mode
(training = forward + backward of ``out.sum()``, inference = forward under
``torch.no_grad()``), three contenders with the same weights in the same dtype, timed in
interleaved rounds: ``torch.nn``'s layer, rnnkit's, and rnnkit's with the time loop in
the weights' own dtype (``computes_in_float32`` switched off: the PyTorch loop, as before
float16/bfloat16 weights computed in float32 on the CPU). Ratio = rnnkit time / torch
time (> 1: rnnkit is slower), the median over rounds of the ratio within a round. Then,
for float16/bfloat16, one training step of an encoder–decoder with additive attention
(no ``torch.nn`` equivalent: against the same model in float32).

    python benchmarks/bench_dtypes.py [--rounds 7] [--seq 40] [--batch 16] [--hidden 128]
        [--dtypes bf16,fp16,fp64] [--cpu-time] [--json]

One torch thread (``torch.set_num_threads(1)``).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import interleaved, machine, median_ratio

import rnnkit.layers.attention_loop as attention_loop
import rnnkit.layers.recurrent as recurrent
from rnnkit import nn as rnnkit_nn
from rnnkit.layers import from_torch
from rnnkit.models import ModelSpec
from rnnkit.models.seq2seq import build_seq2seq

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp64": torch.float64}


@contextlib.contextmanager
def loop_in_weights_dtype() -> Iterator[None]:
    """The time loops (the layers' and the attention decoder's) in the weights' own dtype
    (the behaviour before computes_in_float32)."""
    before = recurrent.computes_in_float32

    def never(weight: torch.Tensor, fused: bool = False) -> bool:
        return False

    recurrent.computes_in_float32 = attention_loop.computes_in_float32 = never
    try:
        yield
    finally:
        recurrent.computes_in_float32 = attention_loop.computes_in_float32 = before


def seq2seq_contenders(dtype: torch.dtype, B: int, H: int) -> dict[str, Callable[[], Any]]:
    """An encoder–decoder with additive attention (LSTM, S = T = 30, vocabularies of 50)
    trained one step: in float32, in ``dtype``, and in ``dtype`` with the loops in it."""
    torch.manual_seed(0)
    base = build_seq2seq(ModelSpec(hidden=H, embedding=32, attention="additive"), 50, 50)
    source, target = torch.randint(3, 50, (B, 30)), torch.randint(3, 50, (B, 30))
    mask = torch.ones_like(source, dtype=torch.bool)

    def step(model: torch.nn.Module) -> Callable[[], Any]:
        def run() -> Any:
            model(source, mask, target, mask).logits.float().sum().backward()

        return run

    low = step(copy.deepcopy(base).to(dtype))

    def before() -> Any:
        with loop_in_weights_dtype():
            return low()

    return {"fp32": step(base), "rnnkit": low, "before": before}


def _call(module: torch.nn.Module, x: Tensor, train: bool, own: bool) -> Callable[[], Any]:
    def run() -> Any:
        if not train:
            with torch.no_grad():
                return module(x)
        out = module(x)
        (out.outputs if own else out[0]).sum().backward()
        return None

    return run


def contenders(
    kind: str, own: bool, dtype: torch.dtype, train: bool, T: int, B: int, H: int
) -> dict[str, Callable[[], Any]]:
    """torch.nn's layer, rnnkit's, and rnnkit's with the loop in the weights' dtype."""
    torch.manual_seed(0)
    reference = getattr(torch.nn, kind)(H, H, batch_first=own).to(dtype)
    if own:
        ours: torch.nn.Module = from_torch(reference)
    else:
        ours = getattr(rnnkit_nn, kind)(H, H).to(dtype)
        ours.load_state_dict(reference.state_dict())
    shape = (B, T, H) if own else (T, B, H)
    x = torch.randn(*shape, dtype=dtype, requires_grad=train)
    run = _call(ours, x, train, own)

    def before() -> Any:
        with loop_in_weights_dtype():
            return run()

    return {"torch": _call(reference, x, train, False), "rnnkit": run, "before": before}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--seq", type=int, default=40)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--dtypes", default="bf16,fp16,fp64")
    p.add_argument("--cpu-time", action="store_true", help="time the thread's CPU time")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    clock = "thread" if args.cpu_time else "wall"
    rows = []
    for name in args.dtypes.split(","):
        for layer in ("nn.LSTM", "nn.GRU", "layers.LSTM", "layers.GRU"):
            own, kind = layer.startswith("layers."), layer.split(".")[1]
            for train in (True, False):
                fns = contenders(kind, own, DTYPES[name], train, args.seq, args.batch, args.hidden)
                times = interleaved(fns, args.rounds, block_s=0.1, clock=clock)
                row = {
                    "dtype": name,
                    "layer": layer,
                    "mode": "train" if train else "infer",
                    "torch_ms": 1e3 * sorted(times["torch"])[len(times["torch"]) // 2],
                    "rnnkit_over_torch": median_ratio(times, "rnnkit", "torch"),
                    "before_over_torch": median_ratio(times, "before", "torch"),
                    "before_over_rnnkit": median_ratio(times, "before", "rnnkit"),
                }
                rows.append(row)
                if not args.json:
                    print(
                        f"{name:5s} {layer:12s} {row['mode']:5s} torch {row['torch_ms']:7.2f} ms"
                        f"  rnnkit/torch {row['rnnkit_over_torch']:5.2f}"
                        f"  before/torch {row['before_over_torch']:5.2f}"
                        f"  before/rnnkit {row['before_over_rnnkit']:5.2f}",
                        flush=True,
                    )
    for name in args.dtypes.split(","):
        if DTYPES[name] == torch.float64:
            continue
        times = interleaved(
            seq2seq_contenders(DTYPES[name], args.batch, args.hidden), args.rounds, 0.1, clock=clock
        )
        row = {
            "dtype": name,
            "layer": "seq2seq",
            "mode": "train",
            "fp32_ms": 1e3 * sorted(times["fp32"])[len(times["fp32"]) // 2],
            "rnnkit_over_fp32": median_ratio(times, "rnnkit", "fp32"),
            "before_over_fp32": median_ratio(times, "before", "fp32"),
        }
        rows.append(row)
        if not args.json:
            print(
                f"{name:5s} seq2seq      train fp32  {row['fp32_ms']:7.2f} ms"
                f"  rnnkit/fp32  {row['rnnkit_over_fp32']:5.2f}"
                f"  before/fp32  {row['before_over_fp32']:5.2f}",
                flush=True,
            )
    if args.json:
        print(json.dumps({"machine": machine(), "rows": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
