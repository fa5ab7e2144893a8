"""``rnnkit build-native``: compile the C++ time loop now instead of at the first training.

``make`` runs it after installing. Where no compiler is found (or the build fails) it says
so in one line and exits 1; training then uses the PyTorch loop, the same function.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

__all__ = ["register", "run"]


def register(sub: Any) -> None:
    p = sub.add_parser(
        "build-native",
        help="compile the C++ time loop now (otherwise built on first use, ~30 s)",
        description="Compile rnnkit's C++ time loop into the cache ($RNNKIT_CACHE, else "
        "~/.cache/rnnkit) now, retrying a build that failed before. Without a C++ compiler "
        "($CXX, else c++) training uses the PyTorch loop: same results, slower.",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rnnkit.bptt import native

    try:
        path = native.build()
    except Exception as exc:  # any compiler or loader failure: say why, in one line
        print(
            f"rnnkit build-native: the compiled time loop cannot be built ({exc}); training "
            "will use the PyTorch loop",
            file=sys.stderr,
        )
        return 1
    print(f"compiled time loop ready: {path}")
    return 0
