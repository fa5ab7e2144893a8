"""Real system-call sessions: record them with strace, learn normal, flag the faults.

Records, on this machine, ``strace -f`` traces of real programs (coreutils, gzip, ls,
Python scripts, a TCP client) run many times on generated inputs of varied sizes, and
the same programs under faults: a missing file, a file they may not read (permission
denied), a connection refused on loopback. Every run is one session (its syscalls, with
result classes such as ``openat:ENOENT``). Then it trains the ``events`` model on 60% of
the normal runs, picks thresholds on 20% (target false-positive rate 1%), and scores the
other 20% of normal runs with every fault run: ROC-AUC, precision, recall and F1 of the
recurrent model and of the n-gram baseline, recall per fault kind, and a check that
streaming verdicts equal batch verdicts.

    python examples/syscalls/run.py [--out runs/syscalls] [--normal-per-kind 30]

Needs ``strace`` (``examples/syscalls/record.sh`` installs it if missing). Run as root,
every program runs as ``nobody`` through ``setpriv`` (normal runs too, so the wrapper is
no signature of a fault): root would read a mode-000 file without complaint.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pwd
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from rnnkit.anomaly.scores import RUNNING_SCORES, SCORES
from rnnkit.anomaly.streaming import StreamItem, StreamScorer
from rnnkit.anomaly.thresholds import THRESHOLD_METHODS
from rnnkit.app.config import BATCH_ORDERS, TASK_DEFAULTS, EventsOptions, TrainConfig
from rnnkit.app.tasks.events import evaluate, load_events, score_sessions, train
from rnnkit.data.events import Session, read_sessions, write_sessions
from rnnkit.data.strace import parse_strace
from rnnkit.diagnostics.plots import plot_detection_curves, plot_score_histograms, to_png
from rnnkit.metrics.detection import precision_recall_curve, roc_curve

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta"]
WORDS += ["eta", "theta", "iota", "kappa", "lambda", "mu"]

PY_COUNT = """
import sys
words = 0
with open(sys.argv[1]) as f:            # uncaught: a missing file ends in a traceback
    for line in f:
        words += len(line.split())
print(words)
"""
PY_JSON = """
import json, sys
try:
    with open(sys.argv[1]) as f:
        data = json.load(f)
except OSError as exc:
    sys.stderr.write(f"cannot read {sys.argv[1]}: {exc}\\n")
    sys.exit(1)
print(len(data), sum(x["n"] for x in data))
"""
PY_NET = """
import socket, sys
try:
    with socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5) as s:
        s.sendall(sys.argv[2].encode() + b"\\n")
        print(s.recv(4096).decode().strip())
except OSError as exc:
    sys.stderr.write(f"connection failed: {exc}\\n")
    sys.exit(2)
"""


def _echo_server() -> int:
    """A loopback server that answers one line per connection; returns its port."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen(64)

    def serve() -> None:
        while True:
            conn, _ = server.accept()
            with conn:
                data = conn.recv(4096)
                conn.sendall(b"ok " + str(len(data)).encode() + b"\n")

    threading.Thread(target=serve, daemon=True).start()
    return server.getsockname()[1]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again on exit: nobody listens there


def _make_inputs(root: Path, rng: random.Random, n: int) -> dict[str, list[Path]]:
    """Text, number and JSON files of varied sizes, and directories, readable by all."""
    files: dict[str, list[Path]] = {"text": [], "numbers": [], "json": [], "dirs": []}
    for i in range(n):
        lines = rng.choice([1, 3, 10, 50, 200, 1000, 5000])
        text = "\n".join(
            " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12))) for _ in range(lines)
        )
        (p := root / f"text{i}.txt").write_text(text + "\n")
        files["text"].append(p)
        numbers = "\n".join(str(rng.randint(-(10**6), 10**6)) for _ in range(lines))
        (p := root / f"nums{i}.txt").write_text(numbers + "\n")
        files["numbers"].append(p)
        items = [{"n": rng.randint(0, 99), "w": rng.choice(WORDS)} for _ in range(lines)]
        (p := root / f"data{i}.json").write_text(json.dumps(items))
        files["json"].append(p)
        d = root / f"dir{i}"
        d.mkdir()
        for j in range(rng.choice([0, 1, 5, 20, 60])):
            (d / f"f{j}.txt").write_text("x" * rng.randint(0, 3000))
        files["dirs"].append(d)
    for path in root.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    root.chmod(0o755)
    return files


def _jobs(files, rng: random.Random, per_kind: int, python: str, ports: dict[str, int]):
    """(session id, label, argv) of every run: normal runs, then faults."""
    text, nums, js, dirs = files["text"], files["numbers"], files["json"], files["dirs"]
    normal = {
        "cat": lambda: ["cat", str(rng.choice(text))],
        "sort": lambda: rng.choice(
            [
                ["sort", str(rng.choice(text))],
                ["sort", "-n", str(rng.choice(nums))],
                ["sort", "-r", str(rng.choice(text))],
            ]
        ),
        "gzip": lambda: ["gzip", "-c", str(rng.choice(text + nums))],
        "wc": lambda: ["wc", rng.choice(["-l", "-w", "-c"]), str(rng.choice(text))],
        "head": lambda: ["head", "-n", str(rng.randint(1, 100)), str(rng.choice(text))],
        "grep": lambda: ["grep", "-c", rng.choice(WORDS), str(rng.choice(text))],
        "sha256sum": lambda: ["sha256sum", str(rng.choice(text + js))],
        "ls": lambda: ["ls", rng.choice(["-l", "-a", "-la", "-1"]), str(rng.choice(dirs))],
        "py-count": lambda: [python, "-S", "-I", "-c", PY_COUNT, str(rng.choice(text))],
        "py-json": lambda: [python, "-S", "-I", "-c", PY_JSON, str(rng.choice(js))],
        "py-net": lambda: [
            python,
            "-S",
            "-I",
            "-c",
            PY_NET,
            str(ports["open"]),
            rng.choice(WORDS) * rng.randint(1, 50),
        ],
    }
    jobs = []
    for kind, make in normal.items():
        for i in range(per_kind):
            jobs.append((f"normal/{kind}-{i}", 0, make()))
    missing = str(Path(text[0]).parent / "no-such-file.txt")
    denied = str(Path(text[0]).parent / "secret" / "denied.txt")
    locked = str(Path(text[0]).parent / "secret")
    faults = {
        "missing": [
            ["cat", missing],
            ["sort", missing],
            ["gzip", "-c", missing],
            ["wc", "-l", missing],
            ["head", "-n", "5", missing],
            ["grep", "-c", "alpha", missing],
            ["sha256sum", missing],
            ["ls", "-l", missing],
            [python, "-S", "-I", "-c", PY_COUNT, missing],
            [python, "-S", "-I", "-c", PY_JSON, missing],
        ],
        "denied": [
            ["cat", denied],
            ["sort", denied],
            ["gzip", "-c", denied],
            ["wc", "-l", denied],
            ["head", "-n", "5", denied],
            ["grep", "-c", "alpha", denied],
            ["sha256sum", denied],
            ["ls", "-l", locked],
            [python, "-S", "-I", "-c", PY_COUNT, denied],
            [python, "-S", "-I", "-c", PY_JSON, denied],
        ],
        "refused": [
            [python, "-S", "-I", "-c", PY_NET, str(ports["closed"]), rng.choice(WORDS)]
            for _ in range(10)
        ],
    }
    for kind, argvs in faults.items():
        for i, argv in enumerate(argvs * 2):  # each fault twice
            jobs.append((f"fault-{kind}/{Path(argv[0]).name}-{i}", 1, argv))
    return jobs


def _record(job, wrapper: list[str], trace_dir: Path, cwd: Path) -> Session | None:
    """One traced run as a session; None for a "normal" run that failed (not normal)."""
    sid, label, argv = job
    trace = trace_dir / (sid.replace("/", "__") + ".strace")
    result = subprocess.run(
        ["strace", "-f", "-o", str(trace), *wrapper, *argv],
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=60,
        check=False,
    )
    # grep exits 1 when it counted no match: a normal outcome, not a failure.
    ok = (0, 1) if Path(argv[0]).name == "grep" else (0,)
    if not trace.is_file() or (label == 0 and result.returncode not in ok):
        return None
    sessions, _ = parse_strace(trace, per="file", name=sid, label=label)
    return sessions[0] if sessions else None


def _python(wrapper: list[str]) -> str:
    """A Python interpreter the wrapped user can run (a pyenv shim under /root is not)."""
    for candidate in ("/usr/bin/python3", shutil.which("python3"), sys.executable):
        if (
            candidate
            and subprocess.run(
                [*wrapper, candidate, "-S", "-c", "pass"], capture_output=True, check=False
            ).returncode
            == 0
        ):
            return candidate
    sys.exit("no Python interpreter runs as the unprivileged user")


def record(out: Path, per_kind: int, seed: int) -> list[Session]:
    """Record every run; returns one session per run."""
    if shutil.which("strace") is None:
        sys.exit(
            "strace is not installed: run examples/syscalls/record.sh (apt-get install strace)"
        )
    rng = random.Random(seed)
    data = Path(tempfile.mkdtemp(prefix="rnnkit-syscalls-"))
    files = _make_inputs(data, rng, n=max(8, per_kind // 2))
    secret = data / "secret"
    secret.mkdir()
    (secret / "denied.txt").write_text("top secret\n")
    (secret / "denied.txt").chmod(0o000)
    secret.chmod(0o711)  # enter, but not list; the file itself is unreadable
    wrapper: list[str] = []
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            sys.exit("running as root needs setpriv (util-linux) to drop to nobody")
        nobody = pwd.getpwnam("nobody")
        wrapper = [
            "setpriv",
            f"--reuid={nobody.pw_uid}",
            f"--regid={nobody.pw_gid}",
            "--clear-groups",
            "--",
        ]
    python = _python(wrapper)
    ports = {"open": _echo_server(), "closed": _closed_port()}
    jobs = _jobs(files, rng, per_kind, python, ports)
    trace_dir = out / "traces"
    shutil.rmtree(trace_dir, ignore_errors=True)
    trace_dir.mkdir(parents=True)
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        recorded = list(pool.map(lambda j: _record(j, wrapper, trace_dir, data), jobs))
    failed = [job[0] for job, s in zip(jobs, recorded, strict=True) if s is None]
    if failed:
        print(f"dropped {len(failed)} normal run(s) that failed, e.g. {failed[0]}")
    sessions = [s for s in recorded if s is not None]
    print(
        f"recorded {len(sessions)} runs in {time.perf_counter() - started:.0f} s "
        f"({sum(len(s.events) for s in sessions):,} syscalls) under {trace_dir}"
    )
    shutil.rmtree(data, ignore_errors=True)
    return sessions


def split(sessions: list[Session], out: Path, seed: int) -> dict[str, Path]:
    """60% of normal runs to train, 20% to validate (thresholds), 20% + faults to test."""
    rng = random.Random(seed)
    normal = [s for s in sessions if s.label == 0]
    faults = [s for s in sessions if s.label == 1]
    rng.shuffle(normal)
    a, b = int(0.6 * len(normal)), int(0.8 * len(normal))
    paths = {name: out / f"{name}.jsonl" for name in ("train", "valid", "test")}
    write_sessions(paths["train"], normal[:a])
    write_sessions(paths["valid"], normal[a:b])
    write_sessions(paths["test"], normal[b:] + faults)
    print(
        f"split: {a} train, {b - a} valid (normal), {len(normal) - b} normal + "
        f"{len(faults)} faults to test"
    )
    return paths


def stream_check(run_dir: Path, test: Path) -> dict[str, float]:
    """Replay the test sessions interleaved, event by event, through the streaming scorer."""
    run = load_events(run_dir)
    sessions = read_sessions(test)
    rng = random.Random(0)
    cursors = {s.session: 0 for s in sessions}
    events = {s.session: s.events for s in sessions}
    items = []
    while cursors:
        sid = rng.choice(list(cursors))
        i = cursors[sid]
        last = i + 1 == len(events[sid])
        items.append(StreamItem(sid, (events[sid][i],), end=last))
        if last:
            del cursors[sid]
        else:
            cursors[sid] = i + 1
    # Streaming keeps the running scores; the others need the whole session.
    name = run.thresholds["score"] if run.thresholds["score"] in RUNNING_SCORES else "max"
    batch = {r["session"]: r for r in score_sessions(run, sessions, score=name)}
    scorer = StreamScorer(
        run.model,
        run.vocab,
        threshold=run.thresholds["rnn"][name],
        score=name,
        top_g=run.thresholds["top_g"],
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one-step batches are tiny: a second thread only spins
    started = time.perf_counter()
    verdicts = []
    for lo in range(0, len(items), 64):  # what one read of a busy input would bring
        verdicts += scorer.feed(items[lo : lo + 64])
    elapsed = time.perf_counter() - started
    torch.set_num_threads(threads)
    closed = {v["session"]: v for v in verdicts if v["closed"]}
    diff = max(abs(closed[k]["score"] - batch[k]["score"]) for k in batch)
    same = sum(closed[k]["verdict"] == batch[k]["verdict"] for k in batch)
    return {
        "events_per_s": len(items) / elapsed,
        "max_abs_score_diff": diff,
        "same_verdicts": same,
        "sessions": len(batch),
    }


def _cell(value: float | None) -> str:
    """A table cell of seven characters: the figure to 3 decimals, or — where undefined."""
    return f"{'—':>7}" if value is None else f"{value:>7.3f}"


def draw(records: list[dict], out: Path, score: str, metrics: dict, cell: str) -> list[Path]:
    """ROC/PR curves and score histograms of the test sessions, LSTM beside the 5-gram."""
    labels = np.array([r["label"] for r in records])
    curves, panels = {}, []
    for model, name in (("rnn", cell), ("ngram", "5-gram")):
        scores = np.array([(r if model == "rnn" else r["ngram"])["scores"][score] for r in records])
        threshold = (records[0] if model == "rnn" else records[0]["ngram"])["threshold"]
        fpr, tpr, _ = roc_curve(scores, labels)
        recall, precision, _ = precision_recall_curve(scores, labels)
        m = metrics[f"{model}_{score}"]
        curves[name] = {
            "fpr": fpr,
            "tpr": tpr,
            "recall": recall,
            "precision": precision,
            "auc": m["auc"],
            # an undefined ratio (None: nothing flagged has no precision) is a point not drawn
            "point": tuple(
                math.nan if m[k] is None else m[k] for k in ("fpr", "recall", "precision")
            ),
        }
        panels.append((name, scores[labels == 0], scores[labels == 1], threshold))
    paths = [out / "detection.png", out / "histograms.png"]
    title = (
        f"Test sessions ({score} score): {np.sum(labels == 0)} normal runs, {labels.sum()} faults"
    )
    paths[0].write_bytes(to_png(plot_detection_curves(curves, title=title), dpi=80))
    paths[1].write_bytes(to_png(plot_score_histograms(panels, score=score), dpi=80))
    return paths


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/syscalls", help="working directory")
    p.add_argument("--normal-per-kind", type=int, default=36, help="normal runs per program")
    p.add_argument("--epochs", type=int, default=60)
    p.add_argument("--cell", default="lstm", choices=("rnn", "lstm", "gru"))
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--batch-order",
        choices=BATCH_ORDERS,
        default=TASK_DEFAULTS["events"]["batch_order"],
        help="training batches: random samples or grouped by length (default %(default)s)",
    )
    p.add_argument("--reuse", action="store_true", help="reuse the recorded sessions in --out")
    p.add_argument("--score", choices=SCORES, default=EventsOptions.score, help="verdict score")
    p.add_argument("--window", type=int, help="DeepLog's history window h (default: none)")
    p.add_argument("--top-g", type=int, default=EventsOptions.top_g)
    p.add_argument(
        "--threshold-method", choices=THRESHOLD_METHODS, default=EventsOptions.threshold_method
    )
    args = p.parse_args(argv)
    torch.set_num_threads(os.cpu_count() or 1)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    sessions_path = out / "sessions.jsonl"
    if args.reuse and sessions_path.is_file():
        sessions = read_sessions(sessions_path)
    else:
        sessions = record(out, args.normal_per_kind, args.seed)
        write_sessions(sessions_path, sessions)
    paths = split(sessions, out, args.seed)
    cfg = TrainConfig(
        task="events",
        train=str(paths["train"]),
        valid=str(paths["valid"]),
        out=str(out / "run"),
        cell=args.cell,
        hidden=args.hidden,
        embedding=32,
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        bptt="full",
        max_len=2048,
        batch_order=args.batch_order,
        ngram_order=5,
        seed=args.seed,
        target_fpr=0.01,
        top_g=args.top_g,
        score=args.score,
        window=args.window,
        threshold_method=args.threshold_method,
    ).validate()
    summary = train(cfg, quiet=True, overwrite=True)  # a rerun replaces the last run
    print(
        f"trained {summary['steps']} steps in {summary['elapsed_s']:.0f} s; vocabulary "
        f"{summary['vocab_size']} events; validation nats/event: LSTM "
        f"{summary['valid']['loss_nats']:.3f}, 5-gram {summary['ngram']['loss_nats']:.3f}"
    )
    metrics = evaluate(out / "run", str(paths["test"]))
    run = load_events(out / "run")
    per_kind: dict[str, Counter] = {}
    records = list(score_sessions(run, read_sessions(paths["test"]), ngram=True))
    figures = draw(records, out, metrics["score"], metrics, args.cell.upper())
    for record_ in records:
        kind = record_["session"].split("/")[0]
        c = per_kind.setdefault(kind, Counter())
        c["n"] += 1
        c["rnn"] += record_["verdict"] == "anomalous"
        c["ngram"] += record_["ngram"]["verdict"] == "anomalous"
    # Streaming carries whole histories: a run with a window is scored in batch only.
    stream = stream_check(out / "run", paths["test"]) if args.window is None else None
    report = {
        "metrics": metrics,
        "flagged_per_kind": per_kind,
        "stream": stream,
        "summary": summary,
    }
    (out / "report.json").write_text(json.dumps(report, indent=2, default=dict))

    print(
        f"\ntest: {metrics['sessions']} sessions ({metrics['anomalous_sessions']} faults), "
        f"{metrics['unknown_events']} events never seen in training; target FPR "
        f"{metrics['target_fpr']:.0%}, top-g {metrics['top_g']}"
    )
    print(f"{'model / score':<16}{'AUC':>7}{'prec':>7}{'recall':>7}{'F1':>7}{'FPR':>7}")
    for model in ("rnn", "ngram"):
        for score in SCORES:
            m = metrics[f"{model}_{score}"]
            cells = (m.get(k) for k in ("auc", "precision", "recall", "f1", "fpr"))
            # None: undefined (no AUC without both kinds, no precision with nothing flagged)
            print(f"{model + ' ' + score:<16}" + "".join(_cell(v) for v in cells))
    print(f"flagged (LSTM {metrics['score']} / 5-gram {metrics['score']}) per kind:")
    for kind, c in sorted(per_kind.items()):
        print(f"  {kind:<16}{c['rnn']:>4}/{c['n']:<4} {c['ngram']:>4}/{c['n']}")
    if stream:
        print(
            f"streaming: {stream['events_per_s']:,.0f} events/s, verdicts equal to batch for "
            f"{stream['same_verdicts']}/{stream['sessions']} sessions, largest score "
            f"difference {stream['max_abs_score_diff']:.2e}"
        )
    print(f"report: {out / 'report.json'}; figures: {', '.join(str(f) for f in figures)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
