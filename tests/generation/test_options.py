"""Every decoding option is checked before any work, and the error names it."""

from __future__ import annotations

import pytest
from step_models import (
    EOS,
    TableModel,
    chain_table,
)

from rnnkit.generation.search import generate


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"max_length": 0}, "max_length"),
        ({"max_length": -3}, "max_length"),
        ({"max_length": 2.5}, "max_length"),
        ({"max_length": True}, "max_length"),
        ({"temperature": 0.0}, "temperature"),
        ({"temperature": -1.0}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_k": 0}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"beam_size": 0, "strategy": "beam"}, "beam_size"),
        ({"num": 0}, "num"),
        ({"num": 3, "beam_size": 2, "strategy": "beam"}, "num"),
        ({"strategy": "nucleus"}, "strategy"),
        ({"eos_id": -1}, "eos_id"),
        ({"length_penalty": float("inf")}, "length_penalty"),
    ],
)
def test_bad_arguments_name_themselves(kwargs: dict, name: str) -> None:
    model = TableModel(chain_table(6))
    args = {"max_length": 5, "eos_id": EOS, **kwargs}
    with pytest.raises(ValueError, match=name):
        generate(model, [1], **args)
    assert model.calls == 0  # checked before any work
