"""``rnnkit score`` throughput, the command itself: events per second of one core, in batch
(with and without the n-gram side by side) and ``--follow`` (event lines on a pipe).

Sessions of realistic length: ``--sessions`` sessions whose lengths are log-uniform in
[20, 2,000] events, made of the toy grammar's blocks
(``rnnkit.data.generated_sessions``). The model is a real ``events`` run trained for a
few steps first (``--hidden``, one layer; throughput does not depend on how well it is
trained). Every measurement is a fresh ``python -m rnnkit score`` process on one thread
(``OMP_NUM_THREADS=1``); the figure is events per CPU-second of that process (its user +
system time: what one core delivers, whatever else runs on the machine) after
subtracting the same command's cost on a one-session file (start-up: imports, loading
the run). Wall-clock events/s are shown too (they include the time other programs took).
``--follow`` reads the sessions' events interleaved at random as
``{"session": ID, "event": E}`` lines from stdin, each session ended by ``"end": true``.

    python benchmarks/bench_score.py             # 300 sessions (~130,000 events), ~2 min
    python benchmarks/bench_score.py --quick     # 150 sessions, 1 repeat (~40 s)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine

from rnnkit.data.events import Session, write_sessions
from rnnkit.data.generated_sessions import generate_sessions

SRC = Path(__file__).resolve().parent.parent / "src"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")])
    env.update(OMP_NUM_THREADS="1", RNNKIT_THREADS="1", RNNKIT_REPORT="0")
    return env


def _rnnkit(args: list[str], stdin: bytes | None = None) -> tuple[float, float]:
    """Run ``python -m rnnkit ARGS``; return (wall seconds, CPU seconds of the child)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "rnnkit", *args],
        input=stdin,
        capture_output=True,
        env=_env(),
        check=False,
    )
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in (0, 1):  # 1: some session was flagged
        raise RuntimeError(f"rnnkit {args[0]} failed: {proc.stderr.decode()[-800:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def _long_sessions(n: int, seed: int) -> list[Session]:
    """``n`` normal sessions, lengths log-uniform in [20, 2000], from grammar blocks."""
    rng = random.Random(seed)
    pool = generate_sessions(4 * n + 50, seed=seed + 1)
    out = []
    for i in range(n):
        target = round(math.exp(rng.uniform(math.log(20), math.log(2000))))
        events: list[str] = []
        while len(events) < target:
            s = pool[rng.randrange(len(pool))].events
            events.extend(s[1:-1] if events else s[:-1])  # one login, blocks, one logout
        out.append(Session(f"s{i}", [*events[: target - 1], "logout"], 0))
    return out


def _follow_lines(sessions: list[Session], seed: int) -> bytes:
    rng = random.Random(seed)
    cursor = {s.session: 0 for s in sessions}
    events = {s.session: s.events for s in sessions}
    lines = []
    while cursor:
        sid = rng.choice(list(cursor))
        i = cursor[sid]
        lines.append(json.dumps({"session": sid, "event": events[sid][i]}))
        if i + 1 == len(events[sid]):
            lines.append(json.dumps({"session": sid, "end": True}))
            del cursor[sid]
        else:
            cursor[sid] = i + 1
    return ("\n".join(lines) + "\n").encode()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=300)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2, help="best of this many runs")
    p.add_argument("--quick", action="store_true", help="150 sessions, 1 repeat")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.quick:
        args.sessions, args.repeats = 150, 1
    info = machine()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        write_sessions(d / "train.jsonl", generate_sessions(300, seed=0))
        run = d / "run"
        train = ["train", "--task", "events", "--train", str(d / "train.jsonl")]
        train += ["--out", str(run), "--hidden", str(args.hidden), "--embedding", "32"]
        train += ["--steps", "20", "--quiet", "--batch-size", "16"]
        _rnnkit(train)
        sessions = _long_sessions(args.sessions, seed=7)
        n_events = sum(len(s.events) for s in sessions)
        write_sessions(d / "score.jsonl", sessions)
        write_sessions(d / "one.jsonl", sessions[:1])
        one_events = len(sessions[0].events)
        follow = _follow_lines(sessions, seed=3)
        follow_one = _follow_lines(sessions[:1], seed=3)
        base = ["score", "--checkpoint", str(run), "--quiet"]
        cases = {
            "batch": ([*base, "--data", str(d / "score.jsonl")], None),
            "batch --ngram": ([*base, "--data", str(d / "score.jsonl"), "--ngram"], None),
            "--follow": ([*base, "--follow", "--data", "-"], follow),
        }
        starts = {
            "batch": ([*base, "--data", str(d / "one.jsonl")], None),
            "batch --ngram": ([*base, "--data", str(d / "one.jsonl"), "--ngram"], None),
            "--follow": ([*base, "--follow", "--data", "-"], follow_one),
        }
        rows = []
        for name, (cmd, stdin) in cases.items():
            s_wall, s_cpu = min(_rnnkit(starts[name][0], starts[name][1]) for _ in range(2))
            runs = [_rnnkit(cmd, stdin) for _ in range(args.repeats)]
            wall = min(r[0] for r in runs) - s_wall
            cpu = min(r[1] for r in runs) - s_cpu
            events = n_events - one_events
            rows.append(
                {
                    "mode": name,
                    "events_per_cpu_s": events / max(cpu, 1e-9),
                    "events_per_wall_s": events / max(wall, 1e-9),
                    "startup_cpu_s": s_cpu,
                }
            )
    lengths = sorted(len(s.events) for s in sessions)
    result = {
        "machine": info,
        "sessions": len(sessions),
        "events": n_events,
        "median_length": lengths[len(lengths) // 2],
        "hidden": args.hidden,
        "rows": rows,
    }
    if args.json:
        print(json.dumps(result))
        return 0
    print(
        f"{info['cpu']}, torch {info['torch']}, {info['date']}, load {info['load_1min']}; "
        f"{len(sessions)} sessions, {n_events:,} events (lengths 20-2000, median "
        f"{result['median_length']}), LSTM H={args.hidden}, one thread"
    )
    print("| mode | events / CPU-second | events / s (wall) | start-up CPU s |")
    print("|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['mode']} | {r['events_per_cpu_s']:,.0f} | {r['events_per_wall_s']:,.0f} | "
            f"{r['startup_cpu_s']:.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
