"""The n-gram baseline: interpolated Kneser-Ney over integer token ids.

What the recurrence buys is measured against this model. It is plain interpolated
Kneser-Ney (Chen & Goodman 1998, §3.5; one absolute discount ``D`` for every order, not the
three discounts of *modified* KN), interpolated at the bottom with the uniform distribution
over the ``V`` ids, so every id, seen or not, gets non-zero mass:

    P_1(w)   = (max(c_1(w) - D, 0) + D · N_1 / V) / T_1
    P_k(w|h) = (max(c_k(h w) - D, 0) + D · N_k(h) · P_{k-1}(w|h')) / T_k(h)   if T_k(h) > 0
             = P_{k-1}(w|h')                                                   otherwise

``h`` is the last ``k-1`` tokens, ``h'`` drops its oldest; ``T_k(h) = Σ_w c_k(h w)`` and
``N_k(h)`` is the number of ``w`` with ``c_k(h w) > 0``. The top order ``n`` counts raw
occurrences; lower orders count continuation types ``N1+(• h w)`` (how many distinct tokens
precede ``h w``), except n-grams that begin at the start padding, which have no left
context and keep raw counts (as KenLM does for ``<s>``). Each sequence is left-padded with
a virtual start symbol that is conditioned on but never predicted, so the sum over the
``V`` ids is exactly 1 for every context.

Counting is numpy only: the k-gram ending at each position gets an integer id from a
sort of ``(first token, id of its (k-1)-gram suffix)``, so no Python object is made per
n-gram; queries look ids up with ``np.searchsorted`` and are vectorized too. A fit holds
about 55 bytes per token at its peak (order 5 on text), whatever the order: one order's
ids are dropped once the next order's are made.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from rnnkit.errors import CheckpointError, ConfigError, DataError

__all__ = ["NGramModel", "count_table_size"]

#: The highest order: each order adds a pass and a count table over every position, and
#: past 10 tokens of context almost every n-gram of real data is seen once.
MAX_ORDER = 10

_START = 0  # the virtual start symbol; real id i is stored as i + 1


def count_table_size(num_symbols: int, length: int) -> int:
    """Entries of a full count table over all sequences of ``length`` symbols: ``k ** n``
    (the table grows exponentially with length, a network's parameters do not).

    >>> count_table_size(10, 5)
    100000
    """
    return num_symbols**length


def _lookup(keys: np.ndarray, query: np.ndarray) -> np.ndarray:
    """Index of each query in the sorted ``keys``, -1 where absent (queries < 0 are absent)."""
    idx = np.minimum(np.searchsorted(keys, query), len(keys) - 1)
    return np.where(keys[idx] == query, idx, -1)


def _unique_inverse(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(key, return_inverse=True)`` with the inverse in int32 where the ids fit,
    and about half numpy's temporary memory (one sort permutation, one sorted copy)."""
    if key.size == 0:
        return key.copy(), np.zeros(0, np.int32)
    perm = np.argsort(key)
    ordered = key[perm]
    starts = np.empty(len(ordered), dtype=bool)
    starts[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=starts[1:])
    uniq = ordered[starts]
    del ordered
    dtype = np.int32 if len(uniq) < 2**31 else np.int64
    rank = np.cumsum(starts, dtype=dtype)
    rank -= 1
    inverse = np.empty(len(key), dtype=dtype)
    inverse[perm] = rank
    return uniq, inverse


def _valid_counts(
    keys: list[np.ndarray],
    counts: list[np.ndarray],
    ctx_total: list[np.ndarray],
    ctx_types: list[np.ndarray],
    total: float,
    types: float,
) -> bool:
    """What a fit always gives: sorted unique keys, one count ≥ 0 each, context totals and
    types ≥ 0 and finite, a positive unigram total."""
    if not (math.isfinite(total) and total > 0 and math.isfinite(types) and types >= 0):
        return False
    for k in range(1, len(keys)):
        if keys[k].ndim != 1 or keys[k].shape != counts[k].shape:
            return False
        if bool(np.any(keys[k][1:] <= keys[k][:-1])) or bool(np.any(counts[k] < 0)):
            return False
    for total_k, types_k in zip(ctx_total[2:], ctx_types[2:], strict=True):
        if not (bool(np.isfinite(total_k).all()) and bool(np.all(total_k >= 0))):
            return False
        if bool(np.any(types_k < 0)):
            return False
    return True


class NGramModel:
    """Interpolated Kneser-Ney n-gram model over ids ``0 .. V-1`` (see the module docstring).

    Args:
        order: ``n``, the model conditions on the previous ``n - 1`` tokens.
        discount: the absolute discount ``D`` in ``(0, 1]``.
        vocab_size: ``V``; by default the largest id seen by the last :meth:`fit` plus one.

    Data passed to :meth:`fit` and :meth:`evaluate` is either one stream (a 1-D integer
    array or tensor) or a list of sequences (each a 1-D array or list of ids). Each
    sequence (or the stream) is scored from the start context, so in sequence mode the
    model's own start padding plays ``<s>``: pass ``w + [</s>]`` and leave ``<s>`` out.

    >>> lm = NGramModel(order=2, discount=0.5, vocab_size=4).fit(np.array([0, 1, 0, 1, 2]))
    >>> round(math.exp(lm.logprob([0], 1)), 7)  # (2 - 0.5 + 0.5 * 1 * P_1(1)) / 2
    0.8046875
    >>> round(float(lm.distribution([2]).sum()), 12)
    1.0
    """

    def __init__(
        self, order: int = 3, discount: float = 0.75, vocab_size: int | None = None
    ) -> None:
        if (
            isinstance(order, bool)
            or not isinstance(order, (int, np.integer))
            or not 1 <= order <= MAX_ORDER
        ):
            raise ConfigError(f"order must be an integer from 1 to {MAX_ORDER}, got {order!r}")
        if not 0.0 < float(discount) <= 1.0:
            raise ConfigError(f"discount must be in (0, 1], got {discount!r}")
        if vocab_size is not None and (
            isinstance(vocab_size, bool)
            or not isinstance(vocab_size, (int, np.integer))
            or vocab_size < 1
        ):
            raise ConfigError(f"vocab_size must be a positive integer, got {vocab_size!r}")
        self.order = int(order)
        self.discount = float(discount)
        self.vocab_size = None if vocab_size is None else int(vocab_size)
        self._infer_vocab_size = vocab_size is None  # re-inferred by every fit
        self._fitted = False

    # ---- data ----------------------------------------------------------------------------

    @staticmethod
    def _sequences(data: Any) -> list[np.ndarray]:
        if hasattr(data, "detach"):  # a torch tensor, without importing torch here
            data = data.detach().cpu().numpy()
        if isinstance(data, np.ndarray):
            if data.ndim != 1:
                raise DataError(
                    f"a token stream must be 1-D, got shape {data.shape} "
                    "(pass a list of 1-D arrays for separate sequences)"
                )
            seqs = [data]
        elif isinstance(data, (list, tuple)):
            seqs = []
            for i, s in enumerate(data):
                if hasattr(s, "detach"):
                    s = s.detach().cpu().numpy()
                arr = np.asarray(s)
                if arr.ndim != 1:
                    raise DataError(
                        f"sequence {i} must be 1-D, got shape {arr.shape} "
                        "(pass a numpy array for one stream, a list of arrays for sequences)"
                    )
                seqs.append(arr)
        else:
            raise DataError(f"expected a 1-D id array or a list of them, got {type(data).__name__}")
        for i, arr in enumerate(seqs):
            if arr.size and arr.dtype.kind not in "iu":
                raise DataError(f"sequence {i} must hold integer ids, got dtype {arr.dtype}")
            if arr.size and arr.min() < 0:
                raise DataError(f"sequence {i} holds a negative id ({int(arr.min())})")
        return seqs

    def _padded(self, seqs: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """All sequences, each after ``n`` start symbols, shifted to ``id + 1``; and the
        positions of the real tokens. ``n`` (not ``n - 1``) start symbols keep every gram
        ending at the last start position inside its own sequence's padding."""
        n = self.order
        pad = np.full(n, _START, dtype=np.int64)
        parts = []
        for s in seqs:
            if s.size:
                parts += [pad, s.astype(np.int64) + 1]
        if not parts:
            raise DataError("no tokens: every sequence is empty")
        P = np.concatenate(parts)
        return P, np.flatnonzero(P != _START)

    # ---- fitting -------------------------------------------------------------------------

    def fit(self, data: Any) -> NGramModel:
        """Count n-grams of ``data`` (replacing any previous fit).

        Args:
            data: one 1-D id stream, or a list of 1-D id sequences.

        Returns:
            ``self``.

        >>> NGramModel(order=3).fit([[1, 2, 3], [1, 2]]).vocab_size
        4
        """
        seqs = self._sequences(data)
        P, R = self._padded(seqs)
        top = int(P.max()) - 1
        if self._infer_vocab_size or self.vocab_size is None:  # None: inferred
            self.vocab_size = top + 1
        elif top >= self.vocab_size:
            raise DataError(f"token id {top} out of range for vocab_size {self.vocab_size}")
        n, V = self.order, self.vocab_size
        # Grams are needed ending at real positions and at the last start symbol before
        # each sequence (the context of its first token); every other start position
        # ends a gram of start symbols only, which nothing counts.
        real = P != _START
        E = np.flatnonzero(real | np.append(real[1:], False))
        del real

        # Level by level, only two position-sized id arrays are alive at once (the
        # grams of order k - 1 and k), so memory stays a few dozen bytes per token.
        keys: list[np.ndarray] = [np.zeros(0, np.int64)]  # keys[k]: sorted k-gram keys
        raw: list[np.ndarray] = [np.zeros(0, np.int64)]  # raw[k][g]: occurrences of gram g
        prefix: list[np.ndarray] = [np.zeros(0, np.int64)] * 2  # prefix[k][g]: g's context
        previous = np.zeros(0, np.int32)
        for k in range(1, n + 1):
            if k == 1:
                key = P[E]
            else:
                M = len(keys[k - 1])
                if (V + 1) * M >= 2**62:
                    raise DataError(f"too many distinct {k - 1}-grams ({M}) to index")
                key = P[E - (k - 1)]
                key *= M
                key += previous[E]
            uniq, inverse = _unique_inverse(key)
            del key
            current = np.full(len(P), -1, dtype=inverse.dtype)
            current[E] = inverse
            del inverse
            gram = current[R]
            keys.append(uniq)
            raw.append(np.bincount(gram, minlength=len(uniq)))
            if k >= 2:
                # The (k-1)-gram before each k-gram: every occurrence of a gram has the
                # same one, so scattering them all leaves the right one.
                ctx = np.zeros(len(uniq), dtype=previous.dtype)
                ctx[gram] = previous[R - 1]
                prefix.append(ctx)
            previous = current
            del gram, current
        del previous

        counts: list[np.ndarray] = [np.zeros(0, np.int64)]
        ctx_total: list[np.ndarray] = [np.zeros(0), np.zeros(0)]
        ctx_types: list[np.ndarray] = [np.zeros(0, np.int64), np.zeros(0, np.int64)]
        for k in range(1, n + 1):
            Mk = len(keys[k])
            c = raw[k]
            if k < n:
                # Continuation count: distinct left extensions (k+1)-grams per k-gram,
                # read off the (k+1)-gram keys (first token, k-gram suffix). The one
                # extension that ends at a start symbol extends the all-start gram,
                # which keeps its raw count below.
                types = np.bincount(keys[k + 1] % Mk, minlength=Mk)
                first_token = keys[k] if k == 1 else keys[k] // len(keys[k - 1])
                c = np.where(first_token == _START, c, types)
            counts.append(c)
            if k >= 2:
                seen = np.flatnonzero(raw[k])
                ctx = prefix[k][seen]
                Mc = len(keys[k - 1])
                ctx_total.append(np.bincount(ctx, weights=c[seen], minlength=Mc))
                ctx_types.append(np.bincount(ctx, minlength=Mc))
        self._keys, self._counts = keys, counts
        self._ctx_total, self._ctx_types = ctx_total, ctx_types
        self._unigram_total = float(counts[1].sum())
        self._unigram_types = int(np.count_nonzero(counts[1]))
        self._fitted = True
        return self

    # ---- queries -------------------------------------------------------------------------

    def _check_fitted(self) -> int:
        """``V`` of the fitted model (given, or set by the fit)."""
        if not self._fitted or self.vocab_size is None:
            raise ConfigError("NGramModel is not fitted: call fit() first")
        return self.vocab_size

    def _probs(self, windows: np.ndarray) -> np.ndarray:
        """P(last column | the ``n - 1`` before it) for each row of shifted ids ``(m, n)``."""
        n, D, V = self.order, self.discount, self._check_fitted()
        keys, counts = self._keys, self._counts
        gram = _lookup(keys[1], windows[:, -1])
        c = np.where(gram >= 0, counts[1][gram], 0)
        p = (np.maximum(c - D, 0.0) + D * self._unigram_types / V) / self._unigram_total
        ctx = np.full(len(windows), -1, dtype=np.int64)
        for k in range(2, n + 1):
            token = windows[:, n - k]  # the token that order k adds on the left
            if k == 2:
                ctx = _lookup(keys[1], token)
            else:
                ctx = _lookup(keys[k - 1], np.where(ctx >= 0, token * len(keys[k - 2]) + ctx, -1))
            gram = _lookup(keys[k], np.where(gram >= 0, token * len(keys[k - 1]) + gram, -1))
            total = np.where(ctx >= 0, self._ctx_total[k][ctx], 0.0)
            types = np.where(ctx >= 0, self._ctx_types[k][ctx], 0)
            c = np.where(gram >= 0, counts[k][gram], 0)
            seen = total > 0
            mixed = (np.maximum(c - D, 0.0) + D * types * p) / np.where(seen, total, 1.0)
            p = np.where(seen, mixed, p)
        return p

    def _windows(self, context: Sequence[int], tokens: np.ndarray) -> np.ndarray:
        V = self._check_fitted()
        history = [int(t) for t in context][-(self.order - 1) :] if self.order > 1 else []
        for t in history:
            if not 0 <= t < V:
                raise DataError(f"context id {t} out of range for vocab_size {V}")
        row = np.full(self.order, _START, dtype=np.int64)
        if history:
            row[-1 - len(history) : -1] = np.asarray(history) + 1
        windows = np.tile(row, (len(tokens), 1))
        windows[:, -1] = tokens + 1
        return windows

    def distribution(self, context: Sequence[int]) -> np.ndarray:
        """Probabilities of every id after ``context``.

        Args:
            context: the preceding ids; only the last ``n - 1`` matter, and a shorter
                context is the start of a sequence.

        Returns:
            ``(V,)`` float64, summing to 1.

        >>> lm = NGramModel(order=2).fit(np.array([0, 1, 1]))
        >>> lm.distribution([1]).round(3).tolist()
        [0.25, 0.75]
        """
        V = self._check_fitted()
        return self._probs(self._windows(context, np.arange(V)))

    def distributions(self, contexts: np.ndarray) -> np.ndarray:
        """Probabilities of every id after each of many contexts, in one vectorised pass.

        Args:
            contexts: ``(C, n - 1)`` integer ids, the most recent last; ``-1`` where the
                context reaches back before the sequence's start (only on the left).

        Returns:
            ``(C, V)`` float64; row ``c`` equals :meth:`distribution` of row ``c``'s ids
            that are ``>= 0``.

        >>> lm = NGramModel(order=2).fit(np.array([0, 1, 1]))
        >>> lm.distributions(np.array([[1], [-1]])).round(3).tolist()
        [[0.25, 0.75], [0.5, 0.5]]
        """
        n, V = self.order, self._check_fitted()
        ctx = np.asarray(contexts, dtype=np.int64)
        if ctx.ndim != 2 or ctx.shape[1] != n - 1:
            raise DataError(f"contexts must have shape (C, {n - 1}), got {tuple(ctx.shape)}")
        if ctx.size and (int(ctx.max()) >= V or int(ctx.min()) < -1):
            bad = int(ctx.max()) if int(ctx.max()) >= V else int(ctx.min())
            raise DataError(f"context id {bad} out of range for vocab_size {V}")
        out = np.empty((len(ctx), V))
        rows = max(1, (1 << 18) // max(V, 1))  # bound the (rows, V, n) temporaries
        for lo in range(0, len(ctx), rows):
            part = ctx[lo : lo + rows] + 1  # -1 becomes the start symbol, id i is i + 1
            windows = np.empty((len(part), V, n), dtype=np.int64)
            windows[:, :, :-1] = part[:, None, :]
            windows[:, :, -1] = np.arange(1, V + 1)
            out[lo : lo + rows] = self._probs(windows.reshape(-1, n)).reshape(len(part), V)
        return out

    def logprob(self, context: Sequence[int], token: int) -> float:
        """Natural log of ``P(token | context)`` (see :meth:`distribution` for ``context``).

        >>> lm = NGramModel(order=2, discount=0.5, vocab_size=3).fit(np.array([0, 1]))
        >>> round(lm.logprob([0], 1), 4)  # ln((1 - 0.5 + 0.5 * P_1(1)) / 1), P_1(1) = 5/12
        -0.3448
        """
        V = self._check_fitted()
        if not 0 <= int(token) < V:
            raise DataError(f"token id {token} out of range for vocab_size {V}")
        p = self._probs(self._windows(context, np.array([int(token)])))
        return math.log(float(p[0]))

    def logprobs(self, data: Any) -> np.ndarray:
        """Log probability (nats) of every token of ``data``, each sequence scored from the
        start context.

        Args:
            data: one 1-D id stream, or a list of 1-D id sequences.

        Returns:
            ``(N,)`` float64, the tokens of all sequences in order.
        """
        V = self._check_fitted()
        seqs = self._sequences(data)
        P, R = self._padded(seqs)
        if int(P.max()) > V:
            raise DataError(f"token id {int(P.max()) - 1} out of range for vocab_size {V}")
        windows = np.lib.stride_tricks.sliding_window_view(P, self.order)  # (len - n + 1, n)
        out = np.empty(len(R))
        step = 1 << 18  # bound the temporaries of the vectorized lookups
        for lo in range(0, len(R), step):
            out[lo : lo + step] = np.log(self._probs(windows[R[lo : lo + step] - self.order + 1]))
        return out

    def evaluate(self, data: Any) -> float:
        """Mean negative log probability per token, in nats.

        >>> lm = NGramModel(order=2, discount=0.5, vocab_size=3).fit(np.array([0, 1]))
        >>> round(lm.evaluate(np.array([0, 1])), 4)
        0.3448
        """
        return float(-self.logprobs(data).mean())

    def perplexity(self, data: Any) -> float:
        """``exp`` of :meth:`evaluate`.

        >>> lm = NGramModel(order=1, discount=1.0, vocab_size=5).fit(np.array([0, 1, 2]))
        >>> round(lm.perplexity(np.array([4, 3])), 6)  # all mass is uniform: perplexity V
        5.0
        """
        return math.exp(self.evaluate(data))

    # ---- state ---------------------------------------------------------------------------

    def to_state(self) -> dict[str, np.ndarray]:
        """All counts as numpy arrays (safetensors-ready: no pickling, no Python objects).

        >>> lm = NGramModel(order=2).fit(np.array([0, 1, 1]))
        >>> NGramModel.from_state(lm.to_state()).distribution([1]).round(3).tolist()
        [0.25, 0.75]
        """
        self._check_fitted()
        state = {
            "config": np.array([self.order, self.vocab_size], dtype=np.int64),
            "discount": np.array([self.discount], dtype=np.float64),
            "unigram": np.array([self._unigram_total, self._unigram_types], dtype=np.float64),
        }
        for k in range(1, self.order + 1):
            state[f"keys_{k}"] = self._keys[k]
            state[f"counts_{k}"] = self._counts[k]
            if k >= 2:
                state[f"ctx_total_{k}"] = self._ctx_total[k]
                state[f"ctx_types_{k}"] = self._ctx_types[k]
        return state

    @classmethod
    def from_state(cls, state: dict[str, np.ndarray], where: str | None = None) -> NGramModel:
        """Rebuild a fitted model from :meth:`to_state` (``where``: the file, for errors)."""
        try:
            order, vocab_size = (int(v) for v in np.asarray(state["config"]).tolist())
            model = cls(order, float(np.asarray(state["discount"])[0]), vocab_size)
            total, types = np.asarray(state["unigram"]).tolist()
            keys: list[np.ndarray] = [np.zeros(0, np.int64)]
            counts: list[np.ndarray] = [np.zeros(0, np.int64)]
            ctx_total: list[np.ndarray] = [np.zeros(0), np.zeros(0)]
            ctx_types: list[np.ndarray] = [np.zeros(0, np.int64), np.zeros(0, np.int64)]
            for k in range(1, order + 1):
                keys.append(np.asarray(state[f"keys_{k}"], dtype=np.int64))
                counts.append(np.asarray(state[f"counts_{k}"], dtype=np.int64))
                if k >= 2:
                    ctx_total.append(np.asarray(state[f"ctx_total_{k}"], dtype=np.float64))
                    ctx_types.append(np.asarray(state[f"ctx_types_{k}"], dtype=np.int64))
        except (KeyError, ValueError, TypeError, IndexError) as exc:
            at = f"{where}: " if where else ""
            raise CheckpointError(f"{at}invalid n-gram state: {exc}") from None
        if not _valid_counts(keys, counts, ctx_total, ctx_types, float(total), float(types)):
            # Negative or non-finite counts (a damaged file) gave NaN probabilities.
            at = f"{where}: " if where else ""
            raise CheckpointError(f"{at}invalid n-gram state (counts or keys)")
        model._keys, model._counts = keys, counts
        model._ctx_total, model._ctx_types = ctx_total, ctx_types
        model._unigram_total, model._unigram_types = float(total), int(types)
        model._fitted = True
        return model
