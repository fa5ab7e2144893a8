"""The builders hand the spec's regularizers to the stacks that run them (not to a stack
stepped through its cells) and the embedding dropout to the word embeddings."""

from __future__ import annotations

import re

import pytest
import torch

from rnnkit import LSTM
from rnnkit.errors import ConfigError
from rnnkit.layers.regularization import DropoutEmbedding
from rnnkit.models import ModelSpec, build_language_model
from rnnkit.models.builders import build_encoder, build_lm
from rnnkit.models.classifier import build_classifier
from rnnkit.models.decoder_only import build_decoder_only
from rnnkit.models.seq2seq import build_seq2seq
from rnnkit.models.tagger import build_tagger

STACK = {
    "input_dropout": 0.1,
    "locked_dropout": 0.2,
    "output_dropout": 0.3,
    "recurrent_dropout": 0.4,
    "weight_drop": 0.5,
    "zoneout": 0.6,
}
REGULARIZED = ModelSpec(hidden=8, embedding=4, embedding_dropout=0.25, **STACK)


def _stack_options(stack):
    return {name: getattr(stack, name) for name in STACK}


def test_encoder_takes_the_regularizers_or_none():
    assert _stack_options(build_encoder(REGULARIZED, 3)) == STACK
    assert set(_stack_options(build_encoder(REGULARIZED, 3, regularize=False)).values()) == {0.0}


def test_word_embeddings_drop_rows():
    lm = build_language_model(REGULARIZED, 10)
    assert isinstance(lm.embedding, DropoutEmbedding) and lm.embedding.dropout == 0.25
    assert _stack_options(lm.encoder) == STACK
    clf = build_classifier(REGULARIZED, 10, 3)
    assert clf.embedding.dropout == 0.25 and _stack_options(clf.encoder) == STACK


def test_seq2seq_regularizes_its_encoder_side_only():
    m = build_seq2seq(REGULARIZED, 10, 12)
    assert m.source_embedding.dropout == 0.25 and _stack_options(m.encoder) == STACK
    assert set(_stack_options(m.decoder).values()) == {0.0}
    assert not isinstance(m.target_embedding, DropoutEmbedding)


def test_tagger_char_encoder_is_plain():
    t = build_tagger(ModelSpec(hidden=8, embedding=6, char_rnn=True, zoneout=0.5), 20, 5, 30)
    assert t.encoder.zoneout == 0.5 and t.char_encoder.encoder.zoneout == 0.0


def test_a_spec_without_regularizers_builds_the_plain_model():
    torch.manual_seed(0)
    plain = build_language_model(ModelSpec(hidden=8, embedding=4), 10)
    tokens = torch.randint(0, 10, (2, 5))
    assert plain.encoder.draw_masks(2, 5, plain.embedding.weight) is None
    assert plain.embedding(tokens).shape == (2, 5, 4)


def test_layer_norm_builds_layer_normalised_cells():
    from rnnkit.cells.layer_norm import LayerNormGRUCell, LayerNormLSTMCell

    lm = build_language_model(ModelSpec(hidden=8, embedding=4, layers=2, layer_norm=True), 10)
    assert all(isinstance(c, LayerNormLSTMCell) for c in lm.encoder.cells())
    gru = ModelSpec(cell="gru", reset="after", update="keep", hidden=8, layer_norm=True)
    cells = build_language_model(gru, 10).encoder.cells()
    assert all(isinstance(c, LayerNormGRUCell) and c.update == "keep" for c in cells)
    assert not any(
        isinstance(c, LayerNormLSTMCell)
        for c in build_language_model(ModelSpec(hidden=8, embedding=4), 10).encoder.cells()
    )


def test_a_seq2seq_decoder_refuses_what_its_stepped_cells_would_not_do():
    from rnnkit import GRU
    from rnnkit.models.seq2seq import Seq2Seq

    emb = DropoutEmbedding(7, 4)
    for decoder, what in (
        (GRU(4, 6, zoneout=0.2), "zoneout"),
        (LSTM(4, 6, layer_norm=True), "layer-normalised cells"),
    ):
        with pytest.raises(ValueError, match=f"the decoder steps through its cells, where {what}"):
            Seq2Seq(emb, GRU(4, 6), torch.nn.Embedding(7, 4), decoder, torch.nn.Linear(6, 7))


def test_a_conditional_lm_without_labels_names_the_arguments():
    # It said --condition, the command line's option (which always passes the labels).
    from rnnkit.models.builders import build_lm

    with pytest.raises(ValueError, match=r"^condition='init' needs num_labels ≥ 1, got None$"):
        build_lm(ModelSpec(hidden=4, embedding=4, condition="init"), 10)


@pytest.mark.parametrize("size", [0, -1, 2.5, True])
def test_a_vocabulary_size_below_one_is_named_by_each_builder(size):
    # 0 built an embedding of no row in silence; -1 was torch's "negative dimension"
    spec = ModelSpec(hidden=8, embedding=4)
    message = r"must be an integer ≥ 1 \(the vocabulary's size\), got " + re.escape(repr(size))
    with pytest.raises(ConfigError, match="^vocab_size " + message):
        build_language_model(spec, size)
    with pytest.raises(ConfigError, match="^vocab_size " + message):
        build_classifier(spec, size, 3)
    with pytest.raises(ConfigError, match="^vocab_size " + message):
        build_lm(ModelSpec(hidden=8, wiring="jordan"), size)
    with pytest.raises(ConfigError, match="^target_vocab_size " + message):
        build_seq2seq(spec, 5, size)
    with pytest.raises(ConfigError, match="^source_vocab_size " + message):
        build_decoder_only(spec, size, 5)
