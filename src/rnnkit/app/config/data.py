"""The data's options: the files, how text becomes tokens and sequences."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rnnkit.app.config.fields import TOKEN_TASKS, option

__all__ = ["BATCH_ORDERS", "DOC_BOUNDARIES", "UNITS", "DataOptions"]

UNITS = ("char", "word")
# lm streams: how line ends are read (none: as whitespace; eos: </s> ends every line, the
# state carries on; line: </s> ends every line and the state is reset at each line start)
DOC_BOUNDARIES = ("none", "eos", "line")
# training batches of separate sequences: sorted by length within chunks of 50 batches,
# or each batch a random sample (a shuffled DataLoader's)
BATCH_ORDERS = ("length", "random")


@dataclass(kw_only=True)
class DataOptions:
    """What is read: the training and validation files and their tokens."""

    title: ClassVar[str] = "data"

    # Not argparse-required: --config may give it (rnnkit.app.cli.train checks it).
    train: str = option(
        "", command_line=None, help="training data file (required, here or in --config)"
    )
    valid: str | None = option(
        None, help="validation data file (default: hold out the end of --train)"
    )
    unit: str = option(
        "char",
        choices=UNITS,
        tasks=("lm", "classify"),
        help="token unit (default %(default)s)",
    )
    min_freq: int = option(
        1,
        positive=True,
        tasks=TOKEN_TASKS,
        help="rarer tokens become <unk> (default %(default)s)",
    )
    max_len: int = option(
        256,
        positive=True,
        help="longer lines are cut into pieces of this many tokens (sequence mode)",
    )
    batch_order: str = option(
        "length",
        choices=BATCH_ORDERS,
        tasks=("lm", "tag", "classify", "events", "regress"),
        help="training batches of whole sequences: 'length' groups similar lengths "
        "(less padding, faster; batches less random, which costs accuracy where the "
        "length tells the examples apart, as a session's length tells its workflow), "
        "'random' makes each batch a random sample (default length)",
    )
    doc_boundary: str = option(
        "none",
        choices=DOC_BOUNDARIES,
        tasks=("lm",),
        help="lm streams (--bptt segment:K): 'eos': every line ends with </s> and the "
        "state carries on across lines (sentence-per-line corpora such as the Penn "
        "Treebank); 'line': every line is a document, ended by </s>, and the carried "
        "state is reset at each line start; 'none' (default): the text as it is (for "
        "--unit word, line ends are then only whitespace)",
    )
    valid_fraction: float = option(
        0.05, help="share of --train held out when no --valid (default %(default)s)"
    )
