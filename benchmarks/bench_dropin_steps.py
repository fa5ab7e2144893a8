"""A decoder that calls its recurrent layer one step at a time, as the translation
tutorials write one: ``torch.nn`` against ``rnnkit.nn`` (the import swapped), side by side.

Per step: an embedding, one call of ``nn.GRU`` / ``nn.LSTM`` on a single time step (or of
``nn.GRUCell`` / ``nn.LSTMCell``) with the state carried, a linear output layer and the
argmax (greedy decoding, no gradient);
and a teacher-forced training step over the same ``STEPS`` calls (the summed loss's
backward). Three contenders in interleaved rounds (``_common.interleaved``): torch's
layer; rnnkit's drop-in as it runs by default (a layer's single step on the CPU is
torch's fused cell operators on torch's weights, a cell's step torch's fused step); and
rnnkit's drop-in with its own time loop and cell step forced (``use_fused("loop")``),
which is how every step ran before. Times
are per decoding or training step; ratios are medians of in-round ratios (> 1: slower
than ``torch.nn``).

    python benchmarks/bench_dropin_steps.py [--rounds 9] [--cpu-time] [--json]
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from typing import Any

import torch
from _common import interleaved, median_ratio, print_rows

from rnnkit import nn as rnnkit_nn
from rnnkit.bptt.fused import use_fused

STEPS = 20
VOCAB = 64


class Decoder(torch.nn.Module):
    """Embedding → a one-layer recurrent layer called per step → linear."""

    def __init__(self, nn: Any, kind: str, hidden: int) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, hidden)
        options = {} if kind.endswith("Cell") else {"batch_first": True}
        self.rnn = getattr(nn, kind)(hidden, hidden, **options)
        self.out = torch.nn.Linear(hidden, VOCAB)
        self.kind = kind

    def step(self, token: torch.Tensor, state: Any) -> tuple[torch.Tensor, Any]:
        if self.kind.endswith("Cell"):  # (B, H) in, h' (LSTMCell: (h', c')) out
            state = self.rnn(self.embed(token), state)
            return self.out(state[0] if isinstance(state, tuple) else state), state
        output, state = self.rnn(self.embed(token)[:, None], state)  # (B, 1, H)
        return self.out(output[:, 0]), state


def _greedy(model: Decoder, batch: int) -> Callable[[], object]:
    start = torch.zeros(batch, dtype=torch.long)

    def run() -> object:
        with torch.no_grad():
            token, state = start, None
            for _ in range(STEPS):
                logits, state = model.step(token, state)
                token = logits.argmax(-1)
        return token

    return run


def _teacher_forced(model: Decoder, batch: int) -> Callable[[], object]:
    gen = torch.Generator().manual_seed(0)
    targets = torch.randint(VOCAB, (batch, STEPS + 1), generator=gen)

    def run() -> object:
        state, loss = None, torch.zeros(())
        for t in range(STEPS):
            logits, state = model.step(targets[:, t], state)
            loss = loss + torch.nn.functional.cross_entropy(logits, targets[:, t + 1])
        model.zero_grad(set_to_none=True)
        loss.backward()
        return loss

    return run


def _forced_loop(fn: Callable[[], object]) -> Callable[[], object]:
    def run() -> object:
        with use_fused("loop"):
            return fn()

    return run


def measure(kind: str, hidden: int, batch: int, rounds: int, clock: str) -> list[dict]:
    torch.manual_seed(0)
    theirs = Decoder(torch.nn, kind, hidden)
    ours = Decoder(rnnkit_nn, kind, hidden)
    ours.load_state_dict(theirs.state_dict())
    rows = []
    for what, make in (("greedy", _greedy), ("teacher-forced", _teacher_forced)):
        fns = {
            "torch.nn": make(theirs, batch),
            "rnnkit.nn": make(ours, batch),
            "rnnkit loop": _forced_loop(make(ours, batch)),
        }
        times = interleaved(fns, rounds, clock=clock)
        rows.append(
            {
                "layer": kind,
                "H": hidden,
                "B": batch,
                "what": what,
                "torch_us_per_step": statistics.median(times["torch.nn"]) / STEPS * 1e6,
                "rnnkit": median_ratio(times, "rnnkit.nn", "torch.nn"),
                "loop_before": median_ratio(times, "rnnkit loop", "torch.nn"),
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--cpu-time", action="store_true", help="one thread, its CPU time")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.cpu_time:
        torch.set_num_threads(1)
    clock = "thread" if args.cpu_time else "wall"
    rows = [
        row
        for kind in ("GRU", "LSTM", "GRUCell", "LSTMCell")
        for hidden, batch in ((128, 1), (256, 16))
        for row in measure(kind, hidden, batch, args.rounds, clock)
    ]
    columns = {
        "layer": "{layer}", "H": "{H}", "B": "{B}", "decoding": "{what}",
        "torch.nn µs/step": "{torch_us_per_step:.0f}", "rnnkit.nn": "**{rnnkit:.2f}**",
        "own loop (before)": "{loop_before:.2f}",
    }  # fmt: skip
    print_rows(rows, columns, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
