"""Generated transduction tasks with exact answers, for examples, tests and benchmarks.

* ``reverse``: ``"hgfbd"`` → ``"dbfgh"`` (random letters).
* ``sort``:    ``"hgfbd"`` → ``"bdfgh"``.
* ``date``:    ``"2024-03-05"`` → ``"5 March 2024"`` (a random valid ``datetime.date``;
  English month names, independent of the locale).

Every pair is a pure function of ``(task, seed, index range)``, so a data file can be
regenerated instead of shipped. Number-to-words is not offered: the package that would do
it exactly (``num2words``) is not a dependency of this project.

Run ``python -m rnnkit.data.generated_pairs reverse --n 2000 --out train.tsv``.
"""

from __future__ import annotations

import argparse
import datetime
import random
from collections.abc import Sequence
from os import PathLike
from pathlib import Path

from rnnkit.errors import ConfigError

__all__ = ["TASKS", "date_to_words", "generate_pairs", "transduce", "write_pairs"]

TASKS = ("reverse", "sort", "date")
MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
_FIRST_DAY = datetime.date(1900, 1, 1).toordinal()
_LAST_DAY = datetime.date(2099, 12, 31).toordinal()


def date_to_words(iso: str) -> str:
    """``"2024-03-05"`` → ``"5 March 2024"`` (day without leading zero, English month).

    >>> date_to_words("2024-03-05")
    '5 March 2024'
    """
    d = datetime.date.fromisoformat(iso)
    return f"{d.day} {MONTHS[d.month - 1]} {d.year}"


def transduce(task: str, source: str) -> str:
    """The exact answer of ``task`` for ``source``.

    >>> transduce("reverse", "abc"), transduce("sort", "cab")
    ('cba', 'abc')
    """
    if task == "reverse":
        return source[::-1]
    if task == "sort":
        return "".join(sorted(source))
    if task == "date":
        return date_to_words(source)
    raise ConfigError(f"generated task must be one of {', '.join(TASKS)}, got {task!r}")


def generate_pairs(
    task: str,
    n: int,
    seed: int = 0,
    min_len: int = 3,
    max_len: int = 8,
    alphabet: str = "abcdefghij",
) -> list[tuple[str, str]]:
    """``n`` random ``(source, target)`` pairs of ``task``.

    Args:
        task: ``"reverse"``, ``"sort"`` or ``"date"``.
        n: number of pairs.
        seed: the random seed (same seed, same pairs).
        min_len, max_len: length range of the letter strings (reverse, sort).
        alphabet: the letters drawn from (reverse, sort).

    >>> generate_pairs("reverse", 2, seed=1)
    [('jbeb', 'bebj'), ('hhgdbh', 'hbdghh')]
    >>> generate_pairs("date", 1, seed=3)
    [('1985-05-25', '25 May 1985')]
    """
    if task not in TASKS:
        raise ConfigError(f"generated task must be one of {', '.join(TASKS)}, got {task!r}")
    if n < 0 or not 1 <= min_len <= max_len or not alphabet:
        raise ConfigError("generate_pairs needs n ≥ 0, 1 ≤ min_len ≤ max_len, a non-empty alphabet")
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        if task == "date":
            source = datetime.date.fromordinal(rng.randint(_FIRST_DAY, _LAST_DAY)).isoformat()
        else:
            length = rng.randint(min_len, max_len)
            source = "".join(rng.choice(alphabet) for _ in range(length))
        out.append((source, transduce(task, source)))
    return out


def write_pairs(path: str | PathLike[str], pairs: Sequence[tuple[str, str]]) -> None:
    """Write ``source<TAB>target`` lines (UTF-8, ``\\n``)."""
    Path(path).write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: write a generated task to a file."""
    p = argparse.ArgumentParser(
        prog="python -m rnnkit.data.generated_pairs",
        description="Write generated source<TAB>target pairs with exact answers.",
    )
    p.add_argument("task", choices=TASKS, help="which transduction")
    p.add_argument("--n", type=int, default=1000, help="number of pairs")
    p.add_argument("--seed", type=int, default=0, help="random seed")
    p.add_argument("--min-len", type=int, default=3, help="shortest string (reverse, sort)")
    p.add_argument("--max-len", type=int, default=8, help="longest string (reverse, sort)")
    p.add_argument("--out", required=True, help="output file")
    args = p.parse_args(argv)
    write_pairs(args.out, generate_pairs(args.task, args.n, args.seed, args.min_len, args.max_len))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
