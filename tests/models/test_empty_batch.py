"""A batch of size 0 (``B = 0``) through every model: the empty result of the same shape
as the first ``0`` rows of a real batch, never a reshape error.

The oracle is the model itself on a batch with rows: its output cut to no row
(``out[:0]``) is what the empty batch must give, shape and dtype alike. A loss over no
example has no mean: it is refused with a ``ValueError`` (never a silent NaN).
"""

from __future__ import annotations

import pytest
import torch

from rnnkit import LSTM
from rnnkit.data.pairs import PairBatch
from rnnkit.models import (
    POOLINGS,
    ModelSpec,
    Regressor,
    build_classifier,
    build_decoder_only,
    build_encoder,
    build_language_model,
    build_seq2seq,
    build_tagger,
    build_vector_classifier,
)
from rnnkit.models.pooling import Pooling, directions_side_by_side, state_pool

CELLS = ("lstm", "gru", "rnn")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def ids(B: int, T: int, vocab: int = 9) -> torch.Tensor:
    return torch.randint(4, vocab, (B, T))


def same_as_no_rows(empty: torch.Tensor, full: torch.Tensor) -> None:
    """``empty`` is ``full[:0]``: the shape of no row, the same dtype."""
    assert empty.shape == full[:0].shape and empty.dtype == full.dtype


@pytest.mark.parametrize("pooling", POOLINGS)
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("cell", CELLS)
def test_classifier_of_no_row_gives_no_logits(pooling, bidirectional, cell):
    # pooling="last" read the final state with reshape(B, -1): ambiguous at B = 0
    spec = ModelSpec(hidden=4, embedding=4, cell=cell, pooling=pooling, bidirectional=bidirectional)
    clf = build_classifier(spec, 9, 3).eval()
    full = clf(ids(2, 5))
    for mask in (None, torch.zeros(0, 5, dtype=torch.bool)):
        empty = clf(ids(0, 5), mask)
        same_as_no_rows(empty, full)
        same_as_no_rows(clf.predict(ids(0, 5), mask), full.argmax(-1))
    frames = build_vector_classifier(spec, 3, 2).eval()
    same_as_no_rows(frames(torch.zeros(0, 5, 3)), frames(torch.randn(2, 5, 3)))


def test_classifier_loss_of_no_row_is_refused_not_nan():
    clf = build_classifier(ModelSpec(hidden=4, embedding=4, pooling="mean"), 9, 3)
    with pytest.raises(ValueError, match="empty batch"):
        clf.loss(ids(0, 5), torch.zeros(0, dtype=torch.long))


@pytest.mark.parametrize("pooling", POOLINGS)
@pytest.mark.parametrize("directions", [1, 2])
def test_every_pooling_of_no_row(pooling, directions):
    enc = LSTM(3, 4, bidirectional=directions == 2)
    x, mask = torch.randn(2, 5, 3), torch.ones(2, 5, dtype=torch.bool)
    out = enc(x, mask=mask)
    full = Pooling(pooling, directions)(out.outputs, mask, out.state)
    out0 = enc(x[:0], mask=mask[:0])
    for state in (out0.state, None):
        same_as_no_rows(Pooling(pooling, directions)(out0.outputs, mask[:0], state), full)
    same_as_no_rows(state_pool(out0.state), state_pool(out.state))


def test_directions_side_by_side_matches_the_reshape_with_rows():
    top = torch.randn(2, 3, 4)  # (D, B, H)
    want = torch.cat([top[0], top[1]], dim=-1)  # [h^f; h^b] per row
    assert torch.equal(directions_side_by_side(top), want)
    same_as_no_rows(directions_side_by_side(top[:, :0]), want)


@pytest.mark.parametrize("cell", CELLS)
def test_language_model_and_tagger_of_no_row(cell):
    spec = ModelSpec(hidden=4, embedding=4, cell=cell)
    lm = build_language_model(spec, 9).eval()
    same_as_no_rows(lm(ids(0, 5)).logits, lm(ids(2, 5)).logits)
    tagger = build_tagger(spec, 9, 3).eval()
    same_as_no_rows(tagger(ids(0, 5)), tagger(ids(2, 5)))
    chars = build_tagger(ModelSpec(hidden=4, embedding=4, cell=cell, char_rnn=True), 9, 3, 7)
    chars.eval()
    full = chars(ids(2, 5), None, ids(2, 5 * 3, 7).view(2, 5, 3))
    empty = chars(ids(0, 5), torch.zeros(0, 5, dtype=torch.bool), ids(0, 15, 7).view(0, 5, 3))
    same_as_no_rows(empty, full)
    with pytest.raises(ValueError, match="no valid position"):  # as ever: no mean of nothing
        lm.loss(ids(0, 5), ids(0, 5))


def pairs(B: int) -> PairBatch:
    mask = torch.ones(B, 4, dtype=torch.bool)
    return PairBatch(ids(B, 4), mask, ids(B, 4), ids(B, 4), mask, torch.arange(B))


@pytest.mark.parametrize("attention", ["none", "bilinear", "additive"])
@pytest.mark.parametrize("cell", CELLS)
def test_encoder_decoder_of_no_row(attention, cell):
    # the bridge from encoder to decoder read [h^f; h^b] with reshape(B, -1)
    spec = ModelSpec(hidden=4, embedding=4, cell=cell, attention=attention, bidirectional=True)
    model = build_seq2seq(spec, 9, 9).eval()
    same_as_no_rows(model.target_logits(pairs(0)), model.target_logits(pairs(2)))
    empty = pairs(0)
    for beam in (1, 3):  # greedy refused a state of no row, beam search gave []
        assert model.decode(empty.source, empty.source_mask, beam=beam, max_length=3) == []
    assert model.sample(empty.source, empty.source_mask, max_length=3) == []


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_decoder_only_of_no_row(cell):
    # the joint rows' width was the max over no row
    model = build_decoder_only(ModelSpec(hidden=4, embedding=4, cell=cell), 9, 9).eval()
    same_as_no_rows(model.target_logits(pairs(0)), model.target_logits(pairs(2)))
    empty = pairs(0)
    assert model.decode(empty.source, empty.source_mask, max_length=3) == []
    assert model.sample(empty.source, empty.source_mask, max_length=3) == []


@pytest.mark.parametrize(
    ("target", "bidirectional"), [("value", False), ("value", True), ("next", False)]
)
def test_regressor_of_no_row(target, bidirectional):
    encoder = build_encoder(ModelSpec(hidden=4, bidirectional=bidirectional), 3)
    model = Regressor(encoder, 2, target=target).eval()
    same_as_no_rows(model(torch.zeros(0, 5, 3)).mean, model(torch.randn(2, 5, 3)).mean)
