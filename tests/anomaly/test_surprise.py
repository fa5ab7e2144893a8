"""The n-gram side of the per-event surprise and rank: equal to the
definition from each context's own distribution, however the ranking is blocked."""

from __future__ import annotations

import numpy as np
import pytest

from rnnkit.anomaly import surprise as surprise_module
from rnnkit.anomaly.surprise import ngram_surprises
from rnnkit.data.vocab import EOS_ID
from rnnkit.models.ngram import NGramModel


def test_ngram_surprise_and_rank_match_its_distributions() -> None:
    seqs = [np.array([4, 5, 4, 6]), np.array([5, 5])]
    ngram = NGramModel(order=3, vocab_size=7).fit([np.append(s, EOS_ID) for s in seqs])
    probe = [np.array([4, 6, 5]), np.array([6])]
    for seq, (surprise, rank) in zip(probe, ngram_surprises(ngram, probe), strict=True):
        full = np.append(seq, EOS_ID)
        for t, target in enumerate(full):
            dist = ngram.distribution(full[max(0, t - 2) : t].tolist())
            assert surprise[t] == pytest.approx(-np.log(dist[target]))
            assert rank[t] == np.sum(dist > dist[target])


@pytest.mark.parametrize("order", [1, 2, 3, 5])
def test_ngram_ranks_vectorised_equal_the_per_event_definition(order: int) -> None:
    """Random sessions (unseen contexts, ties between unseen ids): every event's surprise
    and rank equal those computed from its own context's distribution, one at a time."""
    rng = np.random.default_rng(order)
    train = [rng.integers(4, 12, size=rng.integers(1, 30)) for _ in range(20)]
    ngram = NGramModel(order=order, vocab_size=16).fit([np.append(s, EOS_ID) for s in train])
    probe = [rng.integers(4, 16, size=n) for n in (0, 1, 7, 40)]
    for seq, (surprise, rank) in zip(probe, ngram_surprises(ngram, probe), strict=True):
        full = np.append(seq, EOS_ID)
        assert surprise.shape == rank.shape == (len(full),)
        for t, target in enumerate(full):
            dist = ngram.distribution(full[max(0, t - order + 1) : t].tolist())
            assert surprise[t] == pytest.approx(-np.log(dist[target]))
            assert rank[t] == np.sum(dist > dist[target])


def test_ngram_ranks_in_small_blocks_equal_one_block(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ranking in blocks of a few contexts and events (as with a large vocabulary) gives
    the ranks of one block."""
    rng = np.random.default_rng(3)
    train = [rng.integers(4, 12, size=rng.integers(1, 30)) for _ in range(20)]
    ngram = NGramModel(order=3, vocab_size=16).fit([np.append(s, EOS_ID) for s in train])
    probe = [rng.integers(4, 16, size=n) for n in (0, 3, 25, 60)]
    whole = ngram_surprises(ngram, probe)
    monkeypatch.setattr(surprise_module, "RANK_CELLS", 3 * 16)  # three rows of V at a time
    blocked = ngram_surprises(ngram, probe)
    for (s1, r1), (s2, r2) in zip(whole, blocked, strict=True):
        np.testing.assert_array_equal(s1, s2)
        np.testing.assert_array_equal(r1, r2)


@pytest.mark.parametrize("window", [None, 2], ids=["whole", "window"])
def test_the_device_is_read_once_a_call(monkeypatch: pytest.MonkeyPatch, window) -> None:
    """On a GPU (reads counted on the CPU, as the device would see them) each forward
    call's surprises and ranks are read once, with the model's checks (before: three
    reads a chunk of a batch), and the figures are those read as they go."""
    import sys
    from pathlib import Path

    import torch

    from rnnkit import deferred as deferred_module
    from rnnkit.anomaly.surprise import event_surprises
    from rnnkit.bptt.fused import use_fused
    from rnnkit.bptt.native import use_native
    from rnnkit.models import ModelSpec, build_language_model

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))
    from host_reads import HostReads

    torch.manual_seed(0)
    lm = build_language_model(ModelSpec(hidden=6, embedding=4), 9)
    rng = np.random.default_rng(0)
    seqs = [rng.integers(4, 9, size=int(rng.integers(1, 6))) for _ in range(5)]
    # the paths a GPU takes (no compiled CPU loop: it reads the mask on the host)
    with use_fused("fused"), use_native(False):
        eager = event_surprises(lm, seqs, batch_size=2, window=window)
    monkeypatch.setattr(deferred_module, "waits", lambda tensor: True)  # as on a GPU
    with use_fused("fused"), use_native(False), HostReads(lm) as counted:
        got = event_surprises(lm, seqs, batch_size=2, window=window)
    # whole sessions: 3 batches of 2; windows: 8 × 2 = 16 rows a call, 1 row per event
    # and end (the sessions' n + 1 rows: 5 sessions)
    calls = 3 if window is None else -(-sum(len(s) + 1 for s in seqs) // 16)
    assert sum(counted.sites.values()) == calls, dict(counted.sites)
    assert all(site.startswith("deferred.py:") for site in counted.sites), dict(counted.sites)
    for (s, r), (s0, r0) in zip(got, eager, strict=True):
        np.testing.assert_array_equal(s, s0)
        np.testing.assert_array_equal(r, r0)
