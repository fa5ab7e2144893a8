"""A language model's data: the corpora read, split and encoded as ``--bptt`` reads them,
and their batches.

``--bptt segment:K`` encodes each corpus as one stream of tokens (``</s>`` ending every
line with ``--doc-boundary eos|line``), batched as B parallel streams in segments of K
steps; ``full`` and ``window:K`` keep every non-blank line as its own sequence (cut at
``--max-len``), batched as padded ``<s> w… </s>`` sequences. ``--condition`` reads
``label<TAB>text`` lines, one sequence and class per line. The n-gram baseline reads the
same tokens (:func:`ngram_streams`). The vocabulary holds the tokens the sequences hold:
the newline character only where a stream carries it (``segment:K`` without
``--doc-boundary eos|line``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rnnkit import messages
from rnnkit.app.config import TrainConfig, parse_bptt
from rnnkit.app.tasks.run_config import check_labels
from rnnkit.data.batching import SequenceBatcher, StreamBatcher, lm_pairs
from rnnkit.data.labelled import LabelledExample, LabelSet, read_labelled, split_holdout
from rnnkit.data.limits import MAX_CORPUS_BYTES
from rnnkit.data.text import encode_text, read_text
from rnnkit.data.vocab import BOS_ID, EOS_ID, UNK_ID, Vocabulary, count_tokens
from rnnkit.errors import DataError

__all__ = [
    "LARGE_VOCABULARY",
    "LMData",
    "ngram_streams",
    "prepare_lm_data",
    "stream_eval_batcher",
    "train_batches",
]


@dataclass
class LMData:
    """The corpora of one run, encoded: streams (``segment``) or sequences (``full``,
    ``window``), and with ``--condition`` the class of every sequence."""

    vocab: Vocabulary
    mode: str  # "segment" | "full" | "window"
    k: int | None
    train_stream: np.ndarray | None = None
    valid_stream: np.ndarray | None = None
    train_seqs: list[np.ndarray] | None = None
    valid_seqs: list[np.ndarray] | None = None
    # --condition: the classes, and the class of every sequence
    labels: LabelSet | None = None
    train_labels: np.ndarray | None = None
    valid_labels: np.ndarray | None = None
    valid_unknown: Counter[str] = field(default_factory=Counter)  # unseen label → lines
    # streams of --doc-boundary line: the token whose input starts a line (the state
    # entering it zero), in training and in every evaluation alike
    boundary: int | None = None

    def unknown_valid_tokens(self) -> int:
        """How many validation tokens scored are the unknown symbol: tokens the training
        data never held (or held too rarely for ``--min-freq``)."""
        if self.valid_stream is not None:
            return int((self.valid_stream[1:] == UNK_ID).sum())  # the first is no target
        return sum(int((s == UNK_ID).sum()) for s in self.valid_seqs or [])


def _split_text(text: str, fraction: float, path: str) -> tuple[str, str]:
    """Hold out the last ``fraction`` of the text, cut at a line boundary."""
    cut = int(len(text) * (1 - fraction))
    newline = max(text.rfind("\n", 0, cut), text.rfind("\r", 0, cut))  # a lone CR ends one
    if newline > 0:
        cut = newline + 1
    train, valid = text[:cut], text[cut:]
    if not train.strip() or not valid.strip():
        raise DataError("corpus too small to hold out validation text; pass --valid", path)
    return train, valid


#: Words above which a word vocabulary of every training word (``--min-freq 1``) is said
#: to set the cost of training, with what ``--min-freq 2`` would keep.
LARGE_VOCABULARY = 50_000


def _vocabulary(cfg: TrainConfig, text: str, *, newline: bool) -> Vocabulary:
    """The vocabulary of the training ``text``; ``newline=False`` where no sequence holds
    the character ``"\n"`` (lines read as separate sequences, or ended by ``</s>``), so
    that it is no output the model could ever be trained on, or generate."""
    counts = count_tokens(text, cfg.unit)
    if not newline:
        counts.pop("\n", None)
    vocab = Vocabulary.from_counts(counts, cfg.unit, cfg.min_freq, source=cfg.train)
    if cfg.unit == "word" and cfg.min_freq == 1 and len(counts) > LARGE_VOCABULARY:
        # every word of a large corpus, most seen once: the output layer (V × H) is then
        # most of the model and of each step's time (75,133 words: 296 tokens/s, 2.7 GB)
        once = sum(1 for n in counts.values() if n == 1)
        messages.info(
            f"the vocabulary holds {len(counts):,} words, {once:,} of them seen once; its "
            f"output layer sets the speed and memory of training: --min-freq 2 keeps "
            f"{len(counts) - once:,} (the rest read as <unk>)"
        )
    return vocab


def _sequences(text: str, vocab: Vocabulary, max_len: int) -> list[np.ndarray]:
    """Non-blank lines as id sequences, long lines cut into pieces of ``max_len``."""
    out = []
    # Lines end where predict's reader ends them (read_text made "\r\n" "\n"; a lone
    # "\r" is one too), not where splitlines() would: at \x0c, \x1c, \u2028 … as well.
    for line in text.replace("\r", "\n").split("\n"):
        if not line.strip():
            continue
        ids = vocab.encode_array(line, dtype=np.int64)
        for lo in range(0, len(ids), max_len):
            out.append(ids[lo : lo + max_len])
    return out


def _labelled_sequences(
    examples: list[LabelledExample], data: LMData, max_len: int, path: str
) -> tuple[list[np.ndarray], np.ndarray, Counter[str]]:
    """Texts as id sequences (cut into pieces of ``max_len``), the class of each, and the
    lines whose label is not in ``data.labels`` (left out: they cannot be conditioned on)."""
    assert data.labels is not None
    seqs: list[np.ndarray] = []
    classes: list[int] = []
    unknown: Counter[str] = Counter()
    for ex in examples:
        k = data.labels.get(ex.label)
        if k is None:
            unknown[ex.label] += 1
            continue
        ids = data.vocab.encode_array(ex.text, dtype=np.int64)
        if len(ids) == 0:  # e.g. a word-unit text of only whitespace-like characters
            raise DataError("empty text (no tokens)", path, ex.line)
        for lo in range(0, len(ids), max_len):
            seqs.append(ids[lo : lo + max_len])
            classes.append(k)
    return seqs, np.array(classes, dtype=np.int64), unknown


def _prepare_conditional(
    cfg: TrainConfig, vocab: Vocabulary | None, labels: LabelSet | None, resume: bool = False
) -> LMData:
    """``--condition``: ``label<TAB>text`` lines, one sequence (and class) per line."""
    examples = read_labelled(cfg.train)
    if cfg.valid:
        valid_examples, valid_path = read_labelled(cfg.valid), cfg.valid
    else:
        examples, valid_examples = split_holdout(examples, cfg.valid_fraction, cfg.seed, cfg.train)
        valid_path = cfg.train
    if not examples:
        raise DataError("no label<TAB>text line to train on", cfg.train)
    if vocab is None:  # one sequence a line: "\n" only joins the texts here
        vocab = _vocabulary(cfg, "\n".join(ex.text for ex in examples), newline=False)
    if labels is None:
        labels = LabelSet.from_data(ex.label for ex in examples)
    elif resume:  # the run's labels.json must still be the training data's labels
        check_labels(cfg.out, labels, LabelSet.from_data(ex.label for ex in examples), cfg.train)
    data = LMData(vocab, "full", None, labels=labels)
    data.train_seqs, data.train_labels, _ = _labelled_sequences(
        examples, data, cfg.max_len, cfg.train
    )
    data.valid_seqs, data.valid_labels, data.valid_unknown = _labelled_sequences(
        valid_examples, data, cfg.max_len, valid_path
    )
    if not data.valid_seqs:
        raise DataError(
            f"no line has a label the model knows ({', '.join(labels.labels)})", valid_path
        )
    return data


def prepare_lm_data(
    cfg: TrainConfig,
    vocab: Vocabulary | None = None,
    labels: LabelSet | None = None,
    resume: bool = False,
) -> LMData:
    """Read, split and encode the corpora as ``cfg`` says (``labels``: ``--condition``;
    with ``resume``, they must be exactly the training data's labels)."""
    if cfg.condition != "none":
        return _prepare_conditional(cfg, vocab, labels, resume)
    # A corpus is held whole, then as 8-byte ids: bounded by max_corpus_bytes, not 4 GiB.
    text = read_text(cfg.train, size_limit=MAX_CORPUS_BYTES)
    same = bool(cfg.valid) and cfg.valid == cfg.train  # evaluate: one file, read once
    if same:
        valid_text = text
    elif cfg.valid:
        valid_text = read_text(cfg.valid, size_limit=MAX_CORPUS_BYTES)
    else:
        text, valid_text = _split_text(text, cfg.valid_fraction, cfg.train)
    mode, k = parse_bptt(cfg.bptt)
    if vocab is None:
        # A stream holds "\n" unless --doc-boundary eos|line writes </s> in its place;
        # lines read as sequences (full, window) never hold it.
        if mode == "segment":
            newline = cfg.doc_boundary not in ("eos", "line")
            vocab = _vocabulary(cfg, text, newline=newline)
        else:
            # the lines as _sequences reads them: a lone "\r" ends one
            vocab = _vocabulary(cfg, text.replace("\r", "\n"), newline=False)
    data = LMData(vocab, mode, k)
    if mode == "segment":
        data.boundary = EOS_ID if cfg.doc_boundary == "line" else None
        # eos and line both end every line with </s>; only line resets the state there.
        eos_lines = cfg.doc_boundary in ("eos", "line")
        data.train_stream = encode_text(text, vocab, eos_per_line=eos_lines, dtype=np.int64)
        data.valid_stream = (
            data.train_stream
            if same
            else encode_text(valid_text, vocab, eos_per_line=eos_lines, dtype=np.int64)
        )
        if len(data.valid_stream) < 2:  # was "token stream too short", naming no file
            raise DataError(
                f"{len(data.valid_stream)} token: too short to score (each token is predicted "
                "from those before it: at least 2)",
                cfg.valid or cfg.train,
            )
    else:
        data.train_seqs = _sequences(text, vocab, cfg.max_len)
        data.valid_seqs = data.train_seqs if same else _sequences(valid_text, vocab, cfg.max_len)
        if not data.train_seqs:
            raise DataError("no non-blank line to train on", cfg.train)
        if not data.valid_seqs:
            raise DataError("no non-blank line to validate on", cfg.valid or cfg.train)
    return data


def stream_eval_batcher(
    stream: np.ndarray, batch_size: int, k: int, boundary_id: int | None = None
) -> StreamBatcher:
    """A validation stream as at most ``batch_size`` rows of ``k``-step segments (the
    state reset where the input is ``boundary_id``, as in training)."""
    rows = max(1, min(batch_size, (len(stream) - 1) // max(k, 1)))
    return StreamBatcher(stream, rows, k, boundary_id=boundary_id)


def train_batches(cfg: TrainConfig, data: LMData, drop_last: bool = False) -> Any:
    """The training batches: parallel streams (reset after ``</s>`` with ``--doc-boundary
    line``) or shuffled padded sequences."""
    if data.mode == "segment":
        assert data.train_stream is not None and data.k is not None
        tokens, rows = len(data.train_stream), cfg.batch_size
        if tokens <= rows:  # each of the B parallel streams needs an input and a target
            raise DataError(
                f"{tokens:,} tokens of training text, too few for --batch-size {rows} (that "
                f"many parallel streams need at least {rows + 1:,} tokens); lower --batch-size",
                cfg.train,
            )
        return StreamBatcher(data.train_stream, cfg.batch_size, data.k, boundary_id=data.boundary)
    assert data.train_seqs is not None
    pairs = [lm_pairs(s, BOS_ID, EOS_ID) for s in data.train_seqs]
    return SequenceBatcher(
        [p[0] for p in pairs],
        [p[1] for p in pairs],
        batch_size=cfg.batch_size,
        shuffle=True,
        seed=cfg.seed,
        bucket=cfg.batch_order == "length",
        drop_last=drop_last,  # distributed: every batch splits evenly over the processes
    )


def ngram_streams(data: LMData) -> tuple[Any, Any]:
    """The training and validation tokens of the n-gram baseline: the streams, or every
    line followed by its ``</s>``."""
    if data.mode == "segment":
        return data.train_stream, data.valid_stream

    def with_eos(seqs: list[np.ndarray]) -> list[np.ndarray]:
        return [np.concatenate([s, [EOS_ID]]) for s in seqs]

    assert data.train_seqs is not None and data.valid_seqs is not None
    return with_eos(data.train_seqs), with_eos(data.valid_seqs)
