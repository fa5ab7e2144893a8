"""The options of ``rnnkit score`` checked together: :class:`ScoreConfig`.

Each check names the option that is wrong (a ``ConfigError``, exit status 2), before any
run directory or input is read.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

from rnnkit.app.cli.run_options import check_run_option
from rnnkit.errors import ConfigError

__all__ = ["ScoreConfig"]


@dataclass(frozen=True)
class ScoreConfig:
    """Validated options of ``rnnkit score``.

    >>> ScoreConfig.from_args(argparse.Namespace(
    ...     checkpoint="r", data="-", source="strace", no_result=False, per="pid", top=5,
    ...     batch_size=64, score=None, target_fpr=None, threshold=None, ngram=False,
    ...     follow=True, max_sessions=10000, idle_timeout=300.0, until_idle=None, poll=0.2,
    ...     quiet=False))
    Traceback (most recent call last):
    ...
    rnnkit.errors.ConfigError: --follow reads event lines; --from strace is for whole files
    """

    checkpoint: str
    data: str
    source: str = "sessions"
    with_result: bool = True
    per: str = "pid"
    top: int = 5
    batch_size: int = 64
    score: str | None = None
    target_fpr: float | None = None
    threshold: float | None = None
    ngram: bool = False
    follow: bool = False
    max_sessions: int = 10_000
    idle_timeout: float | None = 300.0
    until_idle: float | None = None
    poll: float = 0.2
    quiet: bool = False
    threshold_method: str | None = None
    params: str | None = None
    confidence: float | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ScoreConfig:
        """Check the options together and build the config."""
        if not args.data:
            raise ConfigError("--data is empty: name a file, or - for standard input")
        if args.follow and args.source != "sessions":
            raise ConfigError("--follow reads event lines; --from strace is for whole files")
        if args.follow and args.ngram:
            raise ConfigError("--ngram applies to batch scoring, not --follow")
        if args.target_fpr is not None and args.threshold is not None:
            raise ConfigError("give --target-fpr or --threshold, not both")
        if args.threshold is not None and not math.isfinite(args.threshold):
            # A NaN threshold compares false with every score: detection silently off.
            raise ConfigError(f"--threshold must be a finite number, got {args.threshold}")
        check_run_option("target_fpr", args.target_fpr)  # the bounds of `rnnkit train`'s
        for name in ("top", "batch_size", "max_sessions"):
            value = getattr(args, name)
            minimum = 0 if name == "top" else 1
            if value < minimum:
                raise ConfigError(f"--{name.replace('_', '-')} must be ≥ {minimum}, got {value}")
        for name in ("idle_timeout", "until_idle", "poll"):
            value = getattr(args, name)
            if value is not None and not value > 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be > 0 seconds, got {value}")
        if not args.follow and (args.until_idle is not None):
            raise ConfigError("--until-idle applies to --follow only")
        if args.source == "sessions" and (args.no_result or args.per != "pid"):
            raise ConfigError("--no-result and --per apply to --from strace only")
        params = getattr(args, "params", None)
        confidence = getattr(args, "confidence", None)
        if params is not None and args.follow:
            raise ConfigError("--params applies to batch scoring, not --follow")
        if params is not None and args.source != "sessions":
            raise ConfigError("--params reads sessions with parameter values, not --from strace")
        check_run_option("confidence", confidence)
        return cls(
            checkpoint=args.checkpoint,
            data=args.data,
            source=args.source,
            with_result=not args.no_result,
            per=args.per,
            top=args.top,
            batch_size=args.batch_size,
            score=args.score,
            target_fpr=args.target_fpr,
            threshold=args.threshold,
            ngram=args.ngram,
            follow=args.follow,
            max_sessions=args.max_sessions,
            idle_timeout=args.idle_timeout,
            until_idle=args.until_idle,
            poll=args.poll,
            quiet=args.quiet,
            threshold_method=_threshold_method(args),
            params=params,
            confidence=confidence,
        )


def _threshold_method(args: argparse.Namespace) -> str | None:
    method = getattr(args, "threshold_method", None)
    if method is not None and args.target_fpr is None:
        raise ConfigError("--threshold-method re-picks thresholds: give --target-fpr too")
    return method
