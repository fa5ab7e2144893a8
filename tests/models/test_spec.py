"""``ModelSpec.for_task(TASK)`` is the spec ``rnnkit train --task TASK`` builds.

The oracle is the command line itself: the configuration ``rnnkit train`` makes of the
same arguments (and prints with ``--print-config``), turned into a spec the way training
does (``rnnkit.app.tasks.settings.model_spec``).
"""

from __future__ import annotations

import dataclasses
import re
import sys

import pytest

from rnnkit.app.config.fields import TASKS
from rnnkit.errors import ConfigError
from rnnkit.models import ModelSpec
from rnnkit.models.spec import task_model_defaults

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - tomli is a dependency before 3.11
    import tomli as tomllib

FIELDS = [f.name for f in dataclasses.fields(ModelSpec)]


def cli_spec(*argv: str) -> ModelSpec:
    """The spec of the model ``rnnkit train --train x ARGV`` would build."""
    from rnnkit.app.cli.main import build_parser, explicit_options
    from rnnkit.app.cli.train import config_from_args
    from rnnkit.app.tasks.settings import model_spec

    full = ["train", "--train", "x", "--out", "r", *argv]
    args = build_parser().parse_args(full)
    args.explicit = explicit_options(full)
    return model_spec(config_from_args(args))


@pytest.mark.parametrize("task", TASKS)
def test_for_task_is_the_spec_train_builds(task: str, run_cli) -> None:
    assert ModelSpec.for_task(task) == cli_spec("--task", task)
    # ... and what --print-config shows a user, field by field.
    code, out, err = run_cli("train", "--task", task, "--train", "x", "--print-config")
    assert code == 0, err
    printed = {k.replace("-", "_"): v for k, v in tomllib.loads(out).items()}
    shown = [name for name in FIELDS if name in printed]
    assert "hidden" in shown
    for name in shown:
        assert getattr(ModelSpec.for_task(task), name) == printed[name], name


def test_the_lm_defaults_differ_from_the_options_own() -> None:
    """The case that matters: ``lm`` trains two layers with dropout 0.3, locked dropout
    0.3 between them and output dropout 0.4; the options' own defaults are one layer
    without dropout (``ModelSpec()``)."""
    own = ModelSpec()
    assert (own.layers, own.dropout, own.locked_dropout, own.output_dropout) == (1, 0, 0, 0)
    lm, cli = ModelSpec.for_task("lm"), cli_spec()
    want = (2, 0.3, 0.3, 0.4)
    assert (lm.layers, lm.dropout, lm.locked_dropout, lm.output_dropout) == want
    assert (cli.layers, cli.dropout, cli.locked_dropout, cli.output_dropout) == want


def test_the_jordan_wiring_takes_no_stack_defaults() -> None:
    """The Jordan wiring has one layer and no stack: the lm's layers and regularizers do
    not apply to it (given, they are refused)."""
    assert task_model_defaults("lm", {"wiring": "jordan"}) == {"dropout": 0.3}


def test_the_tag_defaults_are_those_of_docs_defaults() -> None:
    """``tag`` reads each word's spelling (``--char-rnn``) with dropout 0.5, chosen on
    the Brown corpus's news section (docs/defaults.md); the options' own defaults are off
    and 0, and ``--no-char-rnn`` turns the character RNN off and keeps the rest."""
    assert (ModelSpec().char_rnn, ModelSpec().dropout) == (False, 0.0)
    tag = ModelSpec.for_task("tag")
    assert (
        (tag.char_rnn, tag.dropout)
        == (True, 0.5)
        == (cli_spec("--task", "tag").char_rnn, cli_spec("--task", "tag").dropout)
    )
    assert cli_spec("--task", "tag", "--no-char-rnn") == dataclasses.replace(tag, char_rnn=False)
    assert ModelSpec.for_task("tag", char_rnn=False) == cli_spec("--task", "tag", "--no-char-rnn")


@pytest.mark.parametrize(
    "fields, argv",
    [
        ({"wiring": "jordan"}, ["--wiring", "jordan"]),  # one layer by definition
        ({"dropout": 0.0}, ["--dropout", "0"]),  # a value given at the global default
        (
            {"layers": 3, "hidden": 16, "cell": "gru"},
            ["--layers", "3", "--hidden", "16", "--cell", "gru"],
        ),
    ],
)
def test_fields_given_win_over_the_task_defaults(fields: dict, argv: list[str]) -> None:
    assert ModelSpec.for_task("lm", **fields) == cli_spec("--task", "lm", *argv)


@pytest.mark.parametrize(
    "field",
    [
        "cell",
        "nonlinearity",
        "update",
        "reset",
        "length",
        "wiring",
        "condition",
        "pooling",
        "attention",
    ],
)
def test_a_choice_the_builders_do_not_know_is_refused_naming_the_field(field):
    # cell="bogus" built a GRU; wiring and condition fell back to hidden and none.
    with pytest.raises(ConfigError, match=f"^ModelSpec: {field} must be one of .*, got 'bogus'$"):
        ModelSpec(**{field: "bogus"})


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        (dict(hidden=0), "hidden must be an integer ≥ 1, got 0"),
        (dict(layers=-1), "layers must be an integer ≥ 1, got -1"),
        (dict(embedding=2.5), "embedding must be an integer ≥ 1, got 2.5"),
        (dict(max_len=True), "max_len must be an integer ≥ 1, got True"),
        (dict(recompute=0), "recompute must be an integer ≥ 1 or None, got 0"),
        (dict(dropout=1.0), "dropout must be a probability in [0, 1), got 1.0"),
        (dict(zoneout=-0.1), "zoneout must be a probability in [0, 1), got -0.1"),
        (dict(bidirectional="yes"), "bidirectional must be True or False, got 'yes'"),
        (dict(layer_norm=1), "layer_norm must be True or False, got 1"),
    ],
)
def test_a_size_probability_or_switch_out_of_range_is_refused_naming_the_field(fields, words):
    # hidden=0 failed at build time naming the layer's hidden_size; "yes" was truthy
    with pytest.raises(ConfigError, match="^ModelSpec: " + re.escape(words) + "$"):
        ModelSpec(**fields)


def test_the_builders_still_take_every_known_choice():
    from rnnkit.models import build_language_model

    assert ModelSpec(cell="rnn", layers=2, nonlinearity="tanh,relu").nonlinearities() == (
        "tanh",
        "relu",
    )
    with pytest.raises(ConfigError, match="nonlinearity must be one of"):
        ModelSpec(cell="rnn", layers=2, nonlinearity="tanh,bogus")
    lm = build_language_model(ModelSpec(cell="gru", hidden=4, embedding=4, update="keep"), 9)
    assert lm.encoder.cells()[0].update == "keep"
    for attention in ("none", "dot", "bilinear", "additive"):
        assert ModelSpec(attention=attention).attention == attention


@pytest.mark.parametrize("task", ["bogus", "language", "LM", ""])
def test_an_unknown_task_is_refused_naming_it_and_the_tasks(task):
    # It returned the options' own defaults: a misspelt task silently lost its defaults.
    with pytest.raises(ConfigError) as caught:
        ModelSpec.for_task(task, hidden=8)
    message = str(caught.value)
    assert repr(task) in message and "\n" not in message
    assert all(name in message for name in TASKS)
