"""The regularizer options of TrainConfig: range, the tasks and wirings that read them,
what their time loop cannot combine with, and the model spec that carries them."""

from __future__ import annotations

import pytest

from rnnkit.app.config import REGULARIZERS, TrainConfig
from rnnkit.app.tasks.settings import model_spec
from rnnkit.errors import ConfigError


def cfg(**changes):
    return TrainConfig(train="corpus.txt", **changes)


@pytest.mark.parametrize("name", REGULARIZERS)
@pytest.mark.parametrize("value", [-0.1, 1.0, 2.0])
def test_out_of_range_is_one_line_naming_the_option(name, value):
    flag = "--" + name.replace("_", "-")
    with pytest.raises(ConfigError, match=f"^{flag} must be in \\[0, 1\\), got {value}$"):
        cfg(**{name: value}).validate()


@pytest.mark.parametrize("name", ["recurrent_dropout", "weight_drop", "zoneout"])
def test_in_loop_options_take_a_bptt_window(name):
    cfg(**{name: 0.1}, bptt="window:4").validate()
    cfg(**{name: 0.1}, bptt="segment:8").validate()


@pytest.mark.parametrize("name", ["recurrent_dropout", "weight_drop", "zoneout"])
def test_in_loop_options_take_recompute(name):
    cfg(**{name: 0.1}, recompute=4).validate()


@pytest.mark.parametrize("name", REGULARIZERS)
def test_refused_where_no_stack_reads_them(name):
    flag = "--" + name.replace("_", "-")
    with pytest.raises(ConfigError, match=f"^{flag} does not apply to --task params"):
        cfg(task="params").check_applies({name})
    with pytest.raises(ConfigError, match=f"^{flag} does not apply to --wiring jordan"):
        cfg(task="lm", wiring="jordan").check_applies({name})


def test_embedding_dropout_needs_tokens():
    with pytest.raises(ConfigError, match="--embedding-dropout does not apply to --task regress"):
        cfg(task="regress").check_applies({"embedding_dropout"})
    cfg(task="regress").check_applies({"zoneout", "weight_drop", "input_dropout"})


def test_the_model_spec_carries_them():
    values = {name: 0.1 * (k + 1) for k, name in enumerate(REGULARIZERS)}
    spec = model_spec(cfg(**values))
    assert {name: getattr(spec, name) for name in REGULARIZERS} == values


def test_layer_norm_is_an_lstm_option_of_the_tasks_that_run_the_stack():
    cfg(layer_norm=True).validate().check_applies({"layer_norm"})
    with pytest.raises(ConfigError, match=r"^--layer-norm does not apply to --cell rnn"):
        cfg(cell="rnn", layer_norm=True).check_applies({"layer_norm"})
    with pytest.raises(ConfigError, match=r"^--layer-norm with --cell gru needs --reset after"):
        cfg(cell="gru", layer_norm=True).validate()
    with pytest.raises(ConfigError, match=r"^--recurrent-dropout has no layer-normalised GRU"):
        cfg(cell="gru", reset="after", layer_norm=True, recurrent_dropout=0.1).validate()
    cfg(cell="gru", reset="after", layer_norm=True, zoneout=0.1).validate()
    with pytest.raises(ConfigError, match=r"^--layer-norm does not apply to --task seq2seq"):
        cfg(task="seq2seq", layer_norm=True).check_applies({"layer_norm"})
    cfg(layer_norm=True, bptt="window:3").validate()  # the windowed stack takes it
    cfg(layer_norm=True, recompute=4).validate()
    assert model_spec(cfg(layer_norm=True)).layer_norm
