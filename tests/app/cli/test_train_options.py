"""``rnnkit train``'s options are built from the fields of ``TrainConfig``
(``rnnkit.app.cli.train.add_config_options``): every field is an option with the field's
type, default, choices and help, a configuration file is checked against the same
choices, and nothing else is an option but the command's own."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from rnnkit.app.cli.config_file import apply_config_file
from rnnkit.app.cli.main import build_parser, explicit_options
from rnnkit.app.cli.train import _train_parser, config_from_args
from rnnkit.app.config import TrainConfig
from rnnkit.app.config.fields import SAME, option_of, value_kinds
from rnnkit.errors import ConfigError

FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}
#: The options of the command itself, not of the configuration.
COMMAND = {
    "help",
    "config",
    "print_config",
    "resume",
    "overwrite",
    "skip_checksums",
    "no_clip",
    "no_char_rnn",
    "max_parameters",
    "json",
    "no_report",
    "quiet",
    "verbose",
}
CHOICES = sorted(n for n, f in FIELDS.items() if option_of(f).choices is not None)


@pytest.fixture(scope="module")
def actions() -> dict[str, argparse.Action]:
    return {a.dest: a for a in _train_parser()._actions}


def test_every_field_is_an_option_and_every_option_a_field_or_the_commands(actions):
    assert set(FIELDS) <= set(actions)
    assert set(actions) - set(FIELDS) == COMMAND


@pytest.mark.parametrize("name", CHOICES)
def test_a_field_with_choices_is_offered_with_exactly_those(actions, name):
    assert tuple(actions[name].choices) == option_of(FIELDS[name]).choices


def test_the_choices_include_the_anomaly_scores_and_threshold_methods(actions):
    from rnnkit.anomaly.scores import SCORES
    from rnnkit.anomaly.thresholds import THRESHOLD_METHODS

    assert tuple(actions["score"].choices) == SCORES
    assert tuple(actions["threshold_method"].choices) == THRESHOLD_METHODS


@pytest.mark.parametrize("name", sorted(FIELDS))
def test_an_option_has_its_fields_type_default_and_help(actions, name):
    action, meta = actions[name], option_of(FIELDS[name])
    kind, _ = value_kinds(TrainConfig)[name]
    assert action.option_strings == ["--" + name.replace("_", "-")]
    assert action.help is not None and action.help.startswith(meta.help.rstrip(")"))
    if kind is bool:
        assert isinstance(action, argparse._StoreTrueAction) and action.default is False
        return
    assert action.type is (None if kind is str else kind)
    default = FIELDS[name].default if meta.command_line is SAME else meta.command_line
    assert action.default == default and action.metavar == meta.metavar
    if meta.tasks is not None:
        assert action.help.endswith(f"[tasks: {', '.join(meta.tasks)}]")


@pytest.mark.parametrize("name", CHOICES)
def test_a_configuration_file_is_checked_against_the_same_choices(tmp_path, name):
    parser = _train_parser()
    conf = tmp_path / "bad.toml"
    conf.write_text(f'{name} = "no-such-choice"\n')
    args = parser.parse_args(["--train", "x"])
    choices = ", ".join(option_of(FIELDS[name]).choices)
    with pytest.raises(ConfigError, match=f"{name}: must be one of {choices}, got"):
        apply_config_file(parser, args, set(), str(conf))


def test_the_default_configuration_is_the_fields_defaults_but_the_command_lines_own():
    argv = ["train", "--train", "t.txt", "--out", "r"]
    args = build_parser().parse_args(argv)
    args.explicit = explicit_options(argv)
    cfg = config_from_args(args)
    assert cfg.epochs is None  # the command line trains until validation stops improving
    assert dataclasses.replace(cfg, epochs=1) == TrainConfig.for_task("lm", train="t.txt", out="r")


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--task", "tag", "--word-dropout", "0.2"], {"word_dropout": 0.2}),
        (["--task", "tag"], {"char_rnn": True}),  # the tag task's own default
        (["--task", "tag", "--no-char-rnn"], {"char_rnn": False}),
        (["--task", "tag", "--char-rnn"], {"char_rnn": True}),
        (["--task", "events", "--threshold-method", "gpd", "--window", "4"],
         {"threshold_method": "gpd", "window": 4}),
        (["--task", "params", "--confidence", "0.9", "--target-fpr", "0.05"],
         {"confidence": 0.9, "target_fpr": 0.05}),
    ],
)  # fmt: skip
def test_task_options_reach_their_fields(argv, expected):
    full = ["train", "--train", "t.txt", "--out", "r", *argv]
    args = build_parser().parse_args(full)
    args.explicit = explicit_options(full)
    cfg = config_from_args(args)
    assert {k: getattr(cfg, k) for k in expected} == expected


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--word-dropout", "0.2"], r"--word-dropout does not apply to --task lm \(only to: tag\)"),
        (["--no-char-rnn"], r"--char-rnn does not apply to --task lm \(only to: tag\)"),
        (["--task", "tag", "--char-rnn", "--no-char-rnn"], "--char-rnn and --no-char-rnn"),
        (["--task", "params", "--top-g", "3"], "--top-g does not apply to --task params"),
        (["--task", "events", "--target-fpr", "1.5"], r"--target-fpr must be in \(0, 1\)"),
    ],
)
def test_task_options_are_refused_where_they_do_not_apply(argv, message):
    full = ["train", "--train", "t.txt", "--out", "r", *argv]
    args = build_parser().parse_args(full)
    args.explicit = explicit_options(full)
    with pytest.raises(ConfigError, match=message):
        config_from_args(args)
