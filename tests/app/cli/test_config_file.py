"""``rnnkit train --config FILE`` and ``--print-config`` (``rnnkit.app.cli.config_file``): the
command line wins over the file, every bad key is one line naming the file and the key
(exit 2), the file's options are requests on ``--resume``, and what ``--print-config``
prints loads back to the same configuration and the same text."""

from __future__ import annotations

import json
import math
import os
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rnnkit.app.cli.config_file import toml_value, tomllib  # tomli on Python 3.10

WORDS = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran"]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("data")
    rng = random.Random(0)
    text = "".join(" ".join(rng.choice(WORDS) for _ in range(5)) + "\n" for _ in range(60))
    (d / "train.txt").write_text(text)
    return d


def printed(run_cli, *argv: str) -> str:
    code, out, err = run_cli("train", *argv, "--print-config")
    assert code == 0 and err == "", err
    return out


def values(text: str) -> dict:
    return tomllib.loads(text)


# -- precedence ----------------------------------------------------------------------------------
def test_the_command_line_overrides_the_file_which_overrides_the_defaults(
    data, tmp_path, capsys, run_cli
):
    conf = tmp_path / "run.toml"
    conf.write_text(
        f'train = "{data / "train.txt"}"\nout = "{tmp_path / "run"}"\n'
        "hidden = 16\nembedding = 8\nbatch_size = 4\nlr = 0.01\nsteps = 3\n"
        'bptt = "segment:16"\nngram-order = 3\nno-report = true\n'
    )
    code, _, err = run_cli("train", "--config", str(conf), "--hidden", "8", "-q")
    assert code == 0, err
    saved = json.loads((tmp_path / "run" / "config.json").read_text())["config"]
    assert saved["hidden"] == 8  # command line
    assert (saved["lr"], saved["steps"], saved["batch_size"]) == (0.01, 3, 4)  # file
    assert saved["layers"] == 2 and saved["dropout"] == 0.3  # the lm task's defaults
    assert not (tmp_path / "run" / "report.html").exists()  # no-report from the file
    # the same through --print-config, which writes nothing
    shown = values(printed(run_cli, "--config", str(conf), "--lr", "0.5", "--out", "elsewhere"))
    assert (shown["lr"], shown["hidden"], shown["out"]) == (0.5, 16, "elsewhere")
    assert not Path("elsewhere").exists()


def test_a_flag_of_the_command_line_wins_over_false_in_the_file(tmp_path, run_cli):
    conf = tmp_path / "c.toml"
    conf.write_text('task = "classify"\nbidirectional = false\n')
    shown = values(printed(run_cli, "--config", str(conf), "--bidirectional"))
    assert shown["bidirectional"] is True and shown["task"] == "classify"


def test_no_clip_overrides_the_files_clip_norm_but_not_one_typed_beside_it(tmp_path, run_cli):
    """``--no-clip --clip-norm 3`` dropped the 3 in silence; both typed is refused, while
    ``--no-clip`` over a file's ``clip-norm`` is the command line overriding the file."""
    conf = tmp_path / "c.toml"
    conf.write_text("clip-norm = 3.0\n")
    shown = values(printed(run_cli, "--config", str(conf), "--no-clip"))
    assert shown["no-clip"] is True and "clip-norm" not in shown
    code, _, err = run_cli(
        "train", "--train", "t.txt", "--out", "r", "--no-clip", "--clip-norm", "3"
    )
    assert (code, err) == (2, "rnnkit train: error: --clip-norm and --no-clip: give one of them\n")
    # the other way round: the command line's --clip-norm over the file's no-clip
    conf.write_text("no-clip = true\n")
    shown = values(printed(run_cli, "--config", str(conf), "--clip-norm", "2"))
    assert shown["clip-norm"] == 2.0 and shown["no-clip"] is False
    conf.write_text("no-clip = true\nclip-norm = 3.0\n")  # both in the file
    code, _, err = run_cli("train", "--config", str(conf), "--train", "t.txt", "--out", "r")
    assert (code, err) == (
        2,
        f"rnnkit train: error: {conf}: clip-norm and no-clip: give one of them\n",
    )


# -- refusals ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('hidden = "8"', "hidden: must be an integer, got the string '8'"),
        ("hidden = 8.0", "hidden: must be an integer, got the number 8.0"),
        ("hidden = true", "hidden: must be an integer, got the boolean true"),
        ('lr = "fast"', "lr: must be a number, got the string 'fast'"),
        ("lr = 1" + "0" * 400, "lr: is too large for a number"),
        ("bidirectional = 1", "bidirectional: must be true or false, got the number 1"),
        ("cell = 3", "cell: must be a string, got the number 3"),
        ("bptt = [1, 2]", "bptt: must be a string, got an array"),
        ("seed = 1979-05-27", "seed: must be an integer, got a date"),
        ('cell = "cnn"', "cell: must be one of rnn, lstm, gru, got 'cnn'"),
        ('train = "a\\u0000b"', "train: contains a NUL character"),
        ("hiden = 3", "hiden: unknown option (did you mean hidden?)"),
        ("colour = 3", "colour: unknown option"),
        ("resume = true", "resume: --resume is not a configuration option (give it on the "
         "command line)"),
        ("quiet = 1", "quiet: --quiet is not a configuration option (give it on the command "
         "line)"),
        ("config = 'other.toml'", "config: --config is not a configuration option (give it "
         "on the command line)"),
        ("[model]\nhidden = 3", "model: is a table; options are top-level keys (hidden = "
         "256, not a [section])"),
        ("batch-size = 4\nbatch_size = 8", "batch-size and batch_size are the same option"),
        # the values' own rules and the per-task table, blamed on the file's key
        ("hidden = 0", "hidden: --hidden must be ≥ 1, got 0"),
        ("dropout = 5", "dropout: --dropout must be in [0, 1), got 5.0"),
        ("lr = nan", "lr: --lr must be > 0 and at most 3.4e+38 (float32's largest: the "
         "weights are float32), got nan"),
        ('bptt = "segment:x"', "bptt: --bptt segment:K needs an integer K, got 'x'"),
        ("pooling = 'mean'", "pooling: --pooling does not apply to --task lm (only to: "
         "classify)"),
        ("bidirectional = false", "bidirectional: --bidirectional does not apply to --task "
         "lm (only to: classify, seq2seq, regress)"),
        ("update = 'keep'", "update: --update does not apply to --cell lstm (only to: gru)"),
        ("target-fpr = 0.5", "target-fpr: --target-fpr does not apply to --task lm (only "
         "to: events, params)"),
        ("task = 'events'\ntarget-fpr = 1.5", "target-fpr: --target-fpr must be in (0, 1), got "
         "1.5"),
        ("layers = 1000000", "layers: --layers 1000000 --hidden 256 --embedding 64: the "
         "recurrent layers alone would hold"),
    ],
)  # fmt: skip
def test_a_bad_key_is_one_line_naming_the_file_and_the_key(data, tmp_path, run_cli, text, message):
    conf = tmp_path / "bad.toml"
    conf.write_text(text + "\n")
    out = tmp_path / "run"
    code, stdout, err = run_cli("train", "--config", str(conf), "--train", str(data / "train.txt"),
        "--out", str(out),
    )  # fmt: skip
    assert code == 2 and stdout == ""
    assert err.startswith(f"rnnkit train: error: {conf}: {message}"), err
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()  # refused before anything was written


def test_an_option_of_the_command_line_is_not_blamed_on_the_file(data, tmp_path, run_cli):
    conf = tmp_path / "c.toml"
    conf.write_text("hidden = 0\n")  # overridden: still checked for its type, not its range
    where = ["--train", str(data / "train.txt"), "--out", str(tmp_path / "r")]
    code, _, err = run_cli(
        "train", "--config", str(conf), "--hidden", "8", "--dropout", "5", *where
    )
    assert code == 2 and err == "rnnkit train: error: --dropout must be in [0, 1), got 5.0\n"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"hidden = = 3\n", "not valid TOML: Invalid value (at line 1, column 10)"),
        (b"unit = '\xff'\n", "{path}:1: invalid UTF-8 at byte 9 of the line (byte 0xff)\n"),
        # the byte-order mark is counted: the file's own bytes
        (b"\xef\xbb\xbfa = 1\nunit = '\xff'\n", "{path}:2: invalid UTF-8 at byte 9 of the line"),
        (b"# a comment\r\n" * 1500 + b"u = '\xff'\r\n", "{path}:1501: invalid UTF-8 at byte 6 "),
        (b"x = " + b"[" * 100_000, "not valid TOML: "),
        (b"hidden = " + b"9" * 5000 + b"\n", "not valid TOML: an integer with too many digits"),
        (None, "--config {path}: file not found"),
        ("fifo", "--config {path}: is a FIFO, not a regular file"),
        ("dir", "--config {path}: is a directory, not a regular file"),
        (b"#" * (1 << 20) + b"\n", "--config {path}: larger than 1,048,576 bytes: not a "
         "configuration"),
    ],
)  # fmt: skip
def test_an_unreadable_file_is_one_line(data, tmp_path, run_cli, content, message):
    path = tmp_path / "c.toml"
    if content == "fifo":
        os.mkfifo(path)  # refused at once, never waited on
    elif content == "dir":
        path.mkdir()
    elif content is not None:
        path.write_bytes(content)
    where = ["--train", str(data / "train.txt"), "--out", str(tmp_path / "r")]
    code, _, err = run_cli("train", "--config", str(path), *where)
    assert code == 2 and len(err.splitlines()) == 1, err
    expected = message.format(path=path)
    if not expected.startswith(("--config", str(path))):
        expected = f"{path}: {expected}"
    assert err.startswith(f"rnnkit train: error: {expected}"), err


def test_train_and_out_are_required_here_or_in_the_file(tmp_path, run_cli):
    code, _, err = run_cli("train", "--train", "x.txt")
    assert code == 2 and err == (
        "rnnkit train: error: --out is required (on the command line or in --config)\n"
    )


def test_an_empty_out_or_train_is_empty_not_missing(tmp_path, run_cli):
    """``--out ''`` (or ``out = ""`` in the file) was "--out is required": an empty path
    is never read as not given, and is refused as ``--valid ''`` is, as empty."""
    code, _, err = run_cli("train", "--train", "x.txt", "--out", "")
    assert code == 2 and err == "rnnkit train: error: --out is empty: name the run directory\n"
    conf = tmp_path / "c.toml"
    conf.write_text('train = "x.txt"\nout = ""\n')
    code, _, err = run_cli("train", "--config", str(conf))
    assert code == 2 and err == (
        f"rnnkit train: error: {conf}: out: --out is empty: name the run directory\n"
    )
    code, _, err = run_cli("train", "--train", "", "--out", str(tmp_path / "run"))
    assert code == 2 and err == "rnnkit train: error: --train is empty: name a data file\n"
    assert not (tmp_path / "run").exists()


# -- --resume: the file's options are requests -------------------------------------------------
def test_resume_with_a_file_takes_its_options_as_requests(data, tmp_path, capsys, run_cli):
    out = tmp_path / "run"
    tiny = ["--hidden", "8", "--embedding", "8", "--batch-size", "4", "--bptt", "segment:16",
            "--ngram-order", "3", "--no-report", "-q"]  # fmt: skip
    args = ["train", "--train", str(data / "train.txt"), "--out", str(out), *tiny]
    assert run_cli(*args, "--steps", "2")[0] == 0
    conf = tmp_path / "resume.toml"
    # the run's own configuration, printed by --print-config on --resume, resumes it
    conf.write_text(printed(run_cli, *args[1:], "--resume", "--steps", "4"))
    assert values(conf.read_text())["steps"] == 4
    code, _, err = run_cli("train", "--config", str(conf), "--resume", "-q")
    assert code == 0, err
    assert json.loads((out / "summary.json").read_text())["steps"] == 4
    # a changeable option from the file is taken; a model option that differs is refused
    conf.write_text(conf.read_text().replace("steps = 4", "steps = 5"))
    assert run_cli("train", "--config", str(conf), "--resume", "-q")[0] == 0
    assert json.loads((out / "summary.json").read_text())["steps"] == 5
    conf.write_text(conf.read_text().replace("hidden = 8", "hidden = 9"))
    code, _, err = run_cli("train", "--config", str(conf), "--resume", "--steps", "6")
    assert code == 2 and err.startswith(
        f"rnnkit train: error: {conf}: hidden: --hidden differs from the run being resumed "
        f"(8 in {out}/config.json)"
    ), err
    # given at its default value in the file, it is still a request: refused when it differs
    conf.write_text("lr = 0.002\n")  # the default; this run was trained with it: accepted
    again = ["--train", str(data / "train.txt"), "--out", str(out)]
    assert run_cli("train", "--config", str(conf), "--resume", *again, "--steps", "6")[0] == 0
    conf.write_text("dropout = 0.3\nlayers = 1\n")  # the lm task's dropout; one layer
    code, _, err = run_cli("train", "--config", str(conf), "--resume", *again, "--steps", "7")
    assert code == 2 and f"{conf}: layers: --layers differs" in err


def test_resume_prints_the_validation_file_the_run_goes_on_reading(data, tmp_path, run_cli):
    """``--resume --print-config`` without ``--valid`` printed ``# valid (not set)``: the
    file, loaded with ``--config`` into a new run, validated on a split of the training
    file instead of the run's own validation file."""
    out, again = tmp_path / "run", tmp_path / "again"
    tiny = ["--hidden", "8", "--embedding", "8", "--batch-size", "4", "--bptt", "segment:16",
            "--ngram-order", "3", "--no-report", "-q", "--steps", "2"]  # fmt: skip
    valid = tmp_path / "valid.txt"
    valid.write_text((data / "train.txt").read_text()[:300])
    args = ["--train", str(data / "train.txt"), "--valid", str(valid), "--out", str(out)]
    assert run_cli("train", *args, *tiny)[0] == 0
    text = printed(run_cli, "--out", str(out), "--resume")
    assert values(text)["valid"] == str(valid.resolve())
    conf = tmp_path / "resumed.toml"
    conf.write_text(text)
    assert run_cli("train", "--config", str(conf), "--out", str(again), "-q")[0] == 0
    recorded = [json.loads((d / "config.json").read_text())["data"] for d in (out, again)]
    assert recorded[0] == recorded[1]
    valid.unlink()  # printed, it would load into a run that cannot start
    code, printed_out, err = run_cli("train", "--out", str(out), "--resume", "--print-config")
    assert (code, printed_out) == (2, "") and err == (
        f"rnnkit train: error: --resume: the valid file of this run, {valid.resolve()}, is "
        "gone; give it with --valid\n"
    )


# -- --print-config ------------------------------------------------------------------------------
CONFIGS = [
    ["--task", "lm", "--cell", "gru", "--update", "keep", "--steps", "7", "--no-clip",
     "--lr-schedule", "cosine", "--log-every", "3", "--tensorboard", "tb dir/é"],
    ["--task", "lm", "--cell", "rnn", "--layers", "2", "--nonlinearity", "tanh,sigmoid",
     "--bptt", "full", "--length", "stop", "--max-time", "1e-3", "--lr", "1e-05"],
    ["--task", "lm", "--wiring", "jordan", "--nonlinearity", "relu", "--bptt", "full"],
    ["--task", "tag", "--char-rnn", "--tag-column", "xpos", "--seed", "-4"],
    ["--task", "tag", "--no-char-rnn", "--word-dropout", "0.1"],
    ["--task", "classify", "--pooling", "max", "--unit", "word", "--dropout", "0.25"],
    ["--task", "seq2seq", "--attention", "additive", "--beam", "3", "--max-parameters", "900000"],
    ["--task", "events", "--target-fpr", "0.001", "--window", "5", "--score", "mean"],
    ["--task", "regress", "--target", "value", "--loss", "gaussian", "--cell", "gru"],
]  # fmt: skip


@pytest.mark.parametrize("options", CONFIGS, ids=[c[1] for c in CONFIGS])
def test_print_config_loads_back_to_the_same_configuration(tmp_path, run_cli, options):
    odd = 'data "quoted"\\back\tslash\x7f ü.txt'  # a path TOML must escape
    first = printed(run_cli, "--train", odd, "--out", str(tmp_path / "r"), *options)
    assert not (tmp_path / "r").exists()  # printing trains nothing, writes nothing
    conf = tmp_path / "run.toml"
    conf.write_text(first, encoding="utf-8")
    second = printed(run_cli, "--config", str(conf))
    assert second == first  # round trip: the same text
    loaded = values(first)
    assert loaded["train"] == odd
    # every option given is in it with its value; options of other tasks are not
    flags = [o[2:] for o in options if o.startswith("--")]
    for flag in flags:
        assert flag in loaded or flag in ("no-clip", "no-char-rnn"), flag
    if "--no-clip" in options:
        assert loaded["no-clip"] is True and "clip-norm" not in loaded
    if "--no-char-rnn" in options:  # the switch is printed off, its opposite not at all
        assert loaded["char-rnn"] is False and "no-char-rnn" not in loaded
    task = loaded["task"]
    if task != "classify":
        assert "pooling" not in loaded
    if task in ("lm", "events"):
        assert "bidirectional" not in loaded
    if task != "events":
        assert "target-fpr" not in loaded


def test_the_printed_configuration_trains_the_same_run(data, tmp_path, capsys, run_cli):
    options = ["--hidden", "8", "--embedding", "8", "--batch-size", "4", "--steps", "2", "-q"]
    options += ["--bptt", "segment:16", "--ngram-order", "3", "--no-report", "--lr", "0.003"]
    direct, via_file = tmp_path / "direct", tmp_path / "file"
    train = ["--train", str(data / "train.txt")]
    assert run_cli("train", *train, "--out", str(direct), *options)[0] == 0
    conf = tmp_path / "run.toml"
    conf.write_text(printed(run_cli, *train, "--out", str(via_file), *options))
    assert run_cli("train", "--config", str(conf), "-q")[0] == 0
    a = json.loads((direct / "config.json").read_text())["config"]
    b = json.loads((via_file / "config.json").read_text())["config"]
    assert {**a, "out": None} == {**b, "out": None}
    from safetensors.torch import load_file

    weights = [load_file(d / "model.safetensors") for d in (direct, via_file)]
    assert weights[0].keys() == weights[1].keys()
    assert all(weights[0][k].equal(weights[1][k]) for k in weights[0])


def test_print_config_without_data_is_a_template(tmp_path, capsys, run_cli):
    template = printed(run_cli, "--task", "classify")
    assert "# train (not set)" in template and "# out (not set)" in template
    assert values(template)["pooling"] == "max"  # the defaults, to edit
    conf = tmp_path / "t.toml"
    conf.write_text(template)
    filled = printed(run_cli, "--config", str(conf), "--train", "a.txt", "--out", "r")
    assert filled == printed(run_cli, "--task", "classify", "--train", "a.txt", "--out", "r")
    code, _, err = run_cli("train", "--print-config", "--resume")
    assert code == 2 and "--train is required" in err


def test_verbose_shows_the_effective_configuration(data, tmp_path, run_cli):
    code, _, err = run_cli("train", "--train", str(data / "train.txt"), "--out",
        str(tmp_path / "r"),
        "--hidden", "8", "--embedding", "8", "--batch-size", "4", "--steps", "1", "--bptt",
        "segment:16", "--no-report", "-v",
    )  # fmt: skip
    assert code == 0, err
    start = err.index("rnnkit: the effective configuration (--print-config):\n")
    assert "\nhidden = 8\n" in err[start:] and "\nsteps = 1\n" in err[start:]


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.text(st.characters(exclude_categories=["Cs"])),
        st.floats(allow_nan=True, allow_infinity=True),
        st.integers(min_value=-(2**63), max_value=2**63 - 1),
        st.booleans(),
    )
)
def test_toml_values_read_back_equal(value):
    back = tomllib.loads(f"v = {toml_value(value)}\n")["v"]
    if isinstance(value, float) and math.isnan(value):
        assert math.isnan(back)
    else:
        assert back == value and type(back) is type(value)


def test_a_tasks_own_default_is_printed_and_yields_to_the_file(tmp_path, run_cli):
    """``regress`` trains at its own default rate (``rnnkit.app.config.TASK_DEFAULTS``):
    ``--print-config`` shows it, and a rate in the file counts as given, even the global
    default's value."""
    base = ("--task", "regress", "--train", "x.jsonl", "--out", str(tmp_path / "r"))
    assert values(printed(run_cli, *base))["lr"] == 0.005
    conf = tmp_path / "run.toml"
    conf.write_text("lr = 0.002\n")
    assert values(printed(run_cli, *base, "--config", str(conf)))["lr"] == 0.002


# -- YAML ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["c.toml", "c.yaml"])
def test_a_byte_order_mark_is_dropped(tmp_path, run_cli, name):
    """A file saved by an editor that writes a UTF-8 byte-order mark was refused as
    ``not valid TOML: Invalid statement (at line 1, column 1)``; it reads as without one."""
    path = tmp_path / name
    text = 'task = "tag"\nhidden = 16\n' if name.endswith("toml") else "task: tag\nhidden: 16\n"
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())
    assert values(printed(run_cli, "--config", str(path)))["hidden"] == 16


def test_a_yaml_file_sets_the_same_options_as_toml(tmp_path, run_cli):
    toml_file, yaml_file = tmp_path / "c.toml", tmp_path / "c.yaml"
    toml_file.write_text('task = "classify"\nhidden = 16\nlr = 1.0e-3\nbidirectional = true\n')
    yaml_file.write_text("task: classify\nhidden: 16\nlr: 1.0e-3\nbidirectional: true\n")
    from_toml = values(printed(run_cli, "--config", str(toml_file)))
    assert values(printed(run_cli, "--config", str(yaml_file))) == from_toml
    assert (from_toml["hidden"], from_toml["lr"]) == (16, 0.001)
    # a merge key is YAML's own, not a key given twice
    yaml_file.write_text("<<: {hidden: 16, lr: 1.0e-3}\ntask: classify\nbidirectional: true\n")
    assert values(printed(run_cli, "--config", str(yaml_file))) == from_toml


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("hidden: [1, 2\n", "not valid YAML"),
        ("- hidden\n- 16\n", "a YAML configuration is a mapping of option names"),
        ("lr: 1e-3\n", "lr"),  # YAML 1.1 reads 1e-3 as a string: refused like any wrong type
        ("hidden: " + "9" * 5000 + "\n", "not valid YAML: an integer with too many digits"),
        # PyYAML kept the last in silence; TOML refuses a key given twice
        ("hidden: 8\nhidden: 16\n", "not valid YAML: key 'hidden' given twice"),
        ("? [a, b]\n: 1\n", "not valid YAML: while constructing a mapping"),  # unhashable
    ],
)
def test_a_bad_yaml_file_is_one_line(tmp_path, run_cli, text, message):
    conf = tmp_path / "bad.yml"
    conf.write_text(text)
    code, _, err = run_cli("train", "--config", str(conf), "--print-config")
    assert code == 2 and message in err and str(conf) in err
    assert len(err.strip().splitlines()) == 1, err
