"""User-facing error types: every error a user can fix is one of these, with one clear line.

The command line prints ``str(error)`` on stderr and exits non-zero, never a traceback, so
each message must name what is wrong and where (file, line, argument, expected vs received).
"""

from __future__ import annotations

from os import PathLike

__all__ = [
    "CheckpointError",
    "ConfigError",
    "DataError",
    "RnnkitError",
    "RunFinished",
    "WriteError",
]


class RnnkitError(Exception):
    """Base class of the errors rnnkit reports to users as one line."""


class DataError(RnnkitError, ValueError):
    """Bad input data, located by file and line (1-based) when known.

    >>> str(DataError("line has no tab", path="train.tsv", line=3))
    'train.tsv:3: line has no tab'
    """

    def __init__(
        self, message: str, path: str | PathLike[str] | None = None, line: int | None = None
    ) -> None:
        self.path = None if path is None else str(path)
        self.line = line
        self.message = message
        where = ""
        if self.path is not None:
            where = self.path if line is None else f"{self.path}:{line}"
            where += ": "
        super().__init__(where + message)


class ConfigError(RnnkitError, ValueError):
    """An option or configuration value out of range, of the wrong type, or unknown."""


class CheckpointError(RnnkitError):
    """A checkpoint that is missing, incomplete, corrupted or from an incompatible config."""


class RunFinished(RnnkitError):
    """``resume`` of a run whose step budget is already spent: there is nothing to train,
    and the run's ``summary.json`` and ``model.safetensors`` stay as they are (training
    again would rewrite the summary from the snapshot while the weights stayed those of
    the finished run). Not a failure: the command line exits 0."""

    exit_code = 0


class WriteError(RnnkitError):
    """A file that could not be written (disk full, permissions, a read-only file system,
    a destination that is not a regular file); the previous file, if any, is unchanged."""
