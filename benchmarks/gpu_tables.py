"""The tables of one ``benchmarks/gpu_suite.sh`` run, in Markdown, from the files it wrote.

python benchmarks/gpu_tables.py OUT > OUT/tables.md
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def correctness_table(check: dict) -> list[str]:
    rows = [
        "| form | mask | dtype | path | fused calls | Triton calls | max rel. error | ok |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in check.get("correctness", []):
        rows.append(
            f"| {c['form']} | {c['mask']} | {c['dtype']} | {c.get('path', 'auto')} | "
            f"{c['fused_calls']} | {c.get('steps_calls', 0)} | "
            f"{c['max_rel_err']:.1e} | {'yes' if c['ok'] else '**no**'} |"
        )
    return rows


def _ratio(row: dict, key: str) -> str:
    """A ratio the row may lack (no triton where it ran): "–"."""
    return f"{row[key]:.2f}" if key in row else "–"


def speed_table(check: dict) -> list[str]:
    rows = [
        "| cell | H | B | T | train: torch.nn ms | rnnkit ms | ratio | loop ratio | holes ratio "
        "| Triton ratio | graphs ratio | variant ratio | regularized ratio | window ratio "
        "| drop-in ratio | infer: torch.nn ms | rnnkit ms | ratio | loop ratio "
        "| drop-in ratio |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in check.get("speed", []):
        rows.append(
            f"| {r['cell']} | {r['H']} | {r['B']} | {r['T']} | {r['train_torch_ms']:.2f} | "
            f"{r['train_rnnkit_ms']:.2f} | {r['train_torch_over_rnnkit']:.2f} | "
            f"{r['train_torch_over_loop']:.2f} | {r['train_torch_over_holes']:.2f} | "
            f"{_ratio(r, 'train_torch_over_triton')} | {_ratio(r, 'train_torch_over_graphs')} | "
            f"{_ratio(r, 'train_torch_over_variant')} | "
            f"{_ratio(r, 'train_torch_over_regularized')} | "
            f"{_ratio(r, 'train_torch_over_window')} | "
            f"{_ratio(r, 'train_torch_over_dropin')} | "
            f"{r['infer_torch_ms']:.2f} | {r['infer_rnnkit_ms']:.2f} | "
            f"{r['infer_torch_over_rnnkit']:.2f} | {r['infer_torch_over_loop']:.2f} | "
            f"{_ratio(r, 'infer_torch_over_dropin')} |"
        )
    return rows


def steps_table(check: dict) -> list[str]:
    """The single-step rows: torch.nn's time a step, and its time over each of rnnkit's."""
    rows = [
        "| cell | L | H | B | torch.nn µs/step | rnnkit ratio | fused ratio | drop-in ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in check.get("steps", []):
        rows.append(
            f"| {r['cell']} | {r['L']} | {r['H']} | {r['B']} | {r['step_torch_us']:.0f} | "
            f"{r['step_torch_over_rnnkit']:.2f} | {r['step_torch_over_fused']:.2f} | "
            f"{r['step_torch_over_dropin']:.2f} |"
        )
    return rows


def stacks_table(check: dict) -> list[str]:
    """The stack rows: torch.nn's training time, its time over rnnkit's, rnnkit's calls."""
    rows = [
        "| cell | directions | dropout | H | B | T | torch.nn ms | ratio | rnnkit's fused calls |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in check.get("stacks", []):
        rows.append(
            f"| {r['cell']} | {2 if r['bidirectional'] else 1} | {r['dropout']} | {r['H']} | "
            f"{r['B']} | {r['T']} | {r['stack_torch_ms']:.2f} | "
            f"{r['stack_torch_over_rnnkit']:.2f} | {r['calls']} |"
        )
    return rows


def tasks_table(tasks: dict) -> list[str]:
    rows = ["| task | rnnkit /s | torch.nn /s | ratio |", "|---|---|---|---|"]
    for r in tasks.get("rows", []):
        rows.append(
            f"| {r['task']} | {r['rnnkit_per_s']:,.0f} {r['unit']} | {r['torch_per_s']:,.0f} | "
            f"{r['ratio']:.2f} |"
        )
    return rows


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
