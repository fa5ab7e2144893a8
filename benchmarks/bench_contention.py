"""Training throughput on a busy machine: rnnkit vs the same model on torch.nn, with 0, 1
and 2 competing CPU-bound processes.

The model is the main job's (``make run``): embedding 64 → LSTM 256 → linear over 100
symbols, B = 32, K = 64 (``segment:64``), Adam, global-norm clipping at 5, state carried.
Every measurement is a fresh worker process (OpenMP reads its environment once, at
start), trained for ``--steps`` steps (or ``--max-seconds``) after 2 warm-up steps; the competitors
(``while True: pass`` in their own interpreters) start before the worker, so the worker
sees them when it starts. Contenders:

* ``rnnkit``: as rnnkit trains by default — thread count from the CPU budget
  (``rnnkit.threads.ThreadGovernor``, applied and re-checked the way ``Trainer.fit``
  does) and a short OpenMP spin (set on ``import rnnkit``);
* ``torch.nn``: ``nn.Embedding`` + ``nn.LSTM`` + ``nn.Linear`` in a process that never
  imports rnnkit: torch's defaults (one thread per core, OpenMP's default spin);
* optional ``rnnkit@N`` / ``torch.nn@N``: the same with ``N`` threads fixed
  (``torch.set_num_threads``), e.g. ``rnnkit@2`` is rnnkit before the thread choice;
  a suffix ``+spin=S`` runs the worker with ``GOMP_SPINCOUNT=S`` (libgomp's default is
  300000; rnnkit sets 10000 unless the user chose), e.g. ``rnnkit@2+spin=300000``.

Rounds interleave the levels and contenders (fresh random order each round); figures
are medians over rounds. The header records the 1-minute load before the run: other
programs already running count as competitors the benchmark did not start.

    python benchmarks/bench_contention.py               # 3 rounds, 20 steps (~3-4 min)
    python benchmarks/bench_contention.py --quick       # 1 round, 10 steps (~1 min)
    python benchmarks/bench_contention.py --contenders rnnkit,rnnkit@2,torch.nn,torch.nn@1
    python benchmarks/bench_contention.py --contenders rnnkit@2,rnnkit@2+spin=300000,rnnkit@2+spin=0
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
V, E, H, B, K = 100, 64, 256, 32, 64


def worker(contender: str, steps: int, max_seconds: float) -> dict[str, Any]:
    """Train ``steps`` steps (or until ``max_seconds``) and return tokens/s and threads."""
    name, _, fixed = contender.partition("@")
    if name == "rnnkit":
        import rnnkit  # noqa: F401  (sets the OpenMP spin before torch loads)
    import torch
    from torch import nn

    if fixed:
        torch.set_num_threads(int(fixed))
    torch.manual_seed(0)
    governor = None
    if name == "rnnkit":
        from rnnkit.models.builders import build_language_model
        from rnnkit.models.spec import ModelSpec
        from rnnkit.threads import ThreadGovernor
        from rnnkit.types import LSTMState

        lm = build_language_model(ModelSpec(hidden=H, embedding=E), V)
        model: nn.Module = lm

        def loss_fn(x, y, state):
            out = lm.loss(x, y, state=None if state is None else LSTMState(*state))
            return out.loss, out.state

        if not fixed:
            governor = ThreadGovernor(rows=B)
    else:

        class TorchLM(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.embedding = nn.Embedding(V, E)
                self.lstm = nn.LSTM(E, H, batch_first=True)
                self.head = nn.Linear(H, V)

            def forward(self, x, y, state):
                h, state = self.lstm(self.embedding(x), state)
                logits = self.head(h)
                return nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten()), state

        model = TorchLM()
        loss_fn = model

    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    data = torch.randint(0, V, (8, B, K + 1), generator=gen)
    carry: list[tuple[torch.Tensor, ...] | None] = [None]

    def step(i: int) -> None:
        x, y = data[i % 8, :, :-1], data[i % 8, :, 1:]
        opt.zero_grad(set_to_none=True)
        loss, state = loss_fn(x, y, carry[0])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        opt.step()
        carry[0] = tuple(s.detach() for s in state)

    if governor is not None:
        governor.start()  # Trainer.fit does this before its first step
    for i in range(2):
        step(i)
    done = 0
    t0 = time.perf_counter()
    while done < steps and (done < 1 or time.perf_counter() - t0 < max_seconds):
        step(done)
        if governor is not None:
            governor.tick()
        done += 1
    seconds = time.perf_counter() - t0
    threads = torch.get_num_threads()
    if governor is not None:
        governor.stop()
    return {
        "tokens_per_s": done * B * K / seconds,
        "steps": done,
        "seconds": seconds,
        "threads": threads,
        "note": governor.note if governor is not None else "",
    }


def _spawn_competitors(n: int) -> list[subprocess.Popen]:
    return [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL)
        for _ in range(n)
    ]


def _run_worker(contender: str, steps: int, max_seconds: float) -> dict[str, Any]:
    env = dict(os.environ)
    contender, _, spin = contender.partition("+spin=")
    if spin:  # libgomp reads it at load: only a fresh process can change it
        env["GOMP_SPINCOUNT"] = spin
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, __file__, "--worker", contender, "--steps", str(steps)]
    cmd += ["--max-seconds", str(max_seconds)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"worker {contender} failed: {proc.stderr.strip()[-500:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--contenders", default="rnnkit,torch.nn")
    p.add_argument("--levels", default="0,1,2", help="numbers of competing processes")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=20, help="timed steps per measurement")
    p.add_argument("--max-seconds", type=float, default=10.0, help="cap per measurement")
    p.add_argument("--quick", action="store_true", help="1 round of 10 steps")
    p.add_argument("--json", action="store_true")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.steps, args.max_seconds)))
        return 0
    if args.quick:
        args.rounds, args.steps, args.max_seconds = 1, 10, 5.0

    sys.path.insert(0, str(HERE))
    from _common import machine

    info = machine()
    contenders = args.contenders.split(",")
    levels = [int(v) for v in args.levels.split(",")]
    runs: dict[tuple[int, str], list[dict[str, Any]]] = {
        (lv, c): [] for lv in levels for c in contenders
    }
    rng = random.Random(0)
    started = time.perf_counter()
    for _ in range(args.rounds):
        for level in levels:
            competitors = _spawn_competitors(level)
            try:
                time.sleep(0.5 if level else 0.0)
                order = contenders[:]
                rng.shuffle(order)
                for c in order:
                    runs[(level, c)].append(_run_worker(c, args.steps, args.max_seconds))
            finally:
                for proc in competitors:
                    proc.kill()
                    proc.wait()
    elapsed = time.perf_counter() - started

    table = []
    for level in levels:
        row: dict[str, Any] = {"competitors": level}
        for c in contenders:
            rs = runs[(level, c)]
            row[c] = statistics.median(float(r["tokens_per_s"]) for r in rs)
            row[c + " threads"] = sorted({int(r["threads"]) for r in rs})
        table.append(row)
    idle = {c: table[0][c] for c in contenders} if levels and levels[0] == 0 else {}
    result = {
        "machine": info,
        "seconds": round(elapsed, 1),
        "table": table,
        "runs": {f"{lv}/{c}": rs for (lv, c), rs in runs.items()},
    }
    if args.json:
        print(json.dumps(result))
        return 0
    print(
        f"{info['cpu']}, {info['cores']} cores, torch {info['torch']}, {info['date']}, "
        f"load {info['load_1min']} before the run; {args.rounds} rounds, {elapsed:.0f} s"
    )
    head = "| competitors | " + " | ".join(f"{c} tok/s (threads)" for c in contenders)
    head += " | " + " | ".join(f"{c} % of idle" for c in contenders if idle) + " |"
    if "rnnkit" in contenders and "torch.nn" in contenders:
        head += " rnnkit / torch.nn |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for row in table:
        cells = [f"{row[c]:,.0f} ({','.join(map(str, row[c + ' threads']))})" for c in contenders]
        cells += [f"{100 * row[c] / idle[c]:.0f} %" for c in contenders if idle]
        if "rnnkit" in contenders and "torch.nn" in contenders:
            cells.append(f"{row['rnnkit'] / row['torch.nn']:.2f}")
        print(f"| {row['competitors']} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
