"""Baselines that look their answers up in the training data: the most frequent tag of a
word (tagging) and the target of the nearest training source (transduction).

They are what a model gets for memorising: a recurrent model that does no better has
not yet learned anything from context.

* :class:`MostFrequentTag`: each word seen in training gets the tag it had most often
  there (ties: the smaller tag id); an unseen word gets the most frequent tag overall.
* :class:`NearestNeighbour`: a source gets the target of the training source at the
  smallest Levenshtein distance (insertions, deletions and substitutions of tokens, each
  costing 1); ties go to the training source closest in length (the shorter of two
  equally close), then to the first in the file. A source seen in training is answered
  by its own target (distance 0: pure memorisation). Distances are computed for all
  candidates of one length at once, one numpy row update per source token, and lengths
  are visited outward from the source's own, stopping once the length difference alone
  exceeds the best distance found.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from rnnkit.errors import CheckpointError

__all__ = ["MAX_NEIGHBOURS", "MostFrequentTag", "NearestNeighbour", "levenshtein_many"]

#: At most this many training pairs are searched by :class:`NearestNeighbour` (evenly
#: spaced over the file beyond it): a bound on the baseline's time on large data.
MAX_NEIGHBOURS = 50_000
_NN_KEYS = ("nn/sources", "nn/source_offsets", "nn/targets", "nn/target_offsets", "nn/total")


class MostFrequentTag:
    """Per word id, the tag id it had most often in training.

    >>> m = MostFrequentTag.fit([np.array([4, 5, 4])], [np.array([0, 1, 2])], 7, 3)
    >>> m.best.tolist(), m.fallback, m.predict(np.array([4, 5, 6])).tolist()
    ([-1, -1, -1, -1, 0, 1, -1], 0, [0, 1, 0])
    """

    def __init__(self, best: np.ndarray, fallback: int) -> None:
        self.best = best  # (V,) int64, −1: never seen in training
        self.fallback = fallback

    @classmethod
    def fit(
        cls,
        words: Sequence[np.ndarray],
        tags: Sequence[np.ndarray],
        vocab_size: int,
        num_tags: int,
        skip: Sequence[int] = (),
    ) -> MostFrequentTag:
        """Counts from ``words``/``tags`` id arrays; tag ids ``≥ num_tags`` (unknown) and
        word ids in ``skip`` (e.g. ``<unk>``, which is no one word) are not counted."""
        w = np.concatenate(words) if words else np.zeros(0, np.int64)
        t = np.concatenate(tags) if tags else np.zeros(0, np.int64)
        keep = t < num_tags
        w, t = w[keep], t[keep]
        overall = np.bincount(t, minlength=num_tags)
        fallback = int(overall.argmax()) if len(t) else 0
        counts = np.zeros((vocab_size, num_tags), dtype=np.int64)
        np.add.at(counts, (w, t), 1)
        best = counts.argmax(1)
        seen = counts.sum(1) > 0
        seen[list(skip)] = False
        return cls(np.where(seen, best, -1).astype(np.int64), fallback)

    def predict(self, words: np.ndarray) -> np.ndarray:
        """Tag ids of word ids ``(n,)``."""
        words = np.asarray(words, dtype=np.int64)
        inside = (words >= 0) & (words < len(self.best))
        best = np.where(inside, self.best[np.where(inside, words, 0)], -1)
        return np.where(best >= 0, best, self.fallback)

    def to_state(self) -> dict[str, np.ndarray]:
        return {"tag/best": self.best, "tag/fallback": np.array([self.fallback], np.int64)}

    @classmethod
    def from_state(
        cls, state: dict[str, np.ndarray], num_tags: int, where: str | None = None
    ) -> MostFrequentTag:
        at = f"{where}: " if where else ""
        try:
            best = np.asarray(state["tag/best"], dtype=np.int64)
            fallback = int(np.asarray(state["tag/fallback"]).reshape(-1)[0])
        except (KeyError, ValueError, TypeError, IndexError) as exc:
            raise CheckpointError(f"{at}invalid most-frequent-tag state: {exc}") from None
        if best.ndim != 1 or not (0 <= fallback < num_tags) or bool((best >= num_tags).any()):
            raise CheckpointError(f"{at}invalid most-frequent-tag state (tag ids out of range)")
        return cls(best, fallback)


def levenshtein_many(query: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """Levenshtein distances between ``query (m,)`` and every row of ``candidates (N, n)``
    (rows of one length ``n``).

    Row ``i`` of the table, ``D_i[j] = min(D_{i−1}[j] + 1, D_{i−1}[j−1] + [q_i ≠ c_j],
    D_i[j−1] + 1)``, is computed for all candidates at once: with ``A_j`` the first two
    terms, ``D_i[j] = min_{k ≤ j} (A_k + j − k)``, a running minimum of ``A_k − k``.

    >>> levenshtein_many(np.array([1, 2, 3]), np.array([[1, 2, 3], [3, 2, 1], [1, 3, 4]]))
    array([0, 2, 2])
    """
    N, n = candidates.shape
    j = np.arange(n + 1)
    prev = np.broadcast_to(j, (N, n + 1)).copy()  # D_0[j] = j
    for i, token in enumerate(np.asarray(query).tolist(), 1):
        a = np.empty_like(prev)
        a[:, 0] = i
        a[:, 1:] = np.minimum(prev[:, 1:] + 1, prev[:, :-1] + (candidates != token))
        prev = np.minimum.accumulate(a - j, axis=1) + j
    return prev[:, n]


class NearestNeighbour:
    """The target of the nearest training source (see the module docstring).

    Args:
        sources: training sources, id arrays.
        targets: their targets, id arrays (what :meth:`predict` returns).

    >>> nn = NearestNeighbour([np.array([4, 5]), np.array([6, 6, 6])],
    ...                       [np.array([7]), np.array([8])])
    >>> [t.tolist() for t in nn.predict([np.array([4, 5]), np.array([6, 6]), np.array([4])])]
    [[7], [8], [7]]
    """

    def __init__(self, sources: Sequence[np.ndarray], targets: Sequence[np.ndarray]) -> None:
        if len(sources) != len(targets):
            raise ValueError(f"{len(sources)} sources and {len(targets)} targets")
        self.total = len(sources)
        keep = np.arange(len(sources))
        if len(sources) > MAX_NEIGHBOURS:
            keep = np.linspace(0, len(sources) - 1, MAX_NEIGHBOURS).round().astype(np.int64)
        self.sources = [np.asarray(sources[int(i)], dtype=np.int64) for i in keep]
        self.targets = [np.asarray(targets[int(i)], dtype=np.int64) for i in keep]
        self._exact: dict[bytes, int] = {}
        for index, s in enumerate(self.sources):
            self._exact.setdefault(s.tobytes(), index)
        by_length: dict[int, list[int]] = {}
        for index, s in enumerate(self.sources):
            by_length.setdefault(len(s), []).append(index)
        self._lengths = np.array(sorted(by_length), dtype=np.int64)
        self._groups = {
            n: (np.array(ix, dtype=np.int64), np.stack([self.sources[i] for i in ix]))
            if n
            else (np.array(ix, dtype=np.int64), np.zeros((len(ix), 0), np.int64))
            for n, ix in by_length.items()
        }

    @property
    def searched(self) -> int:
        """Training pairs searched (all of them up to :data:`MAX_NEIGHBOURS`)."""
        return len(self.sources)

    def nearest(self, query: np.ndarray) -> int:
        """Index (into :attr:`sources`) of the nearest training source to ``query``."""
        query = np.asarray(query, dtype=np.int64)
        hit = self._exact.get(query.tobytes())
        if hit is not None:
            return hit
        m = len(query)
        # Lengths by distance from m (then shorter first): |n − m| bounds the distance.
        order = sorted(self._lengths.tolist(), key=lambda n: (abs(n - m), n))
        best, best_index = None, -1
        for n in order:
            if best is not None and abs(n - m) >= best:
                break
            index, rows = self._groups[n]
            d = levenshtein_many(query, rows) if n else np.full(len(index), m)
            k = int(d.argmin())
            if best is None or int(d[k]) < best:
                best, best_index = int(d[k]), int(index[k])
        return best_index

    def predict(self, queries: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The target of the nearest training source of every query."""
        return [self.targets[self.nearest(q)] for q in queries]

    def to_state(self) -> dict[str, np.ndarray]:
        def flat(arrays: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
            offsets = np.cumsum([0] + [len(a) for a in arrays]).astype(np.int64)
            data = np.concatenate(arrays) if arrays else np.zeros(0, np.int64)
            return data.astype(np.int64), offsets

        s, so = flat(self.sources)
        t, to = flat(self.targets)
        return {
            "nn/sources": s,
            "nn/source_offsets": so,
            "nn/targets": t,
            "nn/target_offsets": to,
            "nn/total": np.array([self.total], dtype=np.int64),
        }

    @classmethod
    def from_state(
        cls, state: dict[str, np.ndarray], where: str | None = None, target_size: int | None = None
    ) -> NearestNeighbour:
        """The model of :meth:`state`; ``target_size``: the target vocabulary, which every
        stored target id must be below (a damaged file would index past it)."""
        at = f"{where}: " if where else ""

        def unflat(data: np.ndarray, offsets: np.ndarray) -> list[np.ndarray]:
            ok = (
                data.ndim == 1
                and offsets.ndim == 1
                and len(offsets) >= 1
                and offsets[0] == 0
                and offsets[-1] == len(data)
                and bool(np.all(np.diff(offsets) >= 0))
            )
            if not ok:
                raise CheckpointError(f"{at}invalid nearest-neighbour state (offsets)")
            return [data[a:b] for a, b in itertools.pairwise(offsets.tolist())]

        try:
            arrays = {k: np.asarray(state[k], dtype=np.int64) for k in _NN_KEYS}
        except (KeyError, ValueError, TypeError) as exc:
            raise CheckpointError(f"{at}invalid nearest-neighbour state: {exc}") from None
        sources = unflat(arrays["nn/sources"], arrays["nn/source_offsets"])
        targets = unflat(arrays["nn/targets"], arrays["nn/target_offsets"])
        if len(sources) != len(targets) or not sources:
            raise CheckpointError(f"{at}invalid nearest-neighbour state (pair counts)")
        ids = arrays["nn/targets"]
        if ids.size and (ids.min() < 0 or (target_size is not None and ids.max() >= target_size)):
            raise CheckpointError(f"{at}invalid nearest-neighbour state (target ids out of range)")
        model = cls(sources, targets)
        model.total = max(int(arrays["nn/total"].reshape(-1)[0]), len(sources))
        return model
