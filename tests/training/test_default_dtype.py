"""``torch.set_default_dtype(torch.float64)`` before building: the models are built in
float64 and train in float64 from Python (the ``Trainer``), snapshots and resume included;
nothing silently builds float32. The default is restored after each test."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import torch

from rnnkit.data.batching import StreamBatcher
from rnnkit.models import ModelSpec, build_language_model
from rnnkit.models.classifier import build_classifier
from rnnkit.models.seq2seq import build_seq2seq
from rnnkit.models.tagger import build_tagger
from rnnkit.training.loop import Trainer, TrainOptions

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture
def float64_default() -> Iterator[None]:
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def _dtypes(model: torch.nn.Module) -> set[torch.dtype]:
    tensors = [*model.parameters(), *model.buffers()]
    return {t.dtype for t in tensors if t.is_floating_point()}


@pytest.mark.usefixtures("float64_default")
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_models_build_in_the_default_dtype(cell: str) -> None:
    spec = ModelSpec(cell=cell, hidden=8, embedding=4, layer_norm=cell == "lstm")
    models = [
        build_language_model(spec, 12),
        build_classifier(spec, 12, 3),
        build_tagger(spec, 12, 3, num_chars=20),
        build_seq2seq(ModelSpec(cell=cell, hidden=8, embedding=4, attention="additive"), 10, 12),
    ]
    for model in models:
        assert _dtypes(model) == {torch.float64}, type(model).__name__
    lm = models[0]
    out = lm.loss(torch.randint(1, 12, (2, 5)), torch.randint(1, 12, (2, 5)))
    assert out.loss.dtype == torch.float64


@pytest.mark.usefixtures("float64_default")
def test_a_float64_model_trains_and_resumes_from_python(tmp_path) -> None:
    ids = torch.randint(1, 20, (2000,), generator=torch.Generator().manual_seed(0))

    def trainer(steps: int) -> Trainer:
        torch.manual_seed(0)
        model = build_language_model(ModelSpec(hidden=16, embedding=8), 20)
        return Trainer(
            model,
            torch.optim.Adam(model.parameters(), lr=3e-3),
            StreamBatcher(ids.numpy(), 4, 16),
            lambda m, b, c: m.loss(b.inputs, b.targets, state=c),
            TrainOptions(steps=steps, quiet=True),
            out_dir=tmp_path,
        )

    first = trainer(3)
    result = first.fit()
    first.save()
    assert result.train_loss_nats is not None and math.isfinite(result.train_loss_nats)
    assert _dtypes(first.model) == {torch.float64}
    assert all(p.grad is None or p.grad.dtype == torch.float64 for p in first.model.parameters())
    state = first.optimizer.state_dict()["state"]
    assert {t.dtype for s in state.values() for t in s.values() if t.is_floating_point()} == {
        torch.float64
    }
    again = trainer(5)
    again.resume()
    assert again.step == 3
    again.fit()
    assert again.step == 5 and _dtypes(again.model) == {torch.float64}
    losses = [e["loss_nats"] for e in again.history if "loss_nats" in e]
    assert losses and all(math.isfinite(v) for v in losses)
