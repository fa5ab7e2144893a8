"""``rnnkit train`` with DEFAULT options (no budget, no model or optimiser option) beats
its baseline on small generated data where the answer needs context: a tag that is the
previous word's group (the most frequent tag per word is right about half the time), and
a class that is the order of two letters (a bag of unigrams and bigrams cannot see it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rnnkit.app.cli.main import main
from rnnkit.data.generated import (
    letter_order_examples,
    previous_word_sentences,
    write_labelled,
    write_token_tags,
)


@pytest.fixture(autouse=True, scope="module")
def _one_thread(single_thread):
    yield


def default_run(capsys, task: str, d: Path) -> tuple[dict, str]:
    out = d / "run"
    code = main(["train", "--task", task, "--train", str(d / "train.tsv"), "--valid",
                 str(d / "valid.tsv"), "--out", str(out), "--quiet", "--no-report"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 0, err
    return json.loads((out / "summary.json").read_text()), err


def test_tag_with_default_options_beats_the_most_frequent_tag(capsys, tmp_path):
    write_token_tags(previous_word_sentences(100, seed=0, noise=0.1), tmp_path / "train.tsv")
    write_token_tags(previous_word_sentences(30, seed=1, noise=0.1), tmp_path / "valid.tsv")
    summary, err = default_run(capsys, "tag", tmp_path)
    baseline = summary["baselines"]["most_frequent_tag"]["accuracy"]
    assert baseline < 0.6  # context-free: about half right
    assert summary["valid"]["accuracy"] > baseline + 0.2
    assert summary["stopped"].startswith("no improvement for")  # the default mode ended it
    assert summary["behind_baseline"] is None and "behind baseline" not in err


def test_classify_with_default_options_beats_both_baselines(capsys, tmp_path):
    write_labelled(letter_order_examples(200, seed=0, noise=0.1), tmp_path / "train.tsv")
    write_labelled(letter_order_examples(60, seed=1, noise=0.1), tmp_path / "valid.tsv")
    summary, err = default_run(capsys, "classify", tmp_path)
    best = max(b["accuracy"] for b in summary["baselines"].values())
    assert summary["valid"]["accuracy"] > best + 0.1
    assert summary["stopped"].startswith("no improvement for")
    assert summary["behind_baseline"] is None and "behind baseline" not in err
