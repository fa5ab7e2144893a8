"""``rnnkit train`` / ``rnnkit evaluate`` end to end on a tiny generated corpus: the run
directory, ``evaluate --json``, exact ``--resume``, every truncation mode and unit, and bad
input (one line on stderr, non-zero exit, no traceback, nothing half-written)."""

from __future__ import annotations

import hashlib
import json
import math
import os
import pickle
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rnnkit.app.cli.main import main

WORDS = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "to", "big", "red", "hat"]
TINY = ["--hidden", "8", "--embedding", "8", "--batch-size", "4", "--ngram-order", "3"]
CHECKPOINT_FILES = {"model.safetensors", "latest.json", "snapshots", "summary.json"}


@pytest.fixture(autouse=True, scope="module")
def _one_thread(single_thread):
    # Tiny models: threads only add contention (and time) on a shared machine.
    yield


def corpus(lines, seed):
    rng = random.Random(seed)
    return "".join(
        " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 7))) + "\n" for _ in range(lines)
    )


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("data")
    (d / "train.txt").write_text(corpus(80, 0), encoding="utf-8")
    (d / "valid.txt").write_text(corpus(12, 1), encoding="utf-8")
    return d


def train_args(data: Path, out: Path, *extra: str) -> list[str]:
    return [
        "train",
        "--train",
        str(data / "train.txt"),
        "--out",
        str(out),
        *TINY,
        "--bptt",
        "segment:16",
        "--steps",
        "6",
        "--quiet",
        *extra,
    ]


def skip_manifest(monkeypatch) -> None:
    """Read runs without their manifest: what the readers' own checks catch."""
    monkeypatch.setenv("RNNKIT_SKIP_CHECKSUMS", "1")


def assert_one_line_error(code, err, *words):
    assert code not in (0, None), err
    assert "Traceback" not in err
    lines = err.strip("\n").splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {err!r}"
    for word in words:
        assert word in lines[0], lines[0]


def assert_nothing_half_written(out: Path):
    if not out.exists():
        return
    names = set(os.listdir(out))
    assert not names & CHECKPOINT_FILES, names
    assert not [p for p in out.rglob("*") if ".tmp" in p.name]


def digest_tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def snapshot_tensors(out: Path) -> tuple[int, dict[str, torch.Tensor]]:
    pointer = json.loads((out / "latest.json").read_text())
    return pointer["step"], load_file(str(out / pointer["snapshot"] / "model.safetensors"))


@pytest.fixture(scope="module")
def run(data, tmp_path_factory) -> Path:
    """A trained char run with a validation file."""
    out = tmp_path_factory.mktemp("runs") / "char"
    code = main(train_args(data, out, "--valid", str(data / "valid.txt"), "--dropout", "0.1"))
    assert code == 0
    return out


# -- the run directory ------------------------------------------------------------------------
def test_train_writes_a_complete_run_directory(run):
    for name in (
        "config.json",
        "vocab.json",
        "model.safetensors",
        "latest.json",
        "metrics.jsonl",
        "summary.json",
        "ngram.safetensors",
    ):
        assert (run / name).is_file(), name
    assert not [p for p in run.rglob("*") if ".tmp" in p.name]
    config = json.loads((run / "config.json").read_text())
    assert config["config"]["hidden"] == 8 and config["config"]["dropout"] == 0.1
    events = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert {"train", "valid"} <= {e["event"] for e in events}
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 6 and summary["ngram"]["order"] == 3
    assert summary["valid"]["bits_per_char"] == pytest.approx(
        summary["valid"]["loss_nats"] / math.log(2)
    )
    step, tensors = snapshot_tensors(run)
    assert step == 6 and "embedding.weight" in tensors


def test_train_prints_the_model_next_to_the_baseline(data, tmp_path, run_cli):
    code, out, err = run_cli(*train_args(data, tmp_path / "r"))
    assert code == 0
    assert "trained 6 steps" in out
    assert "validation bits/char: recurrent" in out and "3-gram baseline" in out
    # Six steps leave the model behind the n-gram: one line on stderr says so and why.
    (line,) = err.splitlines()
    assert line.startswith("rnnkit: behind baseline: validation bits/char ")
    assert "for the 3-gram, after 6 steps" in line and "--steps 6" in line


def test_train_json_prints_one_object(data, tmp_path, run_cli):
    code, out, _ = run_cli(*train_args(data, tmp_path / "r", "--json"))
    assert code == 0
    (line,) = out.strip().splitlines()
    summary = json.loads(line)
    assert summary["steps"] == 6 and "bits_per_char" in summary["valid"]
    behind = summary["behind_baseline"]
    assert behind["metric"] == "bits_per_char" and behind["still_improving"] is True
    assert behind["model"] == summary["valid"]["bits_per_char"] > behind["baseline"]
    assert behind["baseline"] == summary["ngram"]["bits_per_char"]


def test_evaluate_json(run, data, run_cli):
    code, out, err = run_cli(
        "evaluate", "--checkpoint", str(run), "--data", str(data / "valid.txt"), "--json"
    )
    assert code == 0 and err == ""
    (line,) = out.strip().splitlines()
    metrics = json.loads(line)
    assert isinstance(metrics, dict)
    assert metrics["tokens"] > 0 and isinstance(metrics["tokens"], int)
    assert metrics["perplexity"] == pytest.approx(math.exp(metrics["loss_nats"]))
    assert metrics["bits_per_char"] == pytest.approx(metrics["loss_nats"] / math.log(2))
    ngram = metrics["ngram"]
    assert ngram["order"] == 3 and ngram["bits_per_char"] > 0
    summary = json.loads((run / "summary.json").read_text())
    assert metrics["loss_nats"] == pytest.approx(summary["valid"]["loss_nats"], rel=1e-6)


def test_evaluate_prints_readable_lines(run, data, run_cli):
    code, out, _ = run_cli("evaluate", "--checkpoint", str(run), "--data", str(data / "valid.txt"))
    assert code == 0
    assert out.startswith("loss_nats: ") and "\nngram: order 3" in out


# -- exact resume -----------------------------------------------------------------------------
def test_resume_continues_exactly(data, tmp_path, run_cli):
    extra = ("--dropout", "0.2", "--doc-boundary", "line", "--layers", "2", "--bptt", "segment:8")
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert run_cli(*train_args(data, straight, *extra), "--steps", "11")[0] == 0
    assert run_cli(*train_args(data, split, *extra))[0] == 0  # 6 steps
    _, after_6 = snapshot_tensors(split)
    # The run's own config holds on --resume: only how long to train is given again.
    code, _, err = run_cli(
        "train",
        "--train",
        str(data / "train.txt"),
        "--out",
        str(split),
        "--resume",
        "--steps",
        "11",
        "--quiet",
    )
    assert code == 0, err
    (step_a, a), (step_b, b) = snapshot_tensors(straight), snapshot_tensors(split)
    assert step_a == step_b == 11
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert not torch.equal(after_6["head.weight"], b["head.weight"])
    config = json.loads((split / "config.json").read_text())["config"]
    assert config["steps"] == 11  # the budget it goes on with: a plain --resume keeps it


def test_resume_of_a_moved_run_trains_where_the_run_is_now(data, tmp_path, run_cli):
    first, moved = tmp_path / "first", tmp_path / "moved"
    assert run_cli(*train_args(data, first))[0] == 0
    shutil.move(first, moved)
    code, _, err = run_cli(*train_args(data, moved, "--resume", "--steps", "8"))
    assert code == 0, err
    assert not first.exists()  # nothing written where config.json says the run was
    assert snapshot_tensors(moved)[0] == 8


# -- every mode -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "extra",
    [
        ("--bptt", "full"),
        ("--bptt", "window:3", "--cell", "gru"),
        ("--unit", "word", "--cell", "rnn", "--tie-weights"),
        ("--unit", "word", "--bptt", "window:2", "--optimizer", "sgd", "--lr", "0.5"),
    ],
    ids=["full", "window", "word-segment", "word-window-sgd"],
)
def test_modes_train_and_evaluate_end_to_end(data, tmp_path, run_cli, extra):
    out = tmp_path / "r"
    code, _, err = run_cli(*train_args(data, out, *extra))
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 6 and math.isfinite(summary["valid"]["loss_nats"])
    code, stdout, _ = run_cli(
        "evaluate", "--checkpoint", str(out), "--data", str(data / "valid.txt"), "--json"
    )
    assert code == 0
    metrics = json.loads(stdout)
    word = "word" in extra
    assert ("bits_per_char" in metrics) is not word
    assert math.isfinite(metrics["perplexity"]) and "ngram" in metrics


# -- bad input --------------------------------------------------------------------------------
def write(path: Path, content: bytes) -> Path:
    path.write_bytes(content)
    return path


BAD_TRAIN = {
    "missing-file": (lambda d: ["--train", str(d / "nope.txt")], ["nope.txt", "file not found"]),
    "directory": (lambda d: ["--train", str(d)], ["is a directory"]),
    "empty-corpus": (lambda d: ["--train", str(write(d / "e.txt", b""))], ["e.txt", "empty"]),
    "whitespace-corpus": (
        lambda d: ["--train", str(write(d / "w.txt", b" \n\n\t\n"))],
        ["w.txt", "empty"],
    ),
    "invalid-utf8": (
        lambda d: ["--train", str(write(d / "u.txt", b"hello\nwor\xffld\n" * 3))],
        ["u.txt:2: invalid UTF-8 at byte 4 of the line (byte 0xff)"],
    ),
    "missing-valid": (
        lambda d: ["--train", str(d / "train.txt"), "--valid", str(d / "v.txt")],
        ["v.txt", "file not found"],
    ),
    "hidden-0": (lambda d: ["--hidden", "0"], ["--hidden must be ≥ 1, got 0"]),
    "bptt-window-0": (lambda d: ["--bptt", "window:0"], ["--bptt window:K needs K ≥ 1"]),
    "bptt-garbage": (lambda d: ["--bptt", "segments"], ["--bptt must be full"]),
    "dropout-1.5": (lambda d: ["--dropout", "1.5"], ["--dropout must be in [0, 1)"]),
    "lr-0": (lambda d: ["--lr", "0"], ["--lr must be > 0"]),
    "batch-size-0": (lambda d: ["--batch-size", "0"], ["--batch-size"]),
    "hidden-not-int": (lambda d: ["--hidden", "eight"], ["--hidden", "invalid int value"]),
    "unknown-option": (lambda d: ["--hiden", "8"], ["unrecognized arguments: --hiden"]),
    "unknown-cell": (lambda d: ["--cell", "transformer"], ["--cell", "invalid choice"]),
    "malformed-line": (lambda d: ["--task", "tag"], ["train.txt:1"]),  # text is not tagged
}


@pytest.mark.parametrize("case", list(BAD_TRAIN), ids=list(BAD_TRAIN))
def test_bad_train_input_is_one_line_and_writes_nothing(data, tmp_path, run_cli, case):
    make, words = BAD_TRAIN[case]
    inputs = tmp_path / "in"
    inputs.mkdir()
    shutil.copy(data / "train.txt", inputs / "train.txt")
    out = tmp_path / "out"
    argv = train_args(inputs, out)
    extra = make(inputs)
    if extra[0] == "--train":  # replace the corpus instead of adding a second --train
        argv[argv.index("--train") + 1] = extra[1]
        extra = extra[2:]
    if "--task" in extra:  # --bptt and --ngram-order are language-model options
        for option in ("--bptt", "--ngram-order"):
            del argv[argv.index(option) : argv.index(option) + 2]
    code, _, err = run_cli(*argv, *extra)
    assert_one_line_error(code, err, *words)
    assert_nothing_half_written(out)


def test_missing_required_option(run_cli, tmp_path):
    code, _, err = run_cli("train", "--out", str(tmp_path / "o"))
    assert_one_line_error(code, err, "required", "--train")


def test_resume_with_a_changed_model_is_refused_and_changes_nothing(run, data, run_cli):
    before = digest_tree(run)
    code, _, err = run_cli(*train_args(data, run, "--resume", "--hidden", "16", "--steps", "9"))
    assert_one_line_error(code, err, "--hidden differs", "config.json")
    assert digest_tree(run) == before


def test_resume_with_an_option_given_at_its_default_is_refused(data, tmp_path, run_cli):
    """``--cell lstm`` is the default, but given on a GRU run's --resume it is a request for
    another model: refused like any change, not silently ignored as if omitted."""
    out = tmp_path / "gru"
    assert run_cli(*train_args(data, out, "--cell", "gru"))[0] == 0
    before = digest_tree(out)
    code, _, err = run_cli(*train_args(data, out, "--resume", "--cell", "lstm"))
    assert_one_line_error(code, err, "--cell differs", "'gru'")
    assert digest_tree(out) == before
    # Omitted, it stays the run's own: the resume trains on as a GRU.
    assert run_cli(*train_args(data, out, "--resume", "--steps", "8"))[0] == 0
    saved = json.loads((out / "config.json").read_text())["config"]
    assert saved["cell"] == "gru"


def test_resume_without_a_run_is_refused(data, tmp_path, run_cli):
    code, _, err = run_cli(*train_args(data, tmp_path / "none", "--resume"))
    assert_one_line_error(code, err, "no such checkpoint directory")
    assert not (tmp_path / "none").exists()


def test_resume_from_a_corrupted_snapshot_is_refused(run, data, tmp_path, run_cli):
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    pointer = json.loads((copy / "latest.json").read_text())
    weights = copy / pointer["snapshot"] / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-16])
    before = digest_tree(copy)
    code, _, err = run_cli(
        "train",
        "--train",
        str(data / "train.txt"),
        "--out",
        str(copy),
        "--resume",
        "--steps",
        "9",
        "--quiet",
    )
    assert_one_line_error(code, err, str(weights), "checksum")
    assert digest_tree(copy) == before


def test_divergence_stops_with_one_line_and_no_checkpoint(data, tmp_path, run_cli):
    out = tmp_path / "r"
    code, _, err = run_cli(
        *train_args(data, out, "--optimizer", "sgd", "--lr", "1e38", "--no-clip")
    )
    assert_one_line_error(code, err, "training loss is", "at step")
    assert_nothing_half_written(out)


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_evaluate_refuses_a_pickle_in_place_of_the_weights(run, data, tmp_path, run_cli):
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    marker = tmp_path / "pwned"
    (copy / "model.safetensors").write_bytes(pickle.dumps({"x": _Payload(marker)}))
    code, out, err = run_cli(
        "evaluate", "--checkpoint", str(copy), "--data", str(data / "valid.txt")
    )
    assert_one_line_error(code, err, "model.safetensors")
    assert out == "" and not marker.exists()


@pytest.mark.parametrize(
    ("case", "words"),
    [
        ("no-checkpoint", ["no such checkpoint directory"]),
        ("missing-data", ["missing.txt", "file not found"]),
        ("invalid-utf8", ["bad.txt:1: invalid UTF-8 at byte 4 of the line (byte 0xc3)"]),
    ],
)
def test_bad_evaluate_input_is_one_line(run, tmp_path, run_cli, case, words):
    checkpoint, path = str(run), str(tmp_path / "missing.txt")
    if case == "no-checkpoint":
        checkpoint = str(tmp_path / "nothing")
        path = str(write(tmp_path / "ok.txt", b"the cat\n"))
    elif case == "invalid-utf8":
        path = str(write(tmp_path / "bad.txt", b"the\xc3(cat\n"))
    code, out, err = run_cli("evaluate", "--checkpoint", checkpoint, "--data", path, "--json")
    assert_one_line_error(code, err, *words)
    assert out == ""


# -- the installed entry points ---------------------------------------------------------------
def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "error"}


def test_console_script_reports_bad_input_in_one_line(data, tmp_path):
    script = Path(sys.executable).parent / "rnnkit"
    if not script.exists():
        pytest.skip("the rnnkit console script is not installed next to this Python")
    argv = [str(script), *train_args(data, tmp_path / "b", "--hidden", "0")]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=_env())
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == ["rnnkit train: error: --hidden must be ≥ 1, got 0"]
    assert not (tmp_path / "b").exists()


def test_python_m_rnnkit_trains(data, tmp_path):
    out = tmp_path / "r"
    argv = [sys.executable, "-m", "rnnkit", *train_args(data, out, "--steps", "2", "--json")]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=_env())
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["steps"] == 2
    assert (out / "model.safetensors").is_file()


@pytest.mark.parametrize("mode", ["stop", "skip"])
def test_diverging_run_ends_with_one_line_in_both_nonfinite_modes(data, tmp_path, capsys, mode):
    """A learning rate of 1e38 makes every step after the first non-finite: ``stop`` ends at
    once, ``skip`` after MAX_SKIPPED_STEPS skipped steps — never a loop that runs forever."""
    from rnnkit.training.nonfinite import MAX_SKIPPED_STEPS

    out = tmp_path / "run"
    args = train_args(data, out, "--steps", "6", "--lr", "1e38", "--no-clip")
    code = main([*args, "--optimizer", "sgd", "--on-nonfinite", mode])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and len(err) == 1, err
    assert "is inf at step 2" in err[0] or "is nan at step 2" in err[0]
    assert (f"{MAX_SKIPPED_STEPS} steps in a row were skipped" in err[0]) == (mode == "skip")
    config = json.loads((out / "config.json").read_text())["config"]
    assert config["on_nonfinite"] == mode
    assert csv_matches_jsonl(out)  # the table is written however training ends


def test_recompute_trains_the_same_weights(data, tmp_path, run_cli):
    """``--recompute K`` changes what is stored, not what is learned: the same run with and
    without it ends with the same weights (float32 round-off apart)."""
    runs = {}
    for name, extra in (("stored", ()), ("recomputed", ("--recompute", "3"))):
        out = tmp_path / name
        assert run_cli(*train_args(data, out, "--bptt", "full", *extra))[0] == 0
        runs[name] = load_file(str(out / "model.safetensors"))
        saved = json.loads((out / "config.json").read_text())["config"]
        assert saved["recompute"] == (3 if extra else None)
    for key, value in runs["stored"].items():
        torch.testing.assert_close(runs["recomputed"][key], value, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--recompute", "0"), "--recompute must be ≥ 1, got 0"),
        (("--recompute", "4", "--bptt", "window:3"), "--recompute cannot be combined with"),
        (("--recompute", "4", "--wiring", "jordan"), "--recompute 4 does not apply to --wiring"),
    ],
)
def test_bad_recompute_is_one_line(data, tmp_path, run_cli, extra, message):
    code, _, err = run_cli(*train_args(data, tmp_path / "run", *extra))
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("task", "extra", "words"),
    [
        ("tag", ("--scheduled-sampling", "linear:5"), ("--scheduled-sampling", "--task tag")),
        ("lm", ("--bidirectional",), ("--bidirectional", "--task lm")),
        ("classify", ("--attention", "dot"), ("--attention", "--task classify", "seq2seq")),
        ("tag", ("--pooling", "last"), ("--pooling", "--task tag", "classify")),
        ("events", ("--unit", "char"), ("--unit", "--task events")),
        ("seq2seq", ("--bptt", "full"), ("--bptt", "--task seq2seq")),
        ("lm", ("--cell", "lstm", "--update", "keep"), ("--update", "--cell lstm")),
        ("lm", ("--cell", "gru", "--nonlinearity", "tanh"), ("--nonlinearity", "--cell gru")),
    ],
)
def test_an_option_the_task_does_not_read_is_refused(data, tmp_path, run_cli, task, extra, words):
    """Given at its default value too: what argv set counts, not what differs."""
    out = tmp_path / "run"
    argv = ["train", "--task", task, "--train", str(data / "train.txt"), "--out", str(out)]
    code, _, err = run_cli(*argv, *extra)
    assert code == 2
    assert_one_line_error(code, err, "does not apply to", *words)
    assert not out.exists()


def test_help_says_which_tasks_an_option_belongs_to(run_cli):
    code, out, _ = run_cli("train", "--help")
    assert code == 0
    text = " ".join(out.split())  # argparse wraps lines
    assert "classify options:" in text and "seq2seq options:" in text
    assert (
        "--pooling {last,mean,max} how the encoder states become one vector (default max) "
        "[tasks: classify]" in text
    )
    assert "[tasks: classify, seq2seq, regress]" in text  # --bidirectional
    assert "[cells: gru]" in text  # --update / --reset


# -- no budget: until validation stops improving -----------------------------------------------
def test_with_no_budget_train_stops_by_itself_and_says_why(data, tmp_path, run_cli):
    out = tmp_path / "r"
    argv = ["train", "--train", str(data / "train.txt"), "--valid", str(data / "valid.txt")]
    code, stdout, _ = run_cli(
        *argv, "--out", str(out), *TINY, "--bptt", "segment:16", "--lr", "0.03"
    )
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stopped_early"], summary
    assert summary["stopped"].startswith("no improvement for ")
    best = summary["valid"]["step"]
    assert f"stopped: {summary['stopped']}; weights of step {best}" in stdout
    config = json.loads((out / "config.json").read_text())["config"]
    assert config["epochs"] is None and config["steps"] is None
    events = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    valid = [e for e in events if e["event"] == "valid"]
    assert len(valid) >= 10
    assert min(valid, key=lambda e: e["loss_nats"])["step"] == best < summary["steps"]
    # several validations per epoch, all with the rate in force
    assert len({e["epoch"] for e in valid}) < len(valid) and all("lr" in e for e in valid)


def test_one_nonlinearity_per_layer_trains_saves_and_reloads(data, tmp_path, run_cli):
    """--nonlinearity tanh,sigmoid on two layers: the layers are built so, the run is saved
    with it, and evaluate rebuilds the same model (the loss it prints is the run's own)."""
    from rnnkit.app.tasks.lm import load_lm

    out = tmp_path / "mixed"
    mixed = ("--cell", "rnn", "--layers", "2", "--nonlinearity", "tanh,sigmoid")
    argv = train_args(data, out, "--valid", str(data / "valid.txt"), *mixed)
    code, _, err = run_cli(*argv)
    assert code == 0, err
    model = load_lm(out)[2]
    assert [c.nonlinearity for c in model.encoder.cells()] == ["tanh", "sigmoid"]
    code, text, err = run_cli(
        "evaluate", "--checkpoint", str(out), "--data", str(data / "valid.txt"), "--json"
    )
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text())
    assert json.loads(text)["loss_nats"] == pytest.approx(summary["valid"]["loss_nats"], rel=1e-6)
    code, _, err = run_cli(*train_args(data, tmp_path / "bad", "--nonlinearity", "tanh,relu"))
    assert_one_line_error(code, err, "--nonlinearity tanh,relu", "--cell rnn")


def test_lm_scheduled_sampling_trains_with_its_schedule(data, tmp_path, run_cli):
    out = tmp_path / "ss"
    argv = train_args(data, out, "--bptt", "full", "--scheduled-sampling", "linear:8", "--json")
    code, text, err = run_cli(*argv)
    assert code == 0, err
    summary = json.loads(text.strip().splitlines()[-1])
    assert summary["steps"] == 6 and summary["scheduled_sampling_p"] == pytest.approx(6 / 8)
    assert json.loads((out / "config.json").read_text())["config"]["scheduled_sampling"] == (
        "linear:8"
    )
    code, _, err = run_cli(*train_args(data, tmp_path / "x", "--scheduled-sampling", "linear:8"))
    assert_one_line_error(code, err, "--scheduled-sampling on --task lm needs --bptt full")


def test_loss_reduction_sequence_is_saved_and_refused_on_streams(data, tmp_path, run_cli):
    out = tmp_path / "seq"
    code, _, err = run_cli(*train_args(data, out, "--bptt", "full", "--loss-reduction", "sequence"))
    assert code == 0, err
    assert json.loads((out / "config.json").read_text())["config"]["loss_reduction"] == "sequence"
    code, _, err = run_cli(*train_args(data, tmp_path / "x", "--loss-reduction", "sequence"))
    assert_one_line_error(code, err, "--loss-reduction sequence needs whole sequences")


# -- shared and hostile run directories ---------------------------------------------------------
def test_training_into_an_existing_run_is_refused_unless_resume_or_overwrite(
    run, data, tmp_path, run_cli
):
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    # the old run's report (rnnkit's page: a page of the user's is never replaced)
    (copy / "report.html").write_text("<!DOCTYPE html>\n<html><title>rnnkit report: copy</title>")
    (copy / "notes.txt").write_text("mine")  # not a run file: never touched
    before = digest_tree(copy)
    code, _, err = run_cli(*train_args(data, copy, "--no-report"))
    assert_one_line_error(code, err, str(copy), "already holds a run", "--overwrite")
    assert digest_tree(copy) == before
    code, _, err = run_cli(*train_args(data, copy, "--resume", "--overwrite"))
    assert_one_line_error(code, err, "--resume and --overwrite")
    assert digest_tree(copy) == before

    code, _, err = run_cli(*train_args(data, copy, "--no-report", "--overwrite", "--steps", "2"))
    assert code == 0, err
    assert not (copy / "report.html").exists()  # it described the old run
    assert (copy / "notes.txt").read_text() == "mine"
    steps = [json.loads(x).get("step") for x in (copy / "metrics.jsonl").read_text().splitlines()]
    assert max(s for s in steps if s is not None) == 2  # the old run's 6 steps are gone
    assert json.loads((copy / "summary.json").read_text())["steps"] == 2


def test_a_new_run_that_fails_before_it_saved_leaves_the_old_run_as_it_was(
    run, data, tmp_path, run_cli
):
    # --overwrite removed the old run first: a typo in --train, or a bad byte found deep
    # in it, then lost the old run and trained nothing.
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    before = digest_tree(copy)
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"ab ba\n" * 5000 + b"\xff\n")
    for train in (tmp_path / "typo.txt", bad):
        extra = ["--overwrite", "--no-report", "--train", str(train)]
        code, _, err = run_cli(*train_args(data, copy, *extra))
        assert_one_line_error(code, err, str(train))
        assert digest_tree(copy) == before
        assert sorted(p.name for p in copy.iterdir()) == sorted(p.name for p in run.iterdir())
    # An input that is a file of the run is refused, before anything is moved.
    code, _, err = run_cli(
        *train_args(data, copy, "--overwrite", "--valid", str(copy / "vocab.json"))
    )
    assert_one_line_error(code, err, f"--valid {copy / 'vocab.json'}: is the run's vocab.json")
    assert digest_tree(copy) == before


HOLD_LOCK = """
import sys, time
from rnnkit.app.tasks.run_dir import lock_run_dir
with lock_run_dir(sys.argv[1]):
    print("locked", flush=True)
    sys.stdin.read()
"""


def test_a_run_directory_in_use_is_refused_naming_the_holder(data, tmp_path, run_cli):
    out = tmp_path / "shared"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(out)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert holder.stdout.readline() == "locked\n"
        code, _, err = run_cli(*train_args(data, out))
        assert_one_line_error(code, err, str(out), "in use", f"pid {holder.pid}")
        assert_nothing_half_written(out)
    finally:
        holder.communicate("", timeout=60)
    code, _, err = run_cli(*train_args(data, out, "--steps", "1"))  # released: trains
    assert code == 0, err


def test_every_file_of_a_run_is_readable_by_others_under_umask_022(run):
    old = os.umask(0o022)
    os.umask(old)
    assert old == 0o022, "the suite runs under the usual umask"
    modes = {
        str(p.relative_to(run)): oct(p.stat().st_mode & 0o777)
        for p in run.rglob("*")
        if p.is_file() and p.name != ".lock"
    }
    assert {"vocab.json", "ngram.safetensors", "model.safetensors"} <= set(modes)
    assert any(name.endswith("optimizer.safetensors") for name in modes)
    assert set(modes.values()) == {"0o644"}, modes


def test_flipped_bytes_in_the_final_weights_are_refused(run, data, tmp_path, run_cli, monkeypatch):
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    weights = copy / "model.safetensors"
    raw = bytearray(weights.read_bytes())
    raw[-5] ^= 0x40  # inside the tensor data: the safetensors header still parses
    raw[-9] ^= 0x01
    weights.write_bytes(bytes(raw))
    code, _, err = run_cli("evaluate", "--checkpoint", str(copy), "--data", str(data / "valid.txt"))
    assert_one_line_error(code, err, str(weights), "does not match its SHA-256 in manifest.json")
    skip_manifest(monkeypatch)  # the weights' own checksum, without the manifest
    code, _, err = run_cli("evaluate", "--checkpoint", str(copy), "--data", str(data / "valid.txt"))
    assert_one_line_error(code, err, str(weights), "checksum mismatch")
    code, _, err = run_cli("generate", "--checkpoint", str(copy))
    assert_one_line_error(code, err, str(weights), "checksum mismatch")


@pytest.fixture
def tiny_disk(tmp_path):
    """A real 200 KiB tmpfs (needs root and mount); skipped where it cannot be mounted."""
    where = tmp_path / "disk"
    where.mkdir()
    try:
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=200k", "tmpfs", str(where)],
            check=True,
            capture_output=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"cannot mount a small tmpfs here ({exc.__class__.__name__})")
    yield where
    subprocess.run(["umount", str(where)], check=False, timeout=30)


def test_a_full_disk_is_one_line_and_leaves_a_loadable_run(data, tiny_disk, run_cli):
    out = tiny_disk / "run"
    big = ["--hidden", "64", "--embedding", "64", "--eval-every", "2", "--steps", "6"]
    code, _, err = run_cli(*train_args(data, out, *big))
    assert_one_line_error(code, err, str(out), "No space left on device")
    assert code == 2
    assert not [p for p in out.rglob("*") if ".tmp" in p.name]


def test_resume_accepts_the_same_data_anywhere_and_refuses_other_data(
    data, tmp_path, run_cli, monkeypatch
):
    # The attack: a relative --train resolved from another directory holding another
    # corpus.txt of the same name.
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    shutil.copy(data / "train.txt", tmp_path / "a" / "corpus.txt")
    (tmp_path / "b" / "corpus.txt").write_text(corpus(80, 7), encoding="utf-8")
    shutil.copy(data / "valid.txt", tmp_path / "a" / "valid.txt")
    out = tmp_path / "run"
    monkeypatch.chdir(tmp_path / "a")
    base = [*TINY, "--bptt", "segment:16", "--quiet", "--out", str(out)]
    code, _, err = run_cli(
        "train", "--train", "corpus.txt", "--valid", "valid.txt", *base, "--steps", "4"
    )
    assert code == 0, err
    recorded = json.loads((out / "config.json").read_text())["data"]
    assert recorded["train"]["path"] == str(tmp_path / "a" / "corpus.txt")
    assert recorded["train"]["size"] == (tmp_path / "a" / "corpus.txt").stat().st_size

    monkeypatch.chdir(tmp_path / "b")
    before = digest_tree(out)
    code, _, err = run_cli("train", "--train", "corpus.txt", *base, "--resume", "--steps", "6")
    assert_one_line_error(code, err, "--train corpus.txt is not the data this run was trained on")
    assert str(tmp_path / "a" / "corpus.txt") in err
    assert digest_tree(out) == before

    # The same content under another name and place is the same data: it resumes, and
    # the validation file is found by its recorded absolute path.
    shutil.copy(tmp_path / "a" / "corpus.txt", tmp_path / "b" / "same.txt")
    code, _, err = run_cli("train", "--train", "same.txt", *base, "--resume", "--steps", "6")
    assert code == 0, err
    assert json.loads((out / "summary.json").read_text())["steps"] == 6

    (tmp_path / "a" / "valid.txt").write_text("changed\n")
    code, _, err = run_cli("train", "--train", "same.txt", *base, "--resume", "--steps", "8")
    assert_one_line_error(code, err, "--valid", "is not the data this run was trained on")


# -- tampered run files: every one is one line naming the file ---------------------------------
def _edit_config(run_dir: Path, **values) -> None:
    path = run_dir / "config.json"
    doc = json.loads(path.read_text())
    doc["config"].update(values)
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize(
    ("values", "words"),
    [
        ({"dropout": 5}, ["--dropout"]),
        ({"hidden": -1}, ["--hidden"]),
        ({"seed": 2**70}, ["--seed"]),
    ],
    ids=["dropout", "hidden", "seed"],
)
def test_a_tampered_config_is_one_line_in_every_command(
    run, data, tmp_path, run_cli, values, words, monkeypatch
):
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    _edit_config(copy, **values)
    code, _, err = run_cli("generate", "--checkpoint", str(copy))
    assert_one_line_error(code, err, str(copy / "config.json"), "does not match its SHA-256")
    skip_manifest(monkeypatch)  # the command line's own rules, without the manifest
    for argv in (
        ["evaluate", "--checkpoint", str(copy), "--data", str(data / "valid.txt")],
        ["generate", "--checkpoint", str(copy)],
        ["report", "--checkpoint", str(copy)],
    ):
        code, _, err = run_cli(*argv)
        assert_one_line_error(code, err, str(copy / "config.json"), *words)
        assert code == 2


def test_tampered_logs_and_baseline_are_one_line(run, data, tmp_path, run_cli, monkeypatch):
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    skip_manifest(monkeypatch)  # the readers' own checks
    (copy / "summary.json").write_text("[" * 100_000)
    code, _, err = run_cli("report", "--checkpoint", str(copy))
    assert_one_line_error(code, err, str(copy / "summary.json"), "nested too deeply")
    ngram = copy / "ngram.safetensors"
    ngram.write_bytes(ngram.read_bytes()[:40])
    code, _, err = run_cli("evaluate", "--checkpoint", str(copy), "--data", str(data / "valid.txt"))
    assert_one_line_error(code, err, str(ngram))


def test_nan_weights_are_refused_even_with_a_matching_checksum(run, tmp_path, run_cli, monkeypatch):
    from rnnkit.training.checkpoint import tensors_sha256

    skip_manifest(monkeypatch)  # a forger who rewrote manifest.json too
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    weights = copy / "model.safetensors"
    tensors = load_file(str(weights))
    name = sorted(tensors)[0]
    tensors[name][0] = float("nan")
    from safetensors.torch import save_file

    save_file(
        tensors, str(weights), metadata={"format": "rnnkit", "sha256": tensors_sha256(tensors)}
    )
    code, _, err = run_cli("generate", "--checkpoint", str(copy))
    assert_one_line_error(code, err, str(weights), name, "NaN or infinite")


def _forge_snapshot(run_dir: Path, state_edit=None, optimizer_edit=None, pointer_edit=None):
    """Change a snapshot and recompute every checksum, as a forger would."""
    from safetensors.torch import save_file

    pointer_path = run_dir / "latest.json"
    pointer = json.loads(pointer_path.read_text())
    snap = run_dir / pointer["snapshot"]
    state = json.loads((snap / "state.json").read_text())
    if optimizer_edit is not None:
        tensors = load_file(str(snap / "optimizer.safetensors"))
        optimizer_edit(tensors)
        save_file(tensors, str(snap / "optimizer.safetensors"))
        raw = (snap / "optimizer.safetensors").read_bytes()
        state["sha256"]["optimizer.safetensors"] = hashlib.sha256(raw).hexdigest()
    if state_edit is not None:
        state_edit(state)
    (snap / "state.json").write_text(json.dumps(state))
    pointer["state_sha256"] = hashlib.sha256((snap / "state.json").read_bytes()).hexdigest()
    if pointer_edit is not None:
        pointer_edit(pointer)
    pointer_path.write_text(json.dumps(pointer))


def _set(key, value):
    return lambda d: d.__setitem__(key, value)


def _first_moment(edit):
    def change(tensors):
        key = next(k for k in sorted(tensors) if k.endswith("/exp_avg"))
        tensors[key] = edit(tensors[key])

    return change


FORGERIES = {
    "step-string": {"state_edit": _set("step", "x")},
    "batches-garbage": {"state_edit": _set("batches", [1, 2])},
    "optimizer-groups-missing": {"state_edit": lambda s: s["optimizer"].pop("param_groups")},
    "lr-string": {"state_edit": lambda s: s["optimizer"]["param_groups"][0].update(lr="fast")},
    "lr-nan": {"state_edit": lambda s: s["optimizer"]["param_groups"][0].update(lr=None)},
    "state-not-object": {"state_edit": lambda s: s.__setitem__("optimizer", [])},
    "moment-wrong-shape": {"optimizer_edit": _first_moment(lambda t: torch.zeros(3))},
    "moment-nan": {"optimizer_edit": _first_moment(lambda t: torch.full_like(t, float("nan")))},
    "unknown-parameter": {
        "optimizer_edit": lambda t: t.__setitem__("999/exp_avg", torch.zeros(2)),
    },
    "nul-in-snapshot-path": {"pointer_edit": _set("snapshot", "snapshots/a\u0000b")},
    "snapshot-path-number": {"pointer_edit": _set("snapshot", 7)},
}


@pytest.mark.parametrize("forgery", sorted(FORGERIES))
def test_a_forged_snapshot_is_one_line_on_resume(run, data, tmp_path, run_cli, forgery):
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    _forge_snapshot(copy, **FORGERIES[forgery])
    code, _, err = run_cli("train", "--train", str(data / "train.txt"), "--out", str(copy),
        "--resume",
        "--steps", "8", "--quiet",
    )  # fmt: skip
    assert_one_line_error(code, err, str(copy))
    assert code == 2


def test_a_renamed_label_in_labels_json_is_refused_on_resume(tmp_path, run_cli, monkeypatch):
    rng = random.Random(0)
    lines = [f"{rng.choice(['pos', 'neg'])}\t{corpus(1, i).strip()}\n" for i in range(60)]
    (tmp_path / "c.tsv").write_text("".join(lines), encoding="utf-8")
    out = tmp_path / "run"
    base = ["train", "--train", str(tmp_path / "c.tsv"), "--out", str(out), "--condition"]
    base += ["init", "--bptt", "full", "--hidden", "4", "--embedding", "4", "--quiet"]
    code, _, err = run_cli(*base, "--steps", "2")
    assert code == 0, err
    labels = out / "labels.json"
    labels.write_text(labels.read_text().replace('"pos"', '"POS"'))
    code, _, err = run_cli(*base, "--steps", "4", "--resume")
    assert_one_line_error(code, err, str(labels), "does not match its SHA-256 in manifest.json")
    skip_manifest(monkeypatch)
    code, _, err = run_cli(*base, "--steps", "4", "--resume")
    assert_one_line_error(code, err, str(labels), "missing ['pos'], unknown ['POS']")


def test_an_absurd_model_size_is_refused_at_once_with_an_override(data, tmp_path, run_cli):
    out = tmp_path / "big"
    code, _, err = run_cli(*train_args(data, out, "--layers", "1000000"))
    assert_one_line_error(code, err, "--layers 1000000", "parameters", "--max-parameters")
    assert not out.exists()
    # The override lets a deliberate large model through (here a small limit shows it).
    code, _, err = run_cli(*train_args(data, out, "--max-parameters", "100"))
    assert_one_line_error(code, err, "over the limit of 100")
    code, _, err = run_cli(*train_args(data, out, "--max-parameters", "100000", "--steps", "1"))
    assert code == 0, err
    for value in ("0", "-5"):  # named as the option (it read "max_parameters must be ...")
        code, _, err = run_cli(*train_args(data, tmp_path / "z", "--max-parameters", value))
        assert err == f"rnnkit train: error: --max-parameters must be ≥ 1, got {value}\n"


def test_the_size_check_counts_both_directions_of_the_tagger():
    """The tagger's sentence encoder is always bidirectional (it reads no
    ``--bidirectional``): the recurrent parameters checked against ``--max-parameters``
    are those of the model built, two directions."""
    from rnnkit.app.cli.train import recurrent_parameters
    from rnnkit.app.config import TrainConfig
    from rnnkit.app.tasks.settings import model_spec
    from rnnkit.models.tagger import build_tagger

    cfg = TrainConfig(task="tag", cell="gru", hidden=8, embedding=4, layers=2, char_rnn=False)
    model = build_tagger(model_spec(cfg), vocab_size=10, num_tags=3)
    assert recurrent_parameters(cfg) == sum(p.numel() for p in model.encoder.parameters())
    assert recurrent_parameters(cfg) == 2 * 3 * 8 * (4 + 8 + 1) + 2 * 3 * 8 * (16 + 8 + 1)
    # with its character encoder (the default), which widens the first layer's input
    cfg = TrainConfig.for_task("tag", cell="lstm", hidden=8, embedding=4, layers=2)
    model = build_tagger(model_spec(cfg), vocab_size=10, num_tags=3, num_chars=20)
    assert model.char_encoder is not None
    recurrent = [*model.encoder.parameters(), *model.char_encoder.encoder.parameters()]
    assert recurrent_parameters(cfg) == sum(p.numel() for p in recurrent)


@pytest.mark.parametrize("task", ["lm", "tag", "classify", "seq2seq"])
def test_training_on_dev_zero_fails_at_once(tmp_path, run_cli, task):
    code, _, err = run_cli(
        "train", "--task", task, "--train", "/dev/zero", "--out", str(tmp_path / "r")
    )
    assert_one_line_error(code, err, "/dev/zero: is a device, not a data file")


def test_a_fifo_as_config_json_is_refused_not_waited_on(run, data, tmp_path, run_cli, monkeypatch):
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    skip_manifest(monkeypatch)  # the reader's own refusal
    (copy / "config.json").unlink()
    os.mkfifo(copy / "config.json")  # reading it would block until a writer comes: never
    code, _, err = run_cli("evaluate", "--checkpoint", str(copy), "--data", str(data / "valid.txt"))
    assert_one_line_error(code, err, str(copy / "config.json"), "is a FIFO, not a regular file")


def test_log_every_sets_the_training_records_and_may_change_on_resume(run_cli, data, tmp_path):
    out = tmp_path / "run"
    code, _, err = run_cli(*train_args(data, out, "--log-every", "4", "--steps", "6"))
    assert code == 0, err

    def steps() -> list[int]:
        lines = (out / "metrics.jsonl").read_text().splitlines()
        return [e["step"] for e in map(json.loads, lines) if e["event"] == "train"]

    assert steps() == [4, 6]
    # --threads too: every option the refusal names as changeable is accepted by the task
    resumed = train_args(data, out, "--resume", "--steps", "9", "--log-every", "2")
    code, _, err = run_cli(*resumed, "--threads", "1")
    assert code == 0, err
    assert steps() == [4, 6, 8, 9]
    for bad in ("0", "-1"):
        code, _, err = run_cli(*train_args(data, tmp_path / "bad", "--log-every", bad))
        assert (
            code == 2 and err.strip() == f"rnnkit train: error: --log-every must be ≥ 1, got {bad}"
        )


def csv_matches_jsonl(out: Path) -> bool:
    """metrics.csv holds the events of metrics.jsonl, one row each, every field equal."""
    import csv

    events = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    with open(out / "metrics.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(events) > 0
    for row, event in zip(rows, events, strict=True):
        assert set(event) <= set(row)
        for key, cell in row.items():
            value = event.get(key)
            if value is None:
                assert cell == "", (key, cell)
            elif isinstance(value, str):
                assert cell == value, (key, cell)
            else:
                assert json.loads(cell) == value, (key, cell, value)  # floats bit for bit
    return True


def test_metrics_csv_beside_metrics_jsonl_across_a_resume(run_cli, data, tmp_path):
    out = tmp_path / "run"
    args = train_args(data, out, "--valid", str(data / "valid.txt"), "--eval-every", "2")
    assert run_cli(*args, "--steps", "4")[0] == 0
    assert csv_matches_jsonl(out)
    assert run_cli(*args, "--steps", "7", "--resume")[0] == 0
    assert csv_matches_jsonl(out)
    rows = (out / "metrics.csv").read_text().splitlines()
    assert [r.split(",")[:2] for r in rows[1:]].count(["valid", "6"]) == 1


@pytest.mark.parametrize(
    ("out", "words"),
    [
        ("/dev/null", "--out /dev/null: exists and is a special file"),
        ("train.txt", "exists and is a regular file, not a directory"),
        ("train.txt/run", "cannot create the directory (Not a directory)"),
    ],
)
def test_an_out_that_cannot_be_a_directory_is_one_line(run_cli, data, out, words):
    # /dev/null was refused with the raw "[Errno 17] File exists: '/dev/null'".
    target = out if out.startswith("/") else str(data / out)
    code, _, err = run_cli(*train_args(data, Path(target)))
    assert code == 2 and err.count("\n") == 1 and words in err and "Errno" not in err, err


def test_resume_without_train_reads_the_recorded_file(run_cli, data, tmp_path, monkeypatch):
    """A run stopped says "continue with --resume"; `train --out D --resume` said
    "--train is required". The run's own training file is found by its recorded absolute
    path (from any directory), and checked; gone, it is named."""
    import shutil

    corpus_dir = tmp_path / "corpus"
    shutil.copytree(data, corpus_dir)
    monkeypatch.chdir(corpus_dir)
    out = tmp_path / "run"
    first = [a if a != str(data / "train.txt") else "train.txt" for a in train_args(data, out)]
    assert run_cli(*first, "--no-report")[0] == 0
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(
        "train", "--out", str(out), "--resume", "--steps", "8", "--quiet", "--no-report"
    )
    assert code == 0, err
    assert json.loads((out / "summary.json").read_text())["steps"] == 8
    (corpus_dir / "train.txt").write_text("another corpus\n" * 50, encoding="utf-8")
    code, _, err = run_cli("train", "--out", str(out), "--resume", "--steps", "9")
    assert code == 2 and "train.txt" in err and err.count("\n") == 1, err
    (corpus_dir / "train.txt").unlink()
    code, _, err = run_cli("train", "--out", str(out), "--resume", "--steps", "9")
    assert code == 2 and err == (
        f"rnnkit train: error: --resume: the training file of this run, "
        f"{corpus_dir / 'train.txt'}, is gone; give it with --train\n"
    )


def test_a_resume_in_epochs_replaces_a_budget_in_steps(run_cli, data, tmp_path):
    """``--steps`` overrides ``--epochs``: once a budget in steps was recorded, ``--resume
    --epochs 3`` said "finished at step 6 of 6" and trained nothing. Epochs given now
    replace the run's steps, and are recorded so."""
    out = tmp_path / "run"
    assert run_cli(*train_args(data, out, "--no-report"))[0] == 0  # --steps 6
    resumed = [
        a for a in train_args(data, out, "--resume", "--no-report", "--json") if a != "--quiet"
    ]
    at = resumed.index("--steps")
    del resumed[at : at + 2]
    code, stdout, err = run_cli(*resumed, "--epochs", "3")
    assert code == 0, err
    summary = json.loads(stdout)
    assert summary["steps"] > 6 and summary["epoch"] == 3
    config = json.loads((out / "config.json").read_text())["config"]
    assert (config["steps"], config["epochs"]) == (None, 3)


def test_resuming_a_finished_run_changes_nothing_and_says_so(run_cli, data, tmp_path):
    # The resumed run rewrote summary.json from its snapshot ("weights of step 192") while
    # model.safetensors kept the finished run's weights (step 200).
    out = tmp_path / "run"
    code, _, err = run_cli(*train_args(data, out, "--no-report"))
    assert code == 0, err
    files = ("summary.json", "model.safetensors", "config.json")
    before = {name: (out / name).read_bytes() for name in files}
    code, stdout, err = run_cli(*train_args(data, out, "--resume", "--no-report", "--json"))
    assert code == 0, err
    assert {name: (out / name).read_bytes() for name in files} == before
    assert json.loads(stdout) == json.loads(before["summary.json"])
    loud = [a for a in train_args(data, out, "--resume", "--no-report") if a != "--quiet"]
    code, _, err = run_cli(*loud)
    assert code == 0 and "finished at step 6 of 6: nothing to resume" in err, err
    code, _, err = run_cli(*[a if a != "6" else "8" for a in train_args(data, out, "--resume")])
    assert code == 0, err
    assert json.loads((out / "summary.json").read_text())["steps"] == 8  # a larger budget goes on
    # ... and is the run's budget from then on: a plain --resume said "finished at step 8
    # of 6" (config.json kept the first budget), and one cut short under the larger
    # budget fell back to the first. Only the budget changes in config.json.
    config = json.loads((out / "config.json").read_text())
    assert config["config"]["steps"] == 8
    first = json.loads(before["config.json"])
    first["config"]["steps"] = 8
    assert config == first
    no_steps = train_args(data, out, "--resume", "--no-report")
    no_steps = [
        a
        for i, a in enumerate(no_steps)
        if a != "--quiet" and "--steps" not in no_steps[i - 1 : i + 1]
    ]
    code, _, err = run_cli(*no_steps)
    assert code == 0 and "finished at step 8 of 8: nothing to resume" in err, err
    code, _, err = run_cli(*no_steps, "--steps", "6")
    assert code == 0 and "is at step 8, past a budget of 6 steps: nothing to resume" in err, err
    code, _, err = run_cli("evaluate", "--checkpoint", str(out), "--data", str(data / "train.txt"))
    assert code == 0, err  # the manifest vouches for the config.json written


def test_a_symlink_loop_as_train_is_one_line(run_cli, tmp_path):
    """It was a RuntimeError traceback ("Symlink loop from ...") from the check of the
    inputs against the run directory, before the reader could say it."""
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    code, _, err = run_cli("train", "--train", str(tmp_path / "a"), "--out", str(tmp_path / "r"))
    assert code == 2 and err.count("\n") == 1 and "symbolic links" in err, err


def test_a_run_directory_whose_name_is_not_utf8_is_named_before_training(data, tmp_path):
    """Training into one succeeded, then every command said "not a valid safetensors
    file": safetensors opens UTF-8 paths only. Refused before training; a run renamed so
    is named as what it is."""
    import os
    import shutil
    import subprocess
    import sys

    def rnnkit(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "rnnkit", *argv], capture_output=True)

    odd = tmp_path / os.fsdecode(b"caf\xe9")
    done = rnnkit(*train_args(data, odd))
    assert done.returncode == 2 and not odd.exists(), done.stderr
    assert done.stderr.count(b"\n") == 1 and b"the path is not valid UTF-8" in done.stderr
    good = tmp_path / "run"
    assert rnnkit(*train_args(data, good)).returncode == 0
    shutil.copytree(good, odd)
    done = rnnkit("evaluate", "--checkpoint", str(odd), "--data", str(data / "valid.txt"))
    assert (
        done.returncode == 2
        and b"model.safetensors: the path is not valid UTF-8, which" in done.stderr
    )
