"""The other wirings (docs/math.md, "Models"), each on generated data with exact answers.

1. Output-to-hidden (Jordan, Fig. 10.4) vs hidden-to-hidden LM on a Fibonacci-mod-5
   language: the Jordan model trains with no time loop but remembers one token, so it
   stops at the bigram floor; the recurrent state reaches the true entropy.
2. A class-conditional LM (fixed context, Fig. 10.9), context at the initial state, at
   every step, or both: how often a sample is a valid string of the requested class.
3. Sequence-length mechanisms on an encoder–decoder: ``</s>``, a stop output per step,
   or a length predicted first with the steps remaining fed to the decoder.

    python examples/wirings/main.py          # about a minute on 2 CPU cores
"""

from __future__ import annotations

import argparse
import itertools
import math
import random
import time
from collections import Counter

import torch
from torch import nn

from rnnkit import GRU
from rnnkit.data.pairs import Pair, encode_pairs, make_pair_batch
from rnnkit.data.vocab import BOS_ID, EOS_ID, Vocabulary
from rnnkit.layers.attention import Attention
from rnnkit.models.conditional import class_conditional_lm
from rnnkit.models.jordan import jordan_lm
from rnnkit.models.language_model import LanguageModel
from rnnkit.models.length import SequenceLength
from rnnkit.models.seq2seq import Seq2Seq


def sentences(seqs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``<s> y`` inputs, ``y </s>`` targets and mask, padded."""
    T = max(len(s) for s in seqs) + 1
    inputs = torch.zeros(len(seqs), T, dtype=torch.long)
    targets, mask = torch.zeros_like(inputs), torch.zeros_like(inputs, dtype=torch.bool)
    for i, s in enumerate(seqs):
        inputs[i, : len(s) + 1] = torch.tensor([BOS_ID, *s])
        targets[i, : len(s) + 1] = torch.tensor([*s, EOS_ID])
        mask[i, : len(s) + 1] = True
    return inputs, targets, mask


def fit(model: nn.Module, loss_of, batches, steps: int, lr: float) -> float:
    """Adam for ``steps`` steps over ``batches`` (cycled); returns the seconds taken."""
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    start = time.perf_counter()
    model.train()
    for i in range(steps):
        opt.zero_grad()
        out = loss_of(batches[i % len(batches)])
        out.loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        opt.step()
    model.eval()
    return time.perf_counter() - start


def chunks(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


# ----------------------------------------------------------------- 1. Jordan vs Elman


def fibonacci(rng: random.Random, n: int = 10) -> list[int]:
    """Two random digits 0–4, then ``x_t = (x_{t−1} + x_{t−2}) mod 5``; ids = digit + 4."""
    x = [rng.randrange(5), rng.randrange(5)]
    while len(x) < n:
        x.append((x[-1] + x[-2]) % 5)
    return [d + 4 for d in x]


def bigram_floor(train: list[list[int]], test: list[list[int]]) -> float:
    """Test nats/token of the maximum-likelihood bigram table of the training data: the
    best a model that remembers only the previous token can do."""
    pairs, firsts = Counter(), Counter()
    for s in train:
        seq = [BOS_ID, *s, EOS_ID]
        for a, b in itertools.pairwise(seq):
            pairs[a, b] += 1
            firsts[a] += 1
    nats, n = 0.0, 0
    for s in test:
        seq = [BOS_ID, *s, EOS_ID]
        for a, b in itertools.pairwise(seq):
            nats -= math.log(pairs[a, b] / firsts[a])
            n += 1
    return nats / n


def part_jordan(rng: random.Random) -> None:
    train = [fibonacci(rng) for _ in range(2000)]
    test = [fibonacci(rng) for _ in range(500)]
    batches = [sentences(c) for c in chunks(train, 50)]
    test_batch = sentences(test)
    V, n = 9, len(test[0]) + 1
    print("1. Output-to-hidden (Jordan) vs hidden-to-hidden, Fibonacci mod 5, 10 digits")
    print(f"   true entropy {2 * math.log(5) / n:.3f} nats/token; "
          f"bigram floor {bigram_floor(train, test):.3f}")  # fmt: skip
    torch.manual_seed(0)
    jordan = jordan_lm(V, 64)
    secs = fit(jordan, lambda b: jordan.loss(*b), batches, 600, 0.01)
    with torch.no_grad():
        nats = jordan.loss(*test_batch).loss.item()
    print(f"   Jordan LM (H=64, no time loop)     {nats:.3f} nats/token   {secs:5.1f} s")
    torch.manual_seed(0)
    gru = LanguageModel(nn.Embedding(V, 16), GRU(16, 64), nn.Linear(64, V))
    secs = fit(gru, lambda b: gru.loss(*b), batches, 600, 0.01)
    with torch.no_grad():
        nats = gru.loss(*test_batch).loss.item()
    print(f"   GRU LM (H=64, hidden-to-hidden)    {nats:.3f} nats/token   {secs:5.1f} s")


# ------------------------------------------------------- 2. class-conditional text

PATTERNS = ["aaaaaaaaaa", "abababababab", "abbabbabbabb"]  # class k: a prefix of these
ALPHABET = Vocabulary(list("ab"))


def conditional_data(rng: random.Random, n: int) -> tuple[list[int], list[list[int]]]:
    labels = [rng.randrange(3) for _ in range(n)]
    texts = [PATTERNS[k][: rng.randint(3, 10)] for k in labels]
    return labels, [ALPHABET.encode(t) for t in texts]


def valid(text: str, k: int) -> bool:
    return 3 <= len(text) <= 10 and PATTERNS[k].startswith(text)


def part_conditional(rng: random.Random) -> None:
    labels, texts = conditional_data(rng, 1500)
    test_labels, test_texts = conditional_data(rng, 300)
    batches = [
        (torch.tensor(labels[i : i + 50]), *sentences(texts[i : i + 50]))
        for i in range(0, len(texts), 50)
    ]
    test = (torch.tensor(test_labels), *sentences(test_texts))
    print("\n2. Class-conditional LM, 3 classes (aaa…, abab…, abbabb…), lengths 3–10")
    print(f"   true entropy {math.log(8) / 7.5:.3f} nats/token (the length is the only choice)")
    for mode in ("init", "input", "both"):
        torch.manual_seed(0)
        lm = class_conditional_lm(len(ALPHABET), 3, 8, 32, context=mode)
        secs = fit(lm, lambda b, lm=lm: lm.loss(*b), batches, 300, 0.01)
        with torch.no_grad():
            nats = lm.loss(*test).loss.item()
        g = torch.Generator().manual_seed(0)
        condition = torch.arange(3).repeat_interleave(100)
        hyps = lm.generate(condition, max_length=12, strategy="sample", generator=g)
        ok = sum(
            valid(ALPHABET.decode(h[0].ids), int(k)) for h, k in zip(hyps, condition, strict=True)
        )
        print(f"   context={mode:5s}  {nats:.3f} nats/token   valid samples of the "
              f"requested class {ok}/300   {secs:4.1f} s")  # fmt: skip


# ------------------------------------------------------------- 3. length mechanisms

LETTERS = Vocabulary(list("abcdefgh"))
SHIFT = str.maketrans("abcdefgh", "bcdefgha")


def shift_pairs(rng: random.Random, n: int) -> list[Pair]:
    words = ["".join(rng.choice("abcdefgh") for _ in range(rng.randint(1, 12))) for _ in range(n)]
    return [Pair(w, w.translate(SHIFT)) for w in words]


def seq2seq(length: str, hidden: int = 48, E: int = 16, max_length: int = 16) -> Seq2Seq:
    V = len(LETTERS)
    mechanism = None
    if length != "eos":
        mechanism = SequenceLength(length, 2 * hidden, context_size=hidden, max_length=max_length)
    extra = 0 if mechanism is None else mechanism.input_size
    return Seq2Seq(
        nn.Embedding(V, E), GRU(E, hidden), nn.Embedding(V, E), GRU(E + extra + hidden, hidden),
        nn.Linear(2 * hidden, V), attention=Attention("dot", hidden, hidden), length=mechanism,
    )  # fmt: skip


def part_length(rng: random.Random) -> None:
    train = shift_pairs(rng, 3000)
    test = shift_pairs(rng, 500)
    src, tgt = encode_pairs(train, LETTERS, LETTERS)
    batches = [make_pair_batch(s, t) for s, t in zip(chunks(src, 50), chunks(tgt, 50), strict=True)]
    tsrc, ttgt = encode_pairs(test, LETTERS, LETTERS)
    test_batch = make_pair_batch(tsrc, ttgt)
    print("\n3. Length mechanisms, seq2seq with dot attention: shift each letter (1–12 letters)")
    for length in ("eos", "stop", "predict"):
        torch.manual_seed(0)
        model = seq2seq(length)
        secs = fit(model, model.loss, batches, 400, 0.01)
        with torch.no_grad():
            # Per sequence: the mechanisms count different steps (</s> is a token or not).
            nats = model.loss(test_batch).nats / len(test)
            hyps = model.decode(test_batch.source, test_batch.source_mask, max_length=20)
        out = [LETTERS.decode(h[0].ids) for h in hyps]
        exact = sum(o == p.target for o, p in zip(out, test, strict=True)) / len(test)
        right_length = sum(len(o) == len(p.target) for o, p in zip(out, test, strict=True)) / len(
            test
        )
        print(f"   length={length:8s} {nats:.3f} nats/sequence   exact match {exact:.3f}   "
              f"right length {right_length:.3f}   {secs:4.1f} s")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=0, help="seed of the generated data")
    args = p.parse_args(argv)
    torch.set_num_threads(1)  # tiny models: a second thread only adds contention
    start = time.perf_counter()
    part_jordan(random.Random(args.seed))
    part_conditional(random.Random(args.seed + 1))
    part_length(random.Random(args.seed + 2))
    print(f"\ntotal {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
