"""Option bounds and extreme numbers against trained runs: every option whose cost grows
with its value has a stated maximum, and every value (``0``, ``-2``, ``10**30``, ``1e-45``,
a 400-digit integer) gives an answer or one line naming the option, never a traceback, an
allocation failure or minutes of work.

The fixed cases are the inputs that broke rnnkit; the hypothesis test draws extreme values
for the numeric options of ``generate`` and ``predict`` on a tiny language model and a
tiny seq2seq run.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fuzzkit import FUZZ, Hang, time_limit
from hypothesis import given
from hypothesis import strategies as st

from rnnkit.app.cli.main import main
from rnnkit.data.generated_pairs import generate_pairs, write_pairs

TINY = ["--hidden", "8", "--embedding", "8", "--batch-size", "4", "--quiet", "--no-report"]
EXTREME = [
    "0", "-2", "1", "101", "100000", "1000000", "10" * 15, str(10**30), "-" + str(10**30),
    "1" + "0" * 400, "1e-45", "5e-324", "1e308", "1e999", "nan", "-0", "0.0",
]  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("bounds")
    (d / "text.txt").write_text("abc abd\nbca cab\n" * 20, encoding="utf-8")
    write_pairs(d / "pairs.tsv", generate_pairs("reverse", 24, seed=0, max_len=4))
    (d / "src.txt").write_text("abc\nba\n", encoding="utf-8")
    out = {"data": d}
    for name, argv in {
        "lm": ["--task", "lm", "--train", str(d / "text.txt"), "--ngram-order", "3"],
        "seq2seq": ["--task", "seq2seq", "--train", str(d / "pairs.tsv")],
    }.items():
        out[name] = d / name
        assert main(["train", *argv, "--out", str(out[name]), "--steps", "2", *TINY]) == 0
    return out


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        with time_limit(30):
            code = main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 2
    except Hang:
        pytest.fail(f"rnnkit {argv!r} hung")
    out, err = capsys.readouterr()
    return code, out, err


def _one_line(argv: list[str], code: int, err: str) -> None:
    assert "Traceback" not in err, (argv, err)
    if code != 0:
        assert code == 2 and len(err.strip().splitlines()) == 1, (argv, code, err)


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["generate", "--beam", "0"], "--beam must be an integer from 1 to 100, got 0"),
        (["generate", "--beam", "-2"], "--beam must be an integer from 1 to 100"),
        (["generate", "--beam", "100000"], "--beam must be an integer from 1 to 100"),
        (["generate", "--seed", str(10**30)], "--seed must be an integer below 2^63"),
        (["generate", "--seed", str(-(2**63))], "--seed must be an integer below 2^63"),
        (["generate", "--temperature", "0"], "temperature must be a finite number > 0"),
        (["seq2seq:predict", "--beam", "100000"], "--beam must be at most 100, got 100000"),
        (["seq2seq:generate", "--beam", "101"], "--beam must be an integer from 1 to 100"),
        (["train-lm", "--ngram-order", "1000000"], "--ngram-order must be at most 10"),
        (["train-lm", "--threads", "1000000"], "--threads must be at most "),
        (["train-seq2seq", "--beam", "100000"], "--beam must be at most 100"),
        (["generate", "--max-len", "1000001"], "--max-len must be at most 1,000,000"),
        (["generate", "--num", "10001"], "--num must be at most 10,000, got 10,001"),
        (["seq2seq:generate", "--max-len", str(10**12)], "--max-len must be at most 1,000,000"),
        (["seq2seq:predict", "--max-len", "2000000"], "--max-len must be at most 1,000,000"),
    ],
)
def test_an_option_beyond_its_bound_is_one_line(
    runs: dict[str, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path, argv, words
) -> None:
    command, *rest = argv
    data = runs["data"]
    if command == "train-lm":
        full = ["train", "--task", "lm", "--train", str(data / "text.txt"), *TINY]
    elif command == "train-seq2seq":
        full = ["train", "--task", "seq2seq", "--train", str(data / "pairs.tsv"), *TINY]
    elif command == "seq2seq:predict":
        full = ["predict", "--checkpoint", str(runs["seq2seq"]), "--input", str(data / "src.txt")]
    elif command == "seq2seq:generate":
        full = ["generate", "--checkpoint", str(runs["seq2seq"]), "--input", "abc"]
    else:
        full = ["generate", "--checkpoint", str(runs["lm"]), "--max-len", "3"]
    if command.startswith("train"):
        full += ["--out", str(tmp_path / "run"), "--steps", "1"]
    code, _, err = _run([*full, *rest], capsys)
    _one_line(argv, code, err)
    assert code == 2 and words in err, err
    assert not (tmp_path / "run").exists()


def test_the_thread_bound_is_256_or_the_cpu_count(
    runs: dict[str, Path], capsys: pytest.CaptureFixture[str], monkeypatch, tmp_path
) -> None:
    most = max(os.cpu_count() or 1, 256)
    argv = ["train", "--task", "lm", "--train", str(runs["data"] / "text.txt"), *TINY,
            "--out", str(tmp_path / "run"), "--steps", "1"]  # fmt: skip
    code, _, err = _run([*argv, "--threads", str(most + 1)], capsys)
    assert code == 2 and f"--threads must be at most {most} " in err, err
    monkeypatch.setenv("RNNKIT_THREADS", "1000000")
    code, _, err = _run(argv, capsys)
    assert code == 2 and f"RNNKIT_THREADS must be at most {most} " in err, err
    monkeypatch.setenv("RNNKIT_THREADS", "1")
    assert _run(argv, capsys)[0] == 0


def test_a_temperature_near_zero_generates_what_greedy_does(
    runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["generate", "--checkpoint", str(runs["lm"]), "--max-len", "12", "--prompt", "a"]
    code, greedy, err = _run([*base, "--greedy"], capsys)
    assert code == 0, err
    for temperature in ("1e-45", "5e-324"):
        code, cold, err = _run([*base, "--temperature", temperature], capsys)
        assert code == 0 and cold == greedy, err


GENERATE_OPTIONS = ["--beam", "--seed", "--temperature", "--top-k", "--top-p", "--num",
                    "--max-len"]  # fmt: skip
PREDICT_OPTIONS = ["--beam", "--batch-size", "--max-len"]


@FUZZ
@given(
    which=st.sampled_from(["lm", "seq2seq"]),
    command=st.sampled_from(["generate", "predict"]),
    options=st.lists(
        st.tuples(st.sampled_from(GENERATE_OPTIONS), st.sampled_from(EXTREME)), max_size=3
    ),
)
def test_extreme_option_values_answer_or_give_one_line(
    runs: dict[str, Path], capsys: pytest.CaptureFixture[str], which, command, options
) -> None:
    data = runs["data"]
    if command == "predict":
        argv = ["predict", "--checkpoint", str(runs[which]), "--input", str(data / "src.txt")]
        options = [(o, v) for o, v in options if o in PREDICT_OPTIONS]
    elif which == "lm":
        argv = ["generate", "--checkpoint", str(runs["lm"]), "--prompt", "a"]
    else:
        argv = ["generate", "--checkpoint", str(runs["seq2seq"]), "--input", "abc"]
    # The output length is the one size left to the user: kept small unless drawn.
    if not any(o == "--max-len" for o, _ in options):
        argv += ["--max-len", "8"]
    for option, value in options:
        if option in ("--max-len", "--num", "--batch-size") and value.isdigit():
            value = str(min(int(value), 50))  # long, not endless: within the bounds, fast
        argv += [option, value]
    code, _, err = _run(argv, capsys)
    _one_line(argv, code, err)


@pytest.mark.parametrize(
    "argv",
    [
        *(["train", "--task", task, "--train", "/dev/zero"]
          for task in ("lm", "tag", "classify", "seq2seq", "events", "params", "regress")),
        ["evaluate", "--checkpoint", "{lm}", "--data", "/dev/zero"],
        ["evaluate", "--checkpoint", "{seq2seq}", "--data", "/dev/zero"],
        ["predict", "--checkpoint", "{lm}", "--input", "/dev/zero"],
        ["predict", "--checkpoint", "{seq2seq}", "--input", "/dev/zero"],
    ],
)  # fmt: skip
def test_every_reader_refuses_an_endless_input_at_once(
    runs: dict[str, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path, argv
) -> None:
    # The regress reader and predict --input read /dev/zero until MemoryError (5-6 GB).
    argv = [a.format(lm=runs["lm"], seq2seq=runs["seq2seq"]) for a in argv]
    if argv[0] == "train":
        argv += ["--out", str(tmp_path / "run"), "--quiet"]
    code, out, err = _run(argv, capsys)
    _one_line(argv, code, err)
    assert code == 2 and "/dev/zero" in err and out == "", err
    assert any(w in err for w in ("is a device", "line too long", "over the limit")), err
