"""The tables of one ``benchmarks/gpu_suite.sh`` run, in Markdown, from the files it wrote.

python benchmarks/gpu_tables.py OUT > OUT/tables.md
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from pathlib import Path


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _table(columns: list[str], rows: Iterable[list[object]]) -> list[str]:
    """A Markdown table: its header of ``columns``, the separator, a line per row."""

    def line(cells: list[object]) -> str:
        return "| " + " | ".join(str(c) for c in cells) + " |"

    return [line(list(columns)), "|" + "---|" * len(columns), *(line(r) for r in rows)]


def correctness_table(check: dict) -> list[str]:
    columns = ["form", "mask", "dtype", "path", "fused calls", "Triton calls"]
    columns += ["max rel. error", "ok"]
    return _table(
        columns,
        (
            [c["form"], c["mask"], c["dtype"], c.get("path", "auto"), c["fused_calls"],
             c.get("steps_calls", 0), f"{c['max_rel_err']:.1e}", "yes" if c["ok"] else "**no**"]
            for c in check.get("correctness", [])
        ),
    )  # fmt: skip


def _ratio(row: dict, key: str) -> str:
    """A ratio the row may lack (no triton where it ran): "–"."""
    return f"{row[key]:.2f}" if key in row else "–"


def speed_table(check: dict) -> list[str]:
    optional = ["triton", "graphs", "variant", "regularized", "window", "dropin"]
    columns = ["cell", "H", "B", "T", "train: torch.nn ms", "rnnkit ms", "ratio", "loop ratio"]
    columns += ["holes ratio", "Triton ratio", "graphs ratio", "variant ratio"]
    columns += ["regularized ratio", "window ratio", "drop-in ratio", "2nd-order node cost"]
    columns += ["infer: torch.nn ms"]
    columns += ["rnnkit ms", "ratio", "loop ratio", "drop-in ratio"]
    return _table(
        columns,
        (
            [r["cell"], r["H"], r["B"], r["T"], f"{r['train_torch_ms']:.2f}",
             f"{r['train_rnnkit_ms']:.2f}", f"{r['train_torch_over_rnnkit']:.2f}",
             f"{r['train_torch_over_loop']:.2f}", f"{r['train_torch_over_holes']:.2f}",
             *(_ratio(r, f"train_torch_over_{k}") for k in optional),
             _ratio(r, "train_node_cost"), f"{r['infer_torch_ms']:.2f}",
             f"{r['infer_rnnkit_ms']:.2f}",
             f"{r['infer_torch_over_rnnkit']:.2f}", f"{r['infer_torch_over_loop']:.2f}",
             _ratio(r, "infer_torch_over_dropin")]
            for r in check.get("speed", [])
        ),
    )  # fmt: skip


def steps_table(check: dict) -> list[str]:
    """The single-step rows: torch.nn's time a step, and its time over each of rnnkit's."""
    columns = ["cell", "L", "H", "B", "torch.nn µs/step", "rnnkit ratio", "fused ratio"]
    return _table(
        [*columns, "drop-in ratio"],
        (
            [r["cell"], r["L"], r["H"], r["B"], f"{r['step_torch_us']:.0f}",
             *(f"{r[f'step_torch_over_{k}']:.2f}" for k in ("rnnkit", "fused", "dropin"))]
            for r in check.get("steps", [])
        ),
    )  # fmt: skip


def stacks_table(check: dict) -> list[str]:
    """The stack rows: torch.nn's training time, its time over rnnkit's, rnnkit's calls."""
    columns = ["cell", "directions", "dropout", "H", "B", "T", "torch.nn ms", "ratio"]
    return _table(
        [*columns, "rnnkit's fused calls"],
        (
            [r["cell"], 2 if r["bidirectional"] else 1, r["dropout"], r["H"], r["B"], r["T"],
             f"{r['stack_torch_ms']:.2f}", f"{r['stack_torch_over_rnnkit']:.2f}", r["calls"]]
            for r in check.get("stacks", [])
        ),
    )  # fmt: skip


def tasks_table(tasks: dict) -> list[str]:
    """A row a task; a task that failed says so in its row (its error in the log)."""
    return _table(
        ["task", "rnnkit /s", "torch.nn /s", "ratio"],
        (
            [r["task"], "failed", "–", "–"] if "error" in r else
            [r["task"], f"{r['rnnkit_per_s']:,.0f} {r['unit']}", f"{r['torch_per_s']:,.0f}",
             f"{r['ratio']:.2f}"]
            for r in tasks.get("rows", [])
        ),
    )  # fmt: skip


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    lines = ["# GPU suite", ""]
    machine = out / "machine.txt"
    if machine.exists():
        lines += ["```", machine.read_text().strip(), "```", ""]
    check = _read(out / "gpu_check.json")
    if check is None:
        lines += ["gpu_check: no result (see gpu_check.log)", ""]
    else:
        lines += ["## Layers: correctness", "", *correctness_table(check), ""]
        lines += ["## Layers: speed (ratio = torch.nn time / rnnkit time)", ""]
        lines += [*speed_table(check), ""]
        lines += ["## Single steps, no gradient (ratio = torch.nn time / rnnkit time)", ""]
        lines += [*steps_table(check), ""]
        lines += ["## Stacks of 2 layers, training (ratio = torch.nn time / rnnkit time)", ""]
        lines += [*stacks_table(check), ""]
    tasks = _read(out / "bench_tasks.json")
    if tasks is None:
        lines += ["bench_tasks: no result (see bench_tasks.log)", ""]
    else:
        lines += ["## Whole tasks, training step (ratio = torch.nn time / rnnkit time)", ""]
        lines += [*tasks_table(tasks), ""]
    ptb = out / "ptb_small.log"
    if ptb.exists():
        tail = ptb.read_text().strip().splitlines()[-6:]
        lines += ["## PTB small", "", "```", *tail, "```", ""]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
