"""Mixed precision on CPU: where bfloat16 pays, and why the recurrence stays float32.

Part 1, one LSTM layer (T=64, B=32, I=64), forward + backward, interleaved rounds:
the compiled float32 loop, the PyTorch float32 loop, and the PyTorch loop in bfloat16
(what running the recurrence in the autocast dtype would cost), each with its error
against float64 (max |output error|, max relative gradient error over the parameters).

Part 2, the ``make run`` character LM (embedding 64 → LSTM 256 → linear, B=32, segments
of 64, Adam, clip 5) trained by the ``Trainer`` with ``precision`` fp32, bf16 and fp16
from the same weights on the same batches, in interleaved blocks of steps: tokens/s
(median over blocks), the final training loss and the validation loss (float32).

    python benchmarks/bench_precision.py [--rounds 8] [--block 40] [--threads N] [--json]
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import interleaved, machine, median
from bench_dtypes import loop_in_weights_dtype

from rnnkit.bptt import native
from rnnkit.cells.lstm import LSTMCell
from rnnkit.data.batching import StreamBatcher
from rnnkit.data.corpus import stdlib_corpus
from rnnkit.data.text import encode_text, read_text
from rnnkit.data.vocab import Vocabulary
from rnnkit.layers.recurrent import Recurrent
from rnnkit.models.builders import build_language_model
from rnnkit.models.spec import ModelSpec
from rnnkit.training.loop import Trainer, TrainOptions


def recurrence(hidden: int, rounds: int) -> dict[str, dict[str, float]]:
    T, B, I = 64, 32, 64
    torch.manual_seed(0)
    ref = Recurrent(LSTMCell(I, hidden)).double()
    x64 = torch.randn(T, B, I, dtype=torch.float64)
    g64 = torch.randn(T, B, hidden, dtype=torch.float64)
    variants = {
        "fp32 compiled": (torch.float32, True),
        "fp32 pytorch": (torch.float32, False),
        "bf16 pytorch": (torch.bfloat16, False),
    }

    def make(dtype: torch.dtype, compiled: bool):
        layer = copy.deepcopy(ref).to(dtype)
        x, g = x64.to(dtype).requires_grad_(), g64.to(dtype)

        def run():
            for p in layer.parameters():
                p.grad = None
            # bf16 on the PyTorch loop in bfloat16 itself (a bfloat16 layer on the CPU
            # otherwise computes in float32)
            low = loop_in_weights_dtype() if dtype == torch.bfloat16 else nullcontext()
            with native.use_native(compiled), low:
                out, _ = layer(x)
                out.backward(g)
            return out

        return layer, run

    x_ref = x64.clone().requires_grad_()
    out_ref, _ = ref(x_ref)
    out_ref.backward(g64)
    grads_ref = {n: p.grad for n, p in ref.named_parameters() if p.grad is not None}
    fns: dict[str, Any] = {}
    result: dict[str, dict[str, float]] = {}
    for name, (dtype, compiled) in variants.items():
        layer, run = make(dtype, compiled)
        out = run().detach().double()
        result[name] = {
            "out_err": float((out - out_ref.detach()).abs().max()),
            "grad_rel_err": max(
                float((p.grad.double() - grads_ref[n]).norm() / grads_ref[n].norm())
                for n, p in layer.named_parameters()
                if p.grad is not None
            ),
        }
        fns[name] = run
    times = interleaved(fns, rounds=rounds, block_s=0.3)
    for name in variants:
        result[name]["tokens_per_s"] = T * B / median(times[name])
    return result


def language_model(rounds: int, block: int) -> dict[str, dict[str, Any]]:
    train_path, valid_path = stdlib_corpus(Path("runs/bench_corpus"), max_chars=300_000)
    text = read_text(train_path)
    vocab = Vocabulary.from_text(text, unit="char")
    ids = encode_text(text, vocab, dtype=np.int64)
    valid_ids = encode_text(read_text(valid_path)[:40_000], vocab, dtype=np.int64)
    spec = ModelSpec(hidden=256, embedding=64)
    torch.manual_seed(0)
    base = build_language_model(spec, len(vocab))
    trainers = {}
    for precision in ("fp32", "bf16", "fp16"):
        model = copy.deepcopy(base)
        trainers[precision] = Trainer(
            model,
            torch.optim.Adam(model.parameters(), lr=3e-3),
            StreamBatcher(ids, 32, 64),
            lambda m, b, c: m.loss(b.inputs, b.targets, state=c),
            TrainOptions(steps=1, clip_norm=5.0, quiet=True, precision=precision),
        )
    rates: dict[str, list[float]] = {p: [] for p in trainers}
    order = list(trainers)
    for r in range(rounds):
        for precision in order[r % 3 :] + order[: r % 3]:  # rotate: no fixed position
            t = trainers[precision]
            t.total_steps = t.step + block  # the budget the trainer resolved, moved on
            res = t.fit()
            rates[precision].append(res.tokens / res.train_seconds)
    result: dict[str, dict[str, Any]] = {}
    valid = StreamBatcher(valid_ids, 32, 64)
    for precision, t in trainers.items():
        t.model.eval()
        nats = tokens = 0.0
        with torch.no_grad():
            for batch in valid:
                out = t.model.loss(batch.inputs, batch.targets)
                nats, tokens = nats + float(out.nats), tokens + int(out.tokens)
        result[precision] = {
            "tokens_per_s": median(rates[precision]),
            "steps": t.step,
            "final_train_loss_nats": t.history[-1]["loss_nats"] if t.history else None,
            "valid_loss_nats": nats / tokens,
            "scaler_skips": t.scaler_skips,
        }
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--block", type=int, default=40, help="training steps per timed block")
    p.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    result: dict[str, Any] = {
        "machine": machine(),
        "recurrence": {f"H={h}": recurrence(h, args.rounds) for h in (128, 256, 512)},
        "char_lm": language_model(args.rounds, args.block),
        "seconds": None,
    }
    result["seconds"] = round(time.perf_counter() - started, 1)
    if args.json:
        print(json.dumps(result))
        return 0
    print(json.dumps(result["machine"]))
    for size, rows in result["recurrence"].items():
        for name, r in rows.items():
            print(
                f"LSTM {size:6s} {name:14s} {r['tokens_per_s']:9.0f} tok/s  "
                f"out err {r['out_err']:.1e}  grad err {r['grad_rel_err']:.1e}"
            )
    for precision, r in result["char_lm"].items():
        print(
            f"char LM {precision}: {r['tokens_per_s']:.0f} tok/s, {r['steps']} steps, "
            f"train loss {r['final_train_loss_nats']:.4f}, valid {r['valid_loss_nats']:.4f} "
            f"nats/char, scaler skips {r['scaler_skips']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
