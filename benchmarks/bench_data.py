"""Reading a corpus and fitting the n-gram baseline: how fast, against plain Python.

Two jobs every language-model run does before its first step, on generated data (no
download):

- **corpus**: a UTF-8 character corpus (``--chars`` characters, 33 symbols, some of them
  outside ASCII) counted into a vocabulary and encoded to ids —
  ``build_vocab_from_file`` then ``encode_corpus`` — against the same two jobs written
  plainly (``collections.Counter`` over the text, a list comprehension over ``stoi``);
- **n-gram**: an order-5 interpolated Kneser–Ney model (``NGramModel``) fitted on
  ``--tokens`` ids of a Markov-like stream over 30 symbols and evaluated on a fifth as
  many more.

Each contender runs ``--repeats`` times; the figure is the best wall-clock time (these
jobs are single-threaded NumPy and Python), as characters or tokens per second, and the
ratio against plain Python where there is one.

    python benchmarks/bench_data.py              # 4M characters, 500k tokens (~1 min)
    python benchmarks/bench_data.py --quick      # a quarter of each
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import best_time, machine

from rnnkit.data.text import build_vocab_from_file, encode_corpus
from rnnkit.data.vocab import Vocabulary
from rnnkit.models.ngram import NGramModel

ALPHABET = list("abcdefghij klmnopqrstuvwxyz\n.,éü😀")


def corpus(n_chars: int, repeats: int) -> dict[str, float]:
    rng = np.random.default_rng(0)
    text = "".join(rng.choice(np.array(ALPHABET), n_chars).tolist())
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "corpus.txt"
        path.write_text(text, encoding="utf-8")

        def rnnkit_job() -> np.ndarray:
            return encode_corpus(path, build_vocab_from_file(path))

        def plain_job() -> list[int]:
            content = path.read_text(encoding="utf-8")
            vocab = Vocabulary.from_counts(Counter(content), "char")
            stoi = vocab.stoi
            return [stoi[c] for c in content]

        # the same ids from both: the plain job is the reference, not just a clock
        assert rnnkit_job().tolist() == plain_job()
        t_rk, t_plain = best_time(rnnkit_job, repeats), best_time(plain_job, repeats)
    return {"chars": n_chars, "rnnkit_s": t_rk, "plain_s": t_plain}


def ngram(n_tokens: int, repeats: int) -> dict[str, float]:
    rng = np.random.default_rng(0)
    held = n_tokens // 5
    ids = np.cumsum(rng.integers(0, 3, size=n_tokens + held)) % 30
    train, test = ids[:n_tokens], ids[n_tokens:]
    fit_s = best_time(lambda: NGramModel(order=5).fit(train), repeats)
    lm = NGramModel(order=5).fit(train)
    eval_s = best_time(lambda: lm.evaluate(test), repeats)
    return {"tokens": n_tokens, "held": held, "fit_s": fit_s, "eval_s": eval_s}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--chars", type=int, default=4_000_000, help="corpus size in characters")
    p.add_argument("--tokens", type=int, default=500_000, help="n-gram training ids")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="a quarter of each size")
    args = p.parse_args(argv)
    scale = 4 if args.quick else 1
    info = machine()
    print(
        f"# {info['cpu']}, {info['cores']} cores, {info['date']}, load {info['load_1min']:.2f}, "
        f"best of {args.repeats}, wall clock"
    )
    c = corpus(args.chars // scale, args.repeats)
    print(
        f"corpus {c['chars']:,} chars: rnnkit {c['rnnkit_s']:.3f} s "
        f"({c['chars'] / c['rnnkit_s'] / 1e6:.1f} M chars/s), plain Python "
        f"{c['plain_s']:.3f} s ({c['chars'] / c['plain_s'] / 1e6:.1f} M chars/s): "
        f"{c['plain_s'] / c['rnnkit_s']:.1f}x"
    )
    g = ngram(args.tokens // scale, args.repeats)
    print(
        f"n-gram order 5, {g['tokens']:,} ids: fit {g['fit_s']:.3f} s "
        f"({g['tokens'] / g['fit_s'] / 1e6:.2f} M ids/s), evaluate {g['held']:,} ids "
        f"{g['eval_s']:.3f} s ({g['held'] / g['eval_s'] / 1e6:.2f} M ids/s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
