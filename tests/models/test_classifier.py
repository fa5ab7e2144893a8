"""Classifier: it learns with every pooling, a sequence's result never depends on its
padding or its batch neighbours, and the loss is the mean over examples."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from rnnkit import GRU, LSTM, RNN
from rnnkit.models.classifier import Classifier, FeedForwardHead, build_classifier
from rnnkit.models.pooling import Pooling
from rnnkit.models.spec import ModelSpec

V, K = 10, 3


@pytest.fixture(autouse=True)
def _one_thread(single_thread):
    yield


def batch(seed=0, B=8, T=6):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0] = T
    mask = torch.arange(T)[None, :] < lengths[:, None]
    inputs = torch.randint(4, V, (B, T), generator=g).masked_fill(~mask, 0)
    labels = torch.randint(0, K, (B,), generator=g)
    return inputs, labels, mask


def make(pooling, bidirectional=True, cell=LSTM, seed=0):
    torch.manual_seed(seed)
    D = 2 if bidirectional else 1
    return Classifier(
        nn.Embedding(V, 5),
        cell(5, 6, bidirectional=bidirectional),
        Pooling(pooling, D),
        FeedForwardHead(6 * D, 8, K),
    ).double()


@pytest.mark.parametrize("pooling", ["last", "mean", "max"])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
def test_overfits_one_batch(pooling, bidirectional):
    inputs, labels, mask = batch()
    model = make(pooling, bidirectional, cell=GRU)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    first = float(model.loss(inputs, labels, mask).loss.detach())
    for _ in range(40):
        opt.zero_grad()
        model.loss(inputs, labels, mask).loss.backward()
        opt.step()
    out = model.loss(inputs, labels, mask)
    assert float(out.loss.detach()) < 0.05 < first
    assert out.tokens == inputs.shape[0]
    assert torch.equal(model.predict(inputs, mask), labels)


@pytest.mark.parametrize("pooling", ["last", "mean", "max"])
@pytest.mark.parametrize("cell", [RNN, GRU, LSTM])
def test_each_sequence_alone_equals_in_batch_with_garbage_padding(pooling, cell):
    inputs, _, mask = batch(1)
    model = make(pooling, True, cell)
    logits = model(torch.where(mask, inputs, 9), mask)  # real ids in the padding
    for i in range(inputs.shape[0]):
        n = int(mask[i].sum())
        alone = model(inputs[i : i + 1, :n])
        torch.testing.assert_close(alone[0], logits[i], rtol=1e-12, atol=1e-12)


def test_loss_is_mean_cross_entropy_over_examples():
    inputs, labels, mask = batch(2)
    model = make("mean")
    out = model.loss(inputs, labels, mask)
    expected = F.cross_entropy(model(inputs, mask), labels, reduction="sum")
    assert out.nats == pytest.approx(float(expected.detach()))
    assert float(out.loss.detach()) == pytest.approx(float(expected.detach()) / inputs.shape[0])
    with pytest.raises(ValueError, match="labels must have shape"):
        model.loss(inputs, labels[:-1], mask)


def test_builder_and_mismatched_parts():
    spec = ModelSpec(cell="rnn", hidden=7, embedding=3, pooling="max", layers=2)
    clf = build_classifier(spec, vocab_size=V, num_classes=4)
    assert clf.num_classes == 4 and clf.pooling.method == "max"
    assert clf(torch.tensor([[4, 5, 0]]), torch.tensor([[True, True, False]])).shape == (1, 4)
    with pytest.raises(ValueError, match="num_directions"):
        Classifier(nn.Embedding(V, 5), GRU(5, 6), Pooling("last", 2), FeedForwardHead(6, 8, K))


def test_labels_and_token_ids_outside_their_ranges_are_named():
    # torch said "Target 3 is out of bounds." and "index out of range in self".
    clf = build_classifier(ModelSpec(hidden=4, embedding=3), 9, 3)
    x = torch.randint(1, 9, (2, 4))
    with pytest.raises(
        ValueError, match=r"^labels must lie in \[0, 3\) \(the classes\), got 3 at 1$"
    ):
        clf.loss(x, torch.tensor([0, 3]))
    with pytest.raises(ValueError, match=r"got -1 at 0$"):
        clf.loss(x, torch.tensor([-1, 0]))
    with pytest.raises(TypeError, match="labels must hold integer class ids"):
        clf.loss(x, torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match=r"^inputs must hold token ids in \[0, 9\)"):
        clf(torch.full((2, 4), 9))
    assert clf.loss(x, torch.tensor([0, 2])).tokens == 2
