"""The ``events`` task: a next-event language model of normal sessions, and anomaly scores.

``rnnkit train --task events`` reads JSON-lines sessions (:mod:`rnnkit.data.events`),
trains a recurrent LM over the event vocabulary on the *normal* sessions (unlabelled or
``label: 0``; ``label: 1`` sessions in the training file are left out and counted), fits
the n-gram baseline on the same sessions, scores the normal validation sessions with both
models and stores, per model and per session score (:mod:`rnnkit.anomaly`), the threshold
for the target false-positive rate. The run directory holds, besides the usual files::

    thresholds.json            target FPR, top-g, the default score, every threshold
    valid_scores.safetensors   the validation sessions' scores (thresholds can be re-picked
                               at another FPR without retraining: ``rnnkit score --target-fpr``)
    ngram.safetensors          the n-gram baseline

Each session is one example: inputs ``<s> e_1 … e_n``, targets ``e_1 … e_n </s>``, padded
and bucketed by length. ``--bptt full`` backpropagates through whole sessions, ``window:K``
(and ``segment:K``, the command line's default, read the same way here: sessions are never
concatenated) through the last K steps. Sessions longer than ``--max-len`` are trained in
pieces of that many events (a piece after the first starts from a zero state with the
previous event as input); scoring always runs whole sessions, carrying the state.

Options without a command-line flag come from ``cfg.extra``: ``target_fpr`` (0.01),
``top_g`` (9, DeepLog's default) and ``score`` (``"max"``, ``"mean"`` or ``"count"``).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.numpy import load_file as load_numpy
from safetensors.numpy import save_file as save_numpy

from rnnkit.anomaly import SCORES, detection_metrics, session_scores, surprise_and_rank
from rnnkit.anomaly import threshold_at_fpr as _threshold_at_fpr
from rnnkit.anomaly import top_events as _top_events
from rnnkit.config import TrainConfig, parse_bptt
from rnnkit.data.batching import SequenceBatcher, lm_pairs, pad_sequences
from rnnkit.data.events import Session, read_sessions
from rnnkit.data.vocab import BOS_ID, EOS_ID, SPECIALS, UNK_ID, Vocabulary
from rnnkit.errors import CheckpointError, ConfigError, DataError
from rnnkit.models.builders import build_language_model
from rnnkit.models.language_model import LanguageModel, LossOutput
from rnnkit.models.ngram import NGramModel
from rnnkit.tasks.run import (
    check_count,
    choose_device,
    load_config,
    save_config,
    seed_everything,
    train_options,
    warn,
)
from rnnkit.training.checkpoint import atomic_write_json, load_model_weights, read_json
from rnnkit.training.loop import Trainer

__all__ = [
    "DEFAULTS",
    "EventVocabulary",
    "EventsModel",
    "evaluate",
    "event_surprises",
    "load_events",
    "ngram_surprises",
    "score_sessions",
    "train",
]

#: Options read from ``cfg.extra`` and their defaults.
DEFAULTS: dict[str, Any] = {"target_fpr": 0.01, "top_g": 9, "score": "max"}
THRESHOLDS_FORMAT = "rnnkit.thresholds"
#: Steps per forward call when scoring: bounds memory whatever a session's length.
SCORE_CHUNK = 512


def options(cfg: TrainConfig) -> dict[str, Any]:
    """The events options of ``cfg.extra`` merged over :data:`DEFAULTS`, validated.

    >>> options(TrainConfig(train="x", extra={"top_g": 3}))
    {'target_fpr': 0.01, 'top_g': 3, 'score': 'max'}
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
def event_surprises(
    model: LanguageModel, seqs: Sequence[np.ndarray], batch_size: int = 64
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Surprise and rank of every event of every session, and of its end ``</s>``.

    Sessions run whole (the state carried across chunks of :data:`SCORE_CHUNK` steps, so
    memory is bounded by ``batch_size × SCORE_CHUNK × V``), grouped by length.

    Args:
        model: the next-event LM (put in eval mode here).
        seqs: event id sequences, each ``(n,)`` with ``n ≥ 1``.
        batch_size: sessions per forward call.

    Returns:
        Per session ``(surprise (n+1,) float64, rank (n+1,) int64)``; position ``n`` is the
        end of the session.

    >>> from rnnkit.models.builders import build_language_model
    >>> torch.manual_seed(0) and None
    >>> lm = build_language_model(TrainConfig(train="x", hidden=4, embedding=3), 6)
    >>> [s.shape for s, _ in event_surprises(lm, [np.array([4, 5]), np.array([4])])]
    [(3,), (2,)]
    """
    model.eval()
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


def ngram_surprises(
    ngram: NGramModel, seqs: Sequence[np.ndarray]
) -> list[tuple[np.ndarray, np.ndarray]]:
    """The n-gram baseline scored the same way as :func:`event_surprises`.

    Surprise from :meth:`NGramModel.logprobs`; ranks from one :meth:`distribution` per
    distinct context (the last ``n - 1`` events).

    >>> ng = NGramModel(order=2, vocab_size=6).fit([np.array([4, 5, 3])])
    >>> [(s.shape, r.tolist()) for s, r in ngram_surprises(ng, [np.array([4, 5])])]
    [((3,), [0, 0, 0])]
    """
    full = [np.concatenate([s, [EOS_ID]]).astype(np.int64) for s in seqs]
    logp = ngram.logprobs(full)
    k = ngram.order - 1
    by_context: dict[tuple[int, ...], list[tuple[int, int]]] = {}
    for i, s in enumerate(full):
        for t in range(len(s)):
            ctx = tuple(s[max(0, t - k) : t].tolist()) if k else ()
            by_context.setdefault(ctx, []).append((i, t))
    ranks = [np.zeros(len(s), dtype=np.int64) for s in full]
    for ctx, where in by_context.items():
        dist = ngram.distribution(list(ctx))
        for i, t in where:
            ranks[i][t] = int(np.sum(dist > dist[full[i][t]]))
    out, lo = [], 0
    for s, r in zip(full, ranks, strict=True):
        out.append((-logp[lo : lo + len(s)], r))
        lo += len(s)
    return out


def _all_scores(
    per_event: Sequence[tuple[np.ndarray, np.ndarray]], top_g: int
) -> dict[str, np.ndarray]:
    rows = [session_scores(s, r >= top_g) for s, r in per_event]
    return {name: np.array([row[name] for row in rows], dtype=np.float64) for name in SCORES}


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

    >>> from rnnkit.models.builders import build_language_model
    >>> lm = build_language_model(TrainConfig(train="x", hidden=4, embedding=3), 6)
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


def _valid_metrics(model: LanguageModel, data: EventsData, batch_size: int) -> dict[str, Any]:
    per_event = event_surprises(model, data.valid, batch_size)
    nats = float(sum(s.sum() for s, _ in per_event))
    return _loss_metrics(nats, sum(len(s) for s, _ in per_event))


# ---- thresholds ------------------------------------------------------------------------


def _save_arrays(arrays: dict[str, np.ndarray], path: Path) -> None:
    """safetensors (numpy) written to a temporary name, then renamed: never half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        save_numpy(arrays, str(tmp))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _thresholds(scores: dict[str, np.ndarray], target_fpr: float) -> dict[str, float]:
    return {name: _threshold_at_fpr(values, target_fpr) for name, values in scores.items()}


def _write_thresholds(
    out: Path,
    opts: dict[str, Any],
    rnn_scores: dict[str, np.ndarray],
    ngram_scores: dict[str, np.ndarray],
) -> dict[str, Any]:
    fpr = float(opts["target_fpr"])
    doc = {
        "format": THRESHOLDS_FORMAT,
        "version": 1,
        "target_fpr": fpr,
        "top_g": int(opts["top_g"]),
        "score": opts["score"],
        "valid_sessions": len(rnn_scores["max"]),
        "rnn": _thresholds(rnn_scores, fpr),
        "ngram": _thresholds(ngram_scores, fpr),
    }
    arrays = {f"rnn/{k}": v for k, v in rnn_scores.items()}
    arrays.update({f"ngram/{k}": v for k, v in ngram_scores.items()})
    _save_arrays(arrays, out / "valid_scores.safetensors")
    atomic_write_json(out / "thresholds.json", doc)
    return doc


def read_thresholds(run_dir: str | Path) -> dict[str, Any]:
    """``thresholds.json`` of a run, checked; errors name the file."""
    path = Path(run_dir) / "thresholds.json"
    doc = read_json(path)
    try:
        ok = (
            doc["format"] == THRESHOLDS_FORMAT
            and doc["version"] == 1
            and doc["score"] in SCORES
            and all(isinstance(doc[m][s], (int, float)) for m in ("rnn", "ngram") for s in SCORES)
            and isinstance(doc["top_g"], int)
            and 0 < doc["target_fpr"] < 1
        )
    except (KeyError, TypeError):
        ok = False
    if not ok:
        raise CheckpointError(f"{path}: not an rnnkit thresholds file of version 1")
    return doc


def repick_thresholds(run_dir: str | Path, target_fpr: float) -> dict[str, dict[str, float]]:
    """Thresholds at another false-positive rate, from the stored validation scores."""
    if not 0 < target_fpr < 1:
        raise ConfigError(f"--target-fpr must be in (0, 1), got {target_fpr}")
    path = Path(run_dir) / "valid_scores.safetensors"
    if not path.is_file():
        raise CheckpointError(f"{path}: missing")
    try:
        arrays = load_numpy(str(path))
        return {
            m: {s: _threshold_at_fpr(arrays[f"{m}/{s}"], target_fpr) for s in SCORES}
            for m in ("rnn", "ngram")
        }
    except (KeyError, ValueError, OSError) as exc:
        raise CheckpointError(f"{path}: not valid ({exc})") from None


# ---- training --------------------------------------------------------------------------


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
        allowed = {"epochs", "steps", "max_time", "eval_every", "patience", "device"}
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
    if data.excluded and not quiet:
        warn(f"{cfg.train}: {data.excluded} session(s) labelled 1 left out of training")
    model = build_language_model(cfg, len(data.vocab)).to(device)
    init_output_bias(model, data.train)  # (resume then loads the saved weights over it)
    optimizer_cls = torch.optim.SGD if cfg.optimizer == "sgd" else torch.optim.Adam
    optimizer = optimizer_cls(model.parameters(), lr=cfg.lr)
    pieces = [p for s in data.train for p in _pieces(s, cfg.max_len)]
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
        evaluate_fn=lambda m: _valid_metrics(m, data, cfg.batch_size),
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

    g = int(opts["top_g"])
    rnn_valid = event_surprises(model, data.valid, cfg.batch_size)
    ngram_valid = ngram_surprises(ngram, data.valid)
    thresholds = _write_thresholds(
        out, opts, _all_scores(rnn_valid, g), _all_scores(ngram_valid, g)
    )
    ngram_nats = float(sum(s.sum() for s, _ in ngram_valid))
    tokens = sum(len(s) for s, _ in ngram_valid)
    summary: dict[str, Any] = {
        "task": "events",
        "steps": result.steps,
        "epoch": result.epochs_done,
        "elapsed_s": elapsed,
        "train_loss_nats": result.train_loss_nats,
        "tokens_per_s": result.tokens / max(result.train_seconds, 1e-9),
        "valid": result.best_valid,
        "ngram": {"order": cfg.ngram_order, **_loss_metrics(ngram_nats, tokens)},
        "clipped_steps": result.clipped_steps,
        "stopped_early": result.stopped_early,
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(data.vocab),
        "sessions": {
            "train": len(data.train),
            "valid": len(data.valid),
            "excluded_anomalous": data.excluded,
            "valid_anomalous": len(data.valid_anomalous),
        },
        "unknown_valid_events": data.unknown_valid,
        "thresholds": {k: thresholds[k] for k in ("target_fpr", "top_g", "score", "rnn", "ngram")},
    }
    if len(data.valid) * opts["target_fpr"] < 1:
        summary["note"] = (
            f"{len(data.valid)} normal validation sessions cannot resolve a false-positive "
            f"rate of {opts['target_fpr']}: the threshold is the largest validation score"
        )
    if data.valid_anomalous:
        labels = [0] * len(data.valid) + [1] * len(data.valid_anomalous)
        rnn_all = rnn_valid + event_surprises(model, data.valid_anomalous, cfg.batch_size)
        name = opts["score"]
        scores = _all_scores(rnn_all, g)[name]
        summary["valid_detection"] = detection_metrics(scores, labels, thresholds["rnn"][name])
    atomic_write_json(out / "summary.json", summary)
    return summary


# ---- loading and scoring ---------------------------------------------------------------


@dataclass
class EventsModel:
    """A trained ``events`` run, loaded: what scoring needs."""

    cfg: TrainConfig
    vocab: EventVocabulary
    model: LanguageModel
    thresholds: dict[str, Any]
    ngram: NGramModel | None


def load_events(run_dir: str | Path, device: str = "cpu") -> EventsModel:
    """Load an ``events`` run directory (no code is unpickled); errors name the file."""
    run_dir = Path(run_dir)
    cfg, info = load_config(run_dir, task="events")
    vocab = EventVocabulary.load(run_dir / "vocab.json")
    check_count(run_dir / "vocab.json", len(vocab), "events", info, "vocab_size")
    thresholds = read_thresholds(run_dir)
    model = build_language_model(cfg, len(vocab)).to(choose_device(device))
    load_model_weights(model, run_dir / "model.safetensors")
    model.eval()
    ngram = None
    ngram_path = run_dir / "ngram.safetensors"
    if ngram_path.is_file():
        ngram = NGramModel.from_state(load_numpy(str(ngram_path)))
    return EventsModel(cfg, vocab, model, thresholds, ngram)


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
    if name not in SCORES:
        raise ConfigError(f"--score must be one of {', '.join(SCORES)}, got {name!r}")
    limits = thresholds or {m: run.thresholds[m] for m in ("rnn", "ngram")}
    g = int(run.thresholds["top_g"])
    if ngram and run.ngram is None:
        raise CheckpointError("this run has no ngram.safetensors")
    batch: list[Session] = []

    def flush() -> Iterator[dict[str, Any]]:
        encoded = [run.vocab.encode_events(s.events) for s in batch]
        seqs = [ids for ids, _ in encoded]
        per_event = event_surprises(run.model, seqs, batch_size)
        per_ngram = ngram_surprises(run.ngram, seqs) if ngram and run.ngram else None
        for i, session in enumerate(batch):
            surprise, rank = per_event[i]
            scores = session_scores(surprise, rank >= g)
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
                ns = session_scores(per_ngram[i][0], per_ngram[i][1] >= g)
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
    rnn = event_surprises(run.model, seqs, bs)
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
    for model_name, per_event in models.items():
        scores = _all_scores([per_event[i] for i in labelled], g)
        for score_name in SCORES:
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
