"""``rnnkit train --task seq2seq``, ``evaluate --json`` and ``generate --input`` end to end
on tiny generated data; decoder-only and scheduled sampling runs; bad input as one line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from rnnkit.app.cli.main import main
from rnnkit.app.tasks.seq2seq import load_seq2seq, transduce
from rnnkit.data.generated_pairs import generate_pairs, write_pairs
from rnnkit.metrics.sequences import bleu

TINY = ["--hidden", "16", "--embedding", "8", "--batch-size", "16", "--max-len", "12"]


@pytest.fixture(autouse=True, scope="module")
def _one_thread(single_thread):
    yield


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("seq2seq")
    write_pairs(d / "train.tsv", generate_pairs("reverse", 96, seed=0, max_len=5))
    write_pairs(d / "valid.tsv", generate_pairs("reverse", 16, seed=1, max_len=5))
    write_pairs(d / "dates.tsv", generate_pairs("date", 40, seed=2))
    return d


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def train(capsys, data, out, *extra, train_file="train.tsv"):
    return run(
        capsys,
        "train",
        "--task",
        "seq2seq",
        "--train",
        str(data / train_file),
        "--valid",
        str(data / "valid.tsv"),
        "--out",
        str(out),
        *TINY,
        "--quiet",
        "--json",
        *extra,
    )


@pytest.fixture(scope="module")
def trained(data, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("run") / "attn"
    code = main(
        [
            "train", "--task", "seq2seq", "--train", str(data / "train.tsv"),
            "--valid", str(data / "valid.tsv"), "--out", str(out), *TINY,
            "--attention", "additive", "--bidirectional", "--context", "both",
            "--epochs", "4", "--lr", "0.01", "--quiet", "--beam", "2",
        ]
    )  # fmt: skip
    assert code == 0
    return out


def test_train_writes_the_run_directory_and_evaluate_prints_json(trained, data, capsys):
    for name in ("config.json", "vocab.json", "source_vocab.json", "model.safetensors"):
        assert (trained / name).is_file(), name
    summary = json.loads((trained / "summary.json").read_text())
    assert summary["task"] == "seq2seq" and summary["model"] == "encoder-decoder"
    assert {"exact_match", "token_error_rate", "loss_nats", "token_accuracy"} <= set(
        summary["valid"]
    )
    code, out, err = run(
        capsys,
        "evaluate",
        "--checkpoint",
        str(trained),
        "--data",
        str(data / "valid.tsv"),
        "--json",
    )
    assert code == 0, err
    metrics = json.loads(out)
    for key in ("loss_nats", "tokens", "exact_match", "token_error_rate", "token_accuracy"):
        assert key in metrics
    assert metrics["tokens"] == sum(len(t) + 1 for _, t in generate_pairs("reverse", 16, 1, 3, 5))
    assert 0.0 <= metrics["exact_match"] <= 1.0 and metrics["token_error_rate"] >= 0.0
    assert metrics["beam"] == 2
    # character targets: the character error rate is the token error rate; BLEU is that of
    # the outputs against the references (sacreBLEU in tests/metrics/test_sequences.py)
    assert metrics["character_error_rate"] == pytest.approx(metrics["token_error_rate"])
    pairs = (data / "valid.tsv").read_text().splitlines()
    outputs = [transduce(trained, line.split("\t")[0]) for line in pairs]
    refs = [list(line.split("\t")[1]) for line in pairs]
    assert metrics["bleu"] == pytest.approx(bleu([list(o) for o in outputs], refs))
    # Training helped: better than a uniform guess over the target vocabulary.
    _, _, vocab, _ = load_seq2seq(trained)
    assert metrics["loss_nats"] < 0.8 * torch.log(torch.tensor(float(len(vocab)))).item()


def test_generate_input_transduces_one_source(trained, capsys):
    code, out, err = run(capsys, "generate", "--checkpoint", str(trained), "--input", "abc")
    assert code == 0, err
    text = out.strip()
    assert text == transduce(trained, "abc", beam=1)
    assert len(text) <= 12
    assert transduce(trained, "abc", beam=3, max_length=2).__len__() <= 2


def test_unknown_tokens_at_evaluation_are_counted_not_fatal(trained, tmp_path, capsys):
    path = tmp_path / "odd.tsv"
    path.write_text("abz\tzba\nab\tba\n")
    code, out, err = run(
        capsys, "evaluate", "--checkpoint", str(trained), "--data", str(path), "--json"
    )
    assert code == 0, err
    metrics = json.loads(out)
    assert metrics["source_unknown_tokens"] == 1 and metrics["target_unknown_tokens"] == 1


def test_decoder_only_run(data, tmp_path, capsys):
    code, out, err = train(capsys, data, tmp_path / "dec", "--decoder-only", "--steps", "6")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["model"] == "decoder-only" and summary["steps"] == 6
    code, out, _ = run(
        capsys, "evaluate", "--checkpoint", str(tmp_path / "dec"), "--data",
        str(data / "valid.tsv"), "--json",
    )  # fmt: skip
    assert code == 0 and "exact_match" in json.loads(out)


def test_scheduled_sampling_word_units_and_resume(data, tmp_path, capsys):
    words = tmp_path / "words.tsv"
    words.write_text(
        "".join(f"{' '.join(s)}\t{' '.join(t)}\n" for s, t in generate_pairs("sort", 40))
    )
    out = tmp_path / "ss"
    extra = ["--source-unit", "word", "--target-unit", "word", "--attention", "dot"]
    extra += ["--scheduled-sampling", "linear:4", "--cell", "gru"]
    code, stdout, err = train(capsys, data, out, "--steps", "3", *extra, train_file=words)
    assert code == 0, err
    assert json.loads(stdout)["scheduled_sampling_p"] == 0.75
    code, stdout, err = train(
        capsys, data, out, "--steps", "5", "--resume", *extra, train_file=words
    )
    assert code == 0, err
    summary = json.loads(stdout)
    assert summary["steps"] == 5 and summary["scheduled_sampling_p"] == 1.0


@pytest.mark.parametrize(
    ("content", "line", "problem"),
    [
        ("abc\tcba\nabc cba\n", 2, "no tab"),
        ("abc\tcba\n\tcba\n", 2, "empty source"),
        ("abc\tcba\n\nabc\t\n", 3, "empty target"),
    ],
)
def test_bad_input_is_one_line_naming_file_and_line(tmp_path, capsys, content, line, problem):
    path = tmp_path / "bad.tsv"
    path.write_text(content)
    out = tmp_path / "never"
    code, _, err = run(
        capsys, "train", "--task", "seq2seq", "--train", str(path), "--out", str(out), "--quiet"
    )
    assert code == 2
    assert err.count("\n") == 1 and f"{path}:{line}: " in err and problem in err
    assert not out.exists()  # nothing half-written


@pytest.mark.parametrize(
    ("options", "named"),
    [
        (["--scheduled-sampling", "cosine:3"], "--scheduled-sampling"),
        (["--bidirectional", "--attention", "dot"], "--attention dot"),
        (["--decoder-only", "--scheduled-sampling", "linear:5"], "--scheduled-sampling"),
        (["--decoder-only", "--bidirectional"], "--bidirectional"),
    ],
)
def test_bad_options_are_one_line(data, tmp_path, capsys, options, named):
    out = tmp_path / "never"
    code, _, err = train(capsys, data, out, "--steps", "1", *options)
    assert code == 2 and err.count("\n") == 1 and named in err
    assert not out.exists()


def test_too_long_lines_and_evaluate_on_missing_file(data, tmp_path, capsys, trained):
    path = tmp_path / "long.tsv"
    path.write_text("ab\tba\n" + "a" * 20 + "\tb\n")
    code, _, err = train(capsys, data, tmp_path / "x", "--steps", "1", train_file=path)
    assert code == 2 and f"{path}:2: " in err and "--max-len 12" in err
    code, _, err = run(
        capsys, "evaluate", "--checkpoint", str(trained), "--data", str(tmp_path / "none.tsv")
    )
    assert code == 2 and "none.tsv" in err


def generate_lines(capsys, trained, *extra) -> tuple[list[str], str]:
    code, out, err = run(capsys, "generate", "--checkpoint", str(trained), *extra)
    assert code == 0, err
    return out.splitlines(), err


def test_generate_samples_as_asked(trained, capsys):
    """--num samples; top-k 1 sampling is greedy search; the same --seed the same samples;
    --max-len bounds every output; the default stays the run's search."""
    greedy = transduce(trained, "abcd", beam=1)
    top1, _ = generate_lines(capsys, trained, "--input", "abcd", "--num", "3", "--top-k", "1")
    assert top1 == [greedy] * 3
    a, _ = generate_lines(capsys, trained, "--input", "abcd", "--num", "5", "--seed", "7",
                          "--temperature", "2.0")  # fmt: skip
    b, _ = generate_lines(capsys, trained, "--input", "abcd", "--num", "5", "--seed", "7",
                          "--temperature", "2.0")  # fmt: skip
    c, _ = generate_lines(capsys, trained, "--input", "abcd", "--num", "5", "--seed", "8",
                          "--temperature", "2.0")  # fmt: skip
    assert len(a) == 5 and a == b and a != c
    short, _ = generate_lines(capsys, trained, "--input", "abcd", "--num", "4", "--seed", "1",
                              "--max-len", "2")  # fmt: skip
    assert len(short) == 4 and all(len(s) <= 2 for s in short)
    searched, _ = generate_lines(capsys, trained, "--input", "abcd")
    assert searched == [transduce(trained, "abcd")]  # the run's beam 2
    best, _ = generate_lines(capsys, trained, "--input", "abcd", "--num", "2", "--beam", "2")
    assert len(best) == 2 and best[0] == transduce(trained, "abcd", beam=2)
    cut, _ = generate_lines(capsys, trained, "--input", "abcd", "--greedy", "--max-len", "1")
    assert cut == [transduce(trained, "abcd", beam=1, max_length=1)]


def test_generate_warns_about_input_outside_the_vocabulary(trained, capsys):
    lines, err = generate_lines(capsys, trained, "--input", "abzz")
    assert len(lines) == 1
    assert "--input has 2 token(s) outside the vocabulary; read as <unk>" in err
    code, _, err = run(capsys, "generate", "--checkpoint", str(trained), "--input", "ab",
                       "--beam", "2", "--temperature", "0.5")  # fmt: skip
    assert code == 2 and "give one or the other" in err and len(err.strip().splitlines()) == 1
    # --greedy --beam 3 searched 3 wide without a word (a language model's too)
    code, _, err = run(capsys, "generate", "--checkpoint", str(trained), "--input", "ab",
                       "--greedy", "--beam", "3")  # fmt: skip
    assert code == 2 and err == (
        "rnnkit generate: error: --greedy takes the most likely token; --beam N keeps the N "
        "most likely prefixes (--beam 1 is greedy): give one or the other\n"
    )
    # --beam 1 --num 3 searched 3 wide in silence, while --greedy --num 3 was refused
    code, _, err = run(capsys, "generate", "--checkpoint", str(trained), "--input", "ab",
                       "--beam", "1", "--num", "3")  # fmt: skip
    assert code == 2 and err == (
        "rnnkit generate: error: --num 3 with --beam 1: a beam of 1 keeps the 1 best; give "
        "--beam 3 or more\n"
    )
    widened, _ = generate_lines(capsys, trained, "--input", "abcd", "--num", "3")
    assert len(widened) == 3  # the run's beam (2), widened to 3
    code, _, err = run(capsys, "generate", "--checkpoint", str(trained), "--input", "ab",
                       "--top-p", "1.5")  # fmt: skip
    assert code == 2 and "top_p" in err.replace("-", "_") and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("python", "message", "cli", "option"),
    [
        ({"beam": 0}, "beam must be an integer from 1 to 100 or None, got 0", ["--beam", "0"],
         "--beam must be an integer from 1 to 100, got 0"),
        ({"beam": 101}, "beam must be an integer from 1 to 100 or None, got 101",
         ["--beam", "101"], "--beam must be an integer from 1 to 100, got 101"),
        ({"max_length": 0}, "max_length must be an integer ≥ 1 or None, got 0",
         ["--max-len", "0"], "--max-len must be ≥ 1, got 0"),
        ({"num": 0}, "num must be an integer ≥ 1, got 0", ["--num", "0"],
         "--num must be ≥ 1, got 0"),
    ],
)  # fmt: skip
def test_search_options_are_named_as_given(trained, capsys, python, message, cli, option):
    """From Python the functions behind ``generate --input`` and ``predict`` (and
    ``rnnkit.load(run).predict``) name their arguments; the command line its options.
    ``beam=-3`` and ``beam=0`` searched greedily, ``--num 0`` said ``--num`` to Python."""
    import rnnkit
    from rnnkit.app.tasks.seq2seq import generate_outputs, predictor
    from rnnkit.errors import ConfigError

    pattern = f"^{re.escape(message)}$"
    with pytest.raises(ConfigError, match=pattern):
        generate_outputs(trained, "abcd", **python)
    searched = {k: v for k, v in python.items() if k != "num"}
    if searched:  # transduce, the predictor and a loaded run search: no num
        with pytest.raises(ConfigError, match=pattern):
            transduce(trained, "abcd", **searched)
        with pytest.raises(ConfigError, match=pattern):
            predictor(trained, **searched)
        with pytest.raises(ConfigError, match=pattern):
            rnnkit.load(trained).predict(["abcd"], **searched)
    code, _, err = run(capsys, "generate", "--checkpoint", str(trained), "--input", "abcd", *cli)
    assert code == 2 and err.strip() == f"rnnkit generate: error: {option}", err


def test_an_empty_source_is_named_as_given(trained, capsys):
    """From Python ``transduce`` and ``generate_outputs`` name their argument ``text`` (they
    said ``--input``, an option a Python caller never gave); ``rnnkit generate`` ``--input``."""
    from rnnkit.app.tasks.seq2seq import generate_outputs
    from rnnkit.errors import DataError

    message = "^text is empty \\(no tokens\\): nothing to transduce$"
    with pytest.raises(DataError, match=message):
        transduce(trained, "")
    with pytest.raises(DataError, match=message):
        generate_outputs(trained, "", num=2)
    code, _, err = run(capsys, "generate", "--checkpoint", str(trained), "--input", "")
    expected = "rnnkit generate: error: --input is empty (no tokens): nothing to transduce"
    assert code != 0 and err.strip() == expected, err
