"""``rnnkit.app.config.fields``: a field declared with ``option()`` carries its metadata,
its type is read from the annotation, and the checks it implies name the option."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest

from rnnkit.app.config.fields import (
    SAME,
    check_choice,
    check_positive,
    flag,
    option,
    option_fields,
    option_of,
    value_kinds,
)
from rnnkit.errors import ConfigError


@dataclass(kw_only=True)
class Base:
    width: int = option(8, help="width", positive=True)


@dataclass(kw_only=True)
class Child(Base):
    mode: str = option("a", help="mode", choices=("a", "b"), tasks=("lm",))
    rate: float | None = option(None, help="rate", command_line=0.5)
    on: bool = option(False, help="switch")


def test_option_stores_its_metadata_beside_the_default():
    fields = {f.name: f for f in dataclasses.fields(Child)}
    assert Child().mode == "a" and Child().rate is None
    mode = option_of(fields["mode"])
    assert (mode.help, mode.choices, mode.tasks, mode.cells) == ("mode", ("a", "b"), ("lm",), None)
    assert mode.command_line is SAME and option_of(fields["rate"]).command_line == 0.5
    assert option_of(fields["width"]).positive and not mode.positive


def test_a_field_without_option_is_refused():
    @dataclass
    class Plain:
        x: int = 1

    with pytest.raises(TypeError, match="not declared with option"):
        option_of(dataclasses.fields(Plain)[0])


def test_option_fields_are_a_classes_own_in_order():
    assert [f.name for f in option_fields(Child)] == ["mode", "rate", "on"]
    assert [f.name for f in option_fields(Base)] == ["width"]


def test_value_kinds_read_the_annotations():
    assert value_kinds(Child) == {
        "width": (int, False),
        "mode": (str, False),
        "rate": (float, True),
        "on": (bool, False),
    }

    @dataclass
    class Odd:
        xs: list[int] = dataclasses.field(default_factory=list)

    with pytest.raises(TypeError, match="not an option's type"):
        value_kinds(Odd)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, "--batch-size must be ≥ 1, got 0"),
        (-3, "--batch-size must be ≥ 1, got -3"),
        (2.0, "--batch-size must be an integer, got 2.0"),
        (True, "--batch-size must be an integer, got True"),
        (2**63, "--batch-size is absurdly large"),
    ],
)
def test_check_positive_names_the_option(value, message):
    with pytest.raises(ConfigError, match=message):
        check_positive("batch_size", value)


def test_check_positive_and_choice_accept_what_is_allowed():
    check_positive("steps", None)
    check_positive("steps", 2**63 - 1)
    check_choice("cell", "gru", ("rnn", "lstm", "gru"))
    with pytest.raises(ConfigError, match="--cell must be one of rnn, lstm, gru, got 'GRU'"):
        check_choice("cell", "GRU", ("rnn", "lstm", "gru"))
    assert flag("tie_weights") == "--tie-weights"
