"""``rnnkit report``: write the self-contained HTML report of a run directory."""

from __future__ import annotations

import argparse
from typing import Any

from rnnkit.app.cli.run_options import add_device_option

__all__ = ["register", "run"]


def register(sub: Any) -> None:
    p = sub.add_parser(
        "report",
        help="write the HTML report of a run (plots embedded)",
        description="Write one self-contained HTML file with the run's configuration, "
        "metrics, n-gram baseline, samples, gradient flow through time and pictures. "
        "It needs no network access to view.",
    )
    p.add_argument("--checkpoint", required=True, help="run directory written by train")
    p.add_argument(
        "--out",
        help="where to write the report (default: DIR/report.html; an existing "
        "file is replaced only if it is an rnnkit report; '-': standard output)",
    )
    add_device_option(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rnnkit.app.report import write_report
    from rnnkit.errors import ConfigError

    if args.out is not None and not args.out:
        raise ConfigError("--out is empty: name the report's file or directory")
    if args.out == "-":  # the page to standard output (it wrote a file named "-")
        from rnnkit.app.cli.stdout import write_stdout
        from rnnkit.app.report.page import render_report

        write_stdout(render_report(args.checkpoint, args.device).encode("utf-8", "replace"))
        return 0
    path = write_report(args.checkpoint, args.out, device=args.device)
    print(f"report: {path}")
    return 0
