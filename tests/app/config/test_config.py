"""TrainConfig: every out-of-range value is a ConfigError naming its option; config.json
round-trips, and unknown keys or wrong types in it are refused."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from rnnkit.app.config import TrainConfig, parse_bptt
from rnnkit.errors import ConfigError


def cfg(**changes):
    return TrainConfig(train="corpus.txt", **changes)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("full", ("full", None)),
        ("segment:1", ("segment", 1)),
        ("segment:64", ("segment", 64)),
        ("window:5", ("window", 5)),
    ],
)
def test_parse_bptt(spec, expected):
    assert parse_bptt(spec) == expected


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("window:0", "K ≥ 1, got 0"),
        ("segment:-3", "K ≥ 1, got -3"),
        ("window:x", "integer K, got 'x'"),
        ("window:", "full, segment:K or window:K"),
        ("segment", "full, segment:K or window:K"),
        ("stride:4", "full, segment:K or window:K"),
        ("Full", "full, segment:K or window:K"),
        ("", "full, segment:K or window:K"),
    ],
)
def test_parse_bptt_errors_name_the_option(spec, words):
    with pytest.raises(ConfigError) as info:
        parse_bptt(spec)
    message = str(info.value)
    assert message.startswith("--bptt") and words in message


def test_defaults_validate():
    assert cfg().validate() == cfg()


@pytest.mark.parametrize(
    ("changes", "option"),
    [
        (dict(hidden=0), "--hidden must be ≥ 1, got 0"),
        (dict(hidden=-4), "--hidden must be ≥ 1"),
        (dict(hidden=2.5), "--hidden must be an integer"),
        (dict(hidden=True), "--hidden must be an integer"),
        (dict(layers=0), "--layers"),
        (dict(embedding=0), "--embedding"),
        (dict(batch_size=0), "--batch-size"),
        (dict(steps=0), "--steps"),
        (dict(epochs=0), "--epochs"),
        (dict(min_freq=0), "--min-freq"),
        (dict(max_len=0), "--max-len"),
        (dict(eval_every=0), "--eval-every"),
        (dict(patience=0), "--patience"),
        (dict(min_gain=1.0), "--min-gain must be in [0, 1) (a fraction of the validation loss)"),
        (dict(min_gain=-1e-3), "--min-gain"),
        (dict(min_gain=float("nan")), "--min-gain"),
        (dict(ngram_order=0), "--ngram-order"),
        (dict(dropout=1.0), "--dropout must be in [0, 1), got 1.0"),
        (dict(dropout=-0.1), "--dropout"),
        (dict(dropout=float("nan")), "--dropout"),
        (dict(word_dropout=1.0), "--word-dropout must be in [0, 1), got 1.0"),
        (dict(target_fpr=0.0), "--target-fpr must be in (0, 1), got 0.0"),
        (dict(confidence=1.0), "--confidence must be in (0, 1), got 1.0"),
        (dict(top_g=0), "--top-g must be ≥ 1, got 0"),
        (dict(window=0), "--window must be ≥ 1, got 0"),
        (dict(score="median"), "--score must be one of max, mean"),
        (dict(threshold_method="pot"), "--threshold-method must be one of quantile, gpd"),
        (dict(lr=0.0), "--lr must be > 0"),
        (dict(lr=float("nan")), "--lr"),
        (dict(lr_decay=0.0), "--lr-decay"),
        (dict(lr_decay=1.5), "--lr-decay"),
        (dict(clip_norm=0.0), "--clip-norm must be > 0"),
        (dict(clip_value=-1.0), "--clip-value"),
        # Past float32's range: a torch RuntimeError traceback at the first step.
        (dict(lr=1e300), "--lr must be > 0 and at most 3.4e+38"),
        (dict(lr=float("inf")), "--lr must be > 0 and at most 3.4e+38"),
        (dict(clip_norm=1e300), "--clip-norm must be > 0 and at most 3.4e+38"),
        (dict(clip_value=float("inf")), "--clip-value must be > 0 and at most 3.4e+38"),
        (dict(init_range=1e300), "--init-range must be > 0 and at most 3.4e+38"),
        (dict(valid_fraction=0.0), "--valid-fraction"),
        (dict(valid_fraction=0.5), "--valid-fraction"),
        (dict(bptt="window:0"), "--bptt window:K needs K ≥ 1"),
        (dict(bptt="chunks"), "--bptt"),
        (dict(cell="transformer"), "--cell must be one of rnn, lstm, gru"),
        (dict(unit="byte"), "--unit"),
        (dict(task="poetry"), "--task"),
        (dict(optimizer="adagrad"), "--optimizer"),
        (dict(device="tpu"), "--device"),
        (dict(nonlinearity="gelu"), "--nonlinearity"),
        (dict(update="both"), "--update"),
        (dict(reset="never"), "--reset"),
        (dict(doc_boundary="page"), "--doc-boundary"),
        (dict(batch_order="shuffled"), "--batch-order"),
        (dict(train=""), "--train is required"),
        # "" was read as no --valid (a split of --train), or as a file named "".
        (dict(valid=""), "--valid is empty: name a file, or leave the option out"),
        (dict(pretrained_vectors=""), "--pretrained-vectors is empty"),
        # --print-config printed these as checked; training refused them
        (dict(task="seq2seq", scheduled_sampling="linear:-5"), "--scheduled-sampling linear:K"),
        (dict(task="seq2seq", scheduled_sampling="inverse-sigmoid:5:nan"), "must be finite"),
    ],
)
def test_validate_names_the_option(changes, option):
    config = TrainConfig(**{"train": "corpus.txt", **changes})
    with pytest.raises(ConfigError) as info:
        config.validate()
    assert option in str(info.value)
    assert "\n" not in str(info.value)


def test_none_means_unset_for_optional_counts():
    cfg(steps=None, eval_every=None, patience=None, clip_norm=None).validate()


def test_round_trip_through_json():
    original = cfg(hidden=12, tie_weights=True, dropout=0.25, steps=7, bptt="window:3")
    data = json.loads(json.dumps(original.to_dict()))
    assert TrainConfig.from_dict(data) == original


def test_from_dict_accepts_an_int_for_a_float():
    assert TrainConfig.from_dict({"train": "x", "lr": 1, "dropout": 0}).lr == 1


def test_from_dict_rejects_unknown_keys():
    with pytest.raises(ConfigError, match=r"run/config\.json: unknown keys \['hiden'\]"):
        TrainConfig.from_dict({"train": "x", "hiden": 8}, where="run/config.json")


@pytest.mark.parametrize("data", [[1, 2], "config", None, 3])
def test_from_dict_rejects_non_objects(data):
    with pytest.raises(ConfigError, match="expected a JSON object"):
        TrainConfig.from_dict(data)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("hidden", "8"),
        ("hidden", 8.0),
        ("hidden", True),
        ("tie_weights", 1),
        ("tie_weights", "yes"),
        ("dropout", "0.1"),
        ("dropout", False),
        ("cell", 3),
        ("hidden", None),  # only options that may be unset may be null
        ("bptt", None),
        # Options whose default is None (unset) must still have the right type when set.
        ("steps", "5"),
        ("steps", 5.5),
        ("eval_every", True),
        ("patience", [3]),
        ("valid", 7),
        ("clip_value", "big"),
    ],
)
def test_from_dict_rejects_wrong_types(key, value):
    with pytest.raises(ConfigError) as info:
        TrainConfig.from_dict({"train": "x", key: value}, where="run/config.json")
    assert str(info.value).startswith("run/config.json: ") and key in str(info.value)


def test_the_concerns_hold_every_field_once_and_in_order():
    from rnnkit.app.config import CONCERNS
    from rnnkit.app.config.fields import option_fields

    names = [f.name for concern in CONCERNS for f in option_fields(concern)]
    assert names == [f.name for f in dataclasses.fields(TrainConfig)]


@pytest.mark.parametrize(
    ("key", "value"),
    [("steps", 5), ("valid", "v.txt"), ("clip_norm", None), ("clip_value", 0.5)],
)
def test_from_dict_accepts_set_and_unset_optionals(key, value):
    assert getattr(TrainConfig.from_dict({"train": "x", key: value}), key) == value


@pytest.mark.parametrize(
    ("change", "message"),
    [
        # Found by tests/fuzz/test_fuzz_cli.py: both were ValueError tracebacks from torch.
        ({"seed": 10**20}, "--seed must be an integer below 2\\^63"),
        ({"hidden": 2**64}, "--hidden is absurdly large"),
    ],
)
def test_out_of_range_integers_are_config_errors(change: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        TrainConfig(train="t.txt", **change).validate()


def test_the_option_table_names_real_fields_and_tasks():
    from rnnkit.app.config import CELL_OPTIONS, TASK_OPTIONS, TASKS

    fields = set(TrainConfig.__dataclass_fields__)
    assert set(TASK_OPTIONS) <= fields and set(CELL_OPTIONS) <= fields
    assert all(set(tasks) <= set(TASKS) for tasks in TASK_OPTIONS.values())


@pytest.mark.parametrize(
    ("values", "given", "message"),
    [
        (dict(task="tag", pooling="mean"), None, "--pooling does not apply to --task tag"),
        (dict(task="tag"), {"pooling"}, "--pooling does not apply to --task tag"),
        # the tagger's encoder is always bidirectional: the option would change nothing
        (
            dict(task="tag"),
            {"bidirectional"},
            "--bidirectional does not apply to --task tag (only to: classify, seq2seq, regress)",
        ),
        (dict(task="lm", beam=3), None, "--beam does not apply to --task lm (only to: seq2seq)"),
        (dict(cell="lstm", reset="after"), None, "--reset does not apply to --cell lstm"),
        (dict(cell="gru", wiring="jordan", update="keep"), None, "--wiring jordan"),
    ],
)
def test_check_applies_refuses_what_the_task_does_not_read(values, given, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        TrainConfig(train="x", **values).check_applies(given)


def test_check_applies_accepts_what_the_task_reads():
    TrainConfig(train="x", task="classify", pooling="max", unit="word").check_applies()
    TrainConfig(train="x", task="lm", wiring="jordan", nonlinearity="relu").check_applies()
    TrainConfig(train="x", task="tag").check_applies({"cell", "hidden", "char_rnn"})
    TrainConfig(train="x", task="classify").check_applies({"bidirectional"})


@pytest.mark.parametrize(
    ("values", "per_layer"),
    [
        (dict(cell="rnn", nonlinearity="sigmoid", layers=2), ("sigmoid", "sigmoid")),
        (dict(cell="rnn", nonlinearity="tanh,sigmoid", layers=2), ("tanh", "sigmoid")),
        (dict(cell="rnn", nonlinearity="relu,tanh,sigmoid", layers=3), ("relu", "tanh", "sigmoid")),
    ],
)
def test_nonlinearity_one_or_one_per_layer(values, per_layer):
    assert TrainConfig(train="x", **values).validate().nonlinearities() == per_layer


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (dict(cell="rnn", nonlinearity="tanh,sigmoid", layers=3), "names 2 layers, --layers is 3"),
        (dict(cell="rnn", nonlinearity="tanh,softsign", layers=2), "must be one of tanh, relu"),
        (dict(cell="rnn", nonlinearity="tanh,", layers=2), "must be one of"),
        (dict(cell="gru", nonlinearity="tanh,sigmoid", layers=2), "applies to --cell rnn"),
    ],
)
def test_bad_nonlinearity_is_named(values, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        TrainConfig(train="x", **values).validate()


def test_task_defaults_name_real_fields_of_options_the_task_reads():
    from rnnkit.app.config import TASK_DEFAULTS, TASK_OPTIONS, TASKS

    fields = set(TrainConfig.__dataclass_fields__)
    for task, defaults in TASK_DEFAULTS.items():
        assert task in TASKS and set(defaults) <= fields
        for name in defaults:  # a default for an option the task does not read is a lie
            assert task in TASK_OPTIONS.get(name, TASKS)
        TrainConfig.for_task(task, train="x").validate()


def test_for_task_applies_the_task_defaults_under_the_options_given():
    from rnnkit.app.config import TASK_DEFAULTS

    task, defaults = next(iter(TASK_DEFAULTS.items()))
    key, value = next(iter(defaults.items()))
    assert getattr(TrainConfig.for_task(task, train="x"), key) == value
    assert getattr(TrainConfig(task=task, train="x"), key) == getattr(TrainConfig(), key)
    other = TrainConfig.for_task(task, train="x", **{key: getattr(TrainConfig(), key)})
    assert getattr(other, key) == getattr(TrainConfig(), key)  # given: kept


def test_batch_order_defaults_by_task_and_applies_to_batches_of_whole_sequences():
    """Events train on random batches (a session's length tells its workflow: batches of
    one length were batches of one workflow), the other tasks on length-grouped ones; a
    language model's streams and seq2seq's pairs are not batched by it, so it is refused
    there rather than stored and ignored."""
    assert TrainConfig.for_task("events", train="x").batch_order == "random"
    for task in ("lm", "tag", "classify", "regress"):
        assert TrainConfig.for_task(task, train="x").batch_order == "length"
    for task in ("tag", "classify", "events", "regress"):
        TrainConfig(train="x", task=task, batch_order="random").check_applies({"batch_order"})
    TrainConfig(train="x", task="lm", bptt="full").check_applies({"batch_order"})
    TrainConfig(train="x", task="lm", bptt="window:8").check_applies({"batch_order"})
    with pytest.raises(ConfigError, match=r"^--batch-order does not apply to --bptt segment:64"):
        TrainConfig(train="x", task="lm", bptt="segment:64").check_applies({"batch_order"})
    with pytest.raises(ConfigError, match=r"^--batch-order does not apply to --task seq2seq"):
        TrainConfig(train="x", task="seq2seq").check_applies({"batch_order"})
