"""The options that the commands loading a run share with ``rnnkit train`` are declared
once: the same type, choices, metavar and help text as ``train``'s, checked against the
same bounds with the same message; only the default is the run's."""

from __future__ import annotations

import argparse

import pytest

from rnnkit.app.cli.main import build_parser, main
from rnnkit.app.cli.run_options import RUN_DEFAULT
from rnnkit.app.config import TrainConfig
from rnnkit.errors import ConfigError

#: command → the options it shares with train, and the default text its help shows.
SHARED = {
    "score": ["score", "target_fpr", "threshold_method", "confidence", "device"],
    "evaluate": ["device"],
    "predict": ["beam", "device"],
    "generate": ["beam", "device"],
    "report": ["device"],
}


def _actions(command: str) -> dict[str, argparse.Action]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {a.dest: a for a in sub.choices[command]._actions}


def _before_default(text: str) -> str:
    return text.split("(default", 1)[0]


@pytest.mark.parametrize(("command", "name"), [(c, n) for c, ns in SHARED.items() for n in ns])
def test_a_shared_option_is_trains_own(command: str, name: str) -> None:
    train, other = _actions("train")[name], _actions(command)[name]
    assert other.option_strings == train.option_strings
    assert (other.type, other.choices, other.metavar) == (train.type, train.choices, train.metavar)
    # The same text up to its default, and after it (train adds [tasks: …], a command a note).
    assert _before_default(other.help) == _before_default(train.help)
    after = train.help.split("%(default)s", 1)[1].split(" [tasks:")[0]
    assert after in other.help
    if name == "device":  # not a run's: the same default as train's
        assert other.default == train.default == TrainConfig().device
    else:
        assert other.default is None and train.default == getattr(TrainConfig(), name)
        assert "(default the run's" in other.help or command == "generate", other.help
        assert RUN_DEFAULT in other.help


def test_the_help_of_score_says_what_train_says() -> None:
    score = _actions("score")["score"].help
    train = _actions("train")["score"].help
    assert score.startswith(train.split("(default")[0] + "(default the run's)")


@pytest.mark.parametrize(
    ("option", "value"), [("target_fpr", "1.5"), ("target_fpr", "0"), ("confidence", "1")]
)
def test_score_and_train_refuse_a_value_with_one_message(option, value, capsys) -> None:
    with pytest.raises(ConfigError) as trained:
        TrainConfig(train="x", task="params", **{option: float(value)}).validate()
    flag = "--" + option.replace("_", "-")
    argv = ["score", "--checkpoint", "nowhere", "--data", "-", flag, value]
    if option == "confidence":
        argv += ["--params", "nowhere"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert str(trained.value) in err and err.count("\n") == 1, err
