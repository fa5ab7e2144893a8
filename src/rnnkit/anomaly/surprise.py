"""How surprising each event of a session is: surprise ``−ln p(e_t | e_<t)`` and rank of
every event (and of the session's end) under the recurrent model (:func:`event_surprises`,
whole sessions or a history window) and under the n-gram baseline (:func:`ngram_surprises`)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from rnnkit.anomaly.scores import surprise_and_rank
from rnnkit.bptt.mask_facts import move_mask
from rnnkit.data.batching import lm_pairs, pad_sequences, to_device
from rnnkit.data.vocab import BOS_ID, EOS_ID
from rnnkit.deferred import deferring
from rnnkit.models.language_model import LanguageModel
from rnnkit.models.ngram import NGramModel

__all__ = ["RANK_CELLS", "SCORE_CHUNK", "event_surprises", "ngram_surprises", "surprise_loss"]


#: Steps per forward call when scoring: bounds memory whatever a session's length.
SCORE_CHUNK = 512


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
        # the inputs moved before the forward (a move after it waits for it), the
        # figures read once a call with the model's checks (on a GPU each read waits)
        inputs = to_device(torch.from_numpy(xs[lo:hi]), device)
        targets = to_device(torch.from_numpy(ys[lo:hi]), device)
        mask = move_mask(torch.from_numpy(mask_all[lo:hi]), device)  # its host copy kept
        with deferring() as deferred:
            logits = model(inputs, mask=mask).logits[:, -1].float()  # (rows, V)
            s, r = surprise_and_rank(torch.log_softmax(logits, -1), targets)
            s_host, r_host = deferred.fetch(s.double(), r)
        surprise[lo:hi] = s_host.numpy()
        rank[lo:hi] = r_host.numpy()
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
        inputs, targets = to_device(inputs, device), to_device(targets, device)
        mask = move_mask(mask, device)  # its host copy kept: the stack reads it there
        state = None
        surprise_parts, rank_parts = [], []
        # every chunk's figures, and the model's checks, read once a batch (on a GPU each
        # read waits for the device)
        with deferring() as deferred:
            for lo in range(0, inputs.shape[1], SCORE_CHUNK):
                hi = lo + SCORE_CHUNK
                res = model(inputs[:, lo:hi], mask=mask[:, lo:hi], state=state)
                state = res.state
                log_probs = torch.log_softmax(res.logits.float(), dim=-1)  # (B, t, V)
                s, r = surprise_and_rank(log_probs, targets[:, lo:hi])
                surprise_parts.append(s.double())
                rank_parts.append(r)
            s_all, r_all = deferred.fetch(torch.cat(surprise_parts, 1), torch.cat(rank_parts, 1))
        surprise, rank = s_all.numpy(), r_all.numpy()
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
        V = ngram.vocab_size
        assert V is not None  # a fitted n-gram (its logprobs above) knows its vocabulary
        contexts, which = _distinct_rows(windows, V)
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


def surprise_loss(per_event: Sequence[tuple[np.ndarray, np.ndarray]]) -> dict[str, Any]:
    """``loss_nats`` (mean surprise in nats per event, session ends included), ``tokens``
    and ``perplexity`` of per-event surprises.

    >>> surprise_loss([(np.array([1.0, 2.0]), np.zeros(2)), (np.array([3.0]), np.zeros(1))])
    {'loss_nats': 2.0, 'tokens': 3, 'perplexity': 7.38905609893065}
    """
    nats = float(sum(s.sum() for s, _ in per_event))
    tokens = sum(len(s) for s, _ in per_event)
    loss = nats / max(tokens, 1)
    return {"loss_nats": loss, "tokens": tokens, "perplexity": math.exp(min(loss, 700))}
