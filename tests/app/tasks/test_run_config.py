"""``check_batch_size``: every task's ``evaluate`` and ``predictor`` refuse a batch size
below 1 (or not an integer) from Python, naming ``batch_size``, before the run is read."""

from __future__ import annotations

from pathlib import Path

import pytest

from rnnkit.app.cli.main import main
from rnnkit.app.tasks.registry import task_module
from rnnkit.app.tasks.run_config import check_batch_size, check_count
from rnnkit.data.events import write_sessions
from rnnkit.data.generated_sessions import generate_sessions
from rnnkit.errors import CheckpointError, ConfigError

TASKS = ["lm", "classify", "tag", "seq2seq", "events", "params", "regress"]
BAD = [0, -1, 2.5, True, "4"]


@pytest.fixture(autouse=True, scope="module")
def _one_thread(single_thread):
    yield


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("value", BAD, ids=repr)
def test_every_entry_point_refuses_the_size_before_reading_the_run(task, value, tmp_path):
    # No run at all: the size is what is named, not the missing directory (0 used to
    # mean the run's batch size, -1 reached the batchers).
    module = task_module(task)
    expected = f"batch_size must be an integer ≥ 1 or None .*, got {value!r}"
    with pytest.raises(ConfigError, match=expected):
        module.evaluate(tmp_path / "no-run", str(tmp_path / "data"), value)
    with pytest.raises(ConfigError, match=expected):
        module.predictor(tmp_path / "no-run", value)


def test_none_is_the_default_and_a_positive_integer_passes():
    assert check_batch_size(None) is None and check_batch_size(1) is None
    with pytest.raises(ConfigError, match="must be an integer ≥ 1, got None"):
        check_batch_size(None, none=None)


def _train(out: Path, task: str, train: Path, *extra: str) -> Path:
    tiny = ["--hidden", "8", "--embedding", "8", "--batch-size", "8", "--quiet"]
    argv = ["train", "--task", task, "--train", str(train), "--out", str(out), *tiny, *extra]
    assert main(argv) == 0
    return out


def test_a_trained_run_is_scored_only_with_a_valid_size(tmp_path):
    # On real runs the old readings were silent: an lm predictor of batch size -1
    # answered no line at all, and an events evaluation of -1 failed inside the scorer.
    (tmp_path / "lm.txt").write_text("the cat sat on the mat.\n" * 20, encoding="utf-8")
    lm = _train(tmp_path / "lm", "lm", tmp_path / "lm.txt", "--steps", "3")
    answer = task_module("lm").predictor(lm, 1)(["the cat"], [("x", 1)])
    assert len(answer) == 1 and len(answer[0]["logprobs"]) == len(answer[0]["tokens"])
    with pytest.raises(ConfigError, match=r"batch_size .* got -1"):
        task_module("lm").predictor(lm, -1)
    write_sessions(tmp_path / "ev.jsonl", generate_sessions(24, seed=1))
    events = _train(tmp_path / "ev", "events", tmp_path / "ev.jsonl", "--steps", "3")
    assert task_module("events").evaluate(events, str(tmp_path / "ev.jsonl"), 5)["sessions"] > 0
    with pytest.raises(ConfigError, match=r"batch_size .* got -1"):
        task_module("events").evaluate(events, str(tmp_path / "ev.jsonl"), -1)


@pytest.mark.parametrize(
    ("count", "info", "words"),
    [
        (3, {"num_labels": 2}, "run/labels.json: 3 labels but config.json says 2"),
        # a classify run's config.json edited to say lm: it was "None labels"
        (None, {"num_labels": 2}, "run/config.json: says num_labels 2, but this run's task"),
        (2, {}, "run/config.json: no num_labels (labels.json holds 2 labels)"),
    ],
)
def test_a_count_that_disagrees_with_config_json_names_the_file_at_fault(count, info, words):
    check_count(Path("run/labels.json"), 2, "labels", {"num_labels": 2}, "num_labels")
    with pytest.raises(CheckpointError) as refused:
        check_count(Path("run/labels.json"), count, "labels", info, "num_labels")
    assert str(refused.value).startswith(words) and "None" not in str(refused.value)


def test_config_json_holds_the_options_the_run_reads(tmp_path):
    """``config.json`` leaves out what the run does not read (a tagger's ``bidirectional``
    said false of an encoder that is always bidirectional); they read back at their
    defaults, and every option the run reads at its value."""
    import json

    from rnnkit.app.config import TrainConfig
    from rnnkit.app.tasks.run_config import save_config

    cfg = TrainConfig(train=str(tmp_path / "t.tsv"), task="tag", cell="lstm", hidden=12)
    (tmp_path / "t.tsv").write_text("a\tX\n")
    save_config(tmp_path, cfg, vocab_size=5)
    saved = json.loads((tmp_path / "config.json").read_text())["config"]
    assert not {"bidirectional", "pooling", "beam", "update"} & set(saved)
    assert {k for k, v in cfg.to_dict().items() if cfg.applies(k)} == set(saved)
    assert TrainConfig.from_dict(saved) == cfg


def test_an_option_given_away_from_its_default_is_kept_though_the_task_reads_it_not(tmp_path):
    """A config built in Python is not checked as the command line's: a decoder-only
    seq2seq model given ``layer_norm=True`` is built layer-normalised, and config.json
    left the option out, so the run no longer loaded ("unexpected ... gamma_c")."""
    from rnnkit.app.config import TrainConfig
    from rnnkit.app.tasks.run_config import load_config, save_config

    (tmp_path / "t.tsv").write_text("ab\tba\n")
    cfg = TrainConfig.for_task(
        "seq2seq", train=str(tmp_path / "t.tsv"), out=str(tmp_path), decoder_only=True,
        attention="none", layer_norm=True,
    )  # fmt: skip
    assert not cfg.applies("layer_norm")
    save_config(tmp_path, cfg)
    assert load_config(tmp_path, verify=False)[0].layer_norm is True


def test_an_option_the_run_reads_not_at_the_value_it_reads_back_as_is_left_out(tmp_path):
    """A Jordan language model's config.json kept ``locked_dropout: 0.0`` and
    ``output_dropout: 0.0`` (compared with the LM's defaults, 0.3 and 0.4), options it
    does not read and that read back as 0.0 anyway."""
    import json

    from rnnkit.app.config import TrainConfig
    from rnnkit.app.tasks.run_config import save_config

    (tmp_path / "t.txt").write_text("ab\n")
    cfg = TrainConfig.for_task(
        "lm", train=str(tmp_path / "t.txt"), out=str(tmp_path), wiring="jordan",
        locked_dropout=0.0, output_dropout=0.0,
    )  # fmt: skip
    save_config(tmp_path, cfg)
    saved = json.loads((tmp_path / "config.json").read_text())["config"]
    assert {k for k, v in cfg.to_dict().items() if cfg.applies(k)} == set(saved)
    assert TrainConfig.from_dict(saved) == cfg
