"""The other wirings on the command line: ``--length`` (lm, seq2seq),
``--wiring jordan`` and ``--condition`` (lm). Each option trains, is saved in
``config.json``, and is honoured by ``--resume``, ``evaluate --json`` and ``generate``;
bad combinations are one line naming the option, with nothing written."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
from safetensors.torch import load_file

from rnnkit.app.config import TrainConfig
from rnnkit.app.tasks.lm import load_lm
from rnnkit.data.generated_pairs import generate_pairs, write_pairs
from rnnkit.errors import ConfigError
from rnnkit.models.conditional import ConditionalLM
from rnnkit.models.jordan import JordanLM

WORDS = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran"]
TINY = ["--hidden", "8", "--embedding", "8", "--batch-size", "8", "--ngram-order", "2"]


@pytest.fixture(autouse=True, scope="module")
def _one_thread(single_thread):
    yield


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("wirings")
    rng = random.Random(0)

    def lines(n: int) -> str:
        return "".join(
            " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 3))) + "\n" for _ in range(n)
        )

    (d / "train.txt").write_text(lines(40), encoding="utf-8")
    (d / "valid.txt").write_text(lines(8), encoding="utf-8")
    # Class-conditional text: the label decides the letters.
    labelled = [("pos", "ab" * rng.randint(1, 3)) for _ in range(20)]
    labelled += [("neg", "xy" * rng.randint(1, 3)) for _ in range(20)]
    rng.shuffle(labelled)
    (d / "labelled.tsv").write_text("".join(f"{k}\t{t}\n" for k, t in labelled))
    (d / "labelled_valid.tsv").write_text("pos\tabab\nneg\txy\nodd\tabxy\n")
    write_pairs(d / "pairs.tsv", generate_pairs("reverse", 48, seed=0, max_len=5))
    write_pairs(d / "pairs_valid.tsv", generate_pairs("reverse", 8, seed=1, max_len=5))
    return d


def train(run_cli, data: Path, out: Path, *extra: str, train_file: str = "train.txt"):
    tiny = TINY
    if "seq2seq" in extra:  # the n-gram baseline is a language-model option
        tiny = TINY[: TINY.index("--ngram-order")]
    return run_cli(
        "train",
        "--train",
        str(data / train_file),
        "--out",
        str(out),
        *tiny,
        "--steps",
        "4",
        "--quiet",
        *extra,
    )


def evaluate(run_cli, out: Path, data_file: Path) -> dict:
    code, stdout, err = run_cli(
        "evaluate", "--checkpoint", str(out), "--data", str(data_file), "--json"
    )
    assert code == 0, err
    return json.loads(stdout)


def generate(run_cli, out: Path, *extra: str) -> list[str]:
    code, stdout, err = run_cli("generate", "--checkpoint", str(out), "--json", *extra)
    assert code == 0, err
    return [json.loads(line)["text"] for line in stdout.splitlines()]


def saved_config(out: Path) -> dict:
    return json.loads((out / "config.json").read_text())["config"]


def one_line_error(code, err, *words):
    assert code == 2 and "Traceback" not in err and err.count("\n") == 1, err
    for word in words:
        assert word in err, err


# -- --length (lm) ----------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["stop", "predict"])
def test_lm_length_trains_evaluates_generates_and_resumes(data, tmp_path, capsys, run_cli, mode):
    out = tmp_path / mode
    code, _, err = train(
        run_cli, data, out, "--bptt", "full", "--length", mode, "--max-len", "12", "--seed", "1"
    )
    assert code == 0, err
    assert saved_config(out)["length"] == mode
    _, _, model = load_lm(out)
    assert model.length is not None and model.length.mode == mode
    metrics = evaluate(run_cli, out, data / "valid.txt")
    # Under a mechanism </s> is no token: only the characters of the lines are counted.
    text = (data / "valid.txt").read_text()
    assert metrics["tokens"] == len(text) - text.count("\n")
    assert math.isfinite(metrics["loss_nats"]) and "bits_per_char" in metrics
    texts = generate(run_cli, out, "--num", "3", "--max-len", "20")
    assert len(texts) == 3
    if mode == "predict":  # at most --max-len tokens, whatever was drawn
        assert all(len(t) <= 12 for t in generate(run_cli, out, "--greedy", "--max-len", "30"))
    # --resume keeps the mechanism; changing it is refused.
    code, _, err = train(run_cli, data, out, "--bptt", "full", "--length", mode, "--max-len",
                         "12", "--seed", "1", "--resume", "--steps", "5")  # fmt: skip
    assert code == 0, err
    assert json.loads((out / "summary.json").read_text())["steps"] == 5
    code, _, err = run_cli("train", "--train", str(data / "train.txt"), "--out", str(out),
                       "--resume", "--length", "predict" if mode == "stop" else "stop")  # fmt: skip
    one_line_error(code, err, "--length")


# -- --wiring jordan --------------------------------------------------------------------------
def test_jordan_trains_on_streams_evaluates_and_generates(data, tmp_path, run_cli):
    out = tmp_path / "jordan"
    code, _, err = train(run_cli, data, out, "--wiring", "jordan", "--bptt", "segment:8")
    assert code == 0, err
    assert saved_config(out)["wiring"] == "jordan"
    weights = load_file(str(out / "model.safetensors"))
    # Fig. 10.4: the fed-back output W_o and no hidden-to-hidden weight anywhere.
    assert "feedback.weight" in weights and not [k for k in weights if "weight_hh" in k]
    assert isinstance(load_lm(out)[2], JordanLM)
    metrics = evaluate(run_cli, out, data / "valid.txt")
    assert math.isfinite(metrics["perplexity"]) and "ngram" in metrics
    assert len(generate(run_cli, out, "--num", "2", "--prompt", "the", "--max-len", "10")) == 2


# -- --condition ------------------------------------------------------------------------------
def test_class_conditional_lm_end_to_end(data, tmp_path, capsys, run_cli):
    out = tmp_path / "cond"
    code, _, err = train(run_cli, data, out, "--condition", "both", "--bptt", "full",
                         "--valid", str(data / "labelled_valid.tsv"), "--lr", "0.05",
                         "--steps", "40", train_file="labelled.tsv")  # fmt: skip
    assert code == 0, err
    assert saved_config(out)["condition"] == "both"
    assert json.loads((out / "labels.json").read_text())["labels"] == ["neg", "pos"]
    assert isinstance(load_lm(out)[2], ConditionalLM)
    # The line of an unseen label is reported, not scored.
    metrics = evaluate(run_cli, out, data / "labelled_valid.tsv")
    assert metrics["unknown_labels"] == 1 and metrics["unknown_label_counts"] == {"odd": 1}
    assert metrics["tokens"] == len("abab") + 1 + len("xy") + 1
    # The label steers generation: each class writes its own letters.
    pos = generate(run_cli, out, "--condition", "pos", "--greedy", "--max-len", "8")[0]
    neg = generate(run_cli, out, "--condition", "neg", "--greedy", "--max-len", "8")[0]
    assert pos and set(pos) <= set("ab") and neg and set(neg) <= set("xy")
    code, _, err = run_cli("generate", "--checkpoint", str(out), "--condition", "odd")
    one_line_error(code, err, "'odd'", "neg, pos")
    code, _, err = run_cli("generate", "--checkpoint", str(out))
    one_line_error(code, err, "--condition LABEL", "neg, pos")


# -- --length (seq2seq) -----------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["stop", "predict"])
def test_seq2seq_length_end_to_end(data, tmp_path, capsys, run_cli, mode):
    out = tmp_path / f"s2s-{mode}"
    code, _, err = train(run_cli, data, out, "--task", "seq2seq", "--length", mode,
                         "--valid", str(data / "pairs_valid.tsv"), "--max-len", "8",
                         "--hidden", "16", train_file="pairs.tsv")  # fmt: skip
    assert code == 0, err
    assert saved_config(out)["length"] == mode
    metrics = evaluate(run_cli, out, data / "pairs_valid.tsv")
    targets = [line.split("\t")[1] for line in (data / "pairs_valid.tsv").read_text().splitlines()]
    assert metrics["tokens"] == sum(len(t) for t in targets)  # no </s> steps
    assert 0.0 <= metrics["token_accuracy"] <= 1.0 and math.isfinite(metrics["loss_nats"])
    code, stdout, err = run_cli("generate", "--checkpoint", str(out), "--input", "abc")
    assert code == 0 and stdout.endswith("\n"), err
    if mode == "predict":  # a reference longer than any length the model can predict
        long = tmp_path / "long.tsv"
        long.write_text("ab\tba\nabc\t" + "c" * 9 + "\n")
        code, _, err = run_cli("evaluate", "--checkpoint", str(out), "--data", str(long))
        one_line_error(code, err, f"{long}:2:", "--max-len 8")


# -- validation -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("options", "named"),
    [
        (["--length", "stop"], "--bptt"),  # streams have no end to predict
        (["--length", "sideways"], "--length"),
        (["--wiring", "jordan", "--layers", "2"], "--layers 2"),
        (["--wiring", "jordan", "--bidirectional"], "--bidirectional"),
        (["--wiring", "jordan", "--tie-weights"], "--tie-weights"),
        (["--wiring", "jordan", "--bptt", "full", "--length", "stop"], "--length stop"),
        (["--wiring", "jordan", "--condition", "init"], "--condition init"),
        (["--condition", "init", "--bptt", "window:4"], "--bptt full"),
        (["--condition", "init", "--bptt", "full", "--length", "stop"], "--length stop"),
        (["--task", "classify", "--wiring", "jordan"], "--wiring"),
        (["--task", "tag", "--length", "stop"], "--length"),
        (["--task", "seq2seq", "--length", "stop", "--decoder-only"], "--decoder-only"),
        (["--task", "seq2seq", "--length", "stop", "--scheduled-sampling", "linear:3"],
         "--scheduled-sampling"),
    ],
)  # fmt: skip
def test_bad_combinations_are_one_line_naming_the_option(data, tmp_path, run_cli, options, named):
    out = tmp_path / "never"
    code, _, err = train(run_cli, data, out, *options)
    one_line_error(code, err, named)
    assert not out.exists()


def test_config_round_trip_and_old_configs_get_the_defaults():
    cfg = TrainConfig(train="x", bptt="full", length="predict", max_len=9).validate()
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg
    cfg = TrainConfig(train="x", wiring="jordan", nonlinearity="relu").validate()
    assert TrainConfig.from_dict(cfg.to_dict()).wiring == "jordan"
    cfg = TrainConfig(train="x", bptt="full", condition="input").validate()
    assert TrainConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    # A config.json written before these options existed reads as today's behaviour.
    old = {k: v for k, v in cfg.to_dict().items() if k not in ("length", "wiring", "condition")}
    back = TrainConfig.from_dict(old)
    assert (back.length, back.wiring, back.condition) == ("eos", "hidden", "none")
    with pytest.raises(ConfigError, match=r"config\.json: length must be str"):
        TrainConfig.from_dict({**cfg.to_dict(), "length": 3})
    with pytest.raises(ConfigError, match="--condition must be one of none, init"):
        TrainConfig(train="x", condition="label").validate()


def test_generate_condition_on_a_checkpoint_without_classes(data, tmp_path, capsys, run_cli):
    out = tmp_path / "plain"
    code, _, err = train(run_cli, data, out, "--bptt", "full", "--steps", "1")
    assert code == 0, err
    code, _, err = run_cli("generate", "--checkpoint", str(out), "--condition", "pos")
    one_line_error(code, err, "--condition", "class-conditional")
