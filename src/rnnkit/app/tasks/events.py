"""The ``events`` task: a next-event language model of normal sessions, and anomaly scores.

``rnnkit train --task events`` reads JSON-lines sessions (:mod:`rnnkit.data.events`),
trains a recurrent LM over the event vocabulary on the *normal* sessions (unlabelled or
``label: 0``; ``label: 1`` sessions in the training file are left out and counted), fits
the n-gram baseline on the same sessions, scores the normal validation sessions with both
models and stores, per model and per session score (:mod:`rnnkit.anomaly.scores`), the threshold
for the target false-positive rate. The run directory holds, besides the usual files::

    thresholds.json            target FPR, top-g, window, the default score, how thresholds
                               are picked, every threshold
    valid_scores.safetensors   the validation sessions' scores (thresholds can be re-picked
                               at another FPR without retraining: ``rnnkit score --target-fpr``),
                               and those of labelled validation sessions (the report's curves)
    calibration.safetensors    per model, each event's mean and standard deviation of
                               surprise and the training sessions' scores: what the ``norm``
                               and ``combined`` scores are measured against
    ngram.safetensors          the n-gram baseline

Each session is one example: inputs ``<s> e_1 … e_n``, targets ``e_1 … e_n </s>``, padded
and bucketed by length. ``--bptt full`` backpropagates through whole sessions, ``window:K``
(and ``segment:K``, the command line's default, read the same way here: sessions are never
concatenated) through the last K steps. Sessions longer than ``--max-len`` are trained in
pieces of that many events (a piece after the first starts from a zero state with the
previous event as input); scoring always runs whole sessions, carrying the state.

Options of ``cfg.extra`` (``rnnkit train --target-fpr/--top-g/--window/--score/
--threshold-method``): ``target_fpr`` (0.01), ``top_g`` (9, DeepLog's default), ``window``
(None: each prediction sees the whole session so far; ``h``: only the last ``h`` events,
from a zero state, as DeepLog's window, and training runs pieces of ``h`` events),
``score`` (one of :data:`rnnkit.anomaly.scores.SCORES`, default ``"max"``) and ``threshold``
(``"quantile"`` or ``"gpd"``, :func:`rnnkit.anomaly.thresholds.pick_threshold`).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.numpy import save_file as save_numpy

from rnnkit.anomaly.scores import (
    COMBINED_PARTS,
    RUNNING_SCORES,
    SCORES,
    KeyStats,
    combined_scores,
    session_scores,
    surprise_and_rank,
)
from rnnkit.anomaly.scores import top_events as _top_events
from rnnkit.anomaly.thresholds import (
    THRESHOLD_METHODS,
    clopper_pearson,
    pick_threshold,
    resolvable_fpr,
)
from rnnkit.app.config import RESUME_CHANGEABLE, TrainConfig, parse_bptt
from rnnkit.app.tasks.run import (
    check_count,
    choose_device,
    finish_summary,
    guarded_run,
    load_config,
    model_spec,
    save_config,
    seed_everything,
    train_options,
    warn,
)
from rnnkit.data.batching import SequenceBatcher, lm_pairs, pad_sequences
from rnnkit.data.events import Session, read_sessions
from rnnkit.data.files import atomic_write
from rnnkit.data.vocab import BOS_ID, EOS_ID, SPECIALS, UNK_ID, Vocabulary
from rnnkit.errors import CheckpointError, ConfigError, DataError
from rnnkit.metrics.detection import detection_metrics
from rnnkit.models.builders import build_language_model
from rnnkit.models.language_model import LanguageModel, LossOutput
from rnnkit.models.ngram import NGramModel
from rnnkit.training.checkpoint import (
    atomic_write_json,
    load_arrays,
    load_model_weights,
    read_json,
)
from rnnkit.training.loop import Trainer

__all__ = [
    "DEFAULTS",
    "EventVocabulary",
    "EventsModel",
    "evaluate",
    "event_surprises",
    "load_events",
    "ngram_surprises",
    "predictor",
    "score_sessions",
    "train",
]

#: Options read from ``cfg.extra`` and their defaults.
DEFAULTS: dict[str, Any] = {
    "target_fpr": 0.01,
    "top_g": 9,
    "score": "max",
    "window": None,
    "threshold": "quantile",
}
THRESHOLDS_FORMAT = "rnnkit.anomaly.thresholds"
#: Steps per forward call when scoring: bounds memory whatever a session's length.
SCORE_CHUNK = 512


def options(cfg: TrainConfig) -> dict[str, Any]:
    """The events options of ``cfg.extra`` merged over :data:`DEFAULTS`, validated.

    >>> options(TrainConfig(train="x", extra={"top_g": 3}))["top_g"]
    3
    """
    unknown = sorted(set(cfg.extra) - set(DEFAULTS))
    if unknown:
        raise ConfigError(f"unknown events option(s) {unknown} (known: {sorted(DEFAULTS)})")
    opts = {**DEFAULTS, **cfg.extra}
    fpr = opts["target_fpr"]
    if isinstance(fpr, bool) or not isinstance(fpr, (int, float)) or not 0 < fpr < 1:
        raise ConfigError(f"target_fpr must be in (0, 1), got {fpr!r}")
    g = opts["top_g"]
    if isinstance(g, bool) or not isinstance(g, int) or g < 1:
        raise ConfigError(f"top_g must be an integer ≥ 1, got {g!r}")
    if opts["score"] not in SCORES:
        raise ConfigError(f"score must be one of {', '.join(SCORES)}, got {opts['score']!r}")
    h = opts["window"]
    if h is not None and (isinstance(h, bool) or not isinstance(h, int) or h < 1):
        raise ConfigError(f"window must be an integer ≥ 1 (events of context), got {h!r}")
    if opts["threshold"] not in THRESHOLD_METHODS:
        raise ConfigError(
            f"threshold method must be one of {', '.join(THRESHOLD_METHODS)}, "
            f"got {opts['threshold']!r}"
        )
    return opts


class EventVocabulary(Vocabulary):
    """A :class:`~rnnkit.data.vocab.Vocabulary` whose tokens are whole events.

    Events are given as lists, never split from text, so a token may hold spaces (a log
    template such as ``"user <*> logged in"``); the file format is the vocabulary's own
    (``unit: "word"``). An event spelled like a special (``"<unk>"``) is unknown, never
    the special itself.

    >>> v = EventVocabulary.from_sessions([["open", "read"], ["open", "a b"]])
    >>> v.itos[4:]
    ['open', 'a b', 'read']
    >>> v.encode_events(["read", "exec", "<s>"])
    (array([6, 1, 1]), 2)
    """

    def __init__(self, tokens: Iterable[str], unit: str = "word") -> None:
        if unit != "word":
            raise DataError(f"an event vocabulary has unit 'word', got {unit!r}")
        super().__init__([], unit="word")
        for tok in tokens:
            if not isinstance(tok, str) or not tok:
                raise DataError(f"event must be a non-empty string, got {tok!r}")
            if tok in self.stoi:
                what = "a special" if tok in SPECIALS else "a duplicate"
                raise DataError(f"vocabulary event {tok!r} is {what}")
            self.stoi[tok] = len(self.itos)
            self.itos.append(tok)
        self._events = {tok: i for tok, i in self.stoi.items() if i >= len(SPECIALS)}

    @classmethod
    def from_sessions(
        cls, sessions: Iterable[Sequence[str]], min_freq: int = 1, source: str | None = None
    ) -> EventVocabulary:
        """Events seen at least ``min_freq`` times, most frequent first."""
        counts: dict[str, int] = {}
        for events in sessions:
            for e in events:
                counts[e] = counts.get(e, 0) + 1
        vocab = cls.from_counts(counts, unit="word", min_freq=min_freq, source=source)
        assert isinstance(vocab, EventVocabulary)
        return vocab

    def encode_event(self, event: str) -> int:
        """The id of one event (``<unk>`` = 1 if unseen)."""
        return self._events.get(event, UNK_ID)

    def encode_events(self, events: Sequence[str]) -> tuple[np.ndarray, int]:
        """``(ids (n,) int64, number of unknown events)``."""
        get = self._events.get
        ids = np.fromiter((get(e, UNK_ID) for e in events), dtype=np.int64, count=len(events))
        return ids, int(np.count_nonzero(ids == UNK_ID))


# ---- model scoring ---------------------------------------------------------------------


def _chunks(order: np.ndarray, size: int) -> Iterator[np.ndarray]:
    for lo in range(0, len(order), size):
        yield order[lo : lo + size]


@torch.no_grad()
def _windowed_surprises(
    model: LanguageModel, seqs: Sequence[np.ndarray], batch_size: int, window: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """:func:`event_surprises` where each prediction sees only the last ``window`` inputs.

    Prediction ``t`` (target ``y_t``) runs the model from a zero state over the inputs
    ``x_{t−h+1} … x_t`` of ``x = <s> e_1 … e_n``, left-padded (a masked step holds the
    zero state) to ``h`` steps: rows of ``(h,)`` windows, ``batch_size × 8`` per call.
    """
    device = next(model.parameters()).device
    rows_x, rows_y, owner = [], [], []
    for i, seq in enumerate(seqs):
        x, y = lm_pairs(seq, BOS_ID, EOS_ID)
        pos = np.arange(len(x))[:, None] - np.arange(window - 1, -1, -1)[None, :]  # (n+1, h)
        # Column j of row t is input x_{t-h+1+j}; before the session's start: padding.
        rows_x.append(np.where(pos >= 0, x[np.maximum(pos, 0)], 0))
        rows_y.append(y)
        owner.append(np.full(len(x), i))
    xs, ys = np.concatenate(rows_x), np.concatenate(rows_y)
    offsets = np.arange(window - 1, -1, -1)[None, :]  # how far back each column looks
    mask_all = np.concatenate([(np.arange(len(y))[:, None] - offsets) >= 0 for y in rows_y])
    surprise = np.empty(len(xs), dtype=np.float64)
    rank = np.empty(len(xs), dtype=np.int64)
    step = max(1, batch_size * 8)
    for lo in range(0, len(xs), step):
        hi = lo + step
        inputs = torch.from_numpy(xs[lo:hi]).to(device)
        mask = torch.from_numpy(mask_all[lo:hi]).to(device)
        logits = model(inputs, mask=mask).logits[:, -1].float()  # (rows, V)
        s, r = surprise_and_rank(
            torch.log_softmax(logits, -1), torch.from_numpy(ys[lo:hi]).to(device)
        )
        surprise[lo:hi] = s.double().cpu().numpy()
        rank[lo:hi] = r.cpu().numpy()
    bounds = np.cumsum([0] + [len(y) for y in rows_y])
    return [(surprise[a:b].copy(), rank[a:b].copy()) for a, b in itertools.pairwise(bounds)]


@torch.no_grad()
def event_surprises(
    model: LanguageModel,
    seqs: Sequence[np.ndarray],
    batch_size: int = 64,
    window: int | None = None,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Surprise and rank of every event of every session, and of its end ``</s>``.

    Sessions run whole (the state carried across chunks of :data:`SCORE_CHUNK` steps, so
    memory is bounded by ``batch_size × SCORE_CHUNK × V``), grouped by length. With a
    ``window`` ``h``, each prediction instead sees only the last ``h`` inputs, from a zero
    state (DeepLog's history window).

    Args:
        model: the next-event LM (put in eval mode here).
        seqs: event id sequences, each ``(n,)`` with ``n ≥ 1``.
        batch_size: sessions per forward call.
        window: None (whole sessions) or ``h ≥ 1``.

    Returns:
        Per session ``(surprise (n+1,) float64, rank (n+1,) int64)``; position ``n`` is the
        end of the session.

    >>> from rnnkit.models import ModelSpec, build_language_model
    >>> torch.manual_seed(0) and None
    >>> lm = build_language_model(ModelSpec(hidden=4, embedding=3), 6)
    >>> [s.shape for s, _ in event_surprises(lm, [np.array([4, 5]), np.array([4])])]
    [(3,), (2,)]
    """
    model.eval()
    if window is not None:
        return _windowed_surprises(model, seqs, batch_size, window)
    device = next(model.parameters()).device
    out: list[tuple[np.ndarray, np.ndarray] | None] = [None] * len(seqs)
    lengths = np.array([len(s) for s in seqs])
    order = np.argsort(-lengths, kind="stable")
    for idx in _chunks(order, batch_size):
        pairs = [lm_pairs(seqs[i], BOS_ID, EOS_ID) for i in idx]
        inputs, mask = pad_sequences([p[0] for p in pairs])  # (B, T)
        targets, _ = pad_sequences([p[1] for p in pairs])
        inputs, targets, mask = inputs.to(device), targets.to(device), mask.to(device)
        state = None
        surprise_parts, rank_parts = [], []
        for lo in range(0, inputs.shape[1], SCORE_CHUNK):
            hi = lo + SCORE_CHUNK
            res = model(inputs[:, lo:hi], mask=mask[:, lo:hi], state=state)
            state = res.state
            log_probs = torch.log_softmax(res.logits.float(), dim=-1)  # (B, t, V)
            s, r = surprise_and_rank(log_probs, targets[:, lo:hi])
            surprise_parts.append(s.double().cpu())
            rank_parts.append(r.cpu())
        surprise = torch.cat(surprise_parts, 1).numpy()
        rank = torch.cat(rank_parts, 1).numpy()
        for row, i in enumerate(idx):
            n = len(seqs[i]) + 1
            out[i] = (surprise[row, :n].copy(), rank[row, :n].astype(np.int64))
    return out  # type: ignore[return-value]


# Entries of one (rows, V) block of n-gram distributions while ranking (32 MiB of float64).
RANK_CELLS = 1 << 22


def _distinct_rows(rows: np.ndarray, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """The distinct rows of ``(N, k)`` ids in ``[-1, V)`` and each row's index among them.

    Rows are packed into one integer key when ``(V + 1) ** k`` fits in 62 bits: a 1-D
    ``np.unique`` is several times faster than ``np.unique(axis=0)``'s row sort.
    """
    k = rows.shape[1]
    if k == 0:
        return rows[:1], np.zeros(len(rows), dtype=np.int64)
    base = vocab_size + 1
    if k * math.log2(base) >= 62:
        distinct, which = np.unique(rows, axis=0, return_inverse=True)
        return distinct, which.reshape(-1)
    key = (rows + 1) @ (base ** np.arange(k - 1, -1, -1, dtype=np.int64))
    _, first, which = np.unique(key, return_index=True, return_inverse=True)
    return rows[first], which.reshape(-1)


def ngram_surprises(
    ngram: NGramModel, seqs: Sequence[np.ndarray]
) -> list[tuple[np.ndarray, np.ndarray]]:
    """The n-gram baseline scored the same way as :func:`event_surprises`.

    Surprise from :meth:`NGramModel.logprobs`; ranks from the distribution after each
    distinct context (the last ``n - 1`` events), all computed by
    :meth:`NGramModel.distributions` in one vectorised pass.

    >>> ng = NGramModel(order=2, vocab_size=6).fit([np.array([4, 5, 3])])
    >>> [(s.shape, r.tolist()) for s, r in ngram_surprises(ng, [np.array([4, 5])])]
    [((3,), [0, 0, 0])]
    """
    full = [np.concatenate([s, [EOS_ID]]).astype(np.int64) for s in seqs]
    logp = ngram.logprobs(full)
    flat = np.concatenate(full) if full else np.zeros(0, np.int64)
    # Vectorised over events (a Python loop per event made the n-gram side by side cost
    # several times the recurrent model): each event's context is its k = n − 1 previous
    # ids, −1 before the session's start; one distribution per distinct context, and the
    # rank of every event that has it by comparison with that distribution.
    k = ngram.order - 1
    pos = np.concatenate([np.arange(len(s)) for s in full]) if full else flat
    windows = np.full((len(flat), k), -1, dtype=np.int64)
    for j in range(1, k + 1):  # column k - j holds the id j steps back
        ok = pos >= j
        windows[ok, k - j] = flat[np.flatnonzero(ok) - j]
    ranks = np.zeros(len(flat), dtype=np.int64)
    if len(flat):
        contexts, which = _distinct_rows(windows, ngram.vocab_size)
        V = ngram.vocab_size
        order = np.argsort(which, kind="stable")  # events grouped by context
        bounds = np.searchsorted(which[order], np.arange(len(contexts) + 1))
        per = max(1, RANK_CELLS // max(V, 1))  # bound the (rows, V) temporaries
        for c0 in range(0, len(contexts), per):
            dists = ngram.distributions(contexts[c0 : c0 + per])  # (≤ per, V)
            events = order[bounds[c0] : bounds[min(c0 + per, len(contexts))]]
            for e0 in range(0, len(events), per):
                ev = events[e0 : e0 + per]
                d = dists[which[ev] - c0]
                own = d[np.arange(len(ev)), flat[ev]]
                # rank = how many ids are strictly more probable than the event's own
                ranks[ev] = (d > own[:, None]).sum(1)
    out, lo = [], 0
    for s in full:
        out.append((-logp[lo : lo + len(s)], ranks[lo : lo + len(s)].copy()))
        lo += len(s)
    return out


def _targets(seq: np.ndarray) -> np.ndarray:
    """The ids each surprise is of: the session's events, then ``</s>``."""
    return np.append(np.asarray(seq, dtype=np.int64), EOS_ID)


def _session_rows(
    per_event: Sequence[tuple[np.ndarray, np.ndarray]],
    seqs: Sequence[np.ndarray],
    top_g: int,
    keys: KeyStats | None,
) -> list[dict[str, float | int]]:
    return [
        session_scores(s, r >= top_g, None if keys is None else keys.normalise(s, _targets(q)))
        for (s, r), q in zip(per_event, seqs, strict=True)
    ]


@dataclass
class Calibration:
    """What a model's ``norm`` and ``combined`` scores are measured against: each event's
    typical surprise, and the :data:`~rnnkit.anomaly.scores.COMBINED_PARTS` scores of the
    (normal) training sessions."""

    keys: KeyStats
    parts: dict[str, np.ndarray]

    @classmethod
    def fit(
        cls,
        per_event: Sequence[tuple[np.ndarray, np.ndarray]],
        seqs: Sequence[np.ndarray],
        vocab_size: int,
        top_g: int,
    ) -> Calibration:
        pairs = [(s, _targets(q)) for (s, _), q in zip(per_event, seqs, strict=True)]
        keys = KeyStats.fit(pairs, vocab_size)
        rows = _session_rows(per_event, seqs, top_g, keys)
        parts = {n: np.array([row[n] for row in rows], dtype=np.float64) for n in COMBINED_PARTS}
        return cls(keys, parts)

    def arrays(self, prefix: str) -> dict[str, np.ndarray]:
        out = {f"{prefix}/key_mean": self.keys.mean, f"{prefix}/key_std": self.keys.std}
        out.update({f"{prefix}/parts/{n}": v for n, v in self.parts.items()})
        return out

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], prefix: str) -> Calibration:
        keys = KeyStats(arrays[f"{prefix}/key_mean"], arrays[f"{prefix}/key_std"])
        return cls(keys, {n: arrays[f"{prefix}/parts/{n}"] for n in COMBINED_PARTS})


def _all_scores(
    per_event: Sequence[tuple[np.ndarray, np.ndarray]],
    seqs: Sequence[np.ndarray],
    top_g: int,
    calibration: Calibration | None,
) -> dict[str, np.ndarray]:
    """Every session score, ``(n,)`` each; without a calibration (a run from before it was
    stored) only the :data:`RUNNING_SCORES` and ``end``."""
    rows = _session_rows(per_event, seqs, top_g, calibration and calibration.keys)
    names = COMBINED_PARTS if calibration is not None else (*RUNNING_SCORES, "end")
    out = {n: np.array([row[n] for row in rows], dtype=np.float64) for n in names}
    if calibration is not None:
        out["combined"] = combined_scores(calibration.parts, out)
    return out


# ---- data ------------------------------------------------------------------------------


@dataclass
class EventsData:
    """Encoded sessions of one training run."""

    vocab: EventVocabulary
    train: list[np.ndarray]
    valid: list[np.ndarray]  # normal validation sessions (loss, thresholds)
    valid_anomalous: list[np.ndarray]  # labelled 1 in --valid (reported, never trained on)
    excluded: int  # label-1 sessions of the training file, left out
    unknown_valid: int


def _normal(sessions: list[Session]) -> tuple[list[Session], list[Session]]:
    normal = [s for s in sessions if s.label != 1]
    return normal, [s for s in sessions if s.label == 1]


def prepare_events_data(cfg: TrainConfig, vocab: EventVocabulary | None = None) -> EventsData:
    """Read, split and encode the sessions as ``cfg`` says."""
    normal, anomalous = _normal(read_sessions(cfg.train))
    if not normal:
        raise DataError(
            f"no normal session to train on (all {len(anomalous)} are labelled 1)", cfg.train
        )
    valid_anomalous: list[Session] = []
    if cfg.valid:
        valid, valid_anomalous = _normal(read_sessions(cfg.valid))
        if not valid:
            raise DataError("no normal session to validate on (all are labelled 1)", cfg.valid)
        train_sessions = normal
    else:
        if len(normal) < 2:
            raise DataError(
                "one normal session cannot be split into training and validation; pass --valid",
                cfg.train,
            )
        rng = np.random.default_rng(cfg.seed)
        order = rng.permutation(len(normal))
        n_valid = min(len(normal) - 1, max(1, round(len(normal) * cfg.valid_fraction)))
        held = set(order[:n_valid].tolist())
        valid = [normal[i] for i in sorted(held)]
        train_sessions = [s for i, s in enumerate(normal) if i not in held]
    if vocab is None:
        vocab = EventVocabulary.from_sessions(
            (s.events for s in train_sessions), cfg.min_freq, source=cfg.train
        )
    enc = [vocab.encode_events(s.events) for s in valid]
    return EventsData(
        vocab=vocab,
        train=[vocab.encode_events(s.events)[0] for s in train_sessions],
        valid=[ids for ids, _ in enc],
        valid_anomalous=[vocab.encode_events(s.events)[0] for s in valid_anomalous],
        excluded=len(anomalous),
        unknown_valid=sum(n for _, n in enc),
    )


def _pieces(seq: np.ndarray, max_len: int) -> list[tuple[np.ndarray, np.ndarray]]:
    inputs, targets = lm_pairs(seq, BOS_ID, EOS_ID)
    return [
        (inputs[lo : lo + max_len], targets[lo : lo + max_len])
        for lo in range(0, len(inputs), max_len)
    ]


@torch.no_grad()
def init_output_bias(model: LanguageModel, seqs: Sequence[np.ndarray]) -> None:
    """Start the output bias at the log-frequencies of the training targets (add-½).

    Training then starts from the unigram model instead of the uniform one, and an id that
    is never a target (``<unk>`` when every event is in the vocabulary, ``<pad>``, ``<s>``)
    starts at ``ln(½ / N)``, below every seen event: an event never seen in training is
    surprising from the first step, not only after the softmax has slowly pushed it down.

    >>> from rnnkit.models import ModelSpec, build_language_model
    >>> lm = build_language_model(ModelSpec(hidden=4, embedding=3), 6)
    >>> init_output_bias(lm, [np.array([4, 4, 5])])
    >>> np.round(lm.head.bias.detach().numpy().astype(float), 2).tolist()  # ln(c / 7)
    [-2.64, -2.64, -2.64, -1.54, -1.03, -1.54]
    """
    bias = getattr(model.head, "bias", None)
    if not isinstance(bias, torch.Tensor) or bias.shape != (model.vocab_size,):
        return
    counts = np.full(model.vocab_size, 0.5)
    for s in seqs:
        counts += np.bincount(s, minlength=model.vocab_size)[: model.vocab_size]
    counts[EOS_ID] += len(seqs)  # every session ends once
    bias.copy_(torch.from_numpy(np.log(counts / counts.sum())).to(bias))


def _window(cfg: TrainConfig) -> int | None:
    mode, k = parse_bptt(cfg.bptt)
    return None if mode == "full" else k


def _loss_metrics(nats: float, tokens: int) -> dict[str, Any]:
    loss = nats / max(tokens, 1)
    return {"loss_nats": loss, "tokens": tokens, "perplexity": math.exp(min(loss, 700))}


def _sessions_to_resolve(target_fpr: float, confidence: float = 0.95) -> int:
    """Fewest clean sessions whose Clopper–Pearson upper end reaches ``target_fpr``:
    ``⌈ln((1−c)/2) / ln(1−α)⌉``.

    >>> _sessions_to_resolve(0.01)
    368
    """
    return math.ceil(math.log((1 - confidence) / 2) / math.log1p(-target_fpr))


def _worst_sessions(
    data: EventsData,
    per_event: Sequence[tuple[np.ndarray, np.ndarray]],
    normal: np.ndarray,
    anomalous: np.ndarray,
    top_g: int,
    k: int = 5,
    top: int = 3,
) -> list[dict[str, Any]]:
    """The ``k`` highest-scoring labelled validation sessions with their most surprising
    events (for the report: what the model finds odd, right or wrong)."""
    scores = np.r_[normal, anomalous]
    seqs = data.valid + data.valid_anomalous
    out = []
    for i in np.argsort(-scores, kind="stable")[:k]:
        events = [data.vocab.itos[t] for t in seqs[i]]
        surprise, rank = per_event[i]
        out.append(
            {
                "index": int(i if i < len(normal) else i - len(normal)),
                "label": int(i >= len(normal)),
                "score": float(scores[i]),
                "events": len(events),
                "top": _top_items(surprise, rank, seqs[i], events, top, top_g),
            }
        )
    return out


def _valid_metrics(
    model: LanguageModel, data: EventsData, batch_size: int, window: int | None = None
) -> dict[str, Any]:
    per_event = event_surprises(model, data.valid, batch_size, window)
    nats = float(sum(s.sum() for s, _ in per_event))
    return _loss_metrics(nats, sum(len(s) for s, _ in per_event))


# ---- thresholds ------------------------------------------------------------------------


def _save_arrays(arrays: dict[str, np.ndarray], path: Path) -> None:
    """safetensors (numpy) written to a temporary name, then renamed: never half a file."""
    atomic_write(path, write_path=lambda tmp: save_numpy(arrays, tmp))


def _thresholds(
    scores: dict[str, np.ndarray], target_fpr: float, method: str
) -> tuple[dict[str, float], dict[str, str]]:
    picked = {name: pick_threshold(values, target_fpr, method) for name, values in scores.items()}
    return {k: v[0] for k, v in picked.items()}, {k: v[1] for k, v in picked.items()}


def _write_thresholds(
    out: Path,
    opts: dict[str, Any],
    valid_scores: dict[str, dict[str, np.ndarray]],
    anomalous_scores: dict[str, dict[str, np.ndarray]] | None,
) -> dict[str, Any]:
    fpr = float(opts["target_fpr"])
    rnn, rnn_how = _thresholds(valid_scores["rnn"], fpr, opts["threshold"])
    ngram, ngram_how = _thresholds(valid_scores["ngram"], fpr, opts["threshold"])
    doc = {
        "format": THRESHOLDS_FORMAT,
        "version": 2,
        "target_fpr": fpr,
        "top_g": int(opts["top_g"]),
        "window": opts["window"],
        "score": opts["score"],
        "method": opts["threshold"],
        "valid_sessions": len(valid_scores["rnn"]["max"]),
        "rnn": rnn,
        "ngram": ngram,
        "how": {"rnn": rnn_how, "ngram": ngram_how},
    }
    arrays = {f"{m}/{k}": v for m, scores in valid_scores.items() for k, v in scores.items()}
    if anomalous_scores:
        # Labelled anomalous validation sessions: the report's ROC and PR curves.
        arrays.update(
            {f"anomalous/{m}/{k}": v for m, sc in anomalous_scores.items() for k, v in sc.items()}
        )
    _save_arrays(arrays, out / "valid_scores.safetensors")
    atomic_write_json(out / "thresholds.json", doc)
    return doc


def _scores_of_version(version: int) -> tuple[str, ...]:
    return ("max", "mean", "count") if version == 1 else SCORES


def read_thresholds(run_dir: str | Path) -> dict[str, Any]:
    """``thresholds.json`` of a run, checked; errors name the file.

    Version 1 (runs from before the ``end``, ``norm`` and ``combined`` scores) holds
    thresholds for ``max``, ``mean`` and ``count`` only; version 2 for every score.
    """
    path = Path(run_dir) / "thresholds.json"
    doc = read_json(path)
    try:
        names = _scores_of_version(doc["version"]) if doc["version"] in (1, 2) else ()
        ok = (
            doc["format"] == THRESHOLDS_FORMAT
            and bool(names)
            and doc["score"] in names
            and all(_finite_number(doc[m][s]) for m in ("rnn", "ngram") for s in names)
            and isinstance(doc["top_g"], int)
            and 0 < doc["target_fpr"] < 1
        )
        window = doc.get("window")
        ok = ok and (window is None or (isinstance(window, int) and window >= 1))
    except (KeyError, TypeError):
        ok = False
    if not ok:
        raise CheckpointError(f"{path}: not an rnnkit thresholds file of version 1 or 2")
    doc.setdefault("window", None)
    doc.setdefault("method", "quantile")
    return doc


def _finite_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def repick_thresholds(
    run_dir: str | Path, target_fpr: float, method: str = "quantile"
) -> dict[str, dict[str, float]]:
    """Thresholds at another false-positive rate (and method), from the stored validation
    scores."""
    if not 0 < target_fpr < 1:
        raise ConfigError(f"--target-fpr must be in (0, 1), got {target_fpr}")
    path = Path(run_dir) / "valid_scores.safetensors"
    arrays = load_arrays(path)
    try:
        return {
            m: {
                s: pick_threshold(arrays[f"{m}/{s}"], target_fpr, method)[0]
                for s in SCORES
                if f"{m}/{s}" in arrays
            }
            for m in ("rnn", "ngram")
        }
    except (KeyError, ValueError, OSError) as exc:
        raise CheckpointError(f"{path}: not valid ({exc})") from None


def read_calibration(run_dir: str | Path) -> dict[str, Calibration] | None:
    """``calibration.safetensors`` of a run per model, or None (a run from before it)."""
    path = Path(run_dir) / "calibration.safetensors"
    if not path.is_file():
        return None
    arrays = load_arrays(path)
    try:
        return {m: Calibration.from_arrays(arrays, m) for m in ("rnn", "ngram")}
    except (KeyError, ValueError, OSError) as exc:
        raise CheckpointError(f"{path}: not valid ({exc})") from None


def validation_fpr(
    normal_scores: np.ndarray, threshold: float, target_fpr: float
) -> dict[str, Any]:
    """What the validation sessions show about the false-positive rate at a threshold:
    the count above it, its 95 % Clopper–Pearson interval, and the smallest rate these
    sessions could show (:func:`rnnkit.anomaly.thresholds.resolvable_fpr`).

    >>> v = validation_fpr(np.array([0.1, 0.2, 0.3]), 0.25, 0.01)
    >>> v["false_positives"], v["sessions"], v["resolved"]
    (1, 3, False)
    """
    n = len(normal_scores)
    k = int(np.sum(np.asarray(normal_scores) > threshold))
    lo, hi = clopper_pearson(k, n)
    smallest = resolvable_fpr(n)
    return {
        "false_positives": k,
        "sessions": n,
        "rate": k / n,
        "interval95": [lo, hi],
        "resolvable": smallest,
        "resolved": bool(smallest <= target_fpr),
    }


# ---- training --------------------------------------------------------------------------


@guarded_run
def train(cfg: TrainConfig, resume: bool = False, quiet: bool = False) -> dict[str, Any]:
    """Train the next-event model and the baseline, pick thresholds, write the run.

    Returns the summary (also written to ``summary.json``).
    """
    opts = options(cfg)
    out = Path(cfg.out)
    device = choose_device(cfg.device)
    vocab = None
    if resume:
        saved, _ = load_config(out)
        # train/valid: checked by content (tasks.run.resume_data), so may be renamed.
        allowed = RESUME_CHANGEABLE | {"out", "train", "valid"}
        bad = [
            k for k, v in cfg.to_dict().items() if saved.to_dict().get(k) != v and k not in allowed
        ]
        if bad:
            raise CheckpointError(
                f"{out / 'config.json'}: --resume with different options {bad} "
                "(checkpoint of an incompatible config)"
            )
        vocab = EventVocabulary.load(out / "vocab.json")
    seed_everything(cfg.seed)
    data = prepare_events_data(cfg, vocab)
    if data.excluded:
        warn(f"{cfg.train}: {data.excluded} session(s) labelled 1 left out of training")
    model = build_language_model(model_spec(cfg), len(data.vocab)).to(device)
    model.loss_reduction = cfg.loss_reduction
    init_output_bias(model, data.train)  # (resume then loads the saved weights over it)
    optimizer_cls = torch.optim.SGD if cfg.optimizer == "sgd" else torch.optim.Adam
    optimizer = optimizer_cls(model.parameters(), lr=cfg.lr)
    # A window of h events: train on pieces of h (each from a zero state), as it scores.
    piece_len = cfg.max_len if opts["window"] is None else min(cfg.max_len, opts["window"])
    pieces = [p for s in data.train for p in _pieces(s, piece_len)]
    batches = SequenceBatcher(
        [p[0] for p in pieces],
        [p[1] for p in pieces],
        batch_size=cfg.batch_size,
        shuffle=True,
        seed=cfg.seed,
    )
    window = _window(cfg)

    def step(m: LanguageModel, batch: Any, carry: Any) -> LossOutput:
        return m.loss(
            batch.inputs.to(device),
            batch.targets.to(device),
            mask=batch.mask.to(device),
            window=window,
        )

    out.mkdir(parents=True, exist_ok=True)
    if not resume:
        data.vocab.save(out / "vocab.json")
        save_config(out, cfg, vocab_size=len(data.vocab))
        (out / "metrics.jsonl").unlink(missing_ok=True)
    trainer = Trainer(
        model,
        optimizer,
        batches,
        step,
        train_options(cfg, quiet),
        evaluate_fn=lambda m: _valid_metrics(m, data, cfg.batch_size, opts["window"]),
        out_dir=out,
    )
    if resume:
        trainer.resume()
    started = time.perf_counter()
    result = trainer.fit()
    elapsed = time.perf_counter() - started
    load_model_weights(model, out / "model.safetensors")  # the best on validation

    ngram = NGramModel(order=cfg.ngram_order, vocab_size=len(data.vocab))
    ngram.fit([np.concatenate([s, [EOS_ID]]) for s in data.train])
    _save_arrays(ngram.to_state(), out / "ngram.safetensors")

    g, h, bs, size = int(opts["top_g"]), opts["window"], cfg.batch_size, len(data.vocab)
    calibration = {
        "rnn": Calibration.fit(event_surprises(model, data.train, bs, h), data.train, size, g),
        "ngram": Calibration.fit(ngram_surprises(ngram, data.train), data.train, size, g),
    }
    arrays = {k: v for m, c in calibration.items() for k, v in c.arrays(m).items()}
    _save_arrays(arrays, out / "calibration.safetensors")
    rnn_valid = event_surprises(model, data.valid, bs, h)
    ngram_valid = ngram_surprises(ngram, data.valid)
    valid_scores = {
        "rnn": _all_scores(rnn_valid, data.valid, g, calibration["rnn"]),
        "ngram": _all_scores(ngram_valid, data.valid, g, calibration["ngram"]),
    }
    anomalous_scores = None
    if data.valid_anomalous:
        anomalous_per_event = {
            "rnn": event_surprises(model, data.valid_anomalous, bs, h),
            "ngram": ngram_surprises(ngram, data.valid_anomalous),
        }
        anomalous_scores = {
            m: _all_scores(per, data.valid_anomalous, g, calibration[m])
            for m, per in anomalous_per_event.items()
        }
    thresholds = _write_thresholds(out, opts, valid_scores, anomalous_scores)
    ngram_nats = float(sum(s.sum() for s, _ in ngram_valid))
    tokens = sum(len(s) for s, _ in ngram_valid)
    name = opts["score"]
    summary: dict[str, Any] = {
        "task": "events",
        "steps": result.steps,
        "threads": result.threads,
        "epoch": result.epochs_done,
        "elapsed_s": elapsed,
        "train_loss_nats": result.train_loss_nats,
        "tokens_per_s": result.tokens / max(result.train_seconds, 1e-9),
        "valid": result.best_valid,
        "ngram": {"order": cfg.ngram_order, **_loss_metrics(ngram_nats, tokens)},
        "clipped_steps": result.clipped_steps,
        "stopped_early": result.stopped_early,
        "stopped": result.stopped,
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(data.vocab),
        "sessions": {
            "train": len(data.train),
            "valid": len(data.valid),
            "excluded_anomalous": data.excluded,
            "valid_anomalous": len(data.valid_anomalous),
        },
        "unknown_valid_events": data.unknown_valid,
        "thresholds": {
            **{k: thresholds[k] for k in ("target_fpr", "top_g", "window", "score", "method")},
            "rnn": thresholds["rnn"],
            "ngram": thresholds["ngram"],
            "how": thresholds["how"]["rnn"][name],
        },
    }
    fpr = validation_fpr(valid_scores["rnn"][name], thresholds["rnn"][name], opts["target_fpr"])
    summary["validation_fpr"] = fpr
    if not fpr["resolved"]:
        summary["note"] = (
            f"{len(data.valid)} normal validation sessions cannot show a false-positive rate "
            f"of {opts['target_fpr']:g}: even none above the threshold leaves up to "
            f"{fpr['resolvable']:.2%} (95 % Clopper–Pearson); validate on at least "
            f"{_sessions_to_resolve(opts['target_fpr'])} normal sessions"
            + ("" if opts["threshold"] == "gpd" else ", or pick it with --threshold-method gpd")
        )
    if anomalous_scores is not None:
        labels = np.r_[np.zeros(len(data.valid)), np.ones(len(data.valid_anomalous))]
        detection = {
            m: {
                n: detection_metrics(
                    np.r_[valid_scores[m][n], anomalous_scores[m][n]], labels, thresholds[m][n]
                )
                for n in SCORES
            }
            for m in ("rnn", "ngram")
        }
        summary["valid_detection"] = detection["rnn"][name]
        summary["detection"] = detection
        summary["worst_sessions"] = _worst_sessions(
            data,
            rnn_valid + anomalous_per_event["rnn"],
            valid_scores["rnn"][name],
            anomalous_scores["rnn"][name],
            g,
        )
    return finish_summary(cfg, summary)


# ---- loading and scoring ---------------------------------------------------------------


@dataclass
class EventsModel:
    """A trained ``events`` run, loaded: what scoring needs."""

    cfg: TrainConfig
    vocab: EventVocabulary
    model: LanguageModel
    thresholds: dict[str, Any]
    ngram: NGramModel | None
    calibration: dict[str, Calibration] | None = None

    @property
    def scores(self) -> tuple[str, ...]:
        """The session scores this run has thresholds for (every one, unless the run
        predates the calibration)."""
        complete = self.calibration is not None and self.thresholds["version"] >= 2
        return SCORES if complete else RUNNING_SCORES

    def check_score(self, name: str) -> None:
        """ConfigError unless this run can give the score ``name``."""
        if name not in SCORES:
            raise ConfigError(f"--score must be one of {', '.join(SCORES)}, got {name!r}")
        if name not in self.scores:
            raise ConfigError(
                f"--score {name} needs calibration.safetensors, which this run predates "
                f"(retrain it; scores here: {', '.join(self.scores)})"
            )

    def surprises(self, seqs: Sequence[np.ndarray], batch_size: int) -> list[Any]:
        """:func:`event_surprises` with the run's window."""
        return event_surprises(self.model, seqs, batch_size, self.thresholds.get("window"))


def load_events(run_dir: str | Path, device: str = "cpu") -> EventsModel:
    """Load an ``events`` run directory (no code is unpickled); errors name the file."""
    run_dir = Path(run_dir)
    cfg, info = load_config(run_dir, task="events")
    vocab = EventVocabulary.load(run_dir / "vocab.json")
    check_count(run_dir / "vocab.json", len(vocab), "events", info, "vocab_size")
    thresholds = read_thresholds(run_dir)
    model = build_language_model(model_spec(cfg), len(vocab)).to(choose_device(device))
    load_model_weights(model, run_dir / "model.safetensors")
    model.eval()
    ngram = None
    ngram_path = run_dir / "ngram.safetensors"
    if ngram_path.is_file():
        ngram = NGramModel.from_state(load_arrays(ngram_path), where=str(ngram_path))
    return EventsModel(cfg, vocab, model, thresholds, ngram, read_calibration(run_dir))


def _top_items(
    surprise: np.ndarray, rank: np.ndarray, ids: np.ndarray, events: Sequence[str], k: int, g: int
) -> list[dict[str, Any]]:
    items = []
    for position, s in _top_events(surprise, k):
        end = position == len(events)
        item: dict[str, Any] = {
            "position": position,
            "event": SPECIALS[EOS_ID] if end else events[position],
            "surprise": round(s, 4),
            "miss": bool(rank[position] >= g),
        }
        if not end and ids[position] == UNK_ID:
            item["unknown"] = True
        items.append(item)
    return items


def score_sessions(
    run: EventsModel,
    sessions: Iterable[Session],
    *,
    batch_size: int = 64,
    top_k: int = 5,
    score: str | None = None,
    thresholds: dict[str, dict[str, float]] | None = None,
    ngram: bool = False,
) -> Iterator[dict[str, Any]]:
    """Score sessions with a loaded run; one result dict per session, in order.

    Sessions are consumed ``batch_size`` at a time, so a file of any size streams through.

    Args:
        run: from :func:`load_events`.
        sessions: the sessions (labels, if any, are passed through).
        top_k: how many of the most surprising events to list.
        score: which session score gives the verdict (default: the run's).
        thresholds: per model and score (default: the run's, see :func:`repick_thresholds`).
        ngram: add the n-gram baseline's scores (``"ngram": {...}``).

    Yields:
        ``{"session", "score", "verdict", "threshold", "scores": {max, mean, count},
        "events", "unknown", "top": [{position, event, surprise, miss[, unknown]}],
        ["label"], ["ngram"]}``.
    """
    name = score or run.thresholds["score"]
    run.check_score(name)
    limits = thresholds or {m: run.thresholds[m] for m in ("rnn", "ngram")}
    cal = run.calibration or {}
    g = int(run.thresholds["top_g"])
    if ngram and run.ngram is None:
        raise CheckpointError("this run has no ngram.safetensors")
    batch: list[Session] = []

    def flush() -> Iterator[dict[str, Any]]:
        encoded = [run.vocab.encode_events(s.events) for s in batch]
        seqs = [ids for ids, _ in encoded]
        per_event = run.surprises(seqs, batch_size)
        per_ngram = ngram_surprises(run.ngram, seqs) if ngram and run.ngram else None
        all_rnn = _all_scores(per_event, seqs, g, cal.get("rnn"))
        all_ngram = _all_scores(per_ngram, seqs, g, cal.get("ngram")) if per_ngram else None
        for i, session in enumerate(batch):
            surprise, rank = per_event[i]
            scores = _row(all_rnn, i)
            value = float(scores[name])
            limit = float(limits["rnn"][name])
            record: dict[str, Any] = {
                "session": session.session,
                "score": value,
                "verdict": "anomalous" if value > limit else "normal",
                "threshold": limit,
                "scores": scores,
                "events": len(session.events),
                "unknown": encoded[i][1],
                "top": _top_items(surprise, rank, seqs[i], session.events, top_k, g),
            }
            if session.label is not None:
                record["label"] = session.label
            if per_ngram is not None:
                assert all_ngram is not None
                ns = _row(all_ngram, i)
                nlimit = float(limits["ngram"][name])
                record["ngram"] = {
                    "score": float(ns[name]),
                    "verdict": "anomalous" if ns[name] > nlimit else "normal",
                    "threshold": nlimit,
                    "scores": ns,
                }
            yield record

    for session in sessions:
        batch.append(session)
        if len(batch) >= batch_size:
            yield from flush()
            batch = []
    if batch:
        yield from flush()


def _row(scores: dict[str, np.ndarray], i: int) -> dict[str, float | int]:
    """Session ``i``'s scores as plain numbers (``count`` an integer)."""
    return {k: int(v[i]) if k == "count" else float(v[i]) for k, v in scores.items()}


def evaluate(run_dir: str | Path, data_path: str, batch_size: int | None = None) -> dict[str, Any]:
    """Score a labelled (or unlabelled) session file with the model and the baseline.

    Returns ``loss_nats``/``tokens``/``perplexity`` over every event (and session end) of the
    file; with labels: ``auc`` (``None`` unless both classes occur), ``precision``,
    ``recall``, ``f1``, ``fpr`` at the stored threshold of the run's score, the same for
    each score (``rnn_max``, ``rnn_mean``, ``rnn_count``) and for the n-gram baseline
    (``ngram`` for the run's score, ``ngram_max``…), side by side.
    """
    run = load_events(run_dir)
    sessions = read_sessions(data_path)
    bs = batch_size or run.cfg.batch_size
    encoded = [run.vocab.encode_events(s.events) for s in sessions]
    seqs = [ids for ids, _ in encoded]
    g = int(run.thresholds["top_g"])
    name = run.thresholds["score"]
    rnn = run.surprises(seqs, bs)
    nats = float(sum(s.sum() for s, _ in rnn))
    metrics: dict[str, Any] = {
        **_loss_metrics(nats, sum(len(s) for s, _ in rnn)),
        "sessions": len(sessions),
        "events": sum(len(s) for s in seqs),
        "unknown_events": sum(n for _, n in encoded),
        "score": name,
        "target_fpr": run.thresholds["target_fpr"],
        "top_g": g,
        "threshold": run.thresholds["rnn"][name],
    }
    labelled = [i for i, s in enumerate(sessions) if s.label is not None]
    ngram_per = ngram_surprises(run.ngram, seqs) if run.ngram is not None else None
    if ngram_per is not None:
        ng_nats = float(sum(s.sum() for s, _ in ngram_per))
        metrics["ngram"] = {
            "order": run.ngram.order,  # type: ignore[union-attr]
            **_loss_metrics(ng_nats, sum(len(s) for s, _ in ngram_per)),
        }
    if not labelled:
        return metrics
    labels = np.array([sessions[i].label for i in labelled])
    metrics["labelled"] = len(labelled)
    metrics["anomalous_sessions"] = int(labels.sum())
    models = {"rnn": rnn, **({"ngram": ngram_per} if ngram_per is not None else {})}
    cal = run.calibration or {}
    for model_name, per_event in models.items():
        scores = _all_scores(
            [per_event[i] for i in labelled], [seqs[i] for i in labelled], g, cal.get(model_name)
        )
        for score_name in run.scores:
            m = detection_metrics(
                scores[score_name], labels, run.thresholds[model_name][score_name]
            )
            metrics[f"{model_name}_{score_name}"] = m
        main = metrics[f"{model_name}_{name}"]
        if model_name == "rnn":
            metrics["auc"] = main.get("auc")
            for key in ("precision", "recall", "f1", "fpr"):
                metrics[key] = main[key]
        else:
            metrics["ngram"].update(
                {k: main[k] for k in ("auc", "precision", "recall", "f1", "fpr") if k in main}
            )
    return metrics


def predictor(
    run_dir: str | Path,
    batch_size: int | None = None,
    top: int = 5,
    params: str | Path | None = None,
    **_: Any,
) -> Any:
    """``rnnkit predict`` for an events run: each input line is one session as JSON
    (``{"session": id, "events": [...]}``, as ``rnnkit score`` reads), the result its
    verdict record from :func:`score_sessions` (the run's score and thresholds). With
    ``params`` (a ``params`` run directory) the parameter values are judged too
    (:func:`rnnkit.app.tasks.params.combine`)."""
    from rnnkit.data.events import parse_session

    run = load_events(run_dir)
    bs = batch_size or 64
    params_run = None
    if params is not None:
        from rnnkit.app.tasks import params as params_task

        params_run = params_task.load_params(params)

    def score(lines: list[str], where: list[tuple[str, int]]) -> list[dict[str, Any]]:
        sessions = [
            parse_session(text, path, line) for text, (path, line) in zip(lines, where, strict=True)
        ]
        records = list(score_sessions(run, sessions, batch_size=bs, top_k=top))
        if params_run is None:
            return records
        items = [(s, path, line) for s, (path, line) in zip(sessions, where, strict=True)]
        judged = params_task.score_sessions(params_run, items, batch_size=bs, top_k=top)
        return [params_task.combine(r, p) for r, p in zip(records, judged, strict=True)]

    return score
