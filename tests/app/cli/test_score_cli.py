"""``rnnkit train --task events`` → ``rnnkit score`` (batch and --follow) → ``evaluate --json``,
end to end through the command line, and its answers to bad input."""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from rnnkit.anomaly.scores import SCORES
from rnnkit.app.cli.main import main
from rnnkit.data.events import write_sessions
from rnnkit.data.generated_sessions import generate_sessions


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    tmp = tmp_path_factory.mktemp("score_cli")
    write_sessions(tmp / "train.jsonl", generate_sessions(126, anomalies=6, seed=1))
    write_sessions(tmp / "valid.jsonl", generate_sessions(100, seed=2, prefix="v"))
    write_sessions(tmp / "test.jsonl", generate_sessions(60, anomalies=20, seed=3, prefix="t"))
    code = main(
        [
            "train", "--task", "events", "--train", str(tmp / "train.jsonl"),
            "--valid", str(tmp / "valid.jsonl"), "--out", str(tmp / "run"), "--hidden", "32",
            "--embedding", "16", "--epochs", "5", "--batch-size", "16", "--lr", "0.01",
            "--bptt", "full", "--ngram-order", "3", "--quiet",
        ]
    )  # fmt: skip
    assert code == 0
    return tmp / "run"


def _lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_train_prints_its_summary_and_leaves_labelled_anomalies_out(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["sessions"]["excluded_anomalous"] == 6
    assert (run_dir / "thresholds.json").is_file()


def test_score_prints_one_line_per_session(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    test = run_dir.parent / "test.jsonl"
    assert main(["score", "--checkpoint", str(run_dir), "--data", str(test), "--top", "3"]) == 0
    out, err = capsys.readouterr()
    records = _lines(out)
    assert [r["session"] for r in records] == [f"t{i}" for i in range(60)]
    for r in records:
        assert {"session", "score", "verdict", "threshold", "top", "scores", "label"} <= set(r)
        assert r["verdict"] in ("anomalous", "normal") and len(r["top"]) == 3
        assert {"position", "event", "surprise"} <= set(r["top"][0])
    flagged = [r["label"] for r in records if r["verdict"] == "anomalous"]
    assert sum(flagged) >= 11  # most of the 20 planted anomalies
    assert "60 session(s)" in err
    # Thresholds re-picked at another false-positive rate, or given outright.
    assert main(["score", "--checkpoint", str(run_dir), "--data", str(test), "--quiet",
                 "--target-fpr", "0.3"]) == 0  # fmt: skip
    relaxed = _lines(capsys.readouterr().out)
    assert relaxed[0]["threshold"] < records[0]["threshold"]
    assert main(["score", "--checkpoint", str(run_dir), "--data", str(test), "--quiet",
                 "--threshold", "1e9", "--score", "mean", "--ngram"]) == 0  # fmt: skip
    fixed = _lines(capsys.readouterr().out)
    assert all(r["verdict"] == "normal" and r["threshold"] == 1e9 for r in fixed)
    assert all("ngram" in r and r["ngram"]["verdict"] in ("anomalous", "normal") for r in fixed)


def test_evaluate_json_reports_detection_side_by_side(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    test = run_dir.parent / "test.jsonl"
    assert main(["evaluate", "--checkpoint", str(run_dir), "--data", str(test), "--json"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    for key in ("loss_nats", "tokens", "auc", "precision", "recall", "f1"):
        assert isinstance(metrics[key], (int, float)), key
    assert metrics["auc"] > 0.85
    assert {"auc", "precision", "recall", "f1"} <= set(metrics["ngram"])
    # The plain-text form prints every value without tripping over nested results.
    assert main(["evaluate", "--checkpoint", str(run_dir), "--data", str(test)]) == 0
    text = capsys.readouterr().out
    assert "auc:" in text and "ngram:" in text


def test_follow_a_file_prints_verdicts_and_skips_bad_lines(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "stream.jsonl"
    normal = generate_sessions(1, seed=7)[0].events
    lines = [
        {"session": "a", "event": normal[0]},
        {"session": "b", "events": ["login:user", "exec_shell"]},
        {"session": "a", "events": normal[1:], "end": True},
    ]
    text = "\n".join(json.dumps(x) for x in lines[:2]) + "\n{broken\n" + json.dumps(lines[2])
    path.write_text(text + '\n{"session": "ghost", "end": true}\n')
    code = main(["score", "--checkpoint", str(run_dir), "--data", str(path), "--follow",
                 "--until-idle", "0.3", "--poll", "0.05"])  # fmt: skip
    assert code == 0
    out, err = capsys.readouterr()
    verdicts = _lines(out)
    by = {(v["session"], v["reason"]): v for v in verdicts}
    assert by[("b", "anomalous")]["closed"] is False
    assert by[("b", "anomalous")]["top"][0] == {
        "position": 1,
        "event": "exec_shell",
        "surprise": by[("b", "anomalous")]["top"][0]["surprise"],
        "unknown": True,
    }
    assert by[("a", "end")]["verdict"] == "normal"
    assert by[("a", "end")]["events"] == len(normal)
    assert by[("b", "input ended")]["closed"] is True
    assert f"{path}:3: invalid JSON" in err and "(line skipped)" in err
    assert "1 end(s) of no open session" in err
    # the run's (default) combined score needs whole sessions: max streams, said once
    assert err.count("which needs whole sessions; --follow gives them by max") == 1


def test_follow_standard_input(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    events = [{"session": "s", "event": e} for e in ("login:admin", "sudo", "write_cfg")]
    events.append({"session": "s", "end": True})
    read_end, write_end = os.pipe()
    os.write(write_end, "".join(json.dumps(e) + "\n" for e in events).encode())
    os.close(write_end)  # the producer is done: the pipe ends after these lines
    saved = os.dup(0)
    os.dup2(read_end, 0)  # --data - reads file descriptor 0 itself
    try:
        code = main(["score", "--checkpoint", str(run_dir), "--data", "-", "--follow", "--quiet"])
    finally:
        os.dup2(saved, 0)
        os.close(saved)
        os.close(read_end)
    assert code == 0
    (verdict,) = _lines(capsys.readouterr().out)
    assert verdict["reason"] == "end" and verdict["events"] == 3


@pytest.mark.parametrize(
    ("content", "extra", "message"),
    [
        ('{"session": "a", "events": ["x"]}\n{"session": "a" "events": []}\n', [],
         r"data.txt:2: invalid JSON"),
        ('{"session": "a", "events": []}\n', [], r"data.txt:1: session 'a' has no events"),
        ("1234  openat(AT_FDCWD, \"/x\", O_RDONLY) = 3\n", [],
         "looks like strace output: add --from strace"),
        ("hello world\nthis is not strace\n", ["--from", "strace"], "data.txt"),
        ("", [], "no sessions"),
    ],
)  # fmt: skip
def test_bad_data_is_one_clear_line(
    run_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    content: str,
    extra: list[str],
    message: str,
) -> None:
    path = tmp_path / "data.txt"
    path.write_text(content)
    code = main(["score", "--checkpoint", str(run_dir), "--data", str(path), *extra])
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and err.startswith("rnnkit score: error: ")
    assert message in err or __import__("re").search(message, err), err


def test_the_sessions_before_a_bad_line_are_scored_first(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # One batch of 64 held the four good sessions and the bad fifth line: their verdicts
    # were lost with it.
    lines = (run_dir.parent / "test.jsonl").read_text().splitlines()[:6]
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join([*lines[:4], '{"session": 3}', *lines[4:]]) + "\n")
    code = main(["score", "--checkpoint", str(run_dir), "--data", str(path)])
    out, err = capsys.readouterr()
    assert code == 2 and f"{path}:5" in err and len(err.strip().splitlines()) == 1, err
    assert [r["session"] for r in _lines(out)] == [f"t{i}" for i in range(4)]


@pytest.mark.parametrize("follow", [False, True])
def test_invalid_utf8_after_8_kb_names_its_own_line(
    run_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    follow: bool,
) -> None:
    # 300 lines (over 8 KB) before the bad one: standard input in batch, a file followed
    good = b"".join(b'{"session": "s%d", "events": ["x"]}\r\n' % i for i in range(300))
    data = good + b'{"session": "\xff", "events": ["x"]}\r\n'
    if follow:
        path = tmp_path / "stream.jsonl"
        path.write_bytes(data + b'{"session": "z", "event": "x", "end": true}\n')
        argv = ["--data", str(path), "--follow", "--until-idle", "0.3", "--poll", "0.05"]
    else:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
        argv = ["--data", "-"]
    code = main(["score", "--checkpoint", str(run_dir), "--quiet", *argv])
    err = capsys.readouterr().err
    where = f"{path}:301" if follow else "<stdin>:301"
    line = f"{where}: invalid UTF-8 at byte 14 of the line (byte 0xff)"
    if follow:  # a bad line of a stream is skipped, never fatal
        assert code == 0 and f"{line} (line skipped)" in err, err
    else:
        assert code == 2 and err == f"rnnkit score: error: {line}\n"


def test_strace_input_is_scored_with_unknown_events(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "trace.txt"
    trace.write_text(
        '10  openat(AT_FDCWD, "/nope", O_RDONLY) = -1 ENOENT (No such file or directory)\n'
        "10  exit_group(1)                     = ?\n"
        "10  +++ exited with 1 +++\n"
    )
    assert main(["score", "--checkpoint", str(run_dir), "--data", str(trace),
                 "--from", "strace"]) == 0  # fmt: skip
    out, err = capsys.readouterr()
    (record,) = _lines(out)
    assert record["unknown"] == 2 and record["verdict"] == "anomalous"
    assert "2 event(s) never seen in training (<unk>)" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--target-fpr", "1.5"], "--target-fpr must be in (0, 1)"),
        (["--target-fpr", "0.1", "--threshold", "2"], "not both"),
        (["--until-idle", "1"], "--until-idle applies to --follow only"),
        (["--follow", "--from", "strace"], "--follow reads event lines"),
        (["--max-sessions", "0", "--follow"], "--max-sessions must be ≥ 1"),
        (["--no-result"], "apply to --from strace only"),
    ],
)
def test_bad_options_are_named(
    run_dir: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    code = main(["score", "--checkpoint", str(run_dir), "--data", "x", *args])
    assert code == 2
    assert message in capsys.readouterr().err


def test_a_checkpoint_that_is_not_an_events_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["score", "--checkpoint", str(tmp_path / "nothing"), "--data", "x"]) == 2
    assert "no such checkpoint directory" in capsys.readouterr().err


def test_train_takes_the_detection_options_and_prints_detection(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_sessions(tmp_path / "train.jsonl", generate_sessions(40, seed=1))
    write_sessions(tmp_path / "valid.jsonl", generate_sessions(30, anomalies=6, seed=2))
    code = main(
        [
            "train", "--task", "events", "--train", str(tmp_path / "train.jsonl"),
            "--valid", str(tmp_path / "valid.jsonl"), "--out", str(tmp_path / "run"),
            "--hidden", "8", "--embedding", "4", "--epochs", "1", "--quiet", "--no-report",
            "--score", "combined", "--top-g", "2", "--window", "4", "--target-fpr", "0.02",
            "--threshold-method", "gpd",
        ]
    )  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    assert "threshold: combined score above" in out
    assert "of 24 normal sessions above it" in out and "Clopper–Pearson" in out
    assert "note: 24 normal validation sessions cannot show" in out
    assert "recurrent" in out and "5-gram" in out
    thresholds = json.loads((tmp_path / "run" / "thresholds.json").read_text())
    assert (thresholds["score"], thresholds["top_g"], thresholds["window"]) == ("combined", 2, 4)
    assert thresholds["method"] == "gpd" and thresholds["target_fpr"] == 0.02
    test = tmp_path / "valid.jsonl"
    assert main(["score", "--checkpoint", str(tmp_path / "run"), "--data", str(test),
                 "--quiet", "--target-fpr", "0.1", "--threshold-method", "gpd"]) == 0  # fmt: skip
    records = _lines(capsys.readouterr().out)
    assert len(records) == 30 and all(set(r["scores"]) == set(SCORES) for r in records)
    # The options belong to the events task, and a streaming score must be a running one.
    assert main(["train", "--task", "lm", "--train", str(test), "--out", str(tmp_path / "x"),
                 "--top-g", "3"]) == 2  # fmt: skip
    assert "--top-g does not apply to --task lm (only to: events)" in capsys.readouterr().err
    assert main(["score", "--checkpoint", str(tmp_path / "run"), "--data", "-", "--follow",
                 "--score", "max"]) == 2  # fmt: skip
    assert "this run predicts from a window of 4 events: score it in batch" in (
        capsys.readouterr().err
    )
    assert main(["score", "--checkpoint", str(tmp_path / "run"), "--data", str(test),
                 "--threshold-method", "gpd"]) == 2  # fmt: skip
    assert "give --target-fpr too" in capsys.readouterr().err


def test_follow_refuses_a_whole_session_score(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        ["score", "--checkpoint", str(run_dir), "--data", "-", "--follow", "--score", "combined"]
    )
    assert code == 2
    assert "streaming scores are max, mean, count (the others need the whole session)" in (
        capsys.readouterr().err
    )


def test_a_closed_pipe_ends_quietly(run_dir: Path, tmp_path: Path) -> None:
    # `rnnkit score ... | head -3`: far more output than a pipe buffers (64 KiB), so the
    # writes after head has gone fail with EPIPE.
    import subprocess
    import sys

    many = tmp_path / "many.jsonl"
    write_sessions(many, generate_sessions(400, seed=4, prefix="m"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    cmd = f"{sys.executable} -m rnnkit score --checkpoint {run_dir} --data {many} --top 20"
    done = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {cmd} | head -3 >/dev/null; echo ${{PIPESTATUS[0]}}"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.stdout.strip() == "0", done.stdout
    assert "Broken pipe" not in done.stderr and "Traceback" not in done.stderr
    # Only the summary line (stderr) remains; nothing about the pipe.
    assert all("session(s)" in line for line in done.stderr.splitlines()), done.stderr


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_a_non_finite_threshold_is_refused(
    run_dir: Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    # NaN compares false with every score: every session would be "normal".
    test = run_dir.parent / "test.jsonl"
    code = main(
        ["score", "--checkpoint", str(run_dir), "--data", str(test), f"--threshold={value}"]
    )
    _, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1
    assert "--threshold must be a finite number" in err


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "1e999"])
def test_a_non_finite_number_in_thresholds_json_is_refused(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], constant: str, monkeypatch
) -> None:
    import re
    import shutil

    monkeypatch.setenv("RNNKIT_SKIP_CHECKSUMS", "1")  # the reader's own check, not the manifest

    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    path = copy / "thresholds.json"
    text = path.read_text()
    doc = json.loads(text)
    first = doc["rnn"][doc["score"]]
    path.write_text(text.replace(json.dumps(first), constant, 1))
    test = run_dir.parent / "test.jsonl"
    code = main(["score", "--checkpoint", str(copy), "--data", str(test)])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1
    assert re.search(r"thresholds\.json: not valid JSON: .*(not a JSON number|finite number)", err)


def test_score_output_is_strict_json(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    test = run_dir.parent / "test.jsonl"
    assert main(["score", "--checkpoint", str(run_dir), "--data", str(test), "--quiet"]) == 0
    for line in capsys.readouterr().out.splitlines():
        json.loads(line, parse_constant=lambda name: pytest.fail(f"{name} in the output"))


@pytest.mark.parametrize("name", ["valid_scores.safetensors", "ngram.safetensors"])
def test_a_truncated_array_file_is_one_line(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    path = copy / name
    path.write_bytes(path.read_bytes()[:50])
    test = run_dir.parent / "test.jsonl"
    # The baseline is checked even without --ngram; the scores only with --target-fpr.
    code = main(["score", "--checkpoint", str(copy), "--data", str(test), "--target-fpr", "0.1"])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1 and str(path) in err, err


def test_a_negative_threshold_of_a_score_that_is_never_negative_is_refused(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Every session scored above -1: all anomalous, silently.
    import shutil

    test = run_dir.parent / "test.jsonl"
    base = ["score", "--checkpoint", str(run_dir), "--data", str(test), "--quiet"]
    assert main([*base, "--threshold", "-1", "--score", "max"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--threshold -1: the max score is never negative" in err
    assert main([*base, "--threshold", "-1"]) == 2  # the run's own (default) score
    err = capsys.readouterr().err.strip()
    assert "--threshold -1: the combined score is never negative" in err
    assert main([*base, "--threshold", "-1", "--score", "norm"]) == 0  # a z-score may be < 0
    capsys.readouterr()
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    doc = json.loads((copy / "thresholds.json").read_text())
    doc["rnn"]["max"] = -0.5
    (copy / "thresholds.json").write_text(json.dumps(doc))
    assert main(["score", "--checkpoint", str(copy), "--data", str(test), "--quiet"]) == 2
    assert "thresholds.json: does not match its SHA-256" in capsys.readouterr().err
    assert main(["score", "--checkpoint", str(copy), "--data", str(test), "--quiet",
                 "--skip-checksums"]) == 2  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "thresholds.json: the rnn threshold of the max score" in err


@pytest.mark.parametrize("rate", [1.5, 0.0, True, "0.1"])
def test_target_fpr_is_named_as_given(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], rate: object
) -> None:
    """The functions that re-pick thresholds name their ``target_fpr`` argument (an events
    run's, and a params run's session score); ``rnnkit score`` checks its ``--target-fpr``
    first and names that. (``True`` passed as 1.0, the string failed inside numpy.)"""
    from rnnkit.app.tasks.events import repick_thresholds
    from rnnkit.app.tasks.params import repick_session_score
    from rnnkit.errors import ConfigError

    for repick in (repick_thresholds, repick_session_score):
        with pytest.raises(ConfigError, match=rf"^target_fpr must be in \(0, 1\), got {rate!r}$"):
            repick(run_dir, rate)  # type: ignore[arg-type]
    if isinstance(rate, float):
        argv = ["score", "--checkpoint", str(run_dir), "--data", "x", "--target-fpr", str(rate)]
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err == f"rnnkit score: error: --target-fpr must be in (0, 1), got {rate}", err


def test_a_nan_validation_score_is_refused_when_thresholds_are_repicked(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A NaN among the stored validation scores (read under --skip-checksums) made the
    # re-picked threshold nan ("0 anomalous (combined score above nan)", exit 0) or moved it.
    import shutil

    from safetensors.numpy import load_file, save_file

    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    path = copy / "valid_scores.safetensors"
    arrays = load_file(str(path))
    name = json.loads((copy / "thresholds.json").read_text())["score"]
    arrays[f"rnn/{name}"][0] = np.nan
    save_file(arrays, str(path))
    test = run_dir.parent / "test.jsonl"
    code = main(["score", "--checkpoint", str(copy), "--data", str(test), "--target-fpr", "0.1",
                 "--skip-checksums"])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert f"{path}: rnn/{name} holds a value that is not finite" in err


def test_an_empty_standard_input_is_named_as_every_other_stdin_error(
    run_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"")))
    code = main(["score", "--checkpoint", str(run_dir), "--quiet", "--data", "-"])
    err = capsys.readouterr().err
    assert code == 2 and err == "rnnkit score: error: <stdin>: no sessions (the input is empty)\n"


@pytest.mark.parametrize(
    ("data", "said"),
    [(b"", "no strace output (the input is empty)"), (b"x\n", "not strace output: none of")],
)
def test_strace_on_standard_input_is_named_in_its_errors(
    run_dir: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    data: bytes,
    said: str,
) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    code = main(["score", "--checkpoint", str(run_dir), "--from", "strace", "--data", "-"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"rnnkit score: error: <stdin>: {said}"), err


def test_strace_on_standard_input_names_it_in_the_skipped_lines_note(
    run_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = 'garbage line\n101   openat(AT_FDCWD, "/etc/hosts", O_RDONLY) = 3\n'
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(trace.encode())))
    code = main(["score", "--checkpoint", str(run_dir), "--from", "strace", "--data", "-"])
    err = capsys.readouterr().err
    assert code == 0 and "skipped 1 non-strace line(s) (first at <stdin>:1)" in err, err


def test_strace_on_standard_input_splits_lines_as_sessions_does(
    run_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lone "\\r" (a traced program's progress output) ends no line, as in `rnnkit
    sessions`: standard input split it off as a line of its own, "skipped" as non-strace."""
    trace = b'101   write(1, "a", 1) = 1 10%\r20%\r\n101   close(3) = 0\r\n'
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(trace)))
    code = main(["score", "--checkpoint", str(run_dir), "--from", "strace", "--data", "-"])
    out, err = capsys.readouterr()
    assert code == 0 and "skipped" not in err, err
    assert [json.loads(line)["events"] for line in out.splitlines()] == [2]


def test_the_summary_line_says_how_the_threshold_was_set(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--threshold-method gpd`` may fall back to the empirical quantile; the summary
    line only gave the threshold, so nothing said which of the two set it."""
    from safetensors.numpy import load_file

    from rnnkit.anomaly.thresholds import pick_threshold

    test = run_dir.parent / "test.jsonl"
    name = json.loads((run_dir / "thresholds.json").read_text())["score"]
    scores = load_file(str(run_dir / "valid_scores.safetensors"))[f"rnn/{name}"]
    hows = set()
    for rate in ("0.3", "0.002"):  # within the validation scores' reach, then past it
        value, how = pick_threshold(scores, float(rate), "gpd")  # the oracle
        hows.add(how.split(" (")[0])
        argv = ["score", "--checkpoint", str(run_dir), "--data", str(test), "--target-fpr",
                rate, "--threshold-method", "gpd"]  # fmt: skip
        assert main(argv) == 0
        err = capsys.readouterr().err
        assert f"({name} score above {value:.4g}; target FPR {rate}: {how})" in err, err
    assert hows == {"empirical quantile", "generalized Pareto tail"}
    assert main(["score", "--checkpoint", str(run_dir), "--data", str(test)]) == 0
    assert "; the run's threshold, target FPR 0.01: " in capsys.readouterr().err
    argv = ["score", "--checkpoint", str(run_dir), "--data", str(test), "--threshold", "3"]
    assert main(argv) == 0
    assert f"({name} score above 3; --threshold)" in capsys.readouterr().err


@pytest.mark.parametrize("how", [None, 5, {"rnn": "x"}])
def test_a_thresholds_file_without_its_record_of_how_still_scores(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], how: object
) -> None:
    """An older run's thresholds.json (no "how") said "empirical quantile" whatever its
    method; a "how" that is not a table was an AttributeError traceback."""
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    path = copy / "thresholds.json"
    doc = json.loads(path.read_text())
    doc.pop("how")
    if how is not None:
        doc["how"] = how
    doc["method"] = "gpd"
    path.write_text(json.dumps(doc))
    test = run_dir.parent / "test.jsonl"
    argv = ["score", "--checkpoint", str(copy), "--data", str(test), "--skip-checksums"]
    assert main(argv) == 0
    assert "; the run's threshold, target FPR 0.01: --threshold-method gpd)" in (
        capsys.readouterr().err
    )
