"""The sessions of an ``events`` run: the event vocabulary, and reading, splitting and
encoding the training and validation sessions (label-1 sessions are never trained on)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from rnnkit.app.config import TrainConfig
from rnnkit.data.events import Session, read_sessions
from rnnkit.data.vocab import SPECIALS, UNK_ID, Vocabulary
from rnnkit.errors import DataError

__all__ = [
    "MIN_THRESHOLD_SESSIONS",
    "EventVocabulary",
    "EventsData",
    "prepare_events_data",
    "validation_sessions",
]

#: The normal validation sessions a threshold should rest on; fewer, and the threshold is
#: picked by the tail fit (``write_thresholds``).
MIN_THRESHOLD_SESSIONS = 30
#: ... but the held-out share never takes more than this of the normal sessions.
MAX_VALID_SHARE = 0.3


def validation_sessions(n: int, valid_fraction: float) -> int:
    """How many of ``n`` normal sessions validate (and pick the threshold) when no
    ``--valid`` file is given: ``--valid-fraction`` of them, but at least
    ``MIN_THRESHOLD_SESSIONS`` where that leaves ``1 − MAX_VALID_SHARE`` to train on, and
    at least one, at most ``n − 1``.

    >>> [validation_sessions(n, 0.05) for n in (120, 60, 2000)]
    [30, 18, 100]
    """
    wanted = max(round(n * valid_fraction), min(MIN_THRESHOLD_SESSIONS, int(n * MAX_VALID_SHARE)))
    return min(n - 1, max(1, wanted))


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


@dataclass
class EventsData:
    """Encoded sessions of one training run."""

    vocab: EventVocabulary
    train: list[np.ndarray]
    valid: list[np.ndarray]  # normal validation sessions (loss, thresholds)
    valid_anomalous: list[np.ndarray]  # labelled 1 in --valid (reported, never trained on)
    excluded: int  # label-1 sessions of the training file, left out
    unknown_valid: int
    # the ids and events as read, of valid then valid_anomalous (the report names them)
    valid_sessions: list[Session] = field(default_factory=list)


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
        rng = np.random.default_rng(cfg.seed % 2**64)  # a negative seed as torch reads it
        order = rng.permutation(len(normal))
        n_valid = validation_sessions(len(normal), cfg.valid_fraction)
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
        valid_sessions=[*valid, *valid_anomalous],
    )
