"""End-to-end character language-model training: rnnkit vs the same model on torch.nn.LSTM.

Both models are the `make run` architecture (embedding 64 → LSTM 256 → linear over the
vocabulary), trained the same way: stream batches of B × K characters with the state
carried (detached) across segments, Adam, global-norm clipping at 5, one optimizer step
per batch. The torch model starts from the same weights (``rnnkit.to_torch``). Rounds
are interleaved; the figure is tokens/s (median) and their ratio. Also measured:
generation tokens/s (sampling at batch 1, the state carried token to token), rnnkit's
``generate`` against the same sampling loop written plainly on the ``torch.nn`` model,
interleaved (``--generate-only``: that alone).

    python benchmarks/bench_lm.py [--rounds 5] [--generate-only] [--cpu-time] [--json]
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import interleaved, machine, median

import rnnkit
from rnnkit.data.batching import StreamBatcher
from rnnkit.data.corpus import stdlib_corpus
from rnnkit.data.text import encode_text, read_text
from rnnkit.data.vocab import Vocabulary
from rnnkit.generation.search import generate
from rnnkit.models.builders import build_language_model
from rnnkit.models.spec import ModelSpec


class TorchLM(nn.Module):
    """The same function as ``LanguageModel`` with ``torch.nn.LSTM`` as the encoder."""

    def __init__(self, lm) -> None:
        super().__init__()
        self.embedding = lm.embedding
        self.lstm = rnnkit.to_torch(lm.encoder)
        self.head = lm.head

    def loss(self, inputs, targets, state):
        h, state = self.lstm(self.embedding(inputs), state)
        logits = self.head(h)
        return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten()), state

    @torch.no_grad()
    def sample(self, start: int, length: int, generator: torch.Generator) -> list[int]:
        """Sampling as a plain program writes it: one token per call of the LSTM."""
        token, state, out = torch.tensor([[start]]), None, []
        for _ in range(length):
            h, state = self.lstm(self.embedding(token), state)
            probs = torch.softmax(self.head(h[:, -1]), dim=-1)
            token = torch.multinomial(probs, 1, generator=generator)
            out.append(int(token))
        return out


def _generation(lm, tlm, rounds: int, clock: str, length: int = 100) -> dict[str, float]:
    """Tokens/s of sampling ``length`` tokens at batch 1, rnnkit's ``generate`` and the
    plain loop on ``torch.nn`` side by side (interleaved rounds, medians)."""
    lm.eval()
    tlm.eval()
    gen = torch.Generator().manual_seed(0)
    fns = {
        "rnnkit": lambda: generate(lm, [4], max_length=length, num=1, generator=gen),
        "torch.nn": lambda: tlm.sample(4, length, gen),
    }
    times = interleaved(fns, rounds=rounds, block_s=0.5, clock=clock)
    return {k: length / median(v) for k, v in times.items()}


def _trainer(model, batches, loss_fn):
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    it = iter(batches)
    carry: list[tuple[torch.Tensor, ...] | None] = [None]

    def step():
        nonlocal it
        try:
            batch = next(it)
        except StopIteration:
            it = iter(batches)
            batch = next(it)
        opt.zero_grad()
        loss, state = loss_fn(batch, carry[0])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        opt.step()
        carry[0] = tuple(s.detach() for s in state)

    return step


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--segment", type=int, default=64)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--generate-only", action="store_true", help="only the generation rounds")
    p.add_argument("--cpu-time", action="store_true", help="one thread, its CPU time")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.cpu_time:
        torch.set_num_threads(1)
    clock = "thread" if args.cpu_time else "wall"

    corpus_dir = Path("runs/bench_corpus")
    train_path, _ = stdlib_corpus(corpus_dir, max_chars=300_000)
    text = read_text(train_path)
    vocab = Vocabulary.from_text(text, unit="char")
    ids = encode_text(text, vocab, dtype=np.int64)
    spec = ModelSpec(hidden=args.hidden, embedding=64)
    torch.manual_seed(0)
    lm = build_language_model(spec, len(vocab))
    tlm = TorchLM(copy.deepcopy(lm))  # same initial weights, torch.nn.LSTM encoder
    batches = StreamBatcher(ids, args.batch, args.segment)
    tokens_per_step = args.batch * args.segment
    config = {
        "batch": args.batch,
        "segment": args.segment,
        "hidden": args.hidden,
        "embedding": 64,
        "vocab": len(vocab),
    }
    gen_tps = _generation(lm, tlm, args.rounds, clock)
    gen_ratio = gen_tps["rnnkit"] / gen_tps["torch.nn"]
    gen_line = (
        f"generation (sampling, batch 1): rnnkit {gen_tps['rnnkit']:.0f} tok/s, torch.nn "
        f"{gen_tps['torch.nn']:.0f} tok/s, ratio {gen_ratio:.2f}"
    )
    if args.generate_only:
        result = {"machine": machine(), "config": config, "generate_tokens_per_s": gen_tps}
        print(json.dumps(result) if args.json else gen_line)
        return 0
    lm.train()
    tlm.train()

    def rnnkit_loss(batch, state):
        if state is not None:
            state = rnnkit.LSTMState(*state)
        out = lm.loss(batch.inputs, batch.targets, state=state)
        return out.loss, out.state

    def torch_loss(batch, state):
        return tlm.loss(batch.inputs, batch.targets, state)

    fns = {
        "rnnkit": _trainer(lm, batches, rnnkit_loss),
        "torch.nn": _trainer(tlm, batches, torch_loss),
    }
    times = interleaved(fns, rounds=args.rounds, block_s=1.0, clock=clock)
    tps = {k: tokens_per_step / median(v) for k, v in times.items()}
    result = {
        "machine": machine(),
        "config": config,
        "train_tokens_per_s": tps,
        "ratio_rnnkit_over_torch": tps["rnnkit"] / tps["torch.nn"],
        "generate_tokens_per_s": gen_tps,
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"char LM training, B={args.batch} K={args.segment} H={args.hidden}: "
            f"rnnkit {tps['rnnkit']:.0f} tok/s, torch.nn.LSTM {tps['torch.nn']:.0f} tok/s, "
            f"ratio {result['ratio_rnnkit_over_torch']:.2f}"
        )
        print(gen_line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
