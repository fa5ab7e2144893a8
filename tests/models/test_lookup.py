"""The lookup baselines against hand-computed answers and a brute-force oracle: the most
frequent tag per word, Levenshtein distances (against the textbook dynamic programme) and
the nearest training source (against an exhaustive search with the same tie rule)."""

from __future__ import annotations

import numpy as np
import pytest

from rnnkit.errors import CheckpointError
from rnnkit.models import lookup
from rnnkit.models.lookup import MostFrequentTag, NearestNeighbour, levenshtein_many


def _edit_distance(a: list[int], b: list[int]) -> int:
    """The textbook O(mn) table, one cell at a time."""
    table = [[i + j if i * j == 0 else 0 for j in range(len(b) + 1)] for i in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            table[i][j] = min(
                table[i - 1][j] + 1,
                table[i][j - 1] + 1,
                table[i - 1][j - 1] + (a[i - 1] != b[j - 1]),
            )
    return table[-1][-1]


def test_most_frequent_tag_by_hand():
    # word 4: tags 0, 1, 1 -> 1; word 5: 2, 0 (a tie) -> 0, the smaller id; word 1 (<unk>)
    # is skipped; tag 3 is unknown (= num_tags) and never counted.
    words = [np.array([4, 4, 5, 1]), np.array([4, 5, 6])]
    tags = [np.array([0, 1, 2, 1]), np.array([1, 0, 3])]
    m = MostFrequentTag.fit(words, tags, vocab_size=8, num_tags=3, skip=(1,))
    assert m.best.tolist() == [-1, -1, -1, -1, 1, 0, -1, -1]
    assert m.fallback == 1  # tag 1 occurs 3 times, 0 twice, 2 once
    assert m.predict(np.array([4, 5, 6, 1, 7])).tolist() == [1, 0, 1, 1, 1]
    again = MostFrequentTag.from_state(m.to_state(), num_tags=3)
    assert again.best.tolist() == m.best.tolist() and again.fallback == 1
    with pytest.raises(CheckpointError, match=r"f\.safetensors: invalid most-frequent-tag"):
        MostFrequentTag.from_state(m.to_state(), num_tags=1, where="f.safetensors")


def test_levenshtein_against_the_textbook_table():
    rng = np.random.default_rng(0)
    for _ in range(30):
        q = rng.integers(0, 4, size=int(rng.integers(0, 8)))
        n = int(rng.integers(0, 8))
        cands = rng.integers(0, 4, size=(5, n))
        got = levenshtein_many(q, cands).tolist()
        assert got == [_edit_distance(q.tolist(), c) for c in cands.tolist()]


def test_nearest_neighbour_against_exhaustive_search():
    rng = np.random.default_rng(1)
    sources = [rng.integers(4, 8, size=int(rng.integers(1, 7))) for _ in range(60)]
    targets = [np.array([i]) for i in range(60)]
    nn = NearestNeighbour(sources, targets)
    for _ in range(40):
        q = rng.integers(4, 8, size=int(rng.integers(1, 8)))
        dist = [_edit_distance(q.tolist(), s.tolist()) for s in sources]
        # ties: the closest length, the shorter, then the first in the file
        want = min(
            range(60), key=lambda i: (dist[i], abs(len(sources[i]) - len(q)), len(sources[i]), i)
        )
        assert dist[nn.nearest(q)] == dist[want]
        assert nn.nearest(q) == want
    # A source seen in training gets its own target (the first of duplicates).
    first = min(i for i in range(60) if sources[i].tolist() == sources[7].tolist())
    assert nn.predict([sources[7]])[0].tolist() == [first]


def test_nearest_neighbour_state_and_cap(monkeypatch):
    sources = [np.array([4, 5]), np.array([6]), np.array([4, 4, 4])]
    targets = [np.array([9]), np.array([8, 8]), np.array([7])]
    nn = NearestNeighbour(sources, targets)
    again = NearestNeighbour.from_state(nn.to_state())
    assert [t.tolist() for t in again.predict(sources)] == [[9], [8, 8], [7]]
    state = nn.to_state()
    state["nn/source_offsets"] = np.array([0, 2, 9, 3])
    with pytest.raises(CheckpointError, match="invalid nearest-neighbour state"):
        NearestNeighbour.from_state(state)
    monkeypatch.setattr(lookup, "MAX_NEIGHBOURS", 2)
    capped = NearestNeighbour(sources, targets)
    assert capped.searched == 2 and capped.total == 3
    assert NearestNeighbour.from_state(capped.to_state()).total == 3


def test_nearest_neighbour_target_ids_past_the_vocabulary_are_refused():
    # A garbled baseline.safetensors read with --skip-checksums: an IndexError in evaluate.
    nn = NearestNeighbour([np.array([4, 5])], [np.array([9, 3])])
    assert NearestNeighbour.from_state(nn.to_state(), target_size=10).predict([[4]])[0].tolist()
    state = nn.to_state()
    state["nn/targets"] = np.array([9, 12345])
    with pytest.raises(CheckpointError, match=r"b\.safetensors: .*target ids out of range"):
        NearestNeighbour.from_state(state, where="b.safetensors", target_size=10)
    state["nn/targets"] = np.array([-1, 3])
    with pytest.raises(CheckpointError, match="target ids out of range"):
        NearestNeighbour.from_state(state)
