"""``rnnkit generate`` on a language model: the prompt and its continuation joined in the
run's unit (words with a space, characters with nothing), and no special symbol among
the generated tokens."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

WORDS = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran"]
TINY = ["--hidden", "8", "--embedding", "8", "--batch-size", "4", "--ngram-order", "2"]


@pytest.fixture(autouse=True, scope="module")
def _one_thread(single_thread):
    yield


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    rng = random.Random(0)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 6))) for _ in range(40)]
    path = tmp_path_factory.mktemp("data") / "lm.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _train(corpus: Path, out: Path, unit: str) -> None:
    from rnnkit.app.cli.main import main

    argv = ["train", "--task", "lm", "--unit", unit, "--bptt", "full", "--train", str(corpus)]
    assert main([*argv, "--out", str(out), *TINY, "--steps", "4", "--quiet"]) == 0


def test_a_word_prompt_is_followed_by_its_continuation_as_words(corpus, tmp_path, run_cli):
    _train(corpus, tmp_path / "lm", "word")
    code, out, err = run_cli(
        "generate", "--checkpoint", str(tmp_path / "lm"), "--prompt", "the cat",
        "--max-len", "4", "--seed", "3", "--num", "6",
    )  # fmt: skip
    assert code == 0, err
    from rnnkit.app.tasks.lm import load_lm, sample_texts

    cfg, vocab, model = load_lm(tmp_path / "lm")
    drawn = sample_texts(cfg, vocab, model, "the cat", num=6, max_length=4, seed=3)
    assert any(drawn)  # some continuation is not empty: there is something to join
    want = ["the cat" + (" " + d if d else "") for d in drawn]
    assert out == "".join(f"{t}\n" for t in want)
    for text in want:  # vocabulary words only: no special, nothing glued
        assert set(text.split(" ")) <= set(WORDS), text


def test_a_char_prompt_is_followed_by_its_continuation_as_characters(corpus, tmp_path, run_cli):
    _train(corpus, tmp_path / "lm", "char")
    code, out, err = run_cli(
        "generate", "--checkpoint", str(tmp_path / "lm"), "--prompt", "the c",
        "--max-len", "6", "--seed", "3", "--num", "3",
    )  # fmt: skip
    assert code == 0, err
    from rnnkit.app.tasks.lm import load_lm, sample_texts

    cfg, vocab, model = load_lm(tmp_path / "lm")
    drawn = sample_texts(cfg, vocab, model, "the c", num=3, max_length=6, seed=3)
    assert out == "".join(f"the c{d}\n" for d in drawn)


def test_max_length_is_the_older_spelling_of_max_len(corpus, tmp_path, run_cli):
    _train(corpus, tmp_path / "lm", "char")
    argv = ["generate", "--checkpoint", str(tmp_path / "lm"), "--prompt", "the", "--seed", "1"]
    code, new, err = run_cli(*argv, "--max-len", "5")
    assert code == 0 and "deprecated" not in err, err
    code, old, err = run_cli(*argv, "--max-length", "5")
    assert code == 0 and old == new
    assert err.strip() == "rnnkit: warning: --max-length is deprecated: write --max-len"
    code, _, err = run_cli(*argv, "--max-len", "0")
    assert code == 2 and "--max-len must be ≥ 1" in err


def test_input_is_refused_for_a_language_model(corpus, tmp_path, run_cli):
    """``--input`` (seq2seq's source) given to a language model was ignored: an unprompted
    sample and exit status 0. Refused now, as a seq2seq run refuses ``--prompt``."""
    _train(corpus, tmp_path / "lm", "char")
    code, out, err = run_cli("generate", "--checkpoint", str(tmp_path / "lm"), "--input", "the")
    assert (code, out) == (2, "")
    assert err == (
        "rnnkit generate: error: --input applies to a seq2seq run; a language model reads "
        "--prompt\n"
    )


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--temperature", "0", "--temperature must be a finite number > 0, got 0.0"),
        ("--temperature", "nan", "--temperature must be a finite number > 0, got nan"),
        ("--top-k", "0", "--top-k must be ≥ 1, got 0"),
        ("--top-p", "1.5", "--top-p must be in (0, 1], got 1.5"),
    ],
)
def test_sampling_options_out_of_range_name_the_option(
    corpus, tmp_path, run_cli, option, value, message
):
    """The sampler's checks named its parameters (``top_k must be ...``); the message now
    names the option the user typed, before the run is read."""
    argv = ["generate", "--checkpoint", str(tmp_path / "absent"), "--prompt", "the"]
    code, out, err = run_cli(*argv, option, value)
    assert (code, out) == (2, "")
    assert err == f"rnnkit generate: error: {message}\n"


SEARCH_AND_SAMPLE = (
    "--beam/--greedy search; --temperature, --top-k, --top-p and --seed sample: "
    "give one or the other"
)
GREEDY_AND_BEAM = (
    "--greedy takes the most likely token; --beam N keeps the N most likely prefixes "
    "(--beam 1 is greedy): give one or the other"
)


def test_a_search_mixed_with_sampling_or_another_search_is_refused(corpus, tmp_path, run_cli):
    """A language model decoded one way and dropped the other's options, exit status 0:
    ``--beam 3 --temperature 5`` searched, ``--greedy --beam 3`` searched 3 wide. Refused
    as a seq2seq run refuses them; ``--beam 1`` alone is greedy search."""
    _train(corpus, tmp_path / "lm", "char")
    argv = ["generate", "--checkpoint", str(tmp_path / "lm"), "--prompt", "the", "--max-len", "4"]
    for mix, message in [
        (["--beam", "3", "--temperature", "5"], SEARCH_AND_SAMPLE),
        (["--beam", "3", "--top-p", "0.1", "--seed", "7"], SEARCH_AND_SAMPLE),
        (["--greedy", "--temperature", "5"], SEARCH_AND_SAMPLE),
        (["--greedy", "--top-k", "2"], SEARCH_AND_SAMPLE),
        (["--greedy", "--beam", "3"], GREEDY_AND_BEAM),
        (["--greedy", "--beam", "1"], GREEDY_AND_BEAM),
        # one text printed 3 times; Python's num and beam_size named for the options
        (
            ["--greedy", "--num", "3"],
            "--greedy gives one output; --num N with --beam N lists the N best",
        ),
        (
            ["--beam", "2", "--num", "3"],
            "--num 3 with --beam 2: a beam of 2 keeps the 2 best; give --beam 3 or more",
        ),
    ]:
        code, out, err = run_cli(*argv, *mix)
        assert (code, out, err) == (2, "", f"rnnkit generate: error: {message}\n"), mix
    code, greedy, err = run_cli(*argv, "--greedy")
    assert code == 0, err
    assert run_cli(*argv, "--beam", "1") == (0, greedy, "")
