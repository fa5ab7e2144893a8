"""The one-step function streaming uses equals the model's own step, state included."""

from __future__ import annotations

import pytest
import torch

from rnnkit.anomaly.session_state import step_function
from rnnkit.models.builders import build_language_model
from rnnkit.models.spec import ModelSpec
from rnnkit.types import LSTMState


@pytest.mark.parametrize(
    "options",
    [
        {"cell": "gru", "layers": 2},
        {"cell": "rnn", "tie_weights": True},
        {"cell": "lstm", "hidden": 6, "embedding": 6, "tie_weights": True},
        {"cell": "lstm", "zoneout": 0.3},  # its expectation at evaluation: model.step's
        {"cell": "gru", "layers": 2, "recurrent_dropout": 0.3, "weight_drop": 0.5},
        {"cell": "lstm", "layers": 2, "layer_norm": True},  # the cell's step: the loop's
        {"cell": "gru", "reset": "after", "layer_norm": True},
    ],
)
def test_fast_step_is_the_models_step(options: dict) -> None:
    torch.manual_seed(1)
    spec = ModelSpec(**{"hidden": 5, "embedding": 3, **options})
    model = build_language_model(spec, 9).eval()
    step = step_function(model)
    tokens = torch.tensor([4, 5, 8])
    fast_state = slow_state = None
    for _ in range(3):
        fast, fast_state = step(tokens, fast_state)
        slow, slow_state = model.step(tokens, slow_state)
        torch.testing.assert_close(fast, slow, atol=1e-6, rtol=1e-5)
        if isinstance(slow_state, LSTMState):
            torch.testing.assert_close(tuple(fast_state), tuple(slow_state), atol=1e-6, rtol=1e-5)
        else:
            torch.testing.assert_close(fast_state, slow_state, atol=1e-6, rtol=1e-5)
        tokens = fast.argmax(-1)
