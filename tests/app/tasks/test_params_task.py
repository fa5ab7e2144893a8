"""``rnnkit train --task params`` end to end on a generated log: parameter values read by
``rnnkit sessions --params``, a planted latency (10x) and size (8x) anomaly found while
the key sequence is normal, the Gaussian bound recomputed by hand from the key models,
the combination with the key-sequence verdict, and bad input as one line."""

from __future__ import annotations

import json
import random
import re
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
import torch

from rnnkit.anomaly.thresholds import normal_quantile
from rnnkit.app.cli.main import main
from rnnkit.app.tasks.params import MIN_ERROR_STD, load_params
from rnnkit.app.tasks.regress import load_regressor
from rnnkit.data.events import read_sessions

TINY = ["--cell", "gru", "--hidden", "8", "--batch-size", "16", "--lr", "0.02", "--quiet",
        "--no-report"]  # fmt: skip
FORMAT = "<Date> <Time> <Level> <Content>"


@pytest.fixture(autouse=True, scope="module")
def _one_thread(single_thread):
    yield


def log_lines(n: int, seed: int, start: int, anomaly: str | None = None) -> list[str]:
    """Sessions ``open (size) → 3–6 reads (latency) → close``; an anomaly changes one
    value only: the second read 10x slower, or the size 8x larger."""
    rng = random.Random(seed)
    t = datetime(2026, 12, 1, 10, 0, 0) + timedelta(hours=start)
    out = []
    for i in range(n):
        sid = f"s{start + i}"
        t += timedelta(seconds=rng.uniform(0.5, 1.5))
        size = int(rng.gauss(1000, 100)) * (8 if anomaly == "size" else 1)
        lines = [(t, f"req={sid} open file size {size} bytes")]
        for j in range(rng.randint(3, 6)):
            latency = rng.gauss(10, 1) * (10 if anomaly == "latency" and j == 1 else 1)
            t += timedelta(milliseconds=latency)
            lines.append((t, f"req={sid} read chunk took {latency:.2f} ms"))
        lines.append((t + timedelta(milliseconds=1), f"req={sid} close"))
        out += [f"{x.isoformat(sep=' ', timespec='milliseconds')} INFO {text}" for x, text in lines]
    return out


def write(path: Path, sessions: list, label: int | None = None) -> Path:
    rows = []
    for s in sessions:
        row = {"session": s.session, "events": s.events, "params": s.params}
        if label is not None:
            row["label"] = label
        rows.append(json.dumps(row))
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("params")
    log = d / "app.log"
    parts = [log_lines(70, 0, 0), log_lines(30, 1, 100), log_lines(12, 2, 200),
             log_lines(6, 3, 300, "latency"), log_lines(6, 4, 400, "size")]  # fmt: skip
    log.write_text("\n".join(line for part in parts for line in part) + "\n")
    status = main(["sessions", "--from", "log", str(log), "--out", str(d / "all.jsonl"),
                   "--session-pattern", r"req=(\w+)", "--log-format", FORMAT, "--params",
                   "--time-field", "Date,Time", "--quiet"])  # fmt: skip
    assert status == 0
    sessions = read_sessions(d / "all.jsonl")
    by = {s.session: s for s in sessions}

    def pick(lo: int, hi: int) -> list:
        return [by[f"s{i}"] for i in range(lo, hi)]

    write(d / "train.jsonl", pick(0, 70))
    write(d / "valid.jsonl", pick(100, 130))
    test = d / "test.jsonl"
    write(test, pick(200, 212), 0)
    with open(test, "a") as f:
        f.write(write(d / "a.jsonl", pick(300, 306) + pick(400, 406), 1).read_text())
    return d


@pytest.fixture(scope="module")
def runs(data: Path) -> tuple[Path, Path]:
    params, events = data / "params_run", data / "events_run"
    common = ["--train", str(data / "train.jsonl"), "--valid", str(data / "valid.jsonl")]
    assert main(["train", "--task", "params", *common, "--out", str(params), "--epochs", "6",
                 *TINY]) == 0  # fmt: skip
    assert main(["train", "--task", "events", *common, "--out", str(events), "--epochs", "2",
                 "--embedding", "4", "--bptt", "full", *TINY]) == 0  # fmt: skip
    return params, events


def test_sessions_carry_the_values_and_time(data: Path) -> None:
    s = read_sessions(data / "train.jsonl")[0]
    assert s.events[0] == "req=<SESSION> open file size <NUM> bytes"
    assert s.events[1] == "req=<SESSION> read chunk took <NUM> ms"
    assert s.params[0][0] == 0.0 and 700 < s.params[0][1] < 1300  # first line: no delta
    delta, latency = s.params[1]
    assert delta == pytest.approx(latency / 1000, abs=1e-3)  # the read's time is its latency


def test_planted_value_anomalies_are_found_while_the_key_sequence_is_normal(
    data: Path, runs: tuple[Path, Path], run_cli
) -> None:
    params, events = runs
    code, out, err = run_cli("score", "--checkpoint", str(events), "--params", str(params),
                         "--data", str(data / "test.jsonl"), "--top", "1")  # fmt: skip
    assert code == 0, err
    records = [json.loads(line) for line in out.splitlines()]
    assert len(records) == 24
    valid_sequences = {tuple(s.events) for s in read_sessions(data / "valid.jsonl")}
    twins = 0
    for r in records:
        either = "anomalous" in (r["keys_verdict"], r["params"]["verdict"])
        assert r["verdict"] == ("anomalous" if either else "normal")
        if r["label"] == 1:
            # The value model flags every planted anomaly, at the value planted.
            assert r["params"]["verdict"] == "anomalous", r
            top = r["params"]["top"][0]
            assert top["anomalous"] and top["z"] > 2.58
            kind = "size" if r["session"].startswith("s40") else "latency"
            assert ("open file" in top["event"]) == (kind == "size")
        events_ = tuple(read_session(data / "test.jsonl", r["session"]).events)
        if r["label"] == 1 and events_ in valid_sequences:
            # The same events as a normal validation session: the key model cannot tell.
            assert r["keys_verdict"] == "normal"
            twins += 1
    assert twins >= 8
    assert "24 session(s)" in err and "(parameter values: " in err


def read_session(path: Path, session: str):
    return next(s for s in read_sessions(path) if s.session == session)


def test_the_error_gaussian_by_hand(data: Path, runs: tuple[Path, Path]) -> None:
    """Recompute one key's validation errors from its regressor and the stored
    normalisation, then its mean, standard deviation and bound."""
    params, _ = runs
    keys = json.loads((params / "keys.json").read_text())["keys"]
    doc = next(k for k in keys if "read chunk" in k["key"])
    assert doc["dims"] == [0, 1]
    _, _, model = load_regressor(params / doc["dir"])
    mean, scale = np.array(doc["mean"]), np.array(doc["scale"])
    errors = []
    for s in read_sessions(data / "valid.jsonl"):
        rows = np.array([p for e, p in zip(s.events, s.params, strict=True) if e == doc["key"]])
        x = np.vstack([np.zeros((1, 2)), (rows - mean) / scale])
        with torch.no_grad():
            pred = model(torch.tensor(x[None], dtype=torch.float32)).mean[0].double().numpy()
        errors += list(((pred[:-1] - x[1:]) ** 2).mean(axis=1))
    mu, sigma = float(np.mean(errors)), max(float(np.std(errors, ddof=1)), MIN_ERROR_STD)
    assert doc["error"]["n"] == len(errors)
    assert doc["error"]["mean"] == pytest.approx(mu, rel=1e-5)
    assert doc["error"]["std"] == pytest.approx(sigma, rel=1e-5)
    thresholds = json.loads((params / "thresholds.json").read_text())
    assert thresholds["z"] == pytest.approx(2.575829, abs=1e-6)
    assert thresholds["bounds"][doc["key"]] == pytest.approx(mu + 2.575829 * sigma, rel=1e-5)
    # The training statistics normalise: the latency column's mean is near 10 ms.
    assert mean[1] == pytest.approx(10, abs=0.5) and scale[1] == pytest.approx(1, abs=0.3)


def test_a_file_without_anomalous_sessions_has_no_recall(
    data: Path, runs: tuple[Path, Path], run_cli
) -> None:
    """Normal sessions only: recall 0/0 is null, not 0 (``recall: 0`` sat beside
    ``auc: None``); F1 2 tp / (2 tp + fp + fn) and precision are null only when nothing
    is flagged; the plain text says why rather than ``None``."""
    normal = data / "normal.jsonl"
    lines = (data / "test.jsonl").read_text().splitlines()
    normal.write_text("".join(f"{x}\n" for x in lines if json.loads(x).get("label") == 0))
    code, out, err = run_cli("evaluate", "--checkpoint", str(runs[0]), "--data", str(normal),
                             "--json")  # fmt: skip
    assert code == 0, err
    m = json.loads(out)
    assert (m["anomalous_sessions"], m["tp"], m["fn"]) == (0, 0, 0)
    assert m["auc"] is None and m["recall"] is None
    assert m["fpr"] == m["fp"] / m["sessions"]
    assert (m["f1"], m["precision"]) == ((0.0, 0.0) if m["fp"] else (None, None))
    code, out, err = run_cli("evaluate", "--checkpoint", str(runs[0]), "--data", str(normal))
    assert code == 0 and "None" not in out
    assert "recall: n/a (no anomalous sessions)" in out.splitlines()


def test_evaluate_predict_and_confidence(data: Path, runs: tuple[Path, Path], run_cli) -> None:
    params, events = runs
    code, out, err = run_cli("evaluate", "--checkpoint", str(params), "--data",
                         str(data / "test.jsonl"), "--json")  # fmt: skip
    assert code == 0, err
    m = json.loads(out)
    assert (m["sessions"], m["anomalous_sessions"], m["recall"]) == (24, 12, 1.0)
    assert m["auc"] > 0.9 and m["unmodelled"] == 0 and m["checked"] == m["vectors"]
    line = (data / "test.jsonl").read_text().splitlines()[-1]
    lines = data / "one.jsonl"
    lines.write_text(line + "\n")
    code, out, err = run_cli("predict", "--checkpoint", str(events), "--params", str(params),
                         "--input", str(lines))  # fmt: skip
    assert code == 0, err
    record = json.loads(out)
    assert record["params"]["verdict"] == "anomalous" and record["verdict"] == "anomalous"
    # A params run alone, and its confidence re-picked: z grows with it, and the session
    # threshold is never below it.
    t = json.loads((params / "thresholds.json").read_text())["session_score"]
    code, out, _ = run_cli("score", "--checkpoint", str(params), "--data", str(lines),
                       "--confidence", "0.999")  # fmt: skip
    assert code == 0
    assert json.loads(out)["threshold"] == pytest.approx(max(normal_quantile(0.9995), t))
    assert load_params(params).confidence == 0.99


def test_the_session_threshold_holds_the_target_rate_on_validation(
    data: Path, runs: tuple[Path, Path], run_cli
) -> None:
    """t: at most ⌊α n⌋ of the n normal validation sessions score above it, and the
    verdict is score > max(z, t); --target-fpr re-picks t from the stored scores."""
    from safetensors.numpy import load_file

    params, _ = runs
    normal = load_file(str(params / "valid_scores.safetensors"))["normal"]
    doc = json.loads((params / "thresholds.json").read_text())
    assert doc["target_fpr"] == 0.01 and doc["method"] == "quantile"
    t = doc["session_score"]
    assert len(normal) == 30 and int(np.sum(normal > t)) == 0  # ⌊0.01 · 30⌋ = 0
    assert t >= float(np.max(normal))
    summary = json.loads((params / "summary.json").read_text())
    z = normal_quantile(0.995)
    assert summary["session_threshold"] == pytest.approx(max(z, t))
    assert summary["validation_fpr"]["false_positives"] == 0
    # Re-picked at 0.2: 6 of the 30 may lie above; the 7th largest is at or below t.
    code, out, err = run_cli("score", "--checkpoint", str(params), "--data",
                         str(data / "test.jsonl"), "--target-fpr", "0.2")  # fmt: skip
    assert code == 0, err
    records = [json.loads(line) for line in out.splitlines()]
    limit = records[0]["threshold"]
    ranked = np.sort(normal)[::-1]
    if limit > z:
        assert int(np.sum(normal > limit)) == 6 and ranked[6] <= limit < ranked[5]
    for r in records:
        assert r["verdict"] == ("anomalous" if (r["score"] or -np.inf) > limit else "normal")
        assert r["anomalous_vectors"] > 0 or r["verdict"] == "normal"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda r: r.pop("params"), "session 's200' has no \"params\" (write the sessions with"),
        (
            lambda r: r["params"][1].append(3.0),
            "session 's200': params[1] has 3 values; the event "
            "'req=<SESSION> read chunk took <NUM> ms' had 2 in training",
        ),
    ],
)
def test_bad_input_is_one_line_with_file_and_line(
    data: Path, runs: tuple[Path, Path], run_cli, edit, message: str, tmp_path: Path
) -> None:
    params, events = runs
    rows = [json.loads(x) for x in (data / "test.jsonl").read_text().splitlines()[:3]]
    edit(rows[0])
    rows[0], rows[1] = rows[1], rows[0]  # the bad session on line 2
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    for argv in (
        ["score", "--checkpoint", str(params), "--data", str(bad)],
        ["score", "--checkpoint", str(events), "--params", str(params), "--data", str(bad)],
        ["evaluate", "--checkpoint", str(params), "--data", str(bad)],
    ):
        code, _, err = run_cli(*argv)
        assert code == 2 and f"{bad}:2: {message}" in err and err.count("\n") == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--task", "events", "--confidence", "0.9"],
            "--confidence does not apply to --task events",
        ),
        (["--task", "params", "--confidence", "1.5"], "--confidence must be in (0, 1), got 1.5"),
        (["--task", "params", "--embedding", "4"], "--embedding does not apply to --task params"),
        (
            ["--task", "params", "--top-g", "3"],
            "--top-g does not apply to --task params (only to: events)",
        ),
        (["--task", "params", "--target-fpr", "2"], "--target-fpr must be in (0, 1), got 2.0"),
        (
            ["--task", "regress", "--target-fpr", "0.1"],
            "--target-fpr does not apply to --task regress (only to: events, params)",
        ),
    ],
)
def test_bad_options_are_refused(data: Path, run_cli, argv, message, tmp_path: Path) -> None:
    code, _, err = run_cli("train", "--train", str(data / "train.jsonl"), "--out",
                       str(tmp_path / "r"), *argv)  # fmt: skip
    assert code == 2 and message in err and err.count("\n") == 1


def test_score_confidence_needs_a_params_run(data: Path, runs, run_cli) -> None:
    _, events = runs
    code, _, err = run_cli("score", "--checkpoint", str(events), "--data",
                       str(data / "test.jsonl"), "--confidence", "0.9")  # fmt: skip
    assert code == 2 and "--confidence applies to a params run: give --params RUN" in err


def test_report_shows_each_key_and_the_errors(runs: tuple[Path, Path]) -> None:
    from rnnkit.app.report import render_report

    params, _ = runs
    html = render_report(params)
    section = html[html.index('<section id="params">') :]
    assert "req=&lt;SESSION&gt; read chunk took &lt;NUM&gt; ms" in section
    assert "mean + 2.576 standard deviations" in section
    assert section[: section.index("</section>")].count("<img") == 1  # no labelled anomalies


@pytest.mark.parametrize("content", [b"[" * 100_000, b'{"z": ' + b"9" * 5000 + b"}", b"\xff"])
def test_a_damaged_params_file_in_the_report_is_a_note(
    runs: tuple[Path, Path], tmp_path: Path, content: bytes
) -> None:
    # keys.json nested 100,000 deep: json.loads' RecursionError stopped the report.
    import shutil

    from rnnkit.app.report import render_report
    from rnnkit.training.manifest import skipping_checksums

    params = tmp_path / "run"
    shutil.copytree(runs[0], params)
    for name in ("keys.json", "thresholds.json"):
        shutil.copy(runs[0] / name, params / name)
        (params / name).write_bytes(content)
        with skipping_checksums():
            html = render_report(params)
        assert '<section id="params">' not in html
        assert f"The parameter-value section is missing: {params / name}" in html
        if name == "keys.json":  # the gradient flow reads the keys' models too
            assert f"Gradient-flow pictures need the run&#x27;s model: {params / name}" in html
        shutil.copy(runs[0] / name, params / name)


def test_target_rate_and_method_from_the_command_line_and_a_config_file(
    data: Path, run_cli, tmp_path: Path
) -> None:
    out = tmp_path / "p"
    config = tmp_path / "params.toml"
    config.write_text('task = "params"\ntarget-fpr = 0.1\nthreshold-method = "gpd"\n')
    code, text, err = run_cli("train", "--config", str(config), "--train",
                          str(data / "train.jsonl"), "--valid", str(data / "valid.jsonl"),
                          "--out", str(out), "--epochs", "2", *TINY,
                          "--print-config")  # fmt: skip
    assert code == 0, err
    assert "target-fpr = 0.1" in text and 'threshold-method = "gpd"' in text
    code, _, err = run_cli("train", "--config", str(config), "--train",
                       str(data / "train.jsonl"), "--valid", str(data / "valid.jsonl"),
                       "--out", str(out), "--epochs", "2", *TINY)  # fmt: skip
    assert code == 0, err
    doc = json.loads((out / "thresholds.json").read_text())
    assert (doc["target_fpr"], doc["method"]) == (0.1, "gpd")
    # 0.1 of 30 sessions is 3, fewer than the 10 the tail is fitted to: the tail fit.
    from safetensors.numpy import load_file

    from rnnkit.anomaly.thresholds import gpd_threshold

    normal = load_file(str(out / "valid_scores.safetensors"))["normal"]
    assert doc["session_how"].startswith("generalized Pareto tail")
    assert doc["session_score"] == pytest.approx(gpd_threshold(normal, 0.1).quantile(0.1))


@pytest.mark.parametrize("bad", [1.5, 0, True])
def test_a_confidence_out_of_range_is_named_as_given(
    data: Path, runs: tuple[Path, Path], run_cli, tmp_path: Path, monkeypatch, bad
) -> None:
    """``score_sessions(confidence=...)`` said nothing of 1.5 but a quantile's ``p`` and
    took 0 for the run's own; ``check_confidence`` said ``--confidence`` to Python and of
    ``thresholds.json``. Each names the Python argument, the command line its option."""
    from shutil import copytree

    from rnnkit.app.tasks.params import score_sessions
    from rnnkit.errors import CheckpointError, ConfigError

    params, events = runs
    run = load_params(params)
    sessions = read_sessions(data / "test.jsonl")[:2]
    items = [(s, "test.jsonl", i + 1) for i, s in enumerate(sessions)]
    with pytest.raises(ConfigError, match=rf"^confidence must be in \(0, 1\), got {bad!r}$"):
        list(score_sessions(run, items, confidence=bad))
    code, _, err = run_cli("score", "--checkpoint", str(events), "--params", str(params),
                           "--data", str(data / "test.jsonl"), "--confidence", "1.5")  # fmt: skip
    assert code == 2 and err.strip().endswith("--confidence must be in (0, 1), got 1.5"), err
    # a run whose thresholds.json holds one: its field is named, from Python and the CLI
    copy = copytree(params, tmp_path / "params")
    doc = json.loads((copy / "thresholds.json").read_text())
    (copy / "thresholds.json").write_text(json.dumps({**doc, "confidence": 1.5}))
    monkeypatch.setenv("RNNKIT_SKIP_CHECKSUMS", "1")  # edited after the run wrote it
    message = r"thresholds\.json: confidence must be in \(0, 1\), got 1\.5$"
    with pytest.raises(CheckpointError, match=message):
        load_params(copy)
    code, _, err = run_cli("score", "--checkpoint", str(copy), "--data", str(data / "test.jsonl"))
    assert code != 0 and re.search(message, err.strip()), err


def _strict(text: str) -> dict:
    def refuse(name: str) -> None:
        raise AssertionError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


def test_a_value_beyond_float32_makes_the_session_anomalous(data, runs, tmp_path, run_cli):
    """A normal session whose first read took 1e300: normalised, beyond float32 (inf), and
    the model's state after it NaN. The NaN errors compared false with the bound and max()
    dropped them, so the session was "normal" (and predict printed ``Infinity``)."""
    params, _ = runs
    normal = read_sessions(data / "test.jsonl")[0]
    read = next(i for i, e in enumerate(normal.events) if "read chunk" in e)
    later = [i for i, e in enumerate(normal.events) if i > read and e == normal.events[read]]
    assert later  # the key's state carries the value on to these
    for bad in ([1e300, 1e300], [1e300, -1e300]):
        rows = [list(p) for p in normal.params]
        rows[read] = bad
        line = {"session": "huge", "events": normal.events, "params": rows}
        (tmp_path / "huge.jsonl").write_text(json.dumps(line) + "\n", encoding="utf-8")
        code, out, err = run_cli("predict", "--checkpoint", str(params), "--input",
                                 str(tmp_path / "huge.jsonl"), "--top", "10")  # fmt: skip
        assert code == 0 and err == "", err
        record = _strict(out)
        assert record["verdict"] == "anomalous", record
        flagged = {t["position"] for t in record["top"] if t["anomalous"]}
        assert read in flagged and record["anomalous_vectors"] >= 1
        assert record["score"] is None  # infinite: null in strict JSON


def test_a_validation_value_beyond_float32_names_the_validation_data(data, tmp_path, run_cli):
    """A validation session whose read took 1e300: normalised it is beyond float32, so the
    validation loss was NaN and training stopped with "training diverged (lower --lr or
    set --clip-norm)"; the validation data is at fault, and is named."""
    sessions = read_sessions(data / "valid.jsonl")
    bad = sessions[3]
    read = next(i for i, e in enumerate(bad.events) if "read chunk" in e)
    bad.params[read] = [bad.params[read][0], 1e300]
    valid = write(tmp_path / "valid.jsonl", sessions)
    code, _, err = run_cli("train", "--task", "params", "--train", str(data / "train.jsonl"),
                           "--valid", str(valid), "--out", str(tmp_path / "r"), "--epochs", "1",
                           *TINY)  # fmt: skip
    assert code == 2 and err.count("\n") == 1, err
    assert f"{valid}:4: validation value 1e+300 (occurrence 1 of the event " in err
    assert "read chunk" in err and "value 1)" in err and "--lr" not in err


def test_the_errors_of_the_threshold_are_computed_on_the_training_device(
    data, tmp_path, run_cli, monkeypatch
):
    """Each key's error Gaussian and the session threshold come from the validation
    errors of the model reloaded after training: on the device it trained on (it was
    the CPU's after ``--device cuda``, while scoring computes the errors on the GPU)."""
    import importlib

    # the module (the package's `train` is the function of the same name)
    params_train = importlib.import_module("rnnkit.app.tasks.params.train")

    devices = []
    real = params_train.load_regressor

    def spy(run_dir, device="cpu"):
        devices.append(device)
        return real(run_dir, device)

    monkeypatch.setattr(params_train, "load_regressor", spy)
    code, _, err = run_cli("train", "--task", "params", "--train", str(data / "train.jsonl"),
                           "--valid", str(data / "valid.jsonl"), "--out", str(tmp_path / "r"),
                           "--epochs", "1", "--device", "auto", *TINY)  # fmt: skip
    assert code == 0, err
    assert devices and set(devices) == {"auto"}, devices


def test_score_with_params_judges_the_sessions_a_batch_at_a_time(
    data: Path, runs: tuple[Path, Path], run_cli, monkeypatch
) -> None:
    """``score --params``: each session's parameter verdict is the params run's own
    (``score`` of that run alone, in the same batches: float32 sums depend on them),
    judged ``--batch-size`` sessions at a time (before: one session at a time, each
    key's regressor run once per session)."""
    import importlib

    params, events = runs
    scoring = importlib.import_module("rnnkit.app.tasks.params.scoring")
    batches = []
    real = scoring.score_items

    def counted(run, items, *args, **kwargs):
        batches.append(len(items))
        return real(run, items, *args, **kwargs)

    test = str(data / "test.jsonl")
    code, out, err = run_cli("score", "--checkpoint", str(params), "--data", test, "--top", "1",
                             "--batch-size", "5")  # fmt: skip
    assert code == 0, err
    alone = [json.loads(line) for line in out.splitlines()]
    monkeypatch.setattr(scoring, "score_items", counted)
    code, out, err = run_cli("score", "--checkpoint", str(events), "--params", str(params),
                             "--data", test, "--top", "1", "--batch-size", "5")  # fmt: skip
    assert code == 0, err
    both = [json.loads(line) for line in out.splitlines()]
    assert batches == [5, 5, 5, 5, 4]  # 24 sessions
    assert [r["session"] for r in both] == [r["session"] for r in alone]
    for r, own in zip(both, alone, strict=True):
        assert r["params"] == {k: v for k, v in own.items() if k not in ("session", "label")}
