"""Encoder–decoder throughput: training and decoding (greedy, beam 5), sentences/s.

The task is string reversal (``rnnkit.data.generated_pairs``), characters, lengths
uniform in ``[min-len, max-len]``. The model is the one ``rnnkit train --task seq2seq``
builds (``build_seq2seq``). Measured in one run:

* training: forward + backward + Adam step on batches of ``--batch`` pairs, for teacher
  forcing with attention (``--attention-wiring before``: one autograd node over the
  decoder's steps; ``after``: one layer call, then batched attention), scheduled
  sampling at p = 0.5 (a cell-level loop with the per-step head and coin tosses), and,
  as a reference, the
  model without attention, whose teacher-forced decoder is one layer call (the library's
  explicit BPTT);
* decoding: the attention model after a short training (so that it ends its outputs
  with ``</s>`` as a trained model does), greedy and beam 5 over ``--decode`` sources in
  batches, length-sorted as ``rnnkit evaluate`` does; the exact match reached is printed
  beside it.

Each figure is the median over ``--rounds`` timed blocks, on ``--threads`` intra-op
threads (default 1).

    python benchmarks/bench_seq2seq.py            # about a minute on 2 cores
    python benchmarks/bench_seq2seq.py --json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import time
from typing import Any

import numpy as np
import torch

from rnnkit.app.tasks.seq2seq import decode_ids
from rnnkit.data.generated_pairs import generate_pairs
from rnnkit.data.pairs import Pair, PairBatcher, encode_pairs
from rnnkit.data.vocab import Vocabulary
from rnnkit.metrics.sequences import exact_match
from rnnkit.models.seq2seq import build_seq2seq
from rnnkit.models.spec import ModelSpec


def _median_time(fn, rounds: int, reps: int) -> float:
    fn()  # warm up
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        times.append((time.perf_counter() - t0) / reps)
    return statistics.median(times)


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _model(args: argparse.Namespace, attention: str, seed: int = 0):
    torch.manual_seed(seed)
    spec = ModelSpec(
        cell=args.cell,
        hidden=args.hidden,
        embedding=args.embedding,
        attention=attention,
        bidirectional=args.bidirectional,
        context="init",
        attention_wiring=args.attention_wiring if attention != "none" else "before",
    )
    return build_seq2seq(spec, args.vocab_size, args.vocab_size)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cell", default="lstm", choices=("rnn", "lstm", "gru"))
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--embedding", type=int, default=64)
    p.add_argument("--attention", default="additive", choices=("dot", "bilinear", "additive"))
    p.add_argument(
        "--attention-wiring",
        default="before",
        choices=("before", "after"),
        help="attention before the decoder step (context fed in) or after it",
    )
    p.add_argument("--bidirectional", action="store_true", help="bidirectional encoder")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--min-len", type=int, default=5)
    p.add_argument("--max-len", type=int, default=15)
    p.add_argument("--train-steps", type=int, default=400, help="training before decoding")
    p.add_argument("--decode", type=int, default=512, help="sources decoded per timing")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="intra-op threads (default 1: the ops are small; on a busy 2-core machine "
        "OpenMP spin-waiting makes 2 threads many times slower)",
    )
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    pairs = [Pair(s, t) for s, t in generate_pairs("reverse", 4096, 0, args.min_len, args.max_len)]
    vocab = Vocabulary.from_text("".join(p.source for p in pairs))
    args.vocab_size = len(vocab)
    src, tgt = encode_pairs(pairs, vocab, vocab)
    batches = list(PairBatcher(src, tgt, batch_size=args.batch, seed=0))

    results: dict[str, float] = {}

    def train_rate(model, sampling_p: float | None) -> float:
        opt = torch.optim.Adam(model.parameters(), lr=2e-3)
        it = iter(range(10**9))

        def one_step() -> None:
            batch = batches[next(it) % len(batches)]
            opt.zero_grad(set_to_none=True)
            model.loss(batch, sampling_p=sampling_p).loss.backward()
            opt.step()

        return args.batch / _median_time(one_step, args.rounds, 5)

    results["train_attention_tf"] = train_rate(_model(args, args.attention), None)
    results["train_attention_ss0.5"] = train_rate(_model(args, args.attention), 0.5)
    results["train_no_attention_tf"] = train_rate(_model(args, "none"), None)

    # Decode with a model trained enough to end its outputs like a trained model.
    model = _model(args, args.attention)
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    t0 = time.perf_counter()
    for step in range(args.train_steps):
        batch = batches[step % len(batches)]
        opt.zero_grad(set_to_none=True)
        model.loss(batch).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        opt.step()
    train_s = time.perf_counter() - t0
    model.eval()
    held = [
        Pair(s, t)
        for s, t in generate_pairs("reverse", args.decode, 99, args.min_len, args.max_len)
    ]
    hsrc, _ = encode_pairs(held, vocab, vocab)
    refs = [list(p.target) for p in held]
    max_length = 2 * args.max_len + 2
    for beam in (1, 5):
        hyps: list[list[int]] = []

        def run(beam: int = beam, hyps: list = hyps) -> None:
            hyps[:] = decode_ids(model, hsrc, torch.device("cpu"), args.batch, beam, max_length)

        seconds = _median_time(run, max(1, args.rounds // 2), 1)
        name = "greedy" if beam == 1 else f"beam{beam}"
        results[f"decode_{name}"] = len(hsrc) / seconds
        results[f"exact_match_{name}"] = exact_match(
            [[vocab.itos[i] for i in h] for h in hyps], refs
        )

    record: dict[str, Any] = {
        "machine": _cpu(),
        "load_average": round(os.getloadavg()[0], 1),
        "cpus": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "date": datetime.date.today().isoformat(),
        "model": {
            "cell": args.cell,
            "hidden": args.hidden,
            "embedding": args.embedding,
            "attention": args.attention,
            "attention_wiring": args.attention_wiring,
            "bidirectional": args.bidirectional,
            "parameters": sum(p.numel() for p in model.parameters()),
        },
        "data": f"reverse, lengths {args.min_len}-{args.max_len}, batch {args.batch}",
        "decode_model_training": {"steps": args.train_steps, "seconds": round(train_s, 1)},
        "sentences_per_s": {k: round(v, 1) for k, v in results.items() if "exact" not in k},
        "exact_match": {k[12:]: v for k, v in results.items() if k.startswith("exact")},
        "mean_target_tokens": float(np.mean([len(p.target) + 1 for p in pairs])),
    }
    if args.json:
        print(json.dumps(record))
        return
    m = record["model"]
    print(
        f"seq2seq {m['cell']} H={m['hidden']} E={m['embedding']} attention={m['attention']} "
        f"({m['parameters']:,} parameters); {record['data']}; torch {record['torch']}, "
        f"{record['threads']} thread(s), {record['machine']}, load {record['load_average']}"
    )
    for key, value in record["sentences_per_s"].items():
        print(f"  {key:<24} {value:10.1f} sentences/s")
    for key, value in record["exact_match"].items():
        print(f"  exact match ({key:<6})    {value:10.3f}  after {args.train_steps} steps")


if __name__ == "__main__":
    main()
