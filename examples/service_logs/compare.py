"""Split a recording into train / validation / test, and tabulate the detectors side by side.

    python examples/service_logs/compare.py split --out runs/service_logs [--seed 0]
    python examples/service_logs/compare.py table --out runs/service_logs

``split`` reads ``OUT/all.jsonl`` (``rnnkit sessions`` of the server's log) and
``OUT/recording/labels.tsv``, keeps the client sessions (not the set-up's or the fault
injector's), shuffles the normal ones with the seed and writes 60 % to ``train.jsonl``,
20 % to ``valid.jsonl`` (both label 0), and the other 20 % with every fault session
(label 1) to ``test.jsonl``.

``table`` reads what ``run.sh`` wrote (``eval_events.json``, ``eval_params.json``,
``scores.jsonl``) and prints the AUC, precision, recall, F1 and false-positive rate of the
recurrent key model (its ``max`` score, as ``run.sh`` trains it), its own 5-gram, the
parameter-value model (its session threshold, the default, and DeepLog's rule: any vector
outside its key's 0.99 interval), and the models joined (anomalous when either says so),
then the sessions flagged per kind.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import Counter
from pathlib import Path

from rnnkit.data.events import read_sessions, write_sessions
from rnnkit.metrics.detection import precision_recall_f1


def split(out: Path, seed: int) -> None:
    kinds = dict(
        line.split("\t") for line in (out / "recording" / "labels.tsv").read_text().splitlines()
    )
    sessions = [s for s in read_sessions(out / "all.jsonl") if s.session in kinds]
    missing = set(kinds) - {s.session for s in sessions}
    if missing:
        sys.exit(f"{len(missing)} recorded sessions have no log line, e.g. {sorted(missing)[0]}")
    normal = [s for s in sessions if kinds[s.session] == "normal"]
    faults = [s for s in sessions if kinds[s.session] != "normal"]
    random.Random(seed).shuffle(normal)
    a, b = int(0.6 * len(normal)), int(0.8 * len(normal))
    for s in normal:
        s.label = 0
    for s in faults:
        s.label = 1
    write_sessions(out / "train.jsonl", normal[:a])
    write_sessions(out / "valid.jsonl", normal[a:b])
    write_sessions(out / "test.jsonl", normal[b:] + faults)
    counts = sorted(Counter(kinds[s.session] for s in faults).items())
    print(f"train {a}, valid {b - a}, test {len(normal) - b} normal + {len(faults)} faults "
          f"({', '.join(f'{k} {n}' for k, n in counts)})")  # fmt: skip


def table(out: Path) -> None:
    kinds = dict(
        line.split("\t") for line in (out / "recording" / "labels.tsv").read_text().splitlines()
    )
    ev = json.loads((out / "eval_events.json").read_text())
    pa = json.loads((out / "eval_params.json").read_text())
    records = [json.loads(line) for line in (out / "scores.jsonl").read_text().splitlines()]
    labels = [r["label"] for r in records]
    verdicts = {
        "LSTM (max)": [r["keys_verdict"] == "anomalous" for r in records],
        "5-gram (max)": [r["ngram"]["verdict"] == "anomalous" for r in records],
        "parameter values": [r["params"]["verdict"] == "anomalous" for r in records],
        "LSTM or parameter values": [r["verdict"] == "anomalous" for r in records],
        "5-gram or parameter values": [
            r["ngram"]["verdict"] == "anomalous" or r["params"]["verdict"] == "anomalous"
            for r in records
        ],
    }
    # DeepLog's rule: a session is anomalous when any of its vectors is outside its key's
    # interval (the per-vector bound, without the session threshold).
    any_vector = [r["params"]["anomalous_vectors"] > 0 for r in records]
    verdicts["parameter values, any vector"] = any_vector
    verdicts["LSTM or parameter values, any vector"] = [
        r["keys_verdict"] == "anomalous" or a for r, a in zip(records, any_vector, strict=True)
    ]
    aucs = {
        "LSTM (max)": ev["rnn_max"].get("auc"),
        "5-gram (max)": ev["ngram_max"].get("auc"),
        "parameter values": pa.get("auc"),
        "parameter values, any vector": pa.get("auc"),  # the same scores, another bound
    }
    print("| detector | AUC | precision | recall | F1 | FPR on test normals |")
    print("|---|---|---|---|---|---|")
    for name, flags in verdicts.items():
        m = precision_recall_f1(flags, labels)
        auc = aucs.get(name)
        # None: undefined (no precision when nothing is flagged)
        cells = [auc, *(m[k] for k in ("precision", "recall", "f1", "fpr"))]
        print("| " + name + " | " + " | ".join("—" if v is None else f"{v:.3f}" for v in cells)
              + " |")  # fmt: skip
    print()
    order = ["lock_wait", "slow_scan", "dup_key", "missing_table", "normal"]
    print("| kind | " + " | ".join(verdicts) + " |")
    print("|---|" + "---|" * len(verdicts))
    for kind in order:
        rows = [i for i, r in enumerate(records) if kinds[r["session"]] == kind]
        cells = [f"{sum(flags[i] for i in rows)}/{len(rows)}" for flags in verdicts.values()]
        print(f"| {kind} | " + " | ".join(cells) + " |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=("split", "table"))
    p.add_argument("--out", type=Path, default=Path("runs/service_logs"))
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    split(args.out, args.seed) if args.what == "split" else table(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
