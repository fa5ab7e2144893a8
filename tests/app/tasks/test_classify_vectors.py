"""``classify --inputs vectors``: real-valued sequences, one label each, end to end (train,
evaluate, predict, report), the frame baseline against scikit-learn, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rnnkit.app.cli.main import main

TINY = ["--hidden", "8", "--batch-size", "8", "--quiet", "--no-report"]
CLASSES = {"walk": 0.6, "run": 1.8, "sit": 0.0}  # the frequency of each activity


def activities(n: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        label = list(CLASSES)[i % 3]
        t = np.arange(int(rng.integers(6, 14)))
        x = np.stack([np.sin(CLASSES[label] * t + rng.uniform(0, 6)), 0.5 * np.cos(t)], 1)
        x += 0.2 * rng.standard_normal(x.shape)
        out.append({"seq": np.round(x, 5).tolist(), "label": label})
    return out


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("activities")
    write_jsonl(d / "train.jsonl", activities(60, 0))
    write_jsonl(d / "valid.jsonl", activities(21, 1))
    return d


@pytest.fixture(scope="module")
def run(data, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "vectors"
    argv = ["train", "--task", "classify", "--inputs", "vectors", "--train"]
    code = main([*argv, str(data / "train.jsonl"), "--valid", str(data / "valid.jsonl"),
                 "--out", str(out), *TINY, "--steps", "8", "--pooling", "mean"])  # fmt: skip
    assert code == 0
    return out


def test_train_evaluate_and_predict_real_valued_sequences(run, data, capsys):
    summary = json.loads((run / "summary.json").read_text())
    assert summary["task"] == "classify" and summary["input_size"] == 2
    assert summary["labels"] == ["run", "sit", "walk"]
    assert not (run / "vocab.json").exists() and (run / "baseline.safetensors").is_file()
    code, out, err = cli(
        capsys, "evaluate", "--checkpoint", str(run), "--data", str(data / "valid.jsonl"), "--json"
    )
    assert code == 0, err
    metrics = json.loads(out)
    assert metrics["examples"] == 21 and sum(map(sum, metrics["confusion_matrix"])) == 21
    code, out, err = cli(
        capsys, "predict", "--checkpoint", str(run), "--input", str(data / "valid.jsonl")
    )
    assert code == 0, err
    records = [json.loads(line) for line in out.splitlines()]
    gold = [r["label"] for r in activities(21, 1)]
    assert [r["steps"] for r in records] == [len(r["seq"]) for r in activities(21, 1)]
    accuracy = np.mean([r["label"] == g for r, g in zip(records, gold, strict=True)])
    assert metrics["accuracy"] == pytest.approx(accuracy)  # evaluate and predict agree
    for r in records:
        assert sum(r["probabilities"].values()) == pytest.approx(1.0)
        assert r["label"] == max(r["probabilities"], key=r["probabilities"].get)


def test_a_file_of_unknown_labels_only_is_one_line(run, tmp_path, capsys):
    """Every figure was None (``examples: 0``), exit status 0 and nothing on stderr."""
    rows = [{**r, "label": "swim"} for r in activities(3, 2)] + [
        {**activities(1, 3)[0], "label": "fly"}
    ]
    path = write_jsonl(tmp_path / "unknown.jsonl", rows)
    code, out, err = cli(capsys, "evaluate", "--checkpoint", str(run), "--data", str(path))
    assert (code, out) == (2, "")
    assert err == (
        f"rnnkit evaluate: error: {path}: no sequence has a label the model knows (run, sit, "
        "walk); 4 sequences have labels it was not trained on: swim (3), fly (1)\n"
    )


def test_training_sequences_of_one_label_are_one_line(tmp_path, capsys):
    """Before: a perfect accuracy (every baseline too), and "walk" for every sequence."""
    path = write_jsonl(tmp_path / "walks.jsonl", [{**r, "label": "walk"} for r in activities(9, 4)])
    argv = ["--train", str(path), "--valid", str(path), "--out", str(tmp_path / "r")]
    code, _, err = cli(capsys, "train", "--task", "classify", "--inputs", "vectors", *argv, *TINY)
    assert (code, err) == (
        2,
        f"rnnkit train: error: {path}: every training sequence has the label 'walk'; a "
        "classifier needs two labels or more\n",
    )


def test_frame_baselines_against_sklearn(run, data):
    sklearn = pytest.importorskip("sklearn")
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    del sklearn

    def features(rows):
        return (
            np.stack([np.concatenate([np.mean(r["seq"], 0), r["seq"][-1]]) for r in rows])
            .astype(np.float32)
            .astype(np.float64)
        )  # the frames are read as float32

    train, valid = activities(60, 0), activities(21, 1)
    scaler = StandardScaler().fit(features(train))
    fitted = LogisticRegression(C=10.0, tol=1e-10, max_iter=10_000)
    fitted.fit(scaler.transform(features(train)), [r["label"] for r in train])
    predicted = fitted.predict(scaler.transform(features(valid)))
    gold = [r["label"] for r in valid]
    b = json.loads((run / "summary.json").read_text())["baselines"]
    assert b["mean_last_frame"]["accuracy"] == pytest.approx(
        np.mean([p == g for p, g in zip(predicted, gold, strict=True)])
    )
    assert b["majority"] == {  # balanced classes: the first label in label order
        "kind": "majority class (run)",
        "accuracy": pytest.approx(7 / 21),
        "macro_f1": pytest.approx((2 * (7 / 21) / (1 + 7 / 21)) / 3),
    }


def test_label_folders_of_csv_files(tmp_path, capsys):
    for split, seed in (("train", 0), ("valid", 1)):
        for i, row in enumerate(activities(24 if split == "train" else 9, seed)):
            folder = tmp_path / split / row["label"]
            folder.mkdir(parents=True, exist_ok=True)
            lines = "".join(",".join(str(v) for v in step) + "\n" for step in row["seq"])
            (folder / f"{i:03d}.csv").write_text("x,y\n" + lines, encoding="utf-8")
    out = tmp_path / "run"
    code, _, err = cli(
        capsys, "train", "--task", "classify", "--inputs", "vectors", "--train",
        str(tmp_path / "train"), "--valid", str(tmp_path / "valid"), "--out", str(out),
        *TINY, "--steps", "2",
    )  # fmt: skip
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["labels"] == ["run", "sit", "walk"] and summary["valid"]["examples"] == 9


def test_bad_vector_input_is_one_line(data, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"seq": [[1, 2]], "label": "walk"}\n{"seq": [[1, 2]]}\n', encoding="utf-8")
    code, _, err = cli(
        capsys, "train", "--task", "classify", "--inputs", "vectors", "--train", str(bad),
        "--out", str(tmp_path / "run"), *TINY, "--steps", "1",
    )  # fmt: skip
    assert code not in (0, None) and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and "bad.jsonl:2" in err and '"label"' in err
    wide = tmp_path / "wide.jsonl"
    wide.write_text('{"seq": [[1, 2, 3]], "label": "walk"}\n', encoding="utf-8")
    code, _, err = cli(
        capsys, "train", "--task", "classify", "--inputs", "vectors", "--train",
        str(data / "train.jsonl"), "--valid", str(wide), "--out", str(tmp_path / "r2"),
        *TINY, "--steps", "1",
    )  # fmt: skip
    assert code not in (0, None) and "wide.jsonl:1" in err and "3 values" in err


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("[" * 100_000, "JSON nested too deeply"),
        ('{"seq": [[' + "9" * 5000 + ', 1]], "label": "walk"}', "an integer with too many digits"),
    ],
)
def test_predict_on_deep_or_huge_integer_json_is_one_line(run, tmp_path, capsys, line, message):
    # predict peeks at each line for a "label" before reading it: json.loads raised
    # RecursionError and ValueError there, past the reader's own checks.
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"seq": [[1, 2]]}\n' + line + "\n", encoding="utf-8")
    code, _, err = cli(capsys, "predict", "--checkpoint", str(run), "--input", str(bad))
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"{bad}:2: not valid JSON ({message}" in err


def test_metrics_read_the_device_once_and_score_each_sequence_as_alone(monkeypatch):
    """``vector_metrics`` equals the model on every sequence alone, and on a GPU (reads
    counted on the CPU, as the device would see them) reads the device once whatever the
    number of batches: every batch's probabilities together, with the model's checks
    (before: one read a batch)."""
    import sys

    import torch
    import torch.nn.functional as F

    from rnnkit import deferred as deferred_module
    from rnnkit.app.tasks.classify_vectors import encode_vectors, vector_metrics
    from rnnkit.bptt.fused import use_fused
    from rnnkit.data.labelled import LabelSet
    from rnnkit.data.vectors import parse_vector_line
    from rnnkit.models.classifier import build_vector_classifier
    from rnnkit.models.spec import ModelSpec

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "training"))
    from host_reads import HostReads

    labels = LabelSet(["walk", "run"])  # "sit" is a label the model does not know

    def encoded(n: int):
        rows = [json.dumps(r) for r in activities(n, n)]
        seqs = [parse_vector_line(r, "f", i + 1, labelled=True) for i, r in enumerate(rows)]
        return encode_vectors(seqs, labels, max_len=8)

    torch.manual_seed(0)
    model = build_vector_classifier(ModelSpec(hidden=8, pooling="mean"), 2, 2).train()
    enc = encoded(10)
    nats, right, n = 0.0, 0, 0
    with torch.no_grad():
        for x, y in zip(enc.inputs, enc.labels.tolist(), strict=True):
            logits = model.eval()(x[None]).double()  # (1, K)
            if y < len(labels):
                nats += float(F.cross_entropy(logits, torch.tensor([y])))
                right += int(int(logits.argmax()) == y)
                n += 1
    model.train()
    eager = vector_metrics(model, enc, labels, batch_size=3)
    monkeypatch.setattr(deferred_module, "waits", lambda tensor: True)  # as on a GPU
    reads = []
    for size in (10, 20):  # 4 and 7 batches
        with use_fused("fused"), HostReads(model) as counted:
            got = vector_metrics(model, encoded(size), labels, batch_size=3)
        reads.append(dict(counted.sites))
        if size == 10:
            for m in (eager, got):
                assert m["examples"] == n < 10  # the unknown labels left out
                assert m["loss_nats"] == pytest.approx(nats / n, rel=1e-5)
                assert m["accuracy"] == right / n
    assert model.training  # put back as it was
    for sites in reads:
        assert sum(sites.values()) == 1 and all(s.startswith("deferred.py:") for s in sites), sites
