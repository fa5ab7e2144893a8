"""Peak memory and time of one training step: rnnkit (stored / recomputed) vs torch.nn.

Every measurement runs in a FRESH process (a child of this script), so that nothing one
contender allocated or cached is counted for another. In the child: the model (rnnkit via
``from_torch`` of the same ``torch.nn`` module), the input and the output gradient are
built, a tiny step warms up the libraries (oneDNN primitives, the compiled loop), then the
kernel's peak-RSS counter is reset (``/proc/self/clear_refs``, value 5) and one full
training step runs (forward, ``backward`` into every parameter and the input). Reported:
``VmHWM − VmRSS before the step`` — the memory the step itself needed — and the step's
wall time (median of ``--repeats`` processes for both).

    python benchmarks/bench_memory.py                       # H 512, B 64, T 100 and the T table
    python benchmarks/bench_memory.py --json > memory.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

_CHILD = r"""
import gc, json, sys, time
import torch
import rnnkit
from rnnkit.bptt import native

cell, H, B, T, who, k, threads = sys.argv[1:8]
H, B, T, k, threads = int(H), int(B), int(T), int(k), int(threads)
torch.set_num_threads(threads)
torch.manual_seed(0)
cls = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU}[cell]
ref = cls(H, H, batch_first=True)
model = ref if who == "torch" else rnnkit.from_torch(ref)
if who == "recompute":
    model.recompute = k
native.available()  # build/load the compiled loop before measuring


def step(b, t):
    x = torch.randn(b, t, H, requires_grad=True)
    out = model(x)
    out = out[0] if who == "torch" else out.outputs
    d = torch.randn_like(out)
    out.backward(d)
    return x


step(2, 3)  # warm up the libraries on a tiny batch
model.zero_grad(set_to_none=True)
gc.collect()


def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024


x = torch.randn(B, T, H, requires_grad=True)
before = status("VmRSS:")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset the peak RSS (VmHWM) to the current RSS
t0 = time.perf_counter()
out = model(x)
out = out[0] if who == "torch" else out.outputs
out.backward(torch.ones_like(out))
elapsed = time.perf_counter() - t0
peak = status("VmHWM:")
print(json.dumps({"peak_bytes": peak - before, "seconds": elapsed}))
"""


def measure(cell: str, H: int, B: int, T: int, who: str, k: int, threads: int) -> dict:
    """One training step in a fresh process: ``{"peak_bytes", "seconds"}``."""
    argv = [sys.executable, "-c", _CHILD, cell, str(H), str(B), str(T), who, str(k), str(threads)]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"child {who} {cell} H{H} B{B} T{T} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def row(cell: str, H: int, B: int, T: int, repeats: int, threads: int) -> dict:
    k = max(1, round(math.sqrt(T)))
    result: dict[str, object] = {"cell": cell, "H": H, "B": B, "T": T, "k": k}
    for who in ("torch", "rnnkit", "recompute"):
        runs = [measure(cell, H, B, T, who, k, threads) for _ in range(repeats)]
        result[f"{who}_mb"] = statistics.median(r["peak_bytes"] for r in runs) / 2**20
        result[f"{who}_s"] = statistics.median(r["seconds"] for r in runs)
    return result


def table(rows: list[dict]) -> str:
    head = (
        "| cell | H | B | T | k | torch MB | rnnkit MB | recompute MB | torch s | rnnkit s "
        "| recompute s |\n|---|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for r in rows:
        lines.append(
            f"| {r['cell']} | {r['H']} | {r['B']} | {r['T']} | {r['k']} | {r['torch_mb']:.1f} "
            f"| {r['rnnkit_mb']:.1f} | {r['recompute_mb']:.1f} | {r['torch_s']:.3f} "
            f"| {r['rnnkit_s']:.3f} | {r['recompute_s']:.3f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cells", default="lstm,gru")
    p.add_argument("--repeats", type=int, default=3, help="fresh processes per figure")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seq", default="100,1000,10000", help="T of the length table")
    p.add_argument("--table-hidden", type=int, default=256)
    p.add_argument("--table-batch", type=int, default=16)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).parent))
    from _common import machine

    cells = args.cells.split(",")
    rows = [row(c, 512, 64, 100, args.repeats, args.threads) for c in cells]
    seqs = [int(t) for t in args.seq.split(",")]
    length_rows = [
        row(c, args.table_hidden, args.table_batch, t, args.repeats, args.threads)
        for c in cells
        for t in seqs
    ]
    info = machine()
    if args.json:
        print(json.dumps({"machine": info, "rows": rows, "length_rows": length_rows}, indent=1))
    out = sys.stderr if args.json else sys.stdout
    print(f"{info}", file=out)
    print("One training step, H 512, B 64, T 100 (k = recompute segment):", file=out)
    print(table(rows), file=out)
    print("\nGrowth in T:", file=out)
    print(table(length_rows), file=out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
