"""The baselines of the supervised tasks end to end: fitted on the training file, scored
on the validation file in the summary and on any file by ``evaluate``, each against a
hand-computed value or scikit-learn; and the one "behind baseline" line when the model
is worse (one training step) — on stderr, in ``summary.json`` and in the report."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from rnnkit.app.cli.main import main
from rnnkit.data.generated import letter_order_examples, write_labelled

TINY = ["--hidden", "8", "--embedding", "8", "--batch-size", "4", "--quiet", "--no-report"]


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def train(capsys, task: str, d: Path, out: Path, *extra: str) -> tuple[dict, str, str]:
    suffix = next(p.suffix for p in d.iterdir() if p.stem == "train")
    code, stdout, err = cli(
        capsys, "train", "--task", task, "--train", str(d / f"train{suffix}"), "--valid",
        str(d / f"valid{suffix}"), "--out", str(out), *TINY, *extra,
    )  # fmt: skip
    assert code == 0, err
    return json.loads((out / "summary.json").read_text()), stdout, err


def evaluate(capsys, out: Path, data: Path) -> dict:
    code, stdout, err = cli(
        capsys, "evaluate", "--checkpoint", str(out), "--data", str(data), "--json"
    )
    assert code == 0, err
    return json.loads(stdout)


def tagged(path: Path, sentences: list[list[tuple[str, str]]]) -> None:
    path.write_text("".join("".join(f"{w}\t{t}\n" for w, t in s) + "\n" for s in sentences))


# -- tag ---------------------------------------------------------------------------------


def test_most_frequent_tag_by_hand(capsys, tmp_path):
    # x: A twice, B once -> A; y -> B; z -> C. Overall B is the most frequent (3).
    tagged(tmp_path / "train.tsv", [[("x", "A"), ("y", "B")], [("x", "A"), ("y", "B")],
                                    [("x", "B"), ("z", "C")]])  # fmt: skip
    # x right, w (unknown: gets B) right, z wrong, y right, q (unknown: B) wrong; the gold
    # tag D was never trained on: that token is not scored (for the model neither).
    valid = [[("x", "A"), ("w", "B"), ("z", "A"), ("y", "B"), ("q", "C"), ("x", "D")]]
    tagged(tmp_path / "valid.tsv", valid)
    summary, stdout, _ = train(capsys, "tag", tmp_path, tmp_path / "run", "--steps", "1")
    want = {
        "kind": "most frequent tag per word",
        "accuracy": 3 / 5,
        "oov_accuracy": 1 / 2,
        "oov_tokens": 2,
    }
    assert summary["baselines"] == {"most_frequent_tag": want}
    assert "baseline, most frequent tag per word: accuracy 0.6000, oov accuracy 0.5000" in stdout
    metrics = evaluate(capsys, tmp_path / "run", tmp_path / "valid.tsv")
    assert metrics["baselines"] == {"most_frequent_tag": want}
    assert metrics["oov_tokens"] == want["oov_tokens"]  # the model's OOV tokens are the same
    # on other data: only y and a new word
    tagged(tmp_path / "other.tsv", [[("y", "C"), ("v", "B")]])
    other = evaluate(capsys, tmp_path / "run", tmp_path / "other.tsv")["baselines"]
    assert other["most_frequent_tag"]["accuracy"] == 0.5
    assert other["most_frequent_tag"]["oov_accuracy"] == 1.0


def _word_tags(n: int, seed: int) -> list[list[tuple[str, str]]]:
    """Each word has one tag: the most-frequent-tag baseline is always right."""
    rng = np.random.default_rng(seed)
    words = {f"w{i}": "ABCD"[i % 4] for i in range(8)}
    names = list(words)
    return [[(w, words[w]) for w in (names[j] for j in rng.integers(8, size=6))] for _ in range(n)]


def test_one_step_is_behind_the_baseline_and_says_why(capsys, tmp_path):
    tagged(tmp_path / "train.tsv", _word_tags(24, 0))
    tagged(tmp_path / "valid.tsv", _word_tags(8, 1))
    out = tmp_path / "run"
    summary, _, err = train(capsys, "tag", tmp_path, out, "--steps", "1")
    behind = summary["behind_baseline"]
    assert behind["baseline"] == 1.0 and behind["model"] < 1.0
    assert behind["still_improving"] is True and behind["steps"] == 1
    (line,) = err.splitlines()
    assert line == f"rnnkit: {behind['line']}"
    assert line.startswith(
        f"rnnkit: behind baseline: validation accuracy {behind['model']:#.4g} vs 1.000 for the "
        "most frequent tag per word, after 1 step; likely cause: the budget (--steps 1) ended "
        "with the run's only validation, too soon to tell whether validation had stopped "
        "improving; try: train longer: raise --steps (with --resume"
    )
    code, _, err = cli(capsys, "report", "--checkpoint", str(out))
    assert code == 0, err
    html = (out / "report.html").read_text()
    assert "behind baseline: validation accuracy" in html and "most frequent tag per word" in html


# -- classify ----------------------------------------------------------------------------


def test_classify_baselines_against_sklearn(capsys, tmp_path):
    pytest.importorskip("sklearn")
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    train_ex = letter_order_examples(160, seed=0, noise=0.1)
    valid_ex = letter_order_examples(60, seed=1)
    write_labelled(train_ex, tmp_path / "train.tsv")
    write_labelled(valid_ex, tmp_path / "valid.tsv")
    max_len = 10  # texts are cut to 10 characters for the model and the baselines alike
    summary, stdout, _ = train(
        capsys, "classify", tmp_path, tmp_path / "run", "--steps", "1", "--max-len", "10"
    )

    def grams(text: str) -> list[str]:
        t = text[:max_len]
        return list(t) + [a + b for a, b in itertools.pairwise(t)]

    vec = TfidfVectorizer(analyzer=grams, sublinear_tf=True)
    X = vec.fit_transform([e.text for e in train_ex])
    fitted = LogisticRegression(C=10.0, tol=1e-10, max_iter=10_000)
    fitted.fit(X, [e.label for e in train_ex])
    predicted = fitted.predict(vec.transform([e.text for e in valid_ex]))
    gold = [e.label for e in valid_ex]
    bow = summary["baselines"]["bag_of_ngrams"]
    assert bow["accuracy"] == pytest.approx(
        np.mean([p == g for p, g in zip(predicted, gold, strict=True)])
    )
    # majority of the training labels (ab: even indices; noise flips some), by hand
    labels = [e.label for e in train_ex]
    top = max(sorted(set(labels)), key=labels.count)
    assert summary["baselines"]["majority"] == {
        "kind": f"majority class ({top})",
        "accuracy": gold.count(top) / len(gold),
        "macro_f1": pytest.approx(summary["baselines"]["majority"]["macro_f1"]),
    }
    assert summary["baselines"]["majority"]["macro_f1"] == pytest.approx(
        (2 * (gold.count(top) / len(gold)) / (1 + gold.count(top) / len(gold))) / 2
    )
    assert "baseline, bag of n-grams" in stdout and "baseline, majority class" in stdout
    metrics = evaluate(capsys, tmp_path / "run", tmp_path / "valid.tsv")
    assert metrics["baselines"] == summary["baselines"]


def test_classify_macro_f1_is_sklearns_when_validation_holds_one_class(capsys, tmp_path):
    f1_score = pytest.importorskip("sklearn.metrics").f1_score
    train_ex = letter_order_examples(40, seed=0)
    valid_ex = [e for e in letter_order_examples(40, seed=1) if e.label == "ab"]
    write_labelled(train_ex, tmp_path / "train.tsv")
    write_labelled(valid_ex, tmp_path / "valid.tsv")
    run = tmp_path / "run"
    summary, _, _ = train(capsys, "classify", tmp_path, run, "--steps", "2")
    gold = [e.label for e in valid_ex]
    # the majority class of the training data (balanced: the first label) on one-class data
    majority = summary["baselines"]["majority"]
    assert majority["accuracy"] == 1.0
    assert majority["macro_f1"] == f1_score(gold, ["ab"] * len(gold), average="macro") == 1.0
    (tmp_path / "texts.txt").write_text("".join(e.text + "\n" for e in valid_ex))
    code, out, err = cli(
        capsys, "predict", "--checkpoint", str(run), "--input", str(tmp_path / "texts.txt")
    )
    assert code == 0, err
    pred = [json.loads(line)["label"] for line in out.splitlines()]
    metrics = evaluate(capsys, run, tmp_path / "valid.tsv")
    assert metrics["macro_f1"] == pytest.approx(f1_score(gold, pred, average="macro"))
    assert metrics["per_class_support"] == {"ab": len(gold), "ba": 0}


# -- seq2seq -----------------------------------------------------------------------------


def test_seq2seq_copy_and_nearest_neighbour_by_hand(capsys, tmp_path):
    (tmp_path / "train.tsv").write_text("abc\tcba\nabd\tdba\nxy\tyx\n")
    (tmp_path / "valid.tsv").write_text("abc\tcba\nabx\txba\nyx\txy\n")
    summary, stdout, _ = train(capsys, "seq2seq", tmp_path, tmp_path / "run", "--steps", "1")
    b = summary["baselines"]
    # copy: abc, abx, yx against cba, xba, xy: 2 + 2 + 2 edits over 3 + 3 + 2 characters
    assert b["copy"]["kind"] == "copy of the source"
    assert b["copy"]["exact_match"] == 0.0
    assert b["copy"]["character_error_rate"] == pytest.approx(6 / 8)
    assert b["copy"]["token_error_rate"] == pytest.approx(6 / 8)
    # nearest: abc is memorised (cba); abx is 1 edit from abc and from abd: the first in
    # the file wins (cba, 1 edit from xba); yx is 2 from xy, 3 from the others (yx, 2 edits)
    assert b["nearest_neighbour"]["kind"] == "nearest training source (edit distance)"
    assert b["nearest_neighbour"]["exact_match"] == pytest.approx(1 / 3)
    assert b["nearest_neighbour"]["character_error_rate"] == pytest.approx(3 / 8)
    assert "baseline, copy of the source: exact match 0.0000" in stdout
    metrics = evaluate(capsys, tmp_path / "run", tmp_path / "valid.tsv")
    assert metrics["baselines"] == b
    # evaluate prints one readable line per baseline
    code, text, _ = cli(capsys, "evaluate", "--checkpoint", str(tmp_path / "run"), "--data",
                        str(tmp_path / "valid.tsv"))  # fmt: skip
    assert code == 0
    assert "baseline nearest_neighbour (nearest training source (edit distance)): " in text


def test_baseline_file_is_checked_on_evaluate(capsys, tmp_path, monkeypatch):
    tagged(tmp_path / "train.tsv", _word_tags(8, 0))
    tagged(tmp_path / "valid.tsv", _word_tags(4, 1))
    out = tmp_path / "run"
    train(capsys, "tag", tmp_path, out, "--steps", "1")
    (out / "baseline.safetensors").write_bytes(b"not safetensors")
    code, _, err = cli(capsys, "evaluate", "--checkpoint", str(out), "--data",
                       str(tmp_path / "valid.tsv"))  # fmt: skip
    assert code == 2
    (line,) = err.splitlines()
    assert "baseline.safetensors: does not match its SHA-256 in manifest.json" in line
    monkeypatch.setenv("RNNKIT_SKIP_CHECKSUMS", "1")  # the reader's own check
    code, _, err = cli(capsys, "evaluate", "--checkpoint", str(out), "--data",
                       str(tmp_path / "valid.tsv"))  # fmt: skip
    (line,) = err.splitlines()
    assert code == 2 and "baseline.safetensors: not a valid safetensors file" in line
    (out / "baseline.safetensors").unlink()  # a run from before the file: no baselines
    assert "baselines" not in evaluate(capsys, out, tmp_path / "valid.tsv")


def test_report_shows_each_baseline_and_says_when_the_model_is_ahead(capsys, tmp_path):
    from rnnkit.app.report import render_report
    from rnnkit.training.manifest import write_manifest

    tagged(tmp_path / "train.tsv", _word_tags(8, 0))
    tagged(tmp_path / "valid.tsv", _word_tags(4, 1))
    out = tmp_path / "run"
    summary, _, _ = train(capsys, "tag", tmp_path, out, "--steps", "1")
    text = render_report(out)
    assert "baseline: most frequent tag per word" in text  # a column of the metrics table
    assert "behind baseline:" in text
    # The same run, had the model been right everywhere:
    summary["valid"]["accuracy"], summary["behind_baseline"] = 1.0, None
    (out / "summary.json").write_text(json.dumps(summary))
    write_manifest(out)
    text = render_report(out)
    assert "behind baseline:" not in text
    assert (
        "The recurrent model is not behind its best baseline on validation accuracy: 1 vs 1 "
        "for the most frequent tag per word." in text
    )


# -- the likely cause, read from the run's course -----------------------------------------


def _random_walks(path: Path, n: int, seed: int, spread: float = 0.0) -> Path:
    """Random walks of 20 steps, from a start uniform in ``±spread``: persistence (the last
    value) is the best forecast of the next one, so any model trained on them ends behind
    it."""
    rng = np.random.default_rng(seed)
    rows = [
        {"seq": (rng.uniform(-spread, spread) + np.cumsum(rng.normal(size=20))).round(4).tolist()}
        for _ in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _course_run(
    capsys, tmp_path: Path, *options: str, walks: tuple[int, int, float] = (2, 1, 0.0)
) -> tuple[dict, str, list[dict]]:
    """A regress run on ``walks``: (training walks, batch size, spread of their starts)."""
    n, batch, spread = walks
    train_file = _random_walks(tmp_path / "t.jsonl", n, 0 if spread == 0 else 3, spread)
    valid_file = _random_walks(tmp_path / "v.jsonl", 20, 1 if spread == 0 else 4, spread)
    code, _, err = cli(
        capsys, "train", "--task", "regress", "--train", str(train_file), "--valid",
        str(valid_file), "--out", str(tmp_path / "run"), "--batch-size", str(batch),
        "--seed", "0", "--threads", "1", "--quiet", "--no-report", *options,
    )  # fmt: skip
    assert code == 0, err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    log = (tmp_path / "run" / "metrics.jsonl").read_text()
    events = [json.loads(line) for line in log.splitlines()]
    return summary, err, events


def test_a_large_model_on_two_sequences_is_said_to_overfit(capsys, tmp_path):
    summary, err, events = _course_run(
        capsys, tmp_path, "--hidden", "64", "--lr", "0.01", "--epochs", "60"
    )
    behind, course = summary["behind_baseline"], summary["trajectory"]
    assert behind["baseline_kind"].startswith("persistence")
    assert behind["model"] > behind["baseline"]
    assert behind["still_improving"] is False
    # the course is the run's own: its training records and validations
    train = [(e["step"], e["loss_nats"]) for e in events if e["event"] == "train"]
    valid = {e["step"]: e["loss"] for e in events if e["event"] == "valid"}
    assert course["best_step"] == summary["valid"]["step"] == min(valid, key=valid.__getitem__)
    assert course["train_loss_end"] == pytest.approx(np.mean([v for _, v in train[-5:]]))
    assert course["valid_loss_best"] == pytest.approx(min(valid.values()))
    assert course["valid_loss_last"] == pytest.approx(valid[max(valid)])
    assert course["train_loss_end"] < 0.95 * course["train_loss_at_best"]
    assert behind["cause"] == (
        f"validation stopped improving at step {course['best_step']} of {summary['steps']}; "
        f"the training loss fell from {course['train_loss_at_best']:.3g} to "
        f"{course['train_loss_end']:.3g} after the best step while validation rose from "
        f"{course['valid_loss_best']:.3g} to {course['valid_loss_last']:.3g}: overfitting"
    )
    assert err.strip() == f"rnnkit: {behind['line']}"


def test_a_small_model_at_a_small_rate_is_not_said_to_overfit(capsys, tmp_path):
    summary, err, _ = _course_run(
        capsys, tmp_path, "--hidden", "4", "--lr", "0.0003", "--epochs", "20"
    )
    behind = summary["behind_baseline"]
    assert behind["model"] > behind["baseline"]
    assert "overfitting" not in behind["line"]
    assert behind["still_improving"] is True
    assert behind["cause"] == "validation was still improving when the budget (--epochs 20) ended"
    assert err.strip() == f"rnnkit: {behind['line']}"


def test_a_model_too_small_for_its_data_is_said_to_underfit(capsys, tmp_path):
    # walks starting anywhere in ±30: two tanh units cannot carry the last value over
    # that range, so the model stays far behind persistence on training data as well
    summary, err, _ = _course_run(
        capsys, tmp_path, "--hidden", "2", "--lr", "0.1", "--epochs", "30", walks=(40, 4, 30.0)
    )
    behind, course = summary["behind_baseline"], summary["trajectory"]
    assert behind["model"] > 10 * behind["baseline"] and behind["still_improving"] is False
    assert course["train_loss_end"] > 0.5 * course["valid_loss_best"]
    assert behind["cause"].endswith("the model underfits") and "overfitting" not in err
    assert behind["advice"].startswith("a larger --hidden (now 2)")
