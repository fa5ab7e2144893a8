"""The main job of `make run`: a character-level LSTM language model on real text.

The corpus is the Python standard library's own source files on this machine (code,
docstrings, comments): real text that ships with the platform, nothing downloaded or
copied into the repository. Trains for a fixed number of optimizer steps — not seconds, so
that the result does not depend on what else the machine is doing — with the learning
rate annealed to zero over them (cosine), then prints samples and the validation bits per
character next to a 5-gram Kneser-Ney baseline.

    python examples/char_lm/main_job.py [--out runs/main] [--steps 5000] [--lr-schedule cosine]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

import rnnkit
from rnnkit.app.cli.train import _write_report
from rnnkit.app.cli.train_summary import print_summary
from rnnkit.app.config import TrainConfig
from rnnkit.app.tasks.lm import load_lm, sample_texts, train_lm
from rnnkit.data.corpus import stdlib_corpus

# Steps, not seconds: measured to pass the 5-gram with a margin, and few enough for `make
# run` to finish in minutes (the figures and times: examples/char_lm/README.md).
STEPS = 5000


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # A training program's own choice, as the rnnkit command makes it (rnnkit.tuning).
    rnnkit.tune_process()
    p.add_argument("--out", default="runs/main", help="run directory")
    p.add_argument("--steps", type=int, default=STEPS, help="optimizer steps (default %(default)s)")
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (Adam)")
    p.add_argument(
        "--lr-schedule",
        default="cosine",
        help="constant | plateau | step:E:F | cosine (default %(default)s)",
    )
    p.add_argument("--eval-every", type=int, default=1000, help="steps between validations")
    p.add_argument(
        "--max-time", type=float, help="also stop after this many seconds (default: no limit)"
    )
    p.add_argument(
        "--corpus-chars",
        type=int,
        default=2_000_000,
        help="training characters, at least: whole source files are added until there are "
        "this many (one large file can pass it by far)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    args = p.parse_args(argv)

    out = Path(args.out)
    train_path, valid_path = stdlib_corpus(out / "corpus", max_chars=args.corpus_chars)
    print(
        f"corpus: {train_path} ({train_path.stat().st_size:,} bytes), "
        f"{valid_path} ({valid_path.stat().st_size:,} bytes) from the standard library"
    )
    cfg = TrainConfig(
        task="lm",
        train=str(train_path),
        valid=str(valid_path),
        out=str(out),
        cell="lstm",
        hidden=256,
        embedding=64,
        layers=1,
        dropout=0.0,
        batch_size=32,
        bptt="segment:64",
        lr=args.lr,
        lr_schedule=args.lr_schedule,
        clip_norm=5.0,
        epochs=None,
        steps=args.steps,
        max_time=args.max_time,
        eval_every=args.eval_every,
        seed=0,
    ).validate()
    # `make run` again replaces the previous run of this job: say so explicitly.
    summary = train_lm(cfg, quiet=args.quiet, overwrite=True)
    _, vocab, model = load_lm(out)
    summary["samples"] = sample_texts(
        cfg, vocab, model, "def ", num=3, max_length=160, temperature=0.8, seed=0
    )
    summary["samples"] = ["def " + s for s in summary["samples"]]
    summary["report"] = _write_report(str(out))
    print_summary(summary)
    command = _rnnkit_command()
    print(f"run directory: {out} (evaluate: {command} evaluate --checkpoint {out} --data FILE)")
    return 0


def _rnnkit_command() -> str:
    """How to call this interpreter's ``rnnkit`` from here: ``rnnkit`` where that is the
    one on PATH, else its path (``make run`` installs into ``.venv``, not on PATH)."""
    beside = Path(sys.executable).with_name("rnnkit")
    found = shutil.which("rnnkit")
    if not beside.exists() or (found and Path(found).resolve() == beside.resolve()):
        return "rnnkit"
    return os.path.relpath(beside) if beside.is_relative_to(Path.cwd()) else str(beside)


if __name__ == "__main__":
    sys.exit(main())
