"""The gradient-flow section's pieces: the stand-in for a model's stack."""

from __future__ import annotations

import pytest
import torch

from rnnkit.app.report.flow import replaying


@pytest.mark.parametrize("pooling", ["last", "mean", "max"])
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_a_models_own_loss_through_the_stand_in_is_its_loss(pooling, cell):
    """The stand-in hands the model what its stack returned: the model's loss is the
    same (a padded batch, two bidirectional layers)."""
    from rnnkit.models import ModelSpec
    from rnnkit.models.classifier import build_classifier

    torch.manual_seed(0)
    spec = ModelSpec(
        cell=cell, hidden=5, embedding=4, layers=2, bidirectional=True, pooling=pooling
    )
    model = build_classifier(spec, vocab_size=9, num_classes=3).double().eval()
    ids = torch.randint(1, 9, (4, 6))
    mask = torch.arange(6)[None, :] < torch.tensor([6, 3, 1, 5])[:, None]
    labels = torch.tensor([0, 2, 1, 1])
    want = model.loss(ids, labels, mask).loss
    with torch.no_grad():
        out = model.encoder(model.embedding(ids), mask=mask)
    with replaying(model, out):
        got = model.loss(ids, labels, mask).loss
    torch.testing.assert_close(got, want, rtol=1e-12, atol=0)
    assert type(model.encoder).__name__ != "_Replay"  # given back after the block


def test_the_stand_in_answers_for_the_stacks_sizes_and_holds_no_parameters():
    """A model may read its stack's sizes besides calling it (a class-conditional LM's
    initial state reads ``num_layers`` and ``hidden_size``)."""
    from rnnkit.models.conditional import class_conditional_lm

    model = class_conditional_lm(9, 2, 4, 5, context="both", cell="lstm", num_layers=2)
    outside = [n for n, _ in model.named_parameters() if not n.startswith("encoder.")]
    with torch.no_grad():
        out = model.encoder(torch.zeros(1, 3, 8))
    with replaying(model, out):
        assert (model.encoder.num_layers, model.encoder.hidden_size) == (2, 5)
        assert model.encoder.is_lstm
        assert [n for n, _ in model.named_parameters()] == outside
        with pytest.raises(AttributeError):
            _ = model.encoder.no_such_attribute
