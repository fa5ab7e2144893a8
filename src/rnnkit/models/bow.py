"""The bag-of-n-grams classifier: tf-idf features of a text's unigrams and bigrams and a
multinomial logistic regression, the classify task's baseline for what word order and
recurrence buy.

Features. A text is a sequence of token ids ``x_1 … x_n`` (the classifier's own
vocabulary and ``--max-len`` cut, so both models read the same tokens); its n-grams are
the unigrams ``x_t`` and the bigrams ``x_t x_{t+1}``. Only n-grams of the training texts
are features (at most :data:`MAX_FEATURES`, those in the most texts). For a text ``x`` and
a feature ``f`` with count ``c_f(x) > 0`` in it::

    tf(f, x) = 1 + ln c_f(x)                          (sublinear term frequency)
    idf(f)   = ln((1 + N) / (1 + df(f))) + 1          (N training texts, df: texts with f)
    φ(x)     = v / ‖v‖₂,   v_f = tf(f, x) · idf(f)

which is scikit-learn's ``TfidfVectorizer(sublinear_tf=True)`` over the same n-grams.

Model and fit. ``p(k | x) = softmax(W φ(x) + b)_k`` with ``W (K, F)``, ``b (K,)``,
minimising the multinomial objective

    C · Σ_i −ln p(y_i | x_i) + ½ ‖W‖²_F               (the bias is not penalised)

which is scikit-learn's ``LogisticRegression(C)`` for three classes or more, while for two
scikit-learn fits one binary vector ``w = W_1 − W_0``, whose penalty ``½‖w‖²`` is twice
the ``¼‖w‖²`` the two rows ``±w/2`` pay here, so the same model is
``LogisticRegression(C=2C)`` (``C=20`` for the baseline's :data:`BOW_C`). It is fitted
by L-BFGS in float64 on a sparse ``(N, F)`` feature matrix (the objective is convex: the
answer does not depend on the start or the seed).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from rnnkit.errors import CheckpointError, ConfigError
from rnnkit.messages import quiet_in_module

__all__ = ["BOW_C", "MAX_FEATURES", "BagOfNgrams", "fit_logistic"]

MAX_FEATURES = 200_000  # n-grams kept as features (those in the most training texts)
BOW_C = 10.0  # inverse regularisation strength C of the fit


def _ngram_keys(ids: np.ndarray, base: int) -> np.ndarray:
    """Integer keys of the unigrams and bigrams of one text: ``a·base`` for the unigram
    ``a`` and ``a·base + b + 1`` for the bigram ``a b`` (``base`` = vocabulary size + 1).

    >>> _ngram_keys(np.array([2, 3]), 10).tolist()
    [20, 30, 24]
    """
    ids = np.asarray(ids, dtype=np.int64)
    return np.concatenate([ids * base, ids[:-1] * base + ids[1:] + 1])


class BagOfNgrams:
    """Tf-idf unigram + bigram features and a multinomial logistic regression.

    Args:
        vocab_size: ids are ``0 … vocab_size − 1``.
        num_classes: ``K``.
        C: inverse regularisation strength (scikit-learn's ``C`` for three classes or
            more; for two, scikit-learn's binary fit with ``2C`` is the same model).

    >>> texts = [np.array([4, 5]), np.array([5, 4]), np.array([4, 4])]
    >>> bow = BagOfNgrams(vocab_size=6, num_classes=2).fit(texts, np.array([0, 1, 0]))
    >>> bow.predict(texts).tolist()
    [0, 1, 0]
    """

    def __init__(self, vocab_size: int, num_classes: int, C: float = BOW_C) -> None:
        if vocab_size < 1 or num_classes < 1 or not C > 0:
            raise ConfigError(
                f"BagOfNgrams needs vocab_size, num_classes ≥ 1 and C > 0, got "
                f"{vocab_size}, {num_classes}, {C}"
            )
        self.vocab_size, self.num_classes, self.C = vocab_size, num_classes, float(C)
        self.keys = np.zeros(0, dtype=np.int64)  # (F,) sorted feature keys
        self.idf = np.zeros(0, dtype=np.float64)  # (F,)
        self.weight = np.zeros((num_classes, 0), dtype=np.float64)  # (K, F)
        self.bias = np.zeros(num_classes, dtype=np.float64)  # (K,)

    @property
    def base(self) -> int:
        return self.vocab_size + 1

    @property
    def num_features(self) -> int:
        return len(self.keys)

    # -- features --------------------------------------------------------------------------

    def _fit_features(self, texts: Sequence[np.ndarray]) -> None:
        per_text = [np.unique(_ngram_keys(t, self.base)) for t in texts]
        every = np.concatenate(per_text) if per_text else np.zeros(0, np.int64)
        keys, df = np.unique(every, return_counts=True)
        if len(keys) > MAX_FEATURES:
            # The n-grams in the most texts; ties by key, so the choice is deterministic.
            keep = np.sort(np.lexsort((keys, -df))[:MAX_FEATURES])
            keys, df = keys[keep], df[keep]
        self.keys = keys
        n = len(texts)
        self.idf = np.log((1.0 + n) / (1.0 + df)) + 1.0

    def features(self, texts: Sequence[np.ndarray]) -> Tensor:
        """``φ`` of every text as a sparse ``(N, F)`` float64 COO tensor (rows L2-normed;
        a text with no known n-gram is a zero row)."""
        rows, cols, vals = [], [], []
        F = len(self.keys)
        for i, text in enumerate(texts):
            found, counts = np.unique(_ngram_keys(text, self.base), return_counts=True)
            if F == 0 or len(found) == 0:
                continue
            idx = np.minimum(np.searchsorted(self.keys, found), F - 1)
            known = self.keys[idx] == found
            idx, counts = idx[known], counts[known]
            v = (1.0 + np.log(counts)) * self.idf[idx]
            norm = float(np.sqrt((v * v).sum()))
            if norm > 0:
                rows.append(np.full(len(idx), i))
                cols.append(idx)
                vals.append(v / norm)
        if rows:
            index = np.stack([np.concatenate(rows), np.concatenate(cols)])
            values = np.concatenate(vals)
        else:
            index, values = np.zeros((2, 0), dtype=np.int64), np.zeros(0)
        # The invariants checked, said in the block form: torch 2.11 warns about checks
        # "implicitly disabled" even when the constructor is asked to check
        with torch.sparse.check_sparse_tensor_invariants(enable=True):
            X = torch.sparse_coo_tensor(
                torch.from_numpy(index), torch.from_numpy(values), (len(texts), F)
            )
            return X.coalesce()

    # -- fit and predict -------------------------------------------------------------------

    def fit(
        self, texts: Sequence[np.ndarray], labels: np.ndarray, max_iter: int = 500
    ) -> BagOfNgrams:
        """Build the features from ``texts`` and fit ``W``, ``b`` to ``labels (N,)`` (class
        ids ``0 … K − 1``)."""
        labels = np.asarray(labels, dtype=np.int64)
        if len(texts) != len(labels) or len(texts) == 0:
            raise ConfigError(f"BagOfNgrams.fit: {len(texts)} texts and {len(labels)} labels")
        self._fit_features(texts)
        X = self.features(texts)
        self.weight, self.bias = fit_logistic(X, labels, self.num_classes, self.C, max_iter)
        return self

    def probabilities(self, texts: Sequence[np.ndarray]) -> np.ndarray:
        """``p(k | x)`` of every text, ``(N, K)`` float64."""
        X = self.features(texts)
        W = torch.from_numpy(self.weight)
        logits = torch.sparse.mm(X, W.T) + torch.from_numpy(self.bias)  # (N, K)
        return torch.softmax(logits, dim=-1).numpy()

    def predict(self, texts: Sequence[np.ndarray]) -> np.ndarray:
        """The most probable class of every text, ``(N,)`` int64."""
        if len(texts) == 0:
            return np.zeros(0, dtype=np.int64)
        return self.probabilities(texts).argmax(-1)

    # -- state -----------------------------------------------------------------------------

    def to_state(self, prefix: str = "bow/") -> dict[str, np.ndarray]:
        """Every array, safetensors-ready (no pickling)."""
        return {
            f"{prefix}config": np.array([self.vocab_size, self.num_classes], dtype=np.int64),
            f"{prefix}C": np.array([self.C], dtype=np.float64),
            f"{prefix}keys": self.keys,
            f"{prefix}idf": self.idf,
            f"{prefix}weight": np.ascontiguousarray(self.weight),
            f"{prefix}bias": self.bias,
        }

    @classmethod
    def from_state(
        cls, state: dict[str, np.ndarray], prefix: str = "bow/", where: str | None = None
    ) -> BagOfNgrams:
        """Rebuild from :meth:`to_state`; shapes and values are checked (``where``: the
        file, for the error)."""
        at = f"{where}: " if where else ""
        try:
            V, K = (int(v) for v in np.asarray(state[f"{prefix}config"]).tolist())
            model = cls(V, K, float(np.asarray(state[f"{prefix}C"])[0]))
            keys = np.asarray(state[f"{prefix}keys"], dtype=np.int64)
            idf = np.asarray(state[f"{prefix}idf"], dtype=np.float64)
            weight = np.asarray(state[f"{prefix}weight"], dtype=np.float64)
            bias = np.asarray(state[f"{prefix}bias"], dtype=np.float64)
        except (KeyError, ValueError, TypeError, IndexError, ConfigError) as exc:
            raise CheckpointError(f"{at}invalid bag-of-n-grams state: {exc}") from None
        F = len(keys)
        ok = (
            keys.ndim == 1
            and idf.shape == (F,)
            and weight.shape == (K, F)
            and bias.shape == (K,)
            and bool(np.all(keys[1:] > keys[:-1]))
            and bool(np.all((keys >= 0) & (keys < (V + 1) * (V + 1))))
            and all(bool(np.isfinite(a).all()) for a in (idf, weight, bias))
            # idf = ln((1 + N) / (1 + df)) + 1 is in [1, 1 + ln(1 + N)]: 64 is beyond any
            # corpus; a weight of 1e6 is far beyond what the L2 penalty leaves. Larger
            # values are a damaged file (they overflowed to inf and NaN probabilities).
            and bool(np.all((idf >= 1.0 - 1e-9) & (idf <= 64.0)))
            and bool(np.all(np.abs(weight) <= 1e6))
            and bool(np.all(np.abs(bias) <= 1e6))
        )
        if not ok:
            raise CheckpointError(f"{at}invalid bag-of-n-grams state (shapes or values)")
        model.keys, model.idf, model.weight, model.bias = keys, idf, weight, bias
        return model


def _row_major(X: Tensor) -> tuple[Tensor, Tensor]:
    """``X`` and ``Xᵀ`` in the form the fit multiplies fastest: compressed sparse rows for
    a sparse ``X`` (about ten times faster than COO in ``torch.sparse.mm`` here, forward
    and transposed), the dense matrix and its transpose otherwise."""
    if X.layout == torch.strided:
        return X, X.T
    # torch says once per process that CSR support is "in beta"; the two products used
    # here are long-standing, and the note would reach users as if their program had asked
    # for CSR, so it is not passed on.
    quiet_in_module(".*[Ss]parse CSR tensor support", __name__)
    X = X.to_sparse_coo().coalesce()  # a CSR (or other sparse) input too
    return X.to_sparse_csr(), X.t().coalesce().to_sparse_csr()


def _logistic_objective(
    X: Tensor, XT: Tensor, y: Tensor, W: Tensor, b: Tensor, penalty: float
) -> tuple[Tensor, Tensor, Tensor]:
    """The fit's objective and its gradient, in closed form.

    With ``z_i = W x_i + b`` and ``p_i = softmax(z_i)``::

        L  = (1/N) Σ_i (logsumexp z_i − z_{i,y_i}) + penalty · ‖W‖²_F
        G  = (P − Y) / N                                  (N, K), Y one-hot
        ∂L/∂W = Gᵀ X + 2 · penalty · W,   ∂L/∂b = Σ_i G_i

    ``Gᵀ X`` is computed as ``(Xᵀ G)ᵀ`` from ``XT`` (``Xᵀ``, stored once), so that
    neither product multiplies a sparse matrix from the right (autograd's backward of
    ``torch.sparse.mm`` did, and took ~70 % of the fit's time).

    Args:
        X: ``(N, F)`` features; XT: ``(F, N)``, its transpose (both from
            :func:`_row_major`).
        y: ``(N,)`` class ids. W: ``(K, F)``. b: ``(K,)``.
        penalty: the weight of ``‖W‖²_F``.

    Returns:
        ``L`` (a 0-d tensor), ``∂L/∂W (K, F)`` and ``∂L/∂b (K,)``.
    """
    N = X.shape[0]
    z = X @ W.T + b  # (N, K)
    log_p = torch.log_softmax(z, dim=1)
    loss = -log_p.gather(1, y[:, None]).mean() + penalty * (W * W).sum()
    G = log_p.exp()
    G[torch.arange(N), y] -= 1.0
    G /= N
    grad_W = (XT @ G).T + (2.0 * penalty) * W
    return loss, grad_W.contiguous(), G.sum(0)


def fit_logistic(
    X: Tensor, labels: np.ndarray, num_classes: int, C: float, max_iter: int = 500
) -> tuple[np.ndarray, np.ndarray]:
    """L2-regularised multinomial logistic regression by L-BFGS (float64).

    Minimises ``Σ_i −ln softmax(W x_i + b)_{y_i} + ‖W‖²_F / (2C)``, divided by ``N`` so
    that the tolerances do not depend on the data's size (the same minimiser), with the
    gradient in closed form (``_logistic_objective``).

    Args:
        X: ``(N, F)`` features, sparse (COO or CSR) or dense, float64.
        labels: ``(N,)`` class ids.
        num_classes: ``K``.
        C: inverse regularisation strength.

    Returns:
        ``W (K, F)`` and ``b (K,)`` as numpy arrays.

    >>> X = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    >>> W, b = fit_logistic(X, np.array([0, 1]), 2, C=1.0)
    >>> bool(W[0, 0] > W[1, 0]) and bool(W[1, 1] > W[0, 1])
    True
    """
    N, F = X.shape
    y = torch.from_numpy(np.asarray(labels, dtype=np.int64))
    X, XT = _row_major(X)
    W = torch.zeros(num_classes, F, dtype=torch.float64, requires_grad=True)
    b = torch.zeros(num_classes, dtype=torch.float64, requires_grad=True)
    penalty = 1.0 / (2.0 * C * N)

    optimizer = torch.optim.LBFGS(
        [W, b],
        lr=1.0,
        max_iter=max_iter,
        tolerance_grad=1e-9,
        tolerance_change=1e-14,
        history_size=20,
        line_search_fn="strong_wolfe",
    )

    def closure() -> Tensor:
        # L-BFGS reads the loss and the parameters' .grad: both set here, no graph built
        with torch.no_grad():
            loss, W.grad, b.grad = _logistic_objective(X, XT, y, W, b, penalty)
        return loss

    optimizer.step(closure)
    return W.detach().numpy().copy(), b.detach().numpy().copy()
