"""``rnnkit train --task regress``, ``evaluate`` and ``predict`` end to end on tiny noisy
sinusoids: the persistence baseline against a hand computation, the metrics against the
model run on each sequence alone, CSV input, and bad input as one line."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from rnnkit.app.cli.main import main
from rnnkit.app.tasks.regress import load_regressor
from rnnkit.data.vectors import read_vector_sequences
from rnnkit.models.regressor import LOG_VAR_MAX
from rnnkit.training.checkpoint import save_model_weights

TINY = ["--cell", "gru", "--hidden", "8", "--batch-size", "8", "--quiet", "--no-report"]


@pytest.fixture(autouse=True, scope="module")
def _one_thread(single_thread):
    yield


def sinusoids(n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        t = rng.uniform(0, 6.3) + 0.4 * np.arange(int(rng.integers(3, 12)))
        out.append(np.stack([np.sin(t), np.cos(t)], 1) + 0.01 * rng.normal(size=(len(t), 2)))
    return out


def write_jsonl(path: Path, seqs: list[np.ndarray]) -> None:
    lines = [json.dumps({"seq": s.tolist(), "y": [float(s[:, 0].mean())]}) for s in seqs]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("regress")
    write_jsonl(d / "train.jsonl", sinusoids(40, 0))
    write_jsonl(d / "valid.jsonl", sinusoids(10, 1))
    for split, seqs in (("csv_train", sinusoids(8, 2)), ("csv_valid", sinusoids(3, 3))):
        (d / split).mkdir()
        for i, s in enumerate(seqs):
            rows = "\n".join(",".join(f"{v:.6f}" for v in row) for row in s)
            (d / split / f"s{i:02d}.csv").write_text("sin,cos\n" + rows + "\n", encoding="utf-8")
    return d


def train(run_cli, data, out, *extra, train="train.jsonl", valid="valid.jsonl"):
    return run_cli("train", "--task", "regress", "--train", str(data / train),
               "--valid", str(data / valid), "--out", str(out), *TINY, *extra)  # fmt: skip


@pytest.fixture(scope="module")
def trained(data, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("run") / "next"
    argv = ["train", "--task", "regress", "--train", str(data / "train.jsonl"), "--valid",
            str(data / "valid.jsonl"), "--out", str(out), *TINY, "--steps", "20"]  # fmt: skip
    assert main(argv) == 0
    return out


def test_summary_has_the_persistence_baseline_computed_by_hand(trained, data):
    summary = json.loads((trained / "summary.json").read_text())
    seqs = [s.values.astype(np.float64) for s in read_vector_sequences(data / "valid.jsonl")]
    errors = np.concatenate([(s[1:] - s[:-1]).ravel() for s in seqs])
    assert summary["baselines"]["persistence"]["mse"] == pytest.approx(
        float((errors**2).mean()), rel=1e-5
    )
    assert summary["valid"]["baseline_mse"] == pytest.approx(
        summary["baselines"]["persistence"]["mse"]
    )
    assert summary["task"] == "regress" and summary["input_size"] == summary["output_size"] == 2


def test_evaluate_equals_the_model_on_each_sequence_alone(trained, data, run_cli):
    code, out, err = run_cli("evaluate", "--checkpoint", str(trained), "--data",
                         str(data / "valid.jsonl"), "--json")  # fmt: skip
    assert code == 0, err
    metrics = json.loads(out)
    _, _, model = load_regressor(trained)
    sq, n = 0.0, 0
    for s in read_vector_sequences(data / "valid.jsonl"):
        x = torch.from_numpy(s.values)[None]
        with torch.no_grad():
            mean = model(x[:, :-1]).mean[0]
        sq += float(((mean - x[0, 1:]) ** 2).sum())
        n += mean.numel()
    assert metrics["elements"] == n
    assert metrics["mse"] == pytest.approx(sq / n, rel=1e-5)
    assert metrics["rmse"] == pytest.approx((sq / n) ** 0.5, rel=1e-5)


def test_predict_gives_the_next_value_after_every_step(trained, data, run_cli, tmp_path):
    lines = (data / "valid.jsonl").read_text().splitlines()[:3]
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    code, out, err = run_cli("predict", "--checkpoint", str(trained), "--input", str(path))
    assert code == 0, err
    _, _, model = load_regressor(trained)
    for line, answer in zip(lines, out.splitlines(), strict=True):
        x = torch.tensor(json.loads(line)["seq"], dtype=torch.float32)[None]
        with torch.no_grad():
            want = model(x).mean[0]
        np.testing.assert_allclose(json.loads(answer)["prediction"], want.numpy(), atol=1e-6)


def test_predict_of_a_sequence_longer_than_max_len_answers_every_step(data, tmp_path, run_cli):
    """The pieces of --max-len steps that training and evaluate read, each from a zero
    state: a prediction after every step, the last the forecast past the sequence, and
    the ones evaluate scores equal to evaluate's (it cut at --max-len before)."""
    out = tmp_path / "run"
    assert train(run_cli, data, out, "--steps", "3", "--max-len", "4")[0] == 0
    seq = sinusoids(1, 9)[0]
    seq = np.concatenate([seq, seq])[:11]  # 11 steps: pieces of 4, 4 and 3
    path = tmp_path / "long.jsonl"
    write_jsonl(path, [seq])
    code, answer, err = run_cli("predict", "--checkpoint", str(out), "--input", str(path))
    assert code == 0, err
    got = np.array(json.loads(answer)["prediction"])
    assert got.shape == (11, 2)
    _, _, model = load_regressor(out)
    x = torch.from_numpy(seq).float()
    with torch.no_grad():
        want = torch.cat([model(x[lo : lo + 4][None]).mean[0] for lo in (0, 4, 8)])
    np.testing.assert_allclose(got, want.numpy(), atol=1e-6)
    code, metrics, err = run_cli(
        "evaluate", "--checkpoint", str(out), "--data", str(path), "--json"
    )
    assert code == 0, err
    mse = float(((got[:-1] - seq[1:]) ** 2).mean())
    assert json.loads(metrics)["mse"] == pytest.approx(mse, rel=1e-5)


def test_value_target_gaussian_and_csv_directories(data, tmp_path, run_cli):
    code, out, err = train(run_cli, data, tmp_path / "v", "--target", "value", "--loss",
                           "gaussian", "--bidirectional", "--steps", "4", "--json")  # fmt: skip
    assert code == 0, err
    summary = json.loads(out)
    assert (summary["target"], summary["loss"], summary["output_size"]) == ("value", "gaussian", 1)
    # The baseline of a value target of another width than a step's is the mean training
    # target, in evaluate as in training (evaluate scored a prediction of 0).
    ys = [float(s.target[0]) for s in read_vector_sequences(data / "train.jsonl")]
    valid = [float(s.target[0]) for s in read_vector_sequences(data / "valid.jsonl")]
    by_hand = float(np.mean((np.array(valid) - np.float32(np.mean(ys, dtype=np.float32))) ** 2))
    assert summary["valid"]["baseline_mse"] == pytest.approx(by_hand, rel=1e-5)
    assert summary["baselines"]["persistence"]["kind"] == "the mean training target"
    code, out, err = run_cli("evaluate", "--checkpoint", str(tmp_path / "v"), "--data",
                             str(data / "valid.jsonl"), "--json")  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["baseline_mse"] == pytest.approx(by_hand, rel=1e-5)
    code, out, err = train(run_cli, data, tmp_path / "c", "--steps", "3", "--json",
                           train="csv_train", valid="csv_valid")  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["input_size"] == 2
    code, _, err = train(run_cli, data, tmp_path / "cv", "--target", "value",
                         train="csv_train", valid="csv_valid")  # fmt: skip
    assert code == 2 and '"y"' in err and "s00.csv" in err


def test_value_targets_of_another_width_are_one_line_in_train_and_evaluate(data, tmp_path, run_cli):
    seqs = sinusoids(12, 4)
    wide = [json.dumps({"seq": q.tolist(), "y": [1.0, 2.0]}) for q in seqs]
    narrow = [json.dumps({"seq": q.tolist(), "y": [1.0]}) for q in seqs]
    (tmp_path / "wide.jsonl").write_text("\n".join(wide) + "\n", encoding="utf-8")
    (tmp_path / "narrow.jsonl").write_text("\n".join(narrow) + "\n", encoding="utf-8")
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("\n".join(wide[:3] + narrow[:3]) + "\n", encoding="utf-8")
    code, _, err = train(run_cli, tmp_path, tmp_path / "m", "--target", "value",
                         train="mixed.jsonl", valid="wide.jsonl")  # fmt: skip
    assert code == 2 and 'mixed.jsonl:4: "y" has 1 values; the first target has 2' in err, err
    code, _, err = train(run_cli, tmp_path, tmp_path / "w", "--target", "value", "--steps", "2",
                         train="wide.jsonl", valid="wide.jsonl")  # fmt: skip
    assert code == 0, err
    code, _, err = run_cli("evaluate", "--checkpoint", str(tmp_path / "w"), "--data",
                           str(tmp_path / "narrow.jsonl"))  # fmt: skip
    assert code == 2 and 'narrow.jsonl:1: "y" has 1 values; the run\'s model predicts 2' in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("content", "extra", "words"),
    [
        ("1,2\n3,4\n5,6,7\n", (), ["bad.csv:3", "row has 3 values"]),
        ("1,2\n3,four\n", (), ["bad.csv:2", "not a number: 'four'"]),
        ("1,2\n3,4\n", ("--embedding", "8"), ["--embedding does not apply to --task regress"]),
        ("1,2\n3,4\n", ("--bidirectional",), ["--bidirectional", "--target next"]),
    ],
)
def test_bad_input_is_one_line(data, tmp_path, run_cli, content, extra, words):
    (tmp_path / "bad.csv").write_text(content, encoding="utf-8")
    out = tmp_path / "run"
    bad = str(tmp_path / "bad.csv")
    code, _, err = run_cli("train", "--task", "regress", "--train", bad, "--valid",
                       str(data / "csv_valid"), "--out", str(out), *TINY, *extra)  # fmt: skip
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for word in words:
        assert word in err
    assert not (out / "model.safetensors").exists()


def test_evaluate_of_huge_values_is_a_figure_or_one_line(trained, data, tmp_path, run_cli):
    """Values near float32's range: a squared error beyond 3.4e38 was ``inf`` (``mse: inf``,
    ``null`` in JSON, exit 0). The mse is now the float64 figure of the model's errors; a
    Gaussian loss that cannot be scored is one line naming the file and line."""
    seqs = [np.array([[0.1, 1e30], [0.2, -1e30], [0.3, 0.5]]), sinusoids(1, 5)[0]]
    write_jsonl(tmp_path / "huge.jsonl", seqs)
    code, out, err = run_cli("evaluate", "--checkpoint", str(trained), "--data",
                             str(tmp_path / "huge.jsonl"), "--json")  # fmt: skip
    assert code == 0, err
    got = json.loads(out)
    _, _, model = load_regressor(trained)
    errors = []
    with torch.no_grad():
        for s in seqs:
            x = torch.tensor(s, dtype=torch.float32)
            pred = model(x[None, :-1]).mean[0].double().numpy()
            errors.append((pred - x[1:].double().numpy()).ravel())
    err64 = np.concatenate(errors)
    assert np.isfinite(err64).all()
    assert got["mse"] == pytest.approx(float(np.mean(err64**2)), rel=1e-6)
    assert got["loss"] == pytest.approx(got["mse"], rel=1e-12)
    as_read = [s.astype(np.float32).astype(np.float64) for s in seqs]
    base = np.concatenate([(s[:-1] - s[1:]).ravel() for s in as_read])  # x_t for x_{t+1}
    assert got["baseline_mse"] == pytest.approx(float(np.mean(base**2)), rel=1e-6)
    code, _, err = train(run_cli, data, tmp_path / "g", "--loss", "gaussian", "--steps", "2")
    assert code == 0, err
    code, out, err = run_cli("evaluate", "--checkpoint", str(tmp_path / "g"), "--data",
                             str(tmp_path / "huge.jsonl"))  # fmt: skip
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "huge.jsonl:1" in err and "not finite" in err and "1e+30" in err


@pytest.mark.parametrize(
    ("loss", "which", "value"),
    # outputs beyond float32; outputs finite whose Gaussian loss overflows float32
    [("mse", "weight", 3e38), ("gaussian", "bias", 1e20)],
)
def test_weights_that_overflow_on_ordinary_data_are_named_not_the_data(
    trained, data, tmp_path, run_cli, loss, which, value
):
    run = tmp_path / "run"
    if loss == "mse":
        shutil.copytree(trained, run)
    else:
        code, _, err = train(run_cli, data, run, "--loss", loss, "--steps", "2")
        assert code == 0, err
    _, _, model = load_regressor(run)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if which in name:
                p.fill_(value)  # finite float32 weights of a damaged or diverged run
    save_model_weights(model, run / "model.safetensors")
    code, _, err = run_cli("evaluate", "--checkpoint", str(run), "--data",
                           str(data / "valid.jsonl"), "--skip-checksums")  # fmt: skip
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"{run}: the " in err and "the run's weights give outputs beyond float32" in err
    assert "rescale the data" not in err


def test_huge_value_targets_are_named_as_the_data_at_fault(data, tmp_path, run_cli):
    # the steps stay within 1, the "y" reach 1e20: the data's fault, not the weights'
    code, _, err = train(run_cli, data, tmp_path / "v", "--target", "value", "--loss",
                         "gaussian", "--steps", "2")  # fmt: skip
    assert code == 0, err
    big = [json.dumps({"seq": q.tolist(), "y": [1e20]}) for q in sinusoids(4, 6)]
    (tmp_path / "big.jsonl").write_text("\n".join(big) + "\n", encoding="utf-8")
    code, _, err = run_cli("evaluate", "--checkpoint", str(tmp_path / "v"), "--data",
                           str(tmp_path / "big.jsonl"))  # fmt: skip
    assert code == 2 and "big.jsonl:1: the loss is not finite: values reach 1e+20" in err, err
    assert "rescale the data" in err


def test_training_on_values_whose_loss_overflows_does_not_blame_the_rate(data, tmp_path, run_cli):
    seqs = [np.array([[0.1, 1e30], [0.2, -1e30], [0.3, 0.5]])] * 4
    write_jsonl(tmp_path / "huge.jsonl", seqs)
    code, _, err = run_cli("train", "--task", "regress", "--train", str(tmp_path / "huge.jsonl"),
                           "--valid", str(data / "valid.jsonl"), "--out", str(tmp_path / "r"),
                           *TINY, "--steps", "2")  # fmt: skip
    assert code != 0 and len(err.strip().splitlines()) == 1, err
    assert "the training loss is inf at step 1" in err and "before any update" in err
    assert "--lr" not in err


def test_a_validation_value_the_gaussian_loss_cannot_score_names_the_data(data, tmp_path, run_cli):
    """A validation value of 1e20: its squared error overflows the float32 Gaussian NLL, so
    the validation loss was inf and training stopped advising a lower --lr; the same
    weights score the training data, so the validation data is named, with the value."""
    seqs = sinusoids(10, 1)
    seqs[2][1, 0] = -1e20
    write_jsonl(tmp_path / "valid.jsonl", seqs)
    code, _, err = train(run_cli, data, tmp_path / "r", "--loss", "gaussian", "--steps", "2",
                         valid=str(tmp_path / "valid.jsonl"))  # fmt: skip
    assert code == 2 and err.count("\n") == 1, err
    assert f"{tmp_path / 'valid.jsonl'}:3: the validation loss is inf" in err
    assert "-1e+20 at step 2 of this sequence" in err and "--lr" not in err


def test_predict_of_a_variance_beyond_float32_is_a_number(data, tmp_path, run_cli):
    """A trained Gaussian regressor's ln σ² can pass 88.7 on an input unlike its training
    data (found on 1e8-scale data, --lr 1, 8 steps): exp overflowed float32 and predict
    wrote the variance as null. Here the head's bias puts it at 200 everywhere."""
    run = tmp_path / "g"
    code, _, err = train(run_cli, data, run, "--loss", "gaussian", "--steps", "2")
    assert code == 0, err
    _, _, model = load_regressor(run)
    with torch.no_grad():
        model.head.bias[2:] = 200.0
    save_model_weights(model, run / "model.safetensors")
    write_jsonl(tmp_path / "in.jsonl", sinusoids(1, 5))
    code, out, err = run_cli("predict", "--checkpoint", str(run), "--input",
                             str(tmp_path / "in.jsonl"), "--skip-checksums")  # fmt: skip
    assert code == 0, err
    variance = np.array(json.loads(out)["variance"], dtype=np.float64)  # null: nan
    np.testing.assert_allclose(variance, np.float32(math.exp(LOG_VAR_MAX)), rtol=1e-6)


@pytest.mark.parametrize(
    ("target", "loss"), [("next", "mse"), ("next", "gaussian"), ("value", "gaussian")]
)
def test_metrics_read_the_device_once_and_score_each_sequence_as_alone(monkeypatch, target, loss):
    """``regression_metrics`` equals the model on every piece alone, and on a GPU (reads
    counted on the CPU, as the device would see them) reads the device once whatever the
    number of batches: the three float64 sums with the model's checks, the count being
    the batch masks' on the host (before: eight reads a batch, nine for the Gaussian).
    The model runs once a batch (before: twice, once for the loss, once for the errors)."""
    import sys

    import torch.nn.functional as F

    from rnnkit import deferred as deferred_module
    from rnnkit.app.config import TrainConfig
    from rnnkit.app.tasks.regress import build_regressor, encode_sequences, regression_metrics
    from rnnkit.bptt.fused import use_fused
    from rnnkit.data.vectors import VectorSequence

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "training"))
    from host_reads import HostReads

    def sequences(n: int) -> list[VectorSequence]:
        rng = np.random.default_rng(n)
        return [
            VectorSequence(
                rng.normal(size=(int(rng.integers(2, 8)), 2)).astype(np.float32),
                rng.normal(size=3).astype(np.float32) if target == "value" else None,
                "f",
                i,
            )
            for i in range(n)
        ]

    cfg = TrainConfig(train="x", hidden=8, target=target, loss=loss)
    torch.manual_seed(0)
    model = build_regressor(cfg, 2, 2 if target == "next" else 3).eval()
    cpu = torch.device("cpu")
    enc = encode_sequences(sequences(9), target, max_len=4)
    nll, sq, ab, count = 0.0, 0.0, 0.0, 0
    with torch.no_grad():
        for x, y in zip(enc.inputs, enc.targets, strict=True):
            out = model(x[None])
            err = (out.mean[0] - y).double()
            sq += float((err * err).sum())
            ab += float(err.abs().sum())
            count += y.numel()
            if loss == "gaussian":
                assert out.log_var is not None
                var = out.log_var[0].double().exp()
                each = F.gaussian_nll_loss(out.mean[0].double(), y.double(), var, full=True)
                nll += float(each) * y.numel()  # the mean over the piece's values
    runs = []
    hook = model.encoder.register_forward_hook(lambda *_: runs.append(1))
    eager = regression_metrics(model, enc, cpu, 4)
    hook.remove()
    assert len(runs) == 3  # the model runs once a batch: its loss and errors from one pass
    monkeypatch.setattr(deferred_module, "waits", lambda tensor: True)  # as on a GPU
    reads = []
    for n in (9, 18):
        with use_fused("fused"), HostReads(model) as counted:
            got = regression_metrics(model, encode_sequences(sequences(n), target, 4), cpu, 4)
        reads.append(dict(counted.sites))
        if n == 9:
            for m in (eager, got):
                assert m["elements"] == count
                assert m["mse"] == pytest.approx(sq / count, rel=1e-5)
                assert m["mae"] == pytest.approx(ab / count, rel=1e-5)
                want = nll / count if loss == "gaussian" else sq / count
                assert m["loss"] == pytest.approx(want, rel=1e-5)
    for sites in reads:
        assert sum(sites.values()) == 1 and all(s.startswith("deferred.py:") for s in sites), sites
