"""The events task: training on normal sessions, planted anomalies, thresholds, baseline,
unknown events, bad input, and real strace traces recorded here."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from rnnkit.anomaly import surprise as surprise_module
from rnnkit.anomaly.scores import COMBINED_PARTS, SCORES, combined_scores
from rnnkit.app.config import TrainConfig
from rnnkit.app.tasks.events import (
    EventVocabulary,
    evaluate,
    event_surprises,
    load_events,
    options,
    score_sessions,
    train,
)
from rnnkit.data.events import Session, read_sessions, write_sessions
from rnnkit.data.generated_sessions import ANOMALY_KINDS, generate_sessions
from rnnkit.data.strace import parse_strace
from rnnkit.data.vocab import EOS_ID
from rnnkit.errors import CheckpointError, ConfigError, DataError
from rnnkit.metrics.detection import roc_auc
from rnnkit.training.manifest import write_manifest

TARGET_FPR = 0.05


def _config(tmp: Path, train_path: Path, valid_path: Path | None, **kw) -> TrainConfig:
    settings = dict(
        task="events",
        train=str(train_path),
        valid=None if valid_path is None else str(valid_path),
        out=str(tmp / "run"),
        hidden=32,
        embedding=16,
        epochs=6,
        batch_size=16,
        lr=1e-2,
        bptt="full",
        ngram_order=3,
        target_fpr=TARGET_FPR,
        top_g=3,
        score="max",  # these tests read the max score's verdicts (not the default, combined)
    )
    settings.update(kw)
    return TrainConfig(**settings).validate()


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """One run on the toy grammar: 200 normal + 12 labelled anomalies in the training file
    (left out), 300 normal + 20 anomalous validation sessions."""
    torch.set_num_threads(1)
    tmp = tmp_path_factory.mktemp("events")
    train_path, valid_path = tmp / "train.jsonl", tmp / "valid.jsonl"
    write_sessions(train_path, generate_sessions(212, anomalies=12, seed=1))
    write_sessions(valid_path, generate_sessions(320, anomalies=20, seed=2, prefix="v"))
    summary = train(_config(tmp, train_path, valid_path), quiet=True)
    return tmp / "run", summary


def test_summary_counts_and_files(trained: tuple[Path, dict]) -> None:
    run_dir, summary = trained
    assert summary["task"] == "events"
    assert summary["sessions"] == {
        "train": 200,
        "valid": 300,
        "excluded_anomalous": 12,
        "valid_anomalous": 20,
    }
    for name in ("config.json", "vocab.json", "model.safetensors", "ngram.safetensors"):
        assert (run_dir / name).is_file()
    thresholds = json.loads((run_dir / "thresholds.json").read_text())
    assert thresholds["target_fpr"] == TARGET_FPR and thresholds["top_g"] == 3
    assert set(thresholds["rnn"]) == set(thresholds["ngram"]) == set(SCORES)
    # The recurrent model beats the trigram on the validation sessions, and already
    # separates the labelled anomalies of --valid.
    assert summary["valid"]["loss_nats"] < summary["ngram"]["loss_nats"]
    assert summary["valid_detection"]["auc"] > 0.9
    # The labelled-1 sessions of the training file never reached the vocabulary.
    assert "exec_shell" not in EventVocabulary.load(run_dir / "vocab.json")


def test_planted_anomalies_are_separated(trained: tuple[Path, dict], tmp_path: Path) -> None:
    run_dir, _ = trained
    test_path = tmp_path / "test.jsonl"
    write_sessions(test_path, generate_sessions(240, anomalies=40, seed=3, prefix="t"))
    m = evaluate(run_dir, str(test_path))
    assert m["labelled"] == 240 and m["anomalous_sessions"] == 40
    assert m["auc"] > 0.93, m
    assert m["recall"] > 0.6 and m["precision"] > 0.5  # a quarter are the hard kind
    assert m["f1"] == pytest.approx(m["rnn_max"]["f1"])
    # The baseline is scored the same way, side by side.
    for key in ("auc", "precision", "recall", "f1", "loss_nats", "perplexity"):
        assert key in m["ngram"]
    assert m["ngram_max"]["threshold"] != m["rnn_max"]["threshold"]
    for name in ("max", "mean", "count"):
        assert 0.0 <= m[f"rnn_{name}"]["auc"] <= 1.0
    # Every kind of anomaly stands out. A sudo block in a user session is normal locally
    # (every trigram of it occurs in admin sessions): only the first event, many steps
    # back, gives it away, and six epochs teach that only partly (ranking, not the
    # threshold); the other kinds clear the threshold region.
    run = load_events(run_dir)
    records = list(score_sessions(run, generate_sessions(200, anomalies=40, seed=8)))
    normal = np.array([r["score"] for r in records if r["label"] == 0])
    for k, kind in enumerate(ANOMALY_KINDS):
        planted = np.array([r["score"] for r in records[160 + k :: 4]])
        if kind == "privilege":
            labels = np.r_[np.zeros(len(normal)), np.ones(len(planted))]
            assert roc_auc(np.r_[normal, planted], labels) > 0.7
        else:
            assert np.median(planted) > np.quantile(normal, 0.95), kind


def test_threshold_meets_the_target_rate_on_held_out_normal_sessions(
    trained: tuple[Path, dict],
) -> None:
    run_dir, _ = trained
    run = load_events(run_dir)
    held_out = generate_sessions(600, seed=11, prefix="h")
    flagged = np.mean([r["verdict"] == "anomalous" for r in score_sessions(run, held_out)])
    assert 0.005 <= flagged <= 0.12, flagged  # target 0.05; 300 validation sessions


def test_unknown_events_are_counted_and_shown(trained: tuple[Path, dict], tmp_path: Path) -> None:
    run_dir, _ = trained
    events = ["login:user", "open", "ptrace:EPERM", "read", "close", "a template with spaces"]
    session = Session("odd", [*events, "logout"], 1)
    (record,) = score_sessions(load_events(run_dir), [session])
    assert record["unknown"] == 2 and record["verdict"] == "anomalous"
    shown = {t["event"]: t for t in record["top"]}
    assert shown["ptrace:EPERM"]["unknown"] is True and shown["ptrace:EPERM"]["miss"] is True
    path = tmp_path / "odd.jsonl"
    write_sessions(path, [session, *generate_sessions(5, seed=5)])
    m = evaluate(run_dir, str(path))
    assert m["unknown_events"] == 2 and m["auc"] == 1.0


def test_a_file_of_normal_sessions_has_no_recall(
    trained: tuple[Path, dict], tmp_path: Path
) -> None:
    """No anomalous session: recall is 0/0 and AUC undefined, None (JSON null) for the
    model and the n-gram alike (recall printed 0 beside ``auc: None``); precision and F1
    are None exactly when nothing is flagged (``2 tp + fp + fn`` = 0), the false-positive
    rate the share flagged."""
    from rnnkit.app.cli.evaluate import plain_text

    path = tmp_path / "normal.jsonl"
    sessions = generate_sessions(20, seed=5)
    assert all(s.label == 0 for s in sessions)
    write_sessions(path, sessions)
    m = evaluate(trained[0], str(path))
    assert m["anomalous_sessions"] == 0
    for figures in (m, m["ngram"]):
        assert figures["auc"] is None and figures["recall"] is None
    for key in [k for k in m if k.startswith(("rnn_", "ngram_"))]:
        v = m[key]
        assert v["recall"] is None and v["fpr"] == v["fp"] / 20
        assert (v["precision"] is None) == (v["f1"] is None) == (v["fp"] == 0)
        assert v["f1"] in (None, 0.0) and v["precision"] in (None, 0.0)
    text = plain_text(m)
    assert "None" not in text and "recall: n/a (no anomalous sessions)" in text


def test_scoring_long_sessions_in_chunks_changes_nothing(
    trained: tuple[Path, dict], monkeypatch: pytest.MonkeyPatch
) -> None:
    run = load_events(trained[0])
    seqs = [run.vocab.encode_events(s.events)[0] for s in generate_sessions(6, seed=6)]
    whole = event_surprises(run.model, seqs, batch_size=4)
    monkeypatch.setattr(surprise_module, "SCORE_CHUNK", 3)
    chunked = event_surprises(run.model, seqs, batch_size=4)
    for (s1, r1), (s2, r2) in zip(whole, chunked, strict=True):
        np.testing.assert_allclose(s1, s2, atol=1e-5)
        np.testing.assert_array_equal(r1, r2)


def test_bad_input_and_options(tmp_path: Path, trained: tuple[Path, dict]) -> None:
    only_anomalies = tmp_path / "bad.jsonl"
    write_sessions(only_anomalies, [Session("x", ["a"], 1)])
    with pytest.raises(DataError, match="no normal session to train on"):
        train(_config(tmp_path, only_anomalies, None), quiet=True)
    one = tmp_path / "one.jsonl"
    write_sessions(one, [Session("x", ["a"])])
    with pytest.raises(DataError, match="pass --valid"):
        train(_config(tmp_path, one, None), quiet=True)
    malformed = tmp_path / "malformed.jsonl"
    malformed.write_text('{"session": "a", "events": ["x"]}\n{"session": "b", "events": []}\n')
    with pytest.raises(DataError, match=r"malformed.jsonl:2: session 'b' has no events"):
        train(_config(tmp_path, malformed, None), quiet=True)
    for changes, message in [
        ({"target_fpr": 1.5}, r"--target-fpr must be in \(0, 1\), got 1.5"),
        ({"top_g": 0}, "--top-g must be ≥ 1, got 0"),
        ({"window": 0}, "--window must be ≥ 1, got 0"),
        ({"score": "median"}, "--score must be one of"),
    ]:
        with pytest.raises(ConfigError, match=message):
            TrainConfig(train="x", task="events", **changes).validate()
    assert options(TrainConfig(train="x", threshold_method="gpd"))["threshold"] == "gpd"
    # A run without its thresholds, or of another task, is refused naming the file.
    broken = tmp_path / "broken"
    shutil.copytree(trained[0], broken)
    (broken / "thresholds.json").unlink()
    with pytest.raises(CheckpointError, match=r"thresholds\.json: missing"):
        load_events(broken)
    config = json.loads((broken / "config.json").read_text())
    config["config"]["task"] = "lm"
    (broken / "config.json").write_text(json.dumps(config))
    write_manifest(broken)  # as a forger would: the task check must still catch it
    with pytest.raises(CheckpointError, match="not 'events'"):
        load_events(broken)


# ---- real strace traces ----------------------------------------------------------------

READ = "import sys\nwith open(sys.argv[1]) as f:\n    n = sum(len(l.split()) for l in f)\nprint(n)"
CONNECT = (
    "import socket, sys\n"
    "try:\n"
    "    socket.create_connection(('127.0.0.1', int(sys.argv[1]))).close()\n"  # blocking
    "except OSError:\n"
    "    sys.exit(2)\n"
)


def _trace(strace: str, code: str, args: list[str], out: Path, cwd: Path) -> list[str]:
    result = subprocess.run(
        [strace, "-f", "-o", str(out), sys.executable, "-S", "-I", "-c", code, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if "ptrace" in result.stderr and not out.exists():
        pytest.skip(f"strace cannot trace here: {result.stderr.strip().splitlines()[0]}")
    sessions, _ = parse_strace(out, per="file")
    return sessions[0].events


def test_real_strace_sessions_flag_a_refused_connection(tmp_path: Path) -> None:
    strace = shutil.which("strace")
    if strace is None:
        pytest.skip("strace is not installed (apt-get install strace to run this test)")
    torch.set_num_threads(1)
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        open_port = server.getsockname()[1]
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            closed_port = probe.getsockname()[1]  # bound, never listening: refused
        normal = []
        for i in range(6):
            data = tmp_path / f"in{i}.txt"
            data.write_text("word " * (i * 37 + 1) + "\n" * i)
            if i % 2:
                events = _trace(strace, READ, [str(data)], tmp_path / f"t{i}", tmp_path)
            else:
                events = _trace(strace, CONNECT, [str(open_port)], tmp_path / f"t{i}", tmp_path)
            normal.append(Session(f"normal-{i}", events, 0))
        refused = _trace(strace, CONNECT, [str(closed_port)], tmp_path / "refused", tmp_path)
    assert any(e.startswith("connect:ECONNREFUSED") for e in refused)
    train_path, valid_path = tmp_path / "train.jsonl", tmp_path / "valid.jsonl"
    write_sessions(train_path, normal[:4])
    write_sessions(valid_path, normal[4:])
    cfg = _config(tmp_path, train_path, valid_path, epochs=8, batch_size=2, max_len=2048)
    train(cfg, quiet=True)
    run = load_events(tmp_path / "run")
    sessions = [*normal[4:], Session("refused", refused, 1)]
    records = {r["session"]: r for r in score_sessions(run, sessions)}
    flagged = records["refused"]
    assert flagged["verdict"] == "anomalous"
    assert flagged["unknown"] >= 1  # ECONNREFUSED never happened in training
    assert any(t["event"] == "connect:ECONNREFUSED" for t in flagged["top"])
    assert flagged["score"] > max(records[s.session]["score"] for s in normal[4:])


def test_a_window_as_long_as_the_session_changes_nothing(trained: tuple[Path, dict]) -> None:
    # Windowed scoring starts each prediction from a zero state over the last h inputs; a
    # window that reaches back to <s> is the whole session: the same surprises and ranks.
    run = load_events(trained[0])
    seqs = [run.vocab.encode_events(s.events)[0] for s in generate_sessions(5, seed=12)]
    whole = event_surprises(run.model, seqs, batch_size=2)
    longest = max(len(s) for s in seqs)
    for h in (longest + 1, longest + 7):
        for (s1, r1), (s2, r2) in zip(whole, event_surprises(run.model, seqs, 2, h), strict=True):
            np.testing.assert_allclose(s1, s2, atol=1e-5)
            np.testing.assert_array_equal(r1, r2)
    # A window of 2: prediction t sees only inputs t-1 and t, from a zero state.
    seq = seqs[0]
    x, y = np.r_[2, seq], np.r_[seq, EOS_ID]  # <s> e_1 … e_n and e_1 … e_n </s>
    ((short, rank),) = event_surprises(run.model, [seq], 1, 2)
    for t in range(len(x)):
        with torch.no_grad():
            logits = run.model(torch.from_numpy(x[max(0, t - 1) : t + 1])[None]).logits[0, -1]
        log_probs = torch.log_softmax(logits.double(), -1)
        assert short[t] == pytest.approx(-log_probs[y[t]].item(), abs=1e-5)
        assert rank[t] == int((log_probs > log_probs[y[t]]).sum())


def test_summary_shows_every_score_and_what_validation_can_show(
    trained: tuple[Path, dict],
) -> None:
    run_dir, summary = trained
    fpr = summary["validation_fpr"]
    assert fpr["sessions"] == 300 and fpr["resolved"]  # 300 clean sessions show 5 %
    lo, hi = fpr["interval95"]
    assert lo <= fpr["false_positives"] / 300 <= hi
    assert "note" not in summary
    for model in ("rnn", "ngram"):
        assert set(summary["detection"][model]) == set(SCORES)
        for m in summary["detection"][model].values():
            assert m["tp"] + m["fn"] == 20 and m["fp"] + m["tn"] == 300
    worst = summary["worst_sessions"]
    assert len(worst) == 5 and worst[0]["score"] >= worst[-1]["score"]
    assert all(w["top"] and w["label"] in (0, 1) for w in worst)
    # Each is named by its id, its events as read (an unknown one by its own name, as
    # `rnnkit score` shows it, never <unk>).
    sessions = {s.session: s for s in read_sessions(run_dir.parent / "valid.jsonl")}
    unknown = 0
    for w in worst:
        read = sessions[w["session"]]
        assert (read.label, len(read.events)) == (w["label"], w["events"])
        for item in w["top"]:
            if item["position"] < len(read.events):
                assert item["event"] == read.events[item["position"]] != "<unk>"
                unknown += bool(item.get("unknown"))
    assert unknown  # the never-seen events of the anomalous sessions are among them
    # Every score of a scored session is there, and the combined one is within its bounds.
    run = load_events(run_dir)
    (record,) = score_sessions(run, generate_sessions(1, seed=13), score="combined")
    assert set(record["scores"]) == set(SCORES)
    parts = {n: [record["scores"][n]] for n in COMBINED_PARTS}
    expected = combined_scores(run.calibration["rnn"].parts, parts)[0]  # type: ignore[index]
    assert record["scores"]["combined"] == pytest.approx(expected) and expected >= 0
    assert record["scores"]["end"] == pytest.approx(
        event_surprises(
            run.model, [run.vocab.encode_events(generate_sessions(1, seed=13)[0].events)[0]]
        )[0][0][-1]
    )


def test_few_validation_sessions_say_so(tmp_path: Path) -> None:
    train_path, valid_path = tmp_path / "train.jsonl", tmp_path / "valid.jsonl"
    write_sessions(train_path, generate_sessions(60, seed=1))
    write_sessions(valid_path, generate_sessions(48, seed=2, prefix="v"))
    cfg = _config(tmp_path, train_path, valid_path, epochs=1, hidden=8, embedding=4,
                  target_fpr=0.01, threshold_method="gpd")  # fmt: skip
    summary = train(cfg, quiet=True)
    assert not summary["validation_fpr"]["resolved"]
    assert summary["validation_fpr"]["resolvable"] == pytest.approx(0.074, abs=1e-3)
    assert (
        "48 normal validation sessions cannot show a false-positive rate of 0.01"
        in (summary["note"])
    )
    assert "368" in summary["note"]
    thresholds = json.loads((tmp_path / "run" / "thresholds.json").read_text())
    assert thresholds["method"] == "gpd" and thresholds["version"] == 2
    assert set(thresholds["how"]["rnn"]) == set(SCORES)


def test_the_note_of_a_run_that_switched_to_the_tail_fit_does_not_suggest_it(tmp_path):
    """Fewer than 30 normal validation sessions switch the default quantile to gpd by
    themselves: the note then only asks for more sessions."""
    train_path, valid_path = tmp_path / "train.jsonl", tmp_path / "valid.jsonl"
    write_sessions(train_path, generate_sessions(60, seed=1))
    write_sessions(valid_path, generate_sessions(20, seed=2, prefix="v"))
    cfg = _config(tmp_path, train_path, valid_path, epochs=1, hidden=8, embedding=4,
                  target_fpr=0.01)  # fmt: skip
    summary = train(cfg, quiet=True)
    assert summary["thresholds"]["method"] == "gpd"
    assert summary["note"].startswith("20 normal validation sessions cannot show")
    assert summary["note"].endswith("validate on at least 368 normal sessions")


def test_a_top_g_that_covers_every_symbol_is_said_to_never_fire(tmp_path, capsys):
    """DeepLog's g carried over to a smaller vocabulary: every rank is below g, so the
    count score is 0 for every session. Training says so (a warning: the run is kept)."""
    train_path = tmp_path / "train.jsonl"
    write_sessions(train_path, generate_sessions(40, seed=1))
    cfg = _config(tmp_path, train_path, None, epochs=1, hidden=8, embedding=4, top_g=50)
    train(cfg, quiet=True)
    size = len(load_events(tmp_path / "run").vocab)
    assert size < 50
    err = capsys.readouterr().err
    assert f"--top-g 50 is at least the {size} symbols the model ranks" in err
    assert f"pass a --top-g below {size}" in err
    (record,) = score_sessions(
        load_events(tmp_path / "run"), generate_sessions(1, seed=13, anomalies=1)
    )
    assert record["scores"]["count"] == 0
    capsys.readouterr()
    train(
        _config(tmp_path / "b", train_path, None, epochs=1, hidden=8, embedding=4, top_g=size - 1),
        quiet=True,
    )
    assert "--top-g" not in capsys.readouterr().err


def test_sessions_cut_by_max_len_are_said_to_be(tmp_path, capsys):
    """A session longer than --max-len trains as pieces, each from a zero state, while
    scoring reads it whole: that was silent (a task whose sessions were cut at 16 events
    fell from AUC 0.998 to 0.508). Training says how many, and what --max-len keeps them."""
    train_path, valid_path = tmp_path / "train.jsonl", tmp_path / "valid.jsonl"
    sessions = generate_sessions(40, seed=1)
    write_sessions(train_path, sessions)
    write_sessions(valid_path, generate_sessions(10, seed=2, prefix="v"))
    longest = max(len(s.events) for s in sessions)
    over = sum(len(s.events) + 1 > 16 for s in sessions)
    assert 0 < over < len(sessions)
    small = dict(epochs=1, hidden=8, embedding=4)
    train(_config(tmp_path, train_path, valid_path, max_len=16, **small), quiet=True)
    err = capsys.readouterr().err
    assert (
        f"{over} of {len(sessions)} sessions are longer than --max-len 16 steps (the "
        f"longest: {longest} events, {longest + 1} steps with <s>)"
    ) in err
    assert f"give --max-len {longest + 1} to train on every session whole" in err
    cfg = _config(tmp_path, train_path, valid_path, max_len=longest + 1, **small)
    train(cfg, quiet=True, overwrite=True)
    assert "longer than --max-len" not in capsys.readouterr().err


@pytest.mark.parametrize(("order", "bucket"), [(None, False), ("length", True)])
def test_sessions_train_in_random_batches_unless_asked(tmp_path, monkeypatch, order, bucket):
    """By default each batch is a random sample of the sessions: length-sorted batches
    (the batcher's bucketing) were each one workflow where the length tells the workflow,
    and trained worse than a shuffled DataLoader (0.254 against 0.237 nats/event)."""
    import importlib

    # the module (the package's own name ``train`` is the function)
    events_train = importlib.import_module("rnnkit.app.tasks.events.train")
    made = []
    batcher = events_train.SequenceBatcher

    def spy(*args, **kwargs):
        made.append(kwargs.get("bucket", True))
        return batcher(*args, **kwargs)

    monkeypatch.setattr(events_train, "SequenceBatcher", spy)
    train_path, valid_path = tmp_path / "train.jsonl", tmp_path / "valid.jsonl"
    write_sessions(train_path, generate_sessions(40, seed=1))
    write_sessions(valid_path, generate_sessions(10, seed=2, prefix="v"))
    options = {} if order is None else {"batch_order": order}
    cfg = TrainConfig.for_task(
        "events", train=str(train_path), valid=str(valid_path), out=str(tmp_path / "run"),
        hidden=8, embedding=4, epochs=1, **options,
    )  # fmt: skip
    train(cfg, quiet=True)
    assert made == [bucket]
    saved = json.loads((tmp_path / "run" / "config.json").read_text())["config"]
    assert saved["batch_order"] == ("random" if order is None else order)
