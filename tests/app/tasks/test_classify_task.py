"""``rnnkit train --task classify`` and ``rnnkit evaluate`` end to end on tiny generated
data (the majority-letter task), char and word units, every pooling, unknown labels at
evaluation, and bad input reported as one line naming file and line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rnnkit.app.cli.main import main
from rnnkit.app.tasks.classify import load_classifier
from rnnkit.data.generated import majority_letter_examples, write_labelled
from rnnkit.data.labelled import LabelledExample, read_labelled
from rnnkit.metrics.labels import confusion_matrix, macro_f1

TINY = ["--hidden", "8", "--embedding", "8", "--batch-size", "8", "--quiet"]


@pytest.fixture(autouse=True, scope="module")
def _one_thread(single_thread):
    yield


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("classify")
    write_labelled(majority_letter_examples(64, seed=0), d / "train.tsv")
    write_labelled(majority_letter_examples(24, seed=1), d / "valid.tsv")
    words = [LabelledExample(e.label, " ".join(e.text), 0) for e in majority_letter_examples(40)]
    write_labelled(words, d / "words.tsv")
    return d


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def train(capsys, data, out, *extra, train_file="train.tsv", valid_file="valid.tsv"):
    valid = ["--valid", str(data / valid_file)] if valid_file else []
    return run(
        capsys,
        "train",
        "--task",
        "classify",
        "--train",
        str(data / train_file),
        *valid,
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


@pytest.mark.parametrize("pooling", ["last", "mean", "max"])
def test_train_then_evaluate_json(capsys, data, tmp_path, pooling):
    out = tmp_path / "run"
    code, stdout, err = train(
        capsys, data, out, "--epochs", "2", "--pooling", pooling, "--bidirectional", "--json"
    )
    assert code == 0, err
    summary = json.loads(stdout)
    assert summary["task"] == "classify" and summary["steps"] == 16
    assert summary["labels"] == ["a", "b", "c"]
    assert set(summary["baselines"]) == {"majority", "bag_of_ngrams"}
    m = evaluate_json(capsys, out, data / "valid.tsv")
    assert m["tokens"] == m["examples"] == 24 and m["unknown_labels"] == 0
    assert m["loss_nats"] == pytest.approx(summary["valid"]["loss_nats"])
    # Figures recomputed by hand from the model's own predictions.
    _, vocab, labels, model = load_classifier(out)
    examples = read_labelled(data / "valid.tsv")
    pred = [
        labels.labels[int(model.predict(torch.tensor([vocab.encode(e.text)]))[0])] for e in examples
    ]
    gold = [e.label for e in examples]
    assert m["accuracy"] == pytest.approx(sum(g == p for g, p in zip(gold, pred, strict=True)) / 24)
    assert m["macro_f1"] == pytest.approx(macro_f1(gold, pred, labels.labels))
    assert m["confusion_matrix"] == confusion_matrix(gold, pred, labels.labels)
    assert m["labels"] == labels.labels
    assert set(m["per_class_f1"]) == {"a", "b", "c"}


def test_word_units_and_held_out_validation(capsys, data, tmp_path):
    out = tmp_path / "words"
    code, _, err = train(
        capsys,
        data,
        out,
        "--unit",
        "word",
        "--steps",
        "3",
        "--cell",
        "gru",
        train_file="words.tsv",
        valid_file=None,
    )
    assert code == 0, err
    vocab = json.loads((out / "vocab.json").read_text())
    assert vocab["unit"] == "word" and set(vocab["tokens"][4:]) == set("abcxyz")
    assert evaluate_json(capsys, out, data / "words.tsv")["tokens"] == 40


def test_unknown_labels_are_counted_not_fatal(capsys, data, tmp_path):
    out = tmp_path / "run"
    assert train(capsys, data, out, "--steps", "2")[0] == 0
    extra = tmp_path / "extra.tsv"
    extra.write_text("a\taaab\nzzz\taxb\nzzz\tccc\nq\tb\n", encoding="utf-8")
    m = evaluate_json(capsys, out, extra)
    assert m["tokens"] == 1 and m["unknown_labels"] == 3
    assert m["unknown_label_counts"] == {"q": 1, "zzz": 2}
    assert sum(map(sum, m["confusion_matrix"])) == 1


def test_a_file_of_unknown_labels_only_is_one_line(capsys, data, tmp_path):
    """Every figure was None (``loss_nats: None``, ``examples: 0``), exit status 0, and
    nothing on stderr: a file of labels the run never had has nothing to score."""
    out = tmp_path / "run"
    assert train(capsys, data, out, "--steps", "2")[0] == 0
    only_unknown = tmp_path / "unknown.tsv"
    only_unknown.write_text("zzz\taxb\nq\tb\nzzz\tccc\n", encoding="utf-8")
    labels = ", ".join(json.loads((out / "labels.json").read_text())["labels"])
    for json_flag in ([], ["--json"]):
        code, stdout, err = run(
            capsys, "evaluate", "--checkpoint", str(out), "--data", str(only_unknown), *json_flag
        )
        assert (code, stdout) == (2, "")
        assert err == (
            f"rnnkit evaluate: error: {only_unknown}: no example has a label the model knows "
            f"({labels}); 3 examples have labels it was not trained on: zzz (2), q (1)\n"
        )


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("a\tabc\nb abc\n", ":2: line has no tab (expected label<TAB>text)"),
        ("a\tabc\n\tabc\n", ":2: empty label (expected label<TAB>text)"),
        ("a\tabc\n\n\nb\t \n", ":4: empty text (expected label<TAB>text)"),
        # Too few to split, or a held-out part without a known label: the file was unnamed.
        ("a\tabc\n", ": 1 example is too few to hold out 5% for validation; pass --valid"),
        # one label left to train on (before: a perfect accuracy, every baseline too)
        (
            "a\tabc\nb\tabd\n",
            ": every training example has the label 'a': the validation part held out of the "
            "file took every other label ('b'); give a validation file of its own (--valid)",
        ),
        (
            "x\tab\nx\tba\n" * 20,
            ": every training example has the label 'x'; a classifier needs two labels or more",
        ),
    ],
)
def test_bad_input_is_one_line_naming_file_and_line(capsys, tmp_path, content, message):
    bad = tmp_path / "bad.tsv"
    bad.write_text(content, encoding="utf-8")
    out = tmp_path / "run"
    code, _, err = run(
        capsys, "train", "--task", "classify", "--train", str(bad), "--out", str(out), *TINY
    )
    assert code == 2
    assert err.strip() == f"rnnkit train: error: {bad}{message}"
    assert not out.exists() or not (out / "model.safetensors").exists()


def test_a_validation_file_without_a_label_seen_in_training_is_one_line(capsys, tmp_path):
    train_file, valid = tmp_path / "train.tsv", tmp_path / "valid.tsv"
    train_file.write_text("a\tabc\nb\tabd\n" * 5, encoding="utf-8")
    valid.write_text("c\tabc\n", encoding="utf-8")
    argv = ["--train", str(train_file), "--valid", str(valid), "--out", str(tmp_path / "r")]
    code, _, err = run(capsys, "train", "--task", "classify", *argv, *TINY)
    assert (code, err.strip()) == (
        2,
        f"rnnkit train: error: {valid}: no validation example has a label seen in training",
    )


def test_evaluate_bad_file_and_wrong_task(capsys, data, tmp_path):
    out = tmp_path / "run"
    assert train(capsys, data, out, "--steps", "1")[0] == 0
    bad = tmp_path / "bad.tsv"
    bad.write_text("a\tok\nnot labelled\n", encoding="utf-8")
    code, _, err = run(capsys, "evaluate", "--checkpoint", str(out), "--data", str(bad))
    assert code == 2 and err.strip().endswith(f"{bad}:2: line has no tab (expected label<TAB>text)")
    from rnnkit.app.tasks.tag import load_tagger
    from rnnkit.errors import CheckpointError

    with pytest.raises(CheckpointError, match="task is 'classify', not 'tag'"):
        load_tagger(out)


def test_resume_continues_exactly(capsys, data, tmp_path):
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert train(capsys, data, straight, "--steps", "6", "--eval-every", "3")[0] == 0
    assert train(capsys, data, split, "--steps", "3", "--eval-every", "3")[0] == 0
    assert train(capsys, data, split, "--steps", "6", "--eval-every", "3", "--resume")[0] == 0
    a = json.loads((straight / "summary.json").read_text())["valid"]
    b = json.loads((split / "summary.json").read_text())["valid"]
    assert a["loss_nats"] == pytest.approx(b["loss_nats"], rel=1e-6)


def test_pretrained_vectors_are_counted_and_a_wrong_dimension_is_one_line(capsys, data, tmp_path):
    vectors = tmp_path / "v.txt"
    vectors.write_text("a 1 0 0 0 0 0 0 0\nb 0 1 0 0 0 0 0 0\nqq 0 0 1 0 0 0 0 0\n")
    code, out, err = train(
        capsys, data, tmp_path / "p", "--pretrained-vectors", str(vectors), "--steps", "2",
        "--json", "-v",  # -v cancels TINY's -q: the default level, where notes show
    )  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["pretrained_vectors"]["found"] == 2  # a and b, not qq
    assert "rnnkit: pretrained vectors: 2 of" in err and "vocabulary words found" in err
    # -q (TINY's) keeps only warnings and errors; summary.json has the count either way.
    code, _, err = train(capsys, data, tmp_path / "p2", "--pretrained-vectors", str(vectors),
                         "--steps", "1")  # fmt: skip
    assert code == 0 and "vocabulary words found" not in err, err
    vectors.write_text("a 1 0 0\n")
    code, _, err = train(capsys, data, tmp_path / "q", "--pretrained-vectors", str(vectors))
    assert code == 2 and f"{vectors}:1:" in err and "--embedding" in err
    assert len(err.strip().splitlines()) == 1


def test_majority_baseline_breaks_ties_by_label_order():
    """Of equally frequent labels the first in label order, whatever order the lines come
    in (a file's order would make the baseline depend on how the data was shuffled)."""
    import numpy as np

    from rnnkit.app.tasks.classify import EncodedExamples, fit_baselines

    def majority(labels: list[int]) -> int:
        inputs = [np.array([1 + i % 3, 2], dtype=np.int64) for i in range(len(labels))]
        train = EncodedExamples([], inputs, np.array(labels, dtype=np.int64))
        return fit_baselines(train, vocab_size=5, num_labels=3).majority

    assert majority([2, 1, 2, 1, 0]) == 1  # 1 and 2 twice each: 1 comes first
    assert majority([1, 2, 2, 1, 2]) == 2
    assert majority([2, 2, 0, 0, 1, 1]) == 0


def _examples(n: int) -> list[LabelledExample]:
    """``n`` texts of 1-6 letters of "abcd", labelled x, y, z or w (w: never trained)."""
    import numpy as np

    rng = np.random.default_rng(n)
    letters = list("abcd")
    return [
        LabelledExample(
            "xyzw"[int(rng.integers(4))], "".join(rng.choice(letters, int(rng.integers(1, 7)))), i
        )
        for i in range(n)
    ]


@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_validation_reads_the_device_once_and_scores_each_example_as_alone(monkeypatch, pooling):
    """``classify_metrics`` equals the model on every example alone, and on a GPU (reads
    counted on the CPU, as the device would see them) reads the device once whatever the
    number of batches: the summed loss and all predictions with the model's checks (before:
    up to seven reads a batch, the loss, its guard, two masked selections, the predictions
    and the model's two checks)."""
    import sys

    import torch.nn.functional as F

    from rnnkit import deferred as deferred_module
    from rnnkit.app.config import TrainConfig
    from rnnkit.app.tasks.classify import classify_metrics, encode_examples
    from rnnkit.app.tasks.settings import model_spec
    from rnnkit.bptt.fused import use_fused
    from rnnkit.data.labelled import LabelSet
    from rnnkit.data.vocab import Vocabulary
    from rnnkit.models.classifier import build_classifier

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "training"))
    from host_reads import HostReads

    vocab, labels = Vocabulary(list("abcd"), unit="char"), LabelSet(["x", "y", "z"])
    cfg = TrainConfig(train="x", hidden=8, embedding=4, pooling=pooling)
    torch.manual_seed(0)
    model = build_classifier(model_spec(cfg), len(vocab), len(labels)).train()
    cpu = torch.device("cpu")

    def score(n: int) -> dict:
        enc = encode_examples(_examples(n), vocab, labels, max_len=8)
        return classify_metrics(model, enc, labels, cpu, batch_size=3)

    enc = encode_examples(_examples(10), vocab, labels, max_len=8)
    nats, gold, pred = 0.0, [], []
    with torch.no_grad():
        for x, y in zip(enc.inputs, enc.labels.tolist(), strict=True):
            logits = model.eval()(torch.from_numpy(x)[None])  # (1, K)
            if y < len(labels):
                nats += float(F.cross_entropy(logits.double(), torch.tensor([y])))
                gold.append(labels.labels[y])
                pred.append(labels.labels[int(logits.argmax())])
    model.train()
    n = len(gold)
    eager = score(10)
    monkeypatch.setattr(deferred_module, "waits", lambda tensor: True)  # as on a GPU
    reads = []
    for size in (10, 20):  # 4 and 7 batches
        with use_fused("fused"), HostReads(model) as counted:
            got = score(size)
        reads.append(dict(counted.sites))
        if size == 10:
            for m in (eager, got):
                assert m["tokens"] == m["examples"] == n < 10  # unknown labels left out
                assert m["unknown_labels"] == 10 - n
                assert m["loss_nats"] == pytest.approx(nats / n, rel=1e-5)
                assert m["accuracy"] == sum(g == p for g, p in zip(gold, pred, strict=True)) / n
                assert m["confusion_matrix"] == confusion_matrix(gold, pred, labels.labels)
    assert model.training  # put back as it was
    for sites in reads:
        assert sum(sites.values()) == 1 and all(s.startswith("deferred.py:") for s in sites), sites

    bad = encode_examples(_examples(4), vocab, labels, max_len=8)
    bad.inputs[1] = bad.inputs[1].copy()
    bad.inputs[1][0] = len(vocab)  # outside the vocabulary
    errors = []
    for on_a_gpu in (True, False):  # the same error on the GPU's path and the CPU's
        monkeypatch.setattr(deferred_module, "waits", lambda tensor, gpu=on_a_gpu: gpu)
        with pytest.raises(ValueError, match="inputs must hold token ids") as error:
            classify_metrics(model, bad, labels, cpu, batch_size=3)
        errors.append(str(error.value))
    assert errors[0] == errors[1], errors


def test_predict_counts_only_the_unknown_tokens_read(capsys, data, tmp_path):
    """``unknown`` counts the unknown tokens among the first ``--max-len``, the ones the
    model reads: never more than ``tokens``. The Python API reads the same ids."""
    import rnnkit
    from rnnkit.app.tasks.classify import predictor

    out = tmp_path / "cut"
    code, _, err = train(capsys, data, out, "--steps", "2", "--max-len", "10", "--no-report")
    assert code == 0, err
    texts = ["ab" + "Ж" * 20, "a" * 9 + "ЖЖ", "ЖaЖ"]  # training letters: a b c x y z
    answers = predictor(out)(texts, [("<stdin>", i + 1) for i in range(len(texts))])
    assert [(a["tokens"], a["unknown"]) for a in answers] == [(10, 8), (10, 1), (3, 2)]
    best = [max(a["probabilities"], key=a["probabilities"].get) for a in answers]
    assert [a["label"] for a in answers] == best == rnnkit.load(out).predict(texts)


def test_words_spelled_like_specials_are_unknown_words(capsys, data, tmp_path):
    """A word-level classifier read a word ``<pad>`` as the padding id 0 (and ``<s>``,
    ``</s>`` as the boundaries), and called it known: each is the unknown word, counted,
    in training, evaluation, predict and the Python API alike."""
    import numpy as np

    import rnnkit
    from rnnkit.app.tasks.classify import encode_examples, predictor

    out = tmp_path / "words"
    code, _, err = train(
        capsys, data, out, "--unit", "word", "--steps", "2", "--no-report",
        train_file="words.tsv", valid_file=None,
    )  # fmt: skip
    assert code == 0, err
    _, vocab, labels, _ = load_classifier(out)
    examples = [LabelledExample("a", "a <pad> b <s> </s> <unk>", 1)]
    enc = encode_examples(examples, vocab, labels, max_len=100)
    a, b = vocab.stoi["a"], vocab.stoi["b"]
    assert enc.inputs[0].tolist() == [a, 1, b, 1, 1, 1]
    texts = ["a <pad> b <s> </s> <unk>", "a 1 b <unk>"]
    answers = predictor(out)(texts, [("<stdin>", 1), ("<stdin>", 2)])
    assert [(x["tokens"], x["unknown"]) for x in answers] == [(6, 3), (4, 1)]
    # the same ids as "1", a word the vocabulary lacks: the same answer
    np.testing.assert_allclose(
        list(answers[0]["probabilities"].values()),
        list(predictor(out)(["a 1 b 1 1 1"], [("<stdin>", 1)])[0]["probabilities"].values()),
    )
    assert rnnkit.load(out).predict(texts) == [x["label"] for x in answers]
