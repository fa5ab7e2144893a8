"""Per-task defaults by measurement: the default model against a few alternatives and the
task's baseline, on small generated data and on the examples' data.

Every run is ``rnnkit train`` in its default mode (no ``--epochs``/``--steps``/
``--max-time``: until validation stops improving), with the one-hour cap of that mode
lowered to ``--cap`` seconds so that a grid fits in an evening; one thread (``--threads
1``), seed 0. A run prints one JSON line: the task, data, options, steps, seconds, why it
stopped, the model's headline validation figure and the best baseline's (for a tagger
also the accuracy on words unseen in training; where the data set has a test part, the
same figures on it).

    python benchmarks/bench_defaults.py --list                     # the data sets and options
    python benchmarks/bench_defaults.py --data tag-gen --cap 150   # one data set, every option
    python benchmarks/bench_defaults.py --data tag-gen --options "default;--hidden 64"

Data sets (written under ``--work``, default ``runs/bench_defaults``):

* ``tag-gen``: 1,000 sentences whose tags are the previous word's group, 10 % noise
  (``previous_word_sentences``), 200 for validation;
* ``tag-python``: the tagging example's data (Python tokens of the standard library,
  ``python_tagging_corpus``, at most 3,000 training sentences);
* ``tag-brown-news``: the news section of the Brown corpus (``recipes/pos_brown``, run
  its ``setup.sh`` first: nothing is downloaded here), tags without their title/headline
  markers, sentences shuffled (seed 0) and cut 80/10/10: 3,698 / 462 sentences, and a
  test part of 463 that every run is also evaluated on (``prepare.py --news``);
* ``classify-gen``: 2,000 strings labelled by which of ``a``/``b`` comes first, 10 %
  noise (``letter_order_examples``), 400 for validation;
* ``classify-stdlib``: the classification example's data (which package a line of the
  standard library comes from, ``stdlib_classification_corpus``);
* ``seq2seq-reverse`` (5–12 letters) / ``seq2seq-date``: 2,000 generated pairs, 300 for
  validation;
* ``lm-stdlib``: the standard library's sources, ``stdlib_corpus(max_chars=300_000)``
  (328,181 training and 28,049 validation characters here);
* ``events-gen``: 1,000 generated sessions, 200 for validation (``generate_sessions``);
* ``regress-sine``: 300 noisy two-dimensional sinusoids, 60 for validation.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

OPTIONS = ("default", "--hidden 64", "--hidden 128", "--lr 0.005", "--dropout 0.3")


def _tag_gen(d: Path) -> list[str]:
    from rnnkit.data.generated import previous_word_sentences, write_token_tags

    write_token_tags(previous_word_sentences(1000, seed=0, noise=0.1), d / "train.tsv")
    write_token_tags(previous_word_sentences(200, seed=1, noise=0.1), d / "valid.tsv")
    return ["--task", "tag"]


def _tag_python(d: Path) -> list[str]:
    from rnnkit.data.generated import python_tagging_corpus

    python_tagging_corpus(d, max_sentences=3000)
    return ["--task", "tag"]


RECIPES = Path(__file__).resolve().parents[1] / "recipes"


def _tag_brown_news(d: Path) -> list[str]:
    import importlib.util

    package = RECIPES / "pos_brown" / "data" / "package"
    if not package.is_dir():
        raise FileNotFoundError(f"{package}: run recipes/pos_brown/setup.sh first")
    spec = importlib.util.spec_from_file_location(
        "pos_brown_prepare", package.parents[1] / "prepare.py"
    )
    assert spec is not None and spec.loader is not None
    prepare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(prepare)
    prepare.prepare_news(package, d)  # train.tsv, valid.tsv, test.tsv
    return ["--task", "tag"]


def _classify_gen(d: Path) -> list[str]:
    from rnnkit.data.generated import letter_order_examples, write_labelled

    write_labelled(letter_order_examples(2000, seed=0, noise=0.1), d / "train.tsv")
    write_labelled(letter_order_examples(400, seed=1, noise=0.1), d / "valid.tsv")
    return ["--task", "classify"]


def _classify_stdlib(d: Path) -> list[str]:
    from rnnkit.data.generated import stdlib_classification_corpus

    stdlib_classification_corpus(d)
    return ["--task", "classify", "--max-len", "80"]


def _pairs(task: str) -> Callable[[Path], list[str]]:
    def make(d: Path) -> list[str]:
        from rnnkit.data.generated_pairs import generate_pairs, write_pairs

        def pairs(n: int, seed: int) -> list[tuple[str, str]]:
            if task == "reverse":
                return generate_pairs(task, n, seed=seed, min_len=5, max_len=12)
            return generate_pairs(task, n, seed=seed)

        write_pairs(d / "train.tsv", pairs(2000, 0))
        write_pairs(d / "valid.tsv", pairs(300, 1))
        return ["--task", "seq2seq", "--max-len", "24"]

    return make


def _lm_stdlib(d: Path) -> list[str]:
    from rnnkit.data.corpus import stdlib_corpus

    stdlib_corpus(d, max_chars=300_000)  # train.txt, valid.txt
    return ["--task", "lm"]


def _events_gen(d: Path) -> list[str]:
    from rnnkit.data.generated_sessions import generate_sessions

    for name, n, seed in (("train.jsonl", 1000, 0), ("valid.jsonl", 200, 1)):
        with open(d / name, "w", encoding="utf-8") as f:
            for s in generate_sessions(n, seed=seed, prefix=name[0]):
                f.write(json.dumps({"session": s.session, "events": s.events}) + "\n")
    return ["--task", "events"]


def _regress_sine(d: Path) -> list[str]:
    for name, n, seed in (("train.jsonl", 300, 0), ("valid.jsonl", 60, 1)):
        rng = np.random.default_rng(seed)
        with open(d / name, "w", encoding="utf-8") as f:
            for _ in range(n):
                t = rng.uniform(0, 6.3) + 0.4 * np.arange(int(rng.integers(5, 31)))
                x = np.stack([np.sin(t), np.cos(t)], 1) + 0.01 * rng.normal(size=(len(t), 2))
                f.write(json.dumps({"seq": x.round(5).tolist()}) + "\n")
    return ["--task", "regress"]


DATA: dict[str, Callable[[Path], list[str]]] = {
    "tag-gen": _tag_gen,
    "tag-python": _tag_python,
    "tag-brown-news": _tag_brown_news,
    "classify-gen": _classify_gen,
    "classify-stdlib": _classify_stdlib,
    "seq2seq-reverse": _pairs("reverse"),
    "seq2seq-date": _pairs("date"),
    "lm-stdlib": _lm_stdlib,
    "events-gen": _events_gen,
    "regress-sine": _regress_sine,
}


def _files(d: Path) -> tuple[Path, Path]:
    for ext in ("tsv", "txt", "jsonl"):
        if (d / f"train.{ext}").is_file():
            return d / f"train.{ext}", d / f"valid.{ext}"
    raise FileNotFoundError(f"no training file in {d}")


def one_run(argv: list[str], cap: float) -> int:
    """``rnnkit train argv`` in this process, the default mode's cap lowered to ``cap``."""
    from rnnkit.app.cli.main import main
    from rnnkit.training import budget

    budget.CAP_SECONDS = cap
    return main(argv)


def run(name: str, options: str, work: Path, cap: float) -> dict[str, object]:
    d = work / name
    marker = d / "task.json"
    if not marker.is_file():
        d.mkdir(parents=True, exist_ok=True)
        marker.write_text(json.dumps(DATA[name](d)))
    base = json.loads(marker.read_text())
    train, valid = _files(d)
    extra = [] if options == "default" else shlex.split(options)
    out = d / ("run-" + ("default" if options == "default" else "_".join(extra).strip("-")))
    argv = [
        "train", *base, "--train", str(train), "--valid", str(valid), "--out", str(out),
        "--overwrite", "--quiet", "--json", "--no-report", "--threads", "1", *extra,
    ]  # fmt: skip
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, __file__, "--one", json.dumps(argv), "--cap", str(cap)],
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - started
    record: dict[str, object] = {"data": name, "options": options, "wall_s": round(wall, 1)}
    if proc.returncode != 0:
        record["error"] = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return record
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    from rnnkit.training.baseline_check import compare

    found = compare(summary) or {}
    record.update(
        steps=summary.get("steps"),
        stopped=summary.get("stopped"),
        metric=found.get("metric"),
        model=found.get("model"),
        baseline=found.get("baseline"),
        baseline_kind=found.get("kind"),
        behind=found.get("behind"),
        parameters=summary.get("parameters"),
        load_1min=round(os.getloadavg()[0], 2),
    )
    best = summary.get("valid") or {}  # the validation figures of the weights kept
    record["elapsed_s"] = round(float(summary.get("elapsed_s") or 0.0), 1)
    record["best_step"] = best.get("step")
    if best.get("oov_accuracy") is not None:
        record["oov_accuracy"] = best["oov_accuracy"]
    test = train.with_name("test" + train.suffix)
    if test.is_file():
        record["test"] = _evaluate(out, test)
    return record


def _evaluate(out: Path, test: Path) -> dict[str, object]:
    """The trained model's headline figures on a data set's test part."""
    proc = subprocess.run(
        [sys.executable, "-m", "rnnkit", "evaluate", "--checkpoint", str(out), "--data", str(test),
         "--json"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["?"])[-1]}
    metrics = json.loads(proc.stdout)
    keys = ("accuracy", "oov_accuracy", "loss_nats")
    found = {k: metrics[k] for k in keys if metrics.get(k) is not None}
    baseline = (metrics.get("baselines") or {}).get("most_frequent_tag")
    if baseline:
        found["baseline_accuracy"] = baseline.get("accuracy")
    return found


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", help="data sets, comma-separated (default: all)")
    p.add_argument("--options", help="option sets separated by ';' (default: the grid)")
    p.add_argument("--cap", type=float, default=240.0, help="seconds, the default mode's cap")
    p.add_argument("--work", default="runs/bench_defaults", help="data and run directories")
    p.add_argument("--list", action="store_true", help="list the data sets and option sets")
    p.add_argument("--one", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        return one_run(json.loads(args.one), args.cap)
    if args.list:
        print("data:", ", ".join(DATA))
        print("options:", "; ".join(OPTIONS))
        return 0
    names = args.data.split(",") if args.data else list(DATA)
    options = args.options.split(";") if args.options else list(OPTIONS)
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(json.dumps({"date": stamp, "cap_s": args.cap, "load_1min": os.getloadavg()[0]}))
    for name in names:
        for opt in options:
            print(json.dumps(run(name, opt.strip(), Path(args.work), args.cap)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
