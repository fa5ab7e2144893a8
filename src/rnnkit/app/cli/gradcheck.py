"""``rnnkit gradcheck``: the explicit BPTT against central finite differences (float64).

::

    rnnkit gradcheck --cell lstm --layers 2 --bidirectional
    rnnkit gradcheck --cell gru --update keep --reset after --window 3 --json
    rnnkit gradcheck --cell lstm --layers 2 --zoneout 0.2 --recurrent-dropout 0.3 --recompute 2

Prints one line per parameter (and the input and the initial state) with its relative
error, then the worst; ``--json`` prints one JSON object instead. Exit status 0 when the
worst relative error is at most ``--tol``, 1 above it, 2 for a bad option.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass
from typing import Any

from rnnkit.diagnostics.gradcheck import CELLS, GradcheckResult, gradcheck
from rnnkit.errors import ConfigError

__all__ = ["GradcheckConfig", "register", "run"]


@dataclass(frozen=True)
class GradcheckConfig:
    """Validated options of ``rnnkit gradcheck``.

    >>> GradcheckConfig.from_args(build_parser().parse_args(["--cell", "lstm", "--reset", "after"]))
    Traceback (most recent call last):
    ...
    rnnkit.errors.ConfigError: --reset applies to --cell gru only
    """

    cell: str
    hidden_size: int = 4
    input_size: int = 3
    batch_size: int = 3
    steps: int = 5
    num_layers: int = 1
    bidirectional: bool = False
    nonlinearity: str = "tanh"
    update: str = "candidate"
    reset: str = "before"
    layer_norm: bool = False
    window: int | None = None
    recurrent_dropout: float = 0.0
    zoneout: float = 0.0
    weight_drop: float = 0.0
    recompute: int | None = None
    resets: bool = False
    seed: int = 0
    tol: float = 1e-6
    eps: float = 1e-6
    json: bool = False

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> GradcheckConfig:
        """Check the options together (argparse checks each alone) and build the config."""
        if args.nonlinearity is not None and args.cell != "rnn":
            raise ConfigError("--nonlinearity applies to --cell rnn only")
        for option in ("update", "reset"):
            if getattr(args, option) is not None and args.cell != "gru":
                raise ConfigError(f"--{option} applies to --cell gru only")
        for option in ("hidden", "input", "batch", "steps", "layers"):
            if getattr(args, option) < 1:
                raise ConfigError(
                    f"--{option} must be a positive integer, got {getattr(args, option)}"
                )
        if args.window is not None and args.window < 1:
            raise ConfigError(f"--window must be a positive integer, got {args.window}")
        if args.recompute is not None and args.recompute < 1:
            raise ConfigError(f"--recompute must be a positive integer, got {args.recompute}")
        if args.window is not None and args.recompute is not None:
            raise ConfigError("--window cannot be combined with --recompute: choose one")
        for option in ("recurrent_dropout", "zoneout", "weight_drop"):
            value = getattr(args, option)
            if not 0 <= value < 1:  # NaN fails too
                name = "--" + option.replace("_", "-")
                raise ConfigError(f"{name} must be in [0, 1), got {value}")
        if args.resets and args.bidirectional:
            raise ConfigError("--resets needs a unidirectional stack (leave out --bidirectional)")
        if args.layer_norm and args.cell == "gru" and args.recurrent_dropout:
            raise ConfigError(
                "--recurrent-dropout has no layer-normalised GRU form: use --zoneout or "
                "--weight-drop"
            )
        if args.layer_norm:
            if args.cell == "rnn":
                raise ConfigError("--layer-norm applies to --cell lstm or gru")
            if args.cell == "gru" and args.reset != "after":
                raise ConfigError("--layer-norm with --cell gru needs --reset after")
        for option in ("tol", "eps"):
            value = getattr(args, option)
            # inf would print as a non-JSON "Infinity" and check nothing.
            if not 0 < value < math.inf:
                raise ConfigError(f"--{option} must be a positive finite number, got {value}")
        if abs(args.seed) >= 2**63:  # a torch seed is 64-bit: a larger one is a ValueError
            raise ConfigError(f"--seed must be below 2^63 in size, got {args.seed}")
        if args.eps > 1:
            raise ConfigError(f"--eps must be at most 1 (a finite-difference step), got {args.eps}")
        work = finite_difference_work(args)
        if work > MAX_WORK:
            # Each checked entry costs two forward passes over all steps and layers: the
            # cost grows like H^3 T L, and --hidden 100000 would ask for 160 GB at once.
            raise ConfigError(
                f"gradcheck of this size needs about {work:,.3g} cell steps, over the limit "
                f"of {MAX_WORK:,} (minutes of work); it checks small layers: lower --hidden, "
                "--input, --batch, --steps or --layers"
            )
        return cls(
            cell=args.cell,
            hidden_size=args.hidden,
            input_size=args.input,
            batch_size=args.batch,
            steps=args.steps,
            num_layers=args.layers,
            bidirectional=args.bidirectional,
            nonlinearity=args.nonlinearity or "tanh",
            update=args.update or "candidate",
            reset=args.reset or "before",
            layer_norm=args.layer_norm,
            # A window as long as the longest path (the batch's steps, in each layer when a
            # reverse direction lets a path turn) is full BPTT; a larger one changes nothing
            # (and an astronomically large one would overflow torch's integer index).
            window=None
            if args.window is None
            else min(args.window, args.steps * (args.layers if args.bidirectional else 1)),
            recurrent_dropout=args.recurrent_dropout,
            zoneout=args.zoneout,
            weight_drop=args.weight_drop,
            recompute=args.recompute,
            resets=args.resets,
            seed=args.seed,
            tol=args.tol,
            eps=args.eps,
            json=args.json,
        )


#: Largest gradcheck accepted, in cell steps (see :func:`finite_difference_work`): a few
#: minutes on one core; the default check is about 2,000.
MAX_WORK = 1_000_000

_GATES = {"rnn": 1, "lstm": 4, "gru": 3}


def finite_difference_work(args: argparse.Namespace) -> float:
    """Cell steps of a check: checked entries x (2 forward passes of T steps, L layers, D
    directions). Computed in floats: absurd sizes must not build huge integers.

    >>> finite_difference_work(build_parser().parse_args(["--cell", "lstm"]))
    2130.0
    """
    G = _GATES.get(args.cell, 4)
    H, I, B, T, L = (
        float(getattr(args, k)) for k in ("hidden", "input", "batch", "steps", "layers")
    )
    D = 2.0 if args.bidirectional else 1.0
    params = sum(G * H * ((I if layer == 0 else D * H) + H + 2) for layer in range(min(int(L), 2)))
    params = D * (params + max(L - 2, 0) * G * H * (D * H + H + 2))
    entries = params + B * T * I + L * D * B * H * (2 if args.cell == "lstm" else 1)
    return 2 * entries * T * L * D


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cell", required=True, choices=CELLS, help="the cell to check")
    parser.add_argument(
        "--hidden", type=int, default=4, metavar="N", help="hidden size H (default 4)"
    )
    parser.add_argument(
        "--input", type=int, default=3, metavar="N", help="input size I (default 3)"
    )
    parser.add_argument(
        "--batch", type=int, default=3, metavar="N", help="batch size B (default 3)"
    )
    parser.add_argument(
        "--steps", type=int, default=5, metavar="N", help="time steps T of the batch (default 5)"
    )
    parser.add_argument(
        "--layers", type=int, default=1, metavar="N", help="stacked layers (default 1)"
    )
    parser.add_argument("--bidirectional", action="store_true", help="two directions per layer")
    parser.add_argument(
        "--nonlinearity",
        choices=("tanh", "relu", "sigmoid"),
        help="(rnn) φ of the simple cell (default tanh)",
    )
    parser.add_argument(
        "--update",
        choices=("candidate", "keep"),
        help="(gru) z is the candidate's share or the old state's (default candidate)",
    )
    parser.add_argument(
        "--reset",
        choices=("before", "after"),
        help="(gru) r multiplies h before or after W_nh (default before)",
    )
    parser.add_argument(
        "--layer-norm",
        action="store_true",
        help="(lstm, gru with --reset after) the layer-normalised cell",
    )
    parser.add_argument(
        "--window",
        type=int,
        metavar="TAU",
        help="check windowed BPTT(TAU) of the whole stack (the loss at step t reaches steps "
        "t-TAU..t of every layer) against differences of the same truncated graph "
        "(default: full BPTT)",
    )
    for option, what in (
        ("--recurrent-dropout", "recurrent dropout on h_{t-1} in the recurrent product"),
        ("--zoneout", "zoneout of the state (and the LSTM's c)"),
        ("--weight-drop", "DropConnect on W_hh"),
    ):
        parser.add_argument(
            option,
            type=float,
            default=0.0,
            metavar="P",
            help=f"{what}, its masks drawn once from --seed and held (default 0)",
        )
    parser.add_argument(
        "--recompute",
        type=int,
        metavar="K",
        help="check the backward that recomputes K-step segments (default: keep every step)",
    )
    parser.add_argument(
        "--resets",
        action="store_true",
        help="rows start documents at random steps of the batch: the state entering such a "
        "step is zero (unidirectional)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of weights, data, mask and loss (default 0)"
    )
    parser.add_argument(
        "--tol",
        type=float,
        default=1e-6,
        help="largest relative error that passes (default 1e-6); above it exit status is 1",
    )
    parser.add_argument(
        "--eps", type=float, default=1e-6, help="finite-difference step (default 1e-6)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def build_parser() -> argparse.ArgumentParser:
    """A stand-alone parser with the subcommand's options (for tests and docs)."""
    parser = argparse.ArgumentParser(prog="rnnkit gradcheck")
    _add_arguments(parser)
    return parser


def register(subparsers: Any) -> None:
    """Add the ``gradcheck`` subcommand to the ``rnnkit`` parser."""
    parser = subparsers.add_parser(
        "gradcheck",
        help="check the explicit BPTT against finite differences; exit 1 if off",
        description=(
            "Run the library's explicit BPTT (a layer's normal backward) and central finite "
            "differences in float64 on a random batch with holes and padding, for every "
            "parameter, the input and the initial state. Exit 1 when the worst relative "
            "error exceeds --tol."
        ),
    )
    _add_arguments(parser)
    parser.set_defaults(func=run)


def _describe(config: GradcheckConfig) -> str:
    parts = [config.cell]
    if config.cell == "rnn":
        parts.append(config.nonlinearity)
    if config.cell == "gru":
        parts.append(f"update={config.update} reset={config.reset}")
    if config.layer_norm:
        parts.append("layer-normalised")
    parts.append(f"H={config.hidden_size} I={config.input_size}")
    parts.append(f"B={config.batch_size} T={config.steps}")
    parts.append(f"{config.num_layers} layer{'s' if config.num_layers > 1 else ''}")
    parts.append("bidirectional" if config.bidirectional else "unidirectional")
    parts.append("full BPTT" if config.window is None else f"BPTT({config.window})")
    if config.recompute is not None:
        parts.append(f"recomputed in segments of {config.recompute}")
    if config.resets:
        parts.append("document starts inside the batch")
    for name in ("recurrent_dropout", "zoneout", "weight_drop"):
        if getattr(config, name):
            parts.append(f"{name.replace('_', ' ')} {getattr(config, name):g}")
    return ", ".join(parts)


def format_result(config: GradcheckConfig, result: GradcheckResult) -> str:
    """The human-readable report: a table, then the verdict."""
    width = max(len(e.name) for e in result.errors)
    lines = [
        f"gradcheck: {_describe(config)}; central differences, eps {config.eps:g}, float64",
        f"{'tensor':<{width}}  {'size':>6}  {'max |g|':>9}  {'max |Δg|':>9}  {'rel. error':>10}",
    ]
    for e in result.errors:
        lines.append(
            f"{e.name:<{width}}  {e.numel:>6}  {e.max_abs_grad:>9.2e}  "
            f"{e.max_abs_error:>9.2e}  {e.rel_error:>10.2e}"
        )
    verdict = "ok" if result.passed else "FAILED"
    relation = "<=" if result.passed else ">"
    lines.append(
        f"worst relative error {result.max_rel_error:.2e} ({result.worst.name}) "
        f"{relation} tol {result.tol:g}: {verdict}"
    )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Run the check; 0 when it passes, 1 when it does not."""
    config = GradcheckConfig.from_args(args)
    options = asdict(config)
    options.pop("json")
    result = gradcheck(options.pop("cell"), **options)
    if config.json:
        print(json.dumps(result.to_dict(), allow_nan=False))
    else:
        print(format_result(config, result))
    return 0 if result.passed else 1
