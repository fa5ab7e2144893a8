"""The bag-of-n-grams baseline against scikit-learn: the same tf-idf features as
``TfidfVectorizer(sublinear_tf=True)`` over the same n-grams, and the same fit as
``LogisticRegression(C)`` (multinomial, L-BFGS) on a small generated problem, and for two
classes its binary fit at ``2C``."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from rnnkit.errors import CheckpointError
from rnnkit.models.bow import BOW_C, BagOfNgrams, _logistic_objective, _row_major, fit_logistic

sklearn = pytest.importorskip("sklearn")
from sklearn.feature_extraction.text import TfidfVectorizer  # noqa: E402
from sklearn.linear_model import LogisticRegression  # noqa: E402


def _problem(n: int = 120, V: int = 12, seed: int = 0) -> tuple[list[np.ndarray], np.ndarray]:
    """Texts over ids 4 … V−1; the class is which of three marker ids occurs most, with
    noise words, so no feature alone decides it and the fit must weigh them."""
    rng = np.random.default_rng(seed)
    texts, labels = [], []
    for _ in range(n):
        length = int(rng.integers(3, 12))
        ids = rng.integers(4, V, size=length)
        texts.append(ids)
        counts = [(ids == m).sum() for m in (4, 5, 6)]
        labels.append(int(np.argmax(counts)))
    return texts, np.array(labels)


def _names(ids: np.ndarray) -> list[str]:
    ids = [int(i) for i in ids]
    return [f"u{a}" for a in ids] + [f"b{a}_{b}" for a, b in itertools.pairwise(ids)]


def test_features_equal_sklearn_tfidf():
    texts, _ = _problem()
    bow = BagOfNgrams(vocab_size=12, num_classes=3)
    bow._fit_features(texts)
    ours = bow.features(texts).to_dense().numpy()
    vec = TfidfVectorizer(analyzer=_names, sublinear_tf=True, norm="l2", smooth_idf=True)
    theirs = vec.fit_transform(texts).toarray()
    # Same features, named: unigram key a·13, bigram key a·13 + b + 1.
    key_of = {}
    for name, col in vec.vocabulary_.items():
        if name[0] == "u":
            key_of[col] = int(name[1:]) * 13
        else:
            a, b = (int(v) for v in name[1:].split("_"))
            key_of[col] = a * 13 + b + 1
    assert sorted(key_of.values()) == bow.keys.tolist()
    order = [bow.keys.tolist().index(key_of[c]) for c in range(theirs.shape[1])]
    np.testing.assert_allclose(ours[:, order], theirs, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("C", [0.5, 10.0])
def test_fit_equals_sklearn_logistic_regression(C):
    texts, labels = _problem()
    bow = BagOfNgrams(vocab_size=12, num_classes=3, C=C).fit(texts, labels)
    X = bow.features(texts).to_dense().numpy()
    ref = LogisticRegression(C=C, solver="lbfgs", tol=1e-12, max_iter=10_000).fit(X, labels)
    np.testing.assert_allclose(bow.weight, ref.coef_, atol=2e-5)
    np.testing.assert_allclose(bow.bias, ref.intercept_, atol=2e-5)
    np.testing.assert_allclose(bow.probabilities(texts), ref.predict_proba(X), atol=1e-6)
    held, held_labels = _problem(60, seed=1)
    Xh = bow.features(held).to_dense().numpy()
    assert bow.predict(held).tolist() == ref.predict(Xh).tolist()
    accuracy = float((bow.predict(held) == held_labels).mean())
    assert accuracy == pytest.approx(float(ref.score(Xh, held_labels)))
    assert accuracy > 0.6  # it learned something (chance is about 0.33)


def test_two_classes_equal_sklearn_binary_fit_at_twice_c():
    """For two classes scikit-learn fits one vector ``w = W_1 − W_0`` with penalty
    ``½‖w‖²``, twice what the multinomial rows ``±w/2`` pay: the baseline's ``C = 10``
    is ``LogisticRegression(C=20)`` (and not ``C=10``)."""
    texts, labels = _problem()
    two = (labels > 0).astype(np.int64)  # marker 4 against the rest
    bow = BagOfNgrams(vocab_size=12, num_classes=2, C=BOW_C).fit(texts, two)
    X = bow.features(texts).to_dense().numpy()
    fit = dict(solver="lbfgs", tol=1e-12, max_iter=10_000)
    ref = LogisticRegression(C=2 * BOW_C, **fit).fit(X, two)
    np.testing.assert_allclose(bow.weight[1] - bow.weight[0], ref.coef_[0], atol=4e-5)
    np.testing.assert_allclose(bow.bias[1] - bow.bias[0], ref.intercept_[0], atol=4e-5)
    np.testing.assert_allclose(bow.probabilities(texts), ref.predict_proba(X), atol=1e-6)
    same_c = LogisticRegression(C=BOW_C, **fit).fit(X, two)
    assert np.abs(same_c.predict_proba(X) - ref.predict_proba(X)).max() > 1e-3


def test_fit_logistic_dense_coo_and_csr_agree():
    texts, labels = _problem(50)
    bow = BagOfNgrams(vocab_size=12, num_classes=3)
    bow._fit_features(texts)
    X = bow.features(texts)
    W1, b1 = fit_logistic(X, labels, 3, 1.0)
    W2, b2 = fit_logistic(X.to_dense(), labels, 3, 1.0)
    np.testing.assert_allclose(W1, W2, atol=1e-8)
    np.testing.assert_allclose(b1, b2, atol=1e-8)
    W3, b3 = fit_logistic(X.to_sparse_csr(), labels, 3, 1.0)  # taken as its COO form
    np.testing.assert_array_equal(W1, W3)
    np.testing.assert_array_equal(b1, b3)


@pytest.mark.parametrize("sparse", [True, False])
def test_the_closed_form_gradient_is_autograds(sparse):
    # the fit's gradient is written out (no graph): autograd of the same objective, in
    # float64, is its oracle, at a point away from the start (W = 0 hides sign errors)
    texts, labels = _problem(50)
    bow = BagOfNgrams(vocab_size=12, num_classes=3)
    bow._fit_features(texts)
    X = bow.features(texts) if sparse else bow.features(texts).to_dense()
    dense = X.to_dense() if sparse else X
    y = torch.from_numpy(labels)
    generator = torch.Generator().manual_seed(0)
    W = torch.randn(3, X.shape[1], dtype=torch.float64, generator=generator)
    b = torch.randn(3, dtype=torch.float64, generator=generator)
    loss, grad_W, grad_b = _logistic_objective(*_row_major(X), y, W, b, penalty=0.01)
    W_, b_ = W.clone().requires_grad_(), b.clone().requires_grad_()
    expected = torch.nn.functional.cross_entropy(dense @ W_.T + b_, y) + 0.01 * (W_**2).sum()
    expected.backward()
    torch.testing.assert_close(loss, expected.detach(), rtol=1e-13, atol=0)
    torch.testing.assert_close(grad_W, W_.grad, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(grad_b, b_.grad, rtol=1e-12, atol=1e-15)


def test_a_fit_leaves_the_programs_warnings_as_they_were():
    # the filter that keeps torch's note on CSR from users changes warnings.filters only
    # when it is not in force: each change empties every module's record of warnings
    # already shown, and a "default" warning of the program would show again
    import warnings

    texts, labels = _problem(40)
    bow = BagOfNgrams(vocab_size=12, num_classes=3)
    bow._fit_features(texts)
    X = bow.features(texts)
    fit_logistic(X, labels, 3, 1.0)  # the filter put in place
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        fit_logistic(X, labels, 3, 1.0)  # behind the caller's filter: put in front again

        def program() -> None:
            warnings.warn("the program's own note", UserWarning, stacklevel=1)

        program()
        fit_logistic(X, labels, 3, 1.0)
        program()
    assert [str(w.message) for w in caught] == ["the program's own note"]


def test_unknown_ngrams_and_empty_rows():
    texts, labels = _problem(40)
    bow = BagOfNgrams(vocab_size=20, num_classes=3).fit(texts, labels)
    X = bow.features([np.array([15, 16, 17]), np.array([4])]).to_dense()
    assert torch.all(X[0] == 0)  # ids never seen in training: no feature, prior only
    assert float(X[1].norm()) == pytest.approx(1.0)
    p = bow.probabilities([np.array([15])])[0]
    expected = torch.softmax(torch.from_numpy(bow.bias), 0).numpy()
    np.testing.assert_allclose(p, expected)


def test_state_round_trip_and_tampering():
    texts, labels = _problem(40)
    bow = BagOfNgrams(vocab_size=12, num_classes=3).fit(texts, labels)
    state = bow.to_state()
    again = BagOfNgrams.from_state(state)
    np.testing.assert_array_equal(again.probabilities(texts), bow.probabilities(texts))
    bad = dict(state, **{"bow/weight": state["bow/weight"][:, :-1]})
    with pytest.raises(CheckpointError, match=r"x\.safetensors: invalid bag-of-n-grams"):
        BagOfNgrams.from_state(bad, where="x.safetensors")
    nan = dict(state, **{"bow/bias": np.full(3, np.nan)})
    with pytest.raises(CheckpointError, match="invalid bag-of-n-grams"):
        BagOfNgrams.from_state(nan)
    with pytest.raises(CheckpointError, match="invalid bag-of-n-grams"):
        BagOfNgrams.from_state({k: v for k, v in state.items() if k != "bow/idf"})


@pytest.mark.parametrize(
    ("key", "value"), [("bow/idf", 1e200), ("bow/idf", 0.5), ("bow/weight", -1e200),
                       ("bow/bias", 1e7)],
)  # fmt: skip
def test_values_no_fit_can_give_are_refused(key, value):
    # A garbled idf of 1e200 overflowed to inf in the features: NaN probabilities.
    texts, labels = _problem(40)
    state = BagOfNgrams(vocab_size=12, num_classes=3).fit(texts, labels).to_state()
    assert state["bow/idf"].min() >= 1.0 and state["bow/idf"].max() <= 64.0
    changed = state[key].copy()
    changed.reshape(-1)[0] = value
    with pytest.raises(CheckpointError, match=r"invalid bag-of-n-grams state \(shapes or values"):
        BagOfNgrams.from_state(dict(state, **{key: changed}))
