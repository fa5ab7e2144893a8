"""Which session score should ``--task events`` give its verdicts by: every score of one
default run, side by side, on every labelled session data set at hand.

For each data set and seed: the normal sessions are shuffled (the seed), three quarters go
to the training file, the rest and every faulty session to the test file; then

    rnnkit train --task events --train train.jsonl --out RUN --seed S --threads 1
    rnnkit evaluate --checkpoint RUN --data test.jsonl --json

that is the default run a user gets (validation sessions held out of the training file by
rnnkit itself, thresholds at the default target rate), and ``evaluate`` reports the AUC,
F1 and false-positive rate of every score at its own threshold. One JSON line per run, then
a table per data set (mean over the splits) and the count of data sets each score wins.

Data sets (``--data``, comma-separated):

* ``strace:DIR``: the sessions ``examples/syscalls/run.py --out DIR`` recorded (its
  ``train``/``valid``/``test.jsonl``, pooled and re-split here);
* ``postgres:DIR``: the sessions of ``examples/service_logs`` (``record.sh DIR`` then
  ``run.sh DIR``: its ``train``/``valid``/``test.jsonl``, pooled);
* ``generated``: 600 sessions of :func:`rnnkit.data.generated_sessions.generate_sessions`,
  60 of them anomalous (every planted kind in turn).

    python benchmarks/bench_anomaly_scores.py --data strace:runs/syscalls,generated \\
        --splits 0,1,2 --work runs/bench_anomaly_scores [--train-sessions 120]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rnnkit.anomaly.scores import SCORES
from rnnkit.data.events import Session, read_sessions, write_sessions
from rnnkit.data.generated_sessions import generate_sessions

RNNKIT = (sys.executable, "-m", "rnnkit")


def _pooled(directory: Path) -> list[Session]:
    out: list[Session] = []
    for name in ("train", "valid", "test"):
        out.extend(read_sessions(str(directory / f"{name}.jsonl")))
    return out


def load(spec: str) -> tuple[str, list[Session]]:
    """A data set's name and its labelled sessions."""
    kind, _, where = spec.partition(":")
    if kind in ("strace", "postgres"):
        if not where:
            raise SystemExit(f"--data {spec}: give the directory, e.g. {kind}:runs/{kind}")
        return kind, _pooled(Path(where))
    if kind == "generated":
        return kind, generate_sessions(600, anomalies=60, seed=0)
    raise SystemExit(f"--data: unknown data set {kind!r} (strace:DIR, postgres:DIR, generated)")


def split(
    sessions: list[Session], seed: int, d: Path, most: int | None = None
) -> tuple[Path, Path]:
    normal = [s for s in sessions if s.label == 0]
    faults = [s for s in sessions if s.label == 1]
    random.Random(seed).shuffle(normal)
    k = (3 * len(normal)) // 4
    d.mkdir(parents=True, exist_ok=True)
    write_sessions(d / "train.jsonl", normal[: min(k, most or k)])
    write_sessions(d / "test.jsonl", normal[k:] + faults)
    return d / "train.jsonl", d / "test.jsonl"


def run(name: str, sessions: list[Session], seed: int, work: Path, most: int | None = None) -> dict:
    d = work / (f"{name}-{seed}" + (f"-{most}" if most else ""))
    train, test = split(sessions, seed, d, most)
    cmd = [*RNNKIT, "train", "--task", "events", "--train", str(train)]
    cmd += ["--out", str(d / "run"), "--seed", str(seed), "--threads", "1", "--overwrite"]
    cmd += ["--quiet"]  # no budget: the default mode, until validation stops improving
    started = time.perf_counter()
    subprocess.run(cmd, check=True)
    seconds = time.perf_counter() - started
    summary = json.loads((d / "run" / "summary.json").read_text())
    out = subprocess.run(
        [*RNNKIT, "evaluate", "--checkpoint", str(d / "run"), "--data", str(test), "--json"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    metrics = json.loads(out)
    row: dict[str, Any] = {
        "data": name,
        "seed": seed,
        "train_sessions": len(read_sessions(str(train))),
        "test_normal": sum(1 for s in read_sessions(str(test)) if s.label == 0),
        "test_faults": metrics.get("anomalous_sessions"),
        "seconds": round(seconds, 1),
        "steps": summary.get("steps"),
        "stopped": summary.get("stopped"),
    }
    for score in SCORES:
        m = metrics.get(f"rnn_{score}")
        if m:
            row[score] = {k: m.get(k) for k in ("auc", "f1", "fpr")}
    print(json.dumps(row), flush=True)
    return row


def table(rows: list[dict]) -> str:
    lines = []
    wins: dict[str, int] = {s: 0 for s in SCORES}
    for name in dict.fromkeys(r["data"] for r in rows):
        mine = [r for r in rows if r["data"] == name]
        lines.append(f"\n{name} ({len(mine)} splits)\n")
        lines.append("| score | AUC | F1 | FPR on test normals |\n|---|---|---|---|")
        means = {}
        for score in SCORES:
            got = [r[score] for r in mine if score in r]
            if not got:
                continue
            mean = {k: sum((g[k] or 0.0) for g in got) / len(got) for k in ("auc", "f1", "fpr")}
            means[score] = mean
            lines.append(f"| {score} | {mean['auc']:.3f} | {mean['f1']:.3f} | {mean['fpr']:.3f} |")
        # the winner of a data set: best mean F1 at the default target rate, AUC the tiebreak
        best = max(means, key=lambda s: (round(means[s]["f1"], 3), round(means[s]["auc"], 3)))
        for s in means:
            if (round(means[s]["f1"], 3), round(means[s]["auc"], 3)) == (
                round(means[best]["f1"], 3),
                round(means[best]["auc"], 3),
            ):
                wins[s] += 1
    lines.append("\nwins (best mean F1, AUC breaking ties; ties count for each): ")
    lines.append(", ".join(f"{s} {n}" for s, n in wins.items()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default="generated", help="comma-separated data sets")
    p.add_argument("--splits", default="0,1,2")
    p.add_argument("--work", default="runs/bench_anomaly_scores")
    p.add_argument(
        "--train-sessions", type=int, help="at most this many normal sessions to train on"
    )
    args = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    work = Path(args.work)
    rows = []
    for spec in args.data.split(","):
        name, sessions = load(spec)
        for seed in (int(s) for s in args.splits.split(",")):
            rows.append(run(name, sessions, seed, work, args.train_sessions))
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
