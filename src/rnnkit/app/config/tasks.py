"""The options of one task (or two): each read only by the tasks its field names
(``tasks=``), refused for the others and marked so in ``rnnkit train --help``.

The anomaly-detection tasks' options are in :mod:`rnnkit.app.config.anomaly`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rnnkit.app.config.data import UNITS
from rnnkit.app.config.fields import option

__all__ = [
    "CONDITIONS",
    "LENGTHS",
    "WIRINGS",
    "ClassifyOptions",
    "LmOptions",
    "RegressOptions",
    "Seq2seqOptions",
    "TagOptions",
]

LENGTHS = ("eos", "stop", "predict")
WIRINGS = ("hidden", "jordan")
CONDITIONS = ("none", "init", "input", "both")


@dataclass(kw_only=True)
class LmOptions:
    """The language model's wirings, how sequences end, and the n-gram baseline."""

    title: ClassVar[str] = "lm options (some also seq2seq or events, as marked)"

    length: str = option(
        "eos",
        choices=LENGTHS,
        tasks=("lm", "seq2seq"),
        help="how a sequence ends: the </s> symbol (eos, default), a stop "
        "output per step (stop), or a length predicted first, at most --max-len, with the "
        "steps remaining fed to every step (predict); lm: needs --bptt full or window:K",
    )
    wiring: str = option(
        "hidden",
        choices=WIRINGS,
        tasks=("lm",),
        help="hidden-to-hidden recurrence (hidden, default) or output-to-hidden only "
        "(jordan: one layer of width --hidden, trained with no time loop; "
        "--cell and --embedding do not apply)",
    )
    condition: str = option(
        "none",
        choices=CONDITIONS,
        tasks=("lm",),
        help="class-conditional LM on label<TAB>text lines; the class embedding "
        "enters the initial state (init), every step (input) or both; needs --bptt full; "
        "generate --condition LABEL",
    )
    ngram_order: int = option(
        5,
        positive=True,
        tasks=("lm", "events"),
        help="order of the n-gram baseline (default %(default)s)",
    )


@dataclass(kw_only=True)
class ClassifyOptions:
    """Sequence classification."""

    title: ClassVar[str] = "classify options"

    # max measured best (docs/defaults.md)
    pooling: str = option(
        "max",
        choices=("last", "mean", "max"),
        tasks=("classify",),
        help="how the encoder states become one vector (default %(default)s)",
    )
    inputs: str = option(
        "text",
        choices=("text", "vectors"),
        tasks=("classify",),
        help="text: label<TAB>text lines (default); vectors: real-valued sequences, JSON "
        'lines {"seq": [[...], ...], "label": "walk"} or a directory LABEL/*.csv (one '
        "sequence per file, one step per row); the stack reads the frames themselves",
    )


@dataclass(kw_only=True)
class TagOptions:
    """Tagging the words of CoNLL-U sentences."""

    title: ClassVar[str] = "tag options"

    tag_column: str = option(
        "upos",
        tasks=("tag",),
        help="CoNLL-U column holding the tag (upos, xpos, deprel, …)",
    )
    char_rnn: bool = option(
        False,
        tasks=("tag",),
        help="add a character-level RNN over each word: features of its spelling, which "
        "words unseen in training have too",
    )
    word_dropout: float = option(
        0.05,
        metavar="P",
        tasks=("tag",),
        help="while training, replace each word by <unk> with probability P, so that the "
        "<unk> embedding (all an unknown word gets) is trained in real contexts "
        "(default %(default)s)",
    )


@dataclass(kw_only=True)
class Seq2seqOptions:
    """Encoder–decoder (or decoder-only) sequence-to-sequence models."""

    title: ClassVar[str] = "seq2seq options"

    source_unit: str = option(
        "char",
        choices=UNITS,
        tasks=("seq2seq",),
        help="unit of the source side (word = split on spaces)",
    )
    target_unit: str = option(
        "char", choices=UNITS, tasks=("seq2seq",), help="unit of the target side"
    )
    attention: str = option(
        "dot",
        choices=("none", "dot", "bilinear", "additive"),
        tasks=("seq2seq",),
        help="attention over encoder states",
    )
    attention_wiring: str = option(
        "before",
        choices=("before", "after"),
        tasks=("seq2seq",),
        help="before: the previous decoder state attends and the context is fed into the "
        "step (Bahdanau); after: the new state attends after the step and the context "
        "reaches only the output layer (Luong, no input feeding; trains faster: the "
        "decoder runs as one layer call)",
    )
    context: str = option(
        "init",
        choices=("init", "input", "both"),
        tasks=("seq2seq",),
        help="the encoder's final state initializes the decoder, is fed "
        "at every decoder step, or both",
    )
    scheduled_sampling: str = option(
        "none",
        tasks=("lm", "seq2seq"),
        help="none | linear:K | exponential:K | inverse-sigmoid:K",
    )
    decoder_only: bool = option(
        False,
        tasks=("seq2seq",),
        help="one language model over 'source <sep> target'",
    )
    beam: int = option(
        1, positive=True, tasks=("seq2seq",), help="beam width for decoding (default %(default)s)"
    )


@dataclass(kw_only=True)
class RegressOptions:
    """Real-valued sequences."""

    title: ClassVar[str] = "regress options"

    target: str = option(
        "next",
        choices=("next", "value"),
        tasks=("regress",),
        help="next: predict x_(t+1) from x_1..x_t at every step (default); value: predict "
        "each sequence's y from the whole sequence",
    )
    loss: str = option(
        "mse",
        choices=("mse", "gaussian"),
        tasks=("regress",),
        help="mse: mean squared error (default); gaussian: a mean and a variance per value, "
        "the Gaussian negative log-likelihood",
    )
