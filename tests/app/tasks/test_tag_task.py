"""``rnnkit train --task tag`` and ``rnnkit evaluate`` end to end on tiny generated data
(Python token tags of a stdlib module, and a BIO variant), CoNLL-U input, exact resume,
unknown tags at evaluation, and bad input reported as one line naming file and line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rnnkit.app.cli.config_file import tomllib  # tomli on Python 3.10
from rnnkit.app.cli.main import main
from rnnkit.app.tasks.tag import load_tagger, word_key
from rnnkit.data.generated import python_token_sentences, stdlib_files, write_token_tags
from rnnkit.metrics.labels import accuracy

TINY = ["--hidden", "8", "--embedding", "8", "--batch-size", "8", "--quiet"]


@pytest.fixture(autouse=True, scope="module")
def _one_thread(single_thread):
    yield


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("tag")
    source = stdlib_files(["json"])[1].read_text(encoding="utf-8")  # json/decoder.py
    for scheme in ("types", "bio"):
        sentences = python_token_sentences(source, scheme=scheme, max_tokens=20)
        write_token_tags(sentences[:48], d / f"{scheme}_train.tsv")
        write_token_tags(sentences[48:64], d / f"{scheme}_valid.tsv")
    return d


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def train(capsys, data, out, scheme="types", *extra):
    return run(
        capsys,
        "train",
        "--task",
        "tag",
        "--train",
        str(data / f"{scheme}_train.tsv"),
        "--valid",
        str(data / f"{scheme}_valid.tsv"),
        "--out",
        str(out),
        *TINY,
        *extra,
    )


def evaluate_json(capsys, out, path) -> dict:
    code, stdout, err = run(
        capsys, "evaluate", "--checkpoint", str(out), "--data", str(path), "--json"
    )
    assert code == 0, err
    return json.loads(stdout)


def test_train_then_evaluate_json(capsys, data, tmp_path):
    out = tmp_path / "run"
    code, stdout, err = train(capsys, data, out, "types", "--epochs", "2", "--char-rnn", "--json")
    assert code == 0, err
    summary = json.loads(stdout)
    assert summary["task"] == "tag" and summary["steps"] == 12
    assert {"vocab.json", "labels.json", "chars.json", "model.safetensors"} <= {
        p.name for p in out.iterdir()
    }
    m = evaluate_json(capsys, out, data / "types_valid.tsv")
    n_tokens = sum(1 for line in (data / "types_valid.tsv").read_text().splitlines() if line)
    assert m["tokens"] == n_tokens and m["unknown_labels"] == 0
    assert m["loss_nats"] == pytest.approx(summary["valid"]["loss_nats"])
    for key in ("accuracy", "oov_accuracy", "macro_f1", "per_tag_f1", "perplexity"):
        assert key in m
    assert 0 <= m["accuracy"] <= 1 and m["oov_tokens"] > 0
    assert set(m["per_tag_f1"]) == set(summary["tags"])
    assert "span_f1" not in m  # not a BIO tag set
    # The accuracy is the model's own predictions scored by hand.
    _, tag_data, model = load_tagger(out)
    from rnnkit.data.tagged import read_token_tags

    sentences = read_token_tags(data / "types_valid.tsv")
    gold, pred = [], []
    for s in sentences:
        words = torch.tensor([[tag_data.vocab.stoi.get(word_key(t), 1) for t in s.tokens]])
        chars = torch.zeros(1, len(s.tokens), 30, dtype=torch.long)
        for i, t in enumerate(s.tokens):
            ids = tag_data.chars.encode(t[:16] + t[-8:] if len(t) > 24 else t)
            chars[0, i, : len(ids)] = torch.tensor(ids)
        pred += [tag_data.tags.labels[j] for j in model.predict(words, None, chars)[0].tolist()]
        gold += s.tags
    assert m["accuracy"] == pytest.approx(accuracy(gold, pred))
    # Text output (no --json) prints one line per figure.
    code, stdout, _ = run(
        capsys, "evaluate", "--checkpoint", str(out), "--data", str(data / "types_valid.tsv")
    )
    assert code == 0 and "accuracy:" in stdout and "per_tag_f1:" in stdout


def test_bio_tags_report_span_f1(capsys, data, tmp_path):
    out = tmp_path / "bio"
    assert train(capsys, data, out, "bio", "--steps", "3", "--cell", "gru")[0] == 0
    m = evaluate_json(capsys, out, data / "bio_valid.tsv")
    assert {"span_precision", "span_recall", "span_f1"} <= set(m)
    assert 0 <= m["span_f1"] <= 1


def test_unknown_tags_are_counted_not_fatal(capsys, data, tmp_path):
    out = tmp_path / "run"
    assert train(capsys, data, out, "types", "--steps", "2")[0] == 0
    extra = tmp_path / "extra.tsv"
    extra.write_text(
        (data / "types_valid.tsv").read_text() + "foo\tMYSTERY\nbar\tMYSTERY\n(\tOP\n\n",
        encoding="utf-8",
    )
    base = evaluate_json(capsys, out, data / "types_valid.tsv")
    m = evaluate_json(capsys, out, extra)
    assert m["unknown_labels"] == 2 and m["unknown_label_counts"] == {"MYSTERY": 2}
    assert m["tokens"] == base["tokens"] + 1  # only the known "(" is scored


def test_a_file_of_unknown_tags_only_is_one_line(capsys, data, tmp_path):
    """Every figure was None (``tokens: 0``), exit status 0 and nothing on stderr."""
    out = tmp_path / "run"
    assert train(capsys, data, out, "types", "--steps", "2")[0] == 0
    only_unknown = tmp_path / "unknown.tsv"
    only_unknown.write_text("foo\tMYSTERY\nbar\tMYSTERY\n\n(\tODD\n\n", encoding="utf-8")
    tags = json.loads((out / "labels.json").read_text())["labels"]
    known = ", ".join(tags[:5]) + (", …" if len(tags) > 5 else "")
    for json_flag in ([], ["--json"]):
        code, stdout, err = run(
            capsys, "evaluate", "--checkpoint", str(out), "--data", str(only_unknown), *json_flag
        )
        assert (code, stdout) == (2, "")
        assert err == (
            f"rnnkit evaluate: error: {only_unknown}: no token has a tag the model knows "
            f"({known}); 3 tokens have tags it was not trained on: MYSTERY (2), ODD (1)\n"
        )


def test_conllu_input_with_tag_column(capsys, tmp_path):
    rows = []
    for i, (form, upos, xpos) in enumerate(
        [("the", "DET", "DT"), ("cat", "NOUN", "NN"), ("sat", "VERB", "VBD")] * 4
    ):
        if i % 3 == 0:
            rows.append(f"# sent_id = {i}")
        rows.append(f"{i % 3 + 1}\t{form}\t{form}\t{upos}\t{xpos}\t_\t0\troot\t_\t_")
        if i % 3 == 2:
            rows.append("")
    path = tmp_path / "tiny.conllu"
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    out = tmp_path / "run"
    code, _, err = run(
        capsys,
        "train",
        "--task",
        "tag",
        "--train",
        str(path),
        "--valid",
        str(path),
        "--out",
        str(out),
        "--tag-column",
        "xpos",
        "--steps",
        "2",
        *TINY,
    )
    assert code == 0, err
    assert json.loads((out / "labels.json").read_text())["labels"] == ["DT", "NN", "VBD"]
    assert evaluate_json(capsys, out, path)["tokens"] == 12


def _refused(capsys, path: Path, out: Path, *extra: str) -> tuple[int, str]:
    """``rnnkit train --task tag`` on ``path`` (its own validation file): the exit code and
    the error line."""
    argv = ["--train", str(path), "--valid", str(path), "--out", str(out)]
    code, _, err = run(capsys, "train", "--task", "tag", *argv, "--steps", "2", *extra, *TINY)
    return code, err.strip()


def test_a_tag_column_the_file_leaves_empty_is_one_line(capsys, tmp_path):
    """UD treebanks often leave XPOS empty (``_``): a tagger of that one tag trained to a
    perfect accuracy, and tagged every word ``_``."""
    rows = [f"{i}\t{w}\t{w}\tNOUN\t_\t_\t0\troot\t_\t_" for i, w in enumerate("abc", 1)]
    path = tmp_path / "no_xpos.conllu"
    path.write_text("\n".join(rows) + "\n\n", encoding="utf-8")
    assert _refused(capsys, path, tmp_path / "run", "--tag-column", "xpos") == (
        2,
        f"rnnkit train: error: {path}: every training token has the tag '_' (CoNLL-U's "
        "empty field: choose a column the file fills, --tag-column); a tagger needs two "
        "tags or more",
    )
    assert not (tmp_path / "run" / "model.safetensors").exists()
    tsv = tmp_path / "no_tags.tsv"  # a file of token<TAB>tag has no column to choose
    tsv.write_text("a\t_\nb\t_\n\n", encoding="utf-8")
    assert _refused(capsys, tsv, tmp_path / "tsv") == (
        2,
        f"rnnkit train: error: {tsv}: every training token has the tag '_'; a tagger needs "
        "two tags or more",
    )


def test_a_tag_column_of_a_file_without_columns_is_refused(capsys, tmp_path):
    """Before: ``--tag-column xpos`` with ``token<TAB>tag`` data was read past, unused."""
    tsv = tmp_path / "tags.tsv"
    tsv.write_text("a\tX\nb\tY\n\n", encoding="utf-8")
    assert _refused(capsys, tsv, tmp_path / "r", "--tag-column", "xpos") == (
        2,
        f"rnnkit train: error: --tag-column xpos: {tsv} is token<TAB>tag, not CoNLL-U: it "
        "has no columns to choose from (leave --tag-column out)",
    )
    assert not (tmp_path / "r" / "config.json").exists()


def test_resume_continues_exactly(capsys, data, tmp_path):
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert train(capsys, data, straight, "types", "--steps", "6", "--eval-every", "3")[0] == 0
    assert train(capsys, data, split, "types", "--steps", "3", "--eval-every", "3")[0] == 0
    code, _, err = run(
        capsys,
        "train",
        "--task",
        "tag",
        "--train",
        str(data / "types_train.tsv"),
        "--valid",
        str(data / "types_valid.tsv"),
        "--out",
        str(split),
        "--resume",
        "--steps",
        "6",
        "--eval-every",
        "3",
        *TINY,
    )
    assert code == 0, err
    a = json.loads((straight / "summary.json").read_text())["valid"]
    b = json.loads((split / "summary.json").read_text())["valid"]
    assert a["loss_nats"] == pytest.approx(b["loss_nats"], rel=1e-6)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("a\tX\nb Y\n", ":2: line has no tab (expected token<TAB>tag)"),
        ("a\tX\nb\tY\tZ\n", ":2: expected token<TAB>tag, got 3 tab-separated fields"),
        ("a\tX\n\tY\n", ":2: empty token (expected token<TAB>tag)"),
        (
            "# c\n1\ta\ta\tX\t_\t_\t0\troot\t_\n",
            ":2: malformed CoNLL-U line: expected 10 tab-separated columns, got 9",
        ),
    ],
)
def test_bad_input_is_one_line_naming_file_and_line(capsys, tmp_path, content, message):
    bad = tmp_path / "bad.tsv"
    bad.write_text(content, encoding="utf-8")
    out = tmp_path / "run"
    code, _, err = run(
        capsys, "train", "--task", "tag", "--train", str(bad), "--out", str(out), *TINY
    )
    assert code == 2
    assert err.strip() == f"rnnkit train: error: {bad}{message}"
    assert not (out / "model.safetensors").exists()


def test_bidirectional_is_refused_and_never_recorded(capsys, data, tmp_path):
    """The tagger's encoder is always bidirectional: ``--bidirectional`` (given even at its
    default, in a config file) is refused as an option the task does not read, and neither
    ``config.json``, ``--print-config`` nor the report says ``bidirectional``."""
    code, _, err = train(capsys, data, tmp_path / "no", "types", "--steps", "1", "--bidirectional")
    assert code == 2
    assert err.strip().endswith(
        "--bidirectional does not apply to --task tag (only to: classify, seq2seq, regress)"
    )
    conf = tmp_path / "c.toml"
    conf.write_text("bidirectional = false\n")
    code, _, err = train(capsys, data, tmp_path / "no", "types", "--config", str(conf))
    assert code == 2 and "--bidirectional does not apply to --task tag" in err
    assert not (tmp_path / "no").exists()
    code, printed, err = train(capsys, data, tmp_path / "p", "types", "--print-config")
    shown = tomllib.loads(printed)
    assert code == 0 and "bidirectional" not in shown and shown["char-rnn"] is True
    out = tmp_path / "run"
    assert train(capsys, data, out, "types", "--steps", "1")[0] == 0
    saved = json.loads((out / "config.json").read_text())["config"]
    assert "bidirectional" not in saved and "pooling" not in saved and saved["task"] == "tag"
    from rnnkit.app.report.page import render_report

    assert "bidirectional" not in render_report(out).replace(str(tmp_path), "")
    _, _, model = load_tagger(out)
    assert model.encoder.bidirectional


@pytest.mark.parametrize("recorded", [False, True])
def test_an_older_run_recording_bidirectional_loads_evaluates_predicts_and_resumes(
    capsys, data, tmp_path, recorded
):
    """Runs trained before the option was refused hold ``"bidirectional": false`` (or true,
    given) in ``config.json``: they are read, evaluated, answered and resumed as before."""
    import rnnkit
    from rnnkit.training.manifest import write_manifest

    out = tmp_path / "old"
    assert train(capsys, data, out, "types", "--steps", "2", "--eval-every", "2")[0] == 0
    path = out / "config.json"
    doc = json.loads(path.read_text())
    doc["config"]["bidirectional"] = recorded
    path.write_text(json.dumps(doc))
    write_manifest(out)
    assert rnnkit.load(out).predict([["def", "f"]])[0].__len__() == 2
    valid = data / "types_valid.tsv"
    assert evaluate_json(capsys, out, valid)["unknown_labels"] == 0
    sentence = tmp_path / "in.txt"
    sentence.write_text("def f ( x ) :\n")
    code, stdout, err = run(capsys, "predict", "--checkpoint", str(out), "--input", str(sentence))
    assert code == 0, err
    assert json.loads(stdout)["tokens"] == ["def", "f", "(", "x", ")", ":"]
    code, _, err = run(
        capsys, "train", "--task", "tag", "--train", str(data / "types_train.tsv"), "--valid",
        str(valid), "--out", str(out), "--resume", "--steps", "4", *TINY,
    )  # fmt: skip
    assert code == 0, err
    assert json.loads((out / "summary.json").read_text())["steps"] == 4
    # the Python API resumes it too, from a configuration that leaves the option unset
    from rnnkit.app.config import TrainConfig
    from rnnkit.app.tasks.fitting import check_resume

    unset = {k: v for k, v in doc["config"].items() if k != "bidirectional"}
    check_resume(TrainConfig.from_dict({**unset, "steps": 6}), out)


def test_words_spelled_like_specials_are_unknown_words(capsys, data, tmp_path):
    """``<pad>`` in a sentence was the padding id 0 and, with ``<s>`` and ``</s>``, counted
    as known: predict counts each as unknown and tags it as any unknown word."""
    out = tmp_path / "run"
    assert train(capsys, data, out, "types", "--steps", "2", "--no-char-rnn")[0] == 0
    sentences = tmp_path / "in.txt"
    sentences.write_text("def <pad> ( <s> </s> <unk>\ndef zzqq ( zzqq zzqq <unk>\n")
    code, stdout, err = run(capsys, "predict", "--checkpoint", str(out), "--input", str(sentences))
    assert code == 0, err
    special, unknown = (json.loads(line) for line in stdout.splitlines())
    assert (special["unknown"], unknown["unknown"]) == (3, 3)
    assert special["tags"] == unknown["tags"]  # without characters, one unknown word is another
