"""Older spellings of options, still accepted with a one-line notice.

One idea has one spelling on every command: the most tokens of an output is ``--max-len``
(as ``rnnkit train --max-len``); ``generate`` and ``predict`` once spelt it
``--max-length``, which still works and says what to write instead.
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["DeprecatedAlias", "add_max_len_option", "warn_deprecated"]


class DeprecatedAlias(argparse.Action):
    """Store the value; remember when it came by a deprecated spelling (the first of
    ``option_strings`` is the current one)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, values)
        if option_string is not None and option_string != self.option_strings[0]:
            used = dict(getattr(namespace, "deprecated_options", None) or {})
            used[option_string] = self.option_strings[0]
            namespace.deprecated_options = used


def add_max_len_option(p: argparse.ArgumentParser, help: str, default: int | None = None) -> None:
    """``--max-len N`` (``args.max_length``), with ``--max-length`` as a deprecated alias.

    >>> p = argparse.ArgumentParser(); add_max_len_option(p, "most tokens")
    >>> args = p.parse_args(["--max-length", "5"])
    >>> args.max_length, args.deprecated_options
    (5, {'--max-length': '--max-len'})
    """
    p.add_argument(
        "--max-len",
        "--max-length",
        dest="max_length",
        type=int,
        default=default,
        action=DeprecatedAlias,
        help=help + " (--max-length: the older spelling)",
    )


def warn_deprecated(args: argparse.Namespace) -> None:
    """One line per deprecated spelling the command line used."""
    from rnnkit import messages

    for old, new in (getattr(args, "deprecated_options", None) or {}).items():
        messages.warning(f"{old} is deprecated: write {new}")
