"""Tamper with every file of a trained run of every task: the weights, the vocabularies
and labels, and each task's auxiliary files (``baseline.safetensors``,
``ngram.safetensors``, ``calibration.safetensors``, ``valid_scores.safetensors``,
``thresholds.json``). Each is covered by ``manifest.json``: a reader refuses the changed
run in one line naming the file. With ``--skip-checksums`` the readers' own checks are
all that is left: a result or one line, never a traceback.

Garbling 32 bytes of ``baseline.safetensors`` moved the bag-of-n-grams accuracy
0.625 → 0.57, of ``ngram.safetensors`` the 5-gram's nats/token 0.735 → 0.829, and
``score --target-fpr`` picked its threshold from garbled scores: all were accepted.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path

import pytest
from fuzzkit import FUZZ, Hang, time_limit
from hypothesis import given
from hypothesis import strategies as st

from rnnkit.app.cli.main import main
from rnnkit.data.events import write_sessions
from rnnkit.data.generated import (
    majority_letter_examples,
    python_token_sentences,
    stdlib_files,
    write_labelled,
    write_token_tags,
)
from rnnkit.data.generated_pairs import generate_pairs, write_pairs
from rnnkit.data.generated_sessions import generate_sessions

TINY = ["--hidden", "8", "--batch-size", "8", "--quiet", "--no-report", "--steps", "3"]
TASKS = ("lm", "events", "classify", "tag", "seq2seq", "regress")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, list[str]]]:
    """A tiny trained run of each task, with the command that reads it back."""
    d = tmp_path_factory.mktemp("aux")
    source = stdlib_files(["json"])[1].read_text(encoding="utf-8")
    write_token_tags(python_token_sentences(source, max_tokens=12)[:32], d / "tags.tsv")
    write_labelled(majority_letter_examples(48, seed=0), d / "labelled.tsv")
    write_pairs(d / "pairs.tsv", generate_pairs("reverse", 48, seed=0, max_len=5))
    (d / "text.txt").write_text("abc abd\nbca cab\n" * 30, encoding="utf-8")
    write_sessions(d / "sessions.jsonl", generate_sessions(60, anomalies=0, seed=1))
    write_sessions(d / "valid.jsonl", generate_sessions(30, anomalies=4, seed=2))
    (d / "r.jsonl").write_text(
        "".join(json.dumps({"seq": [[i], [i + 1], [i + 2]]}) + "\n" for i in range(12))
    )
    emb = ["--embedding", "8"]
    train = {
        "lm": ["--train", str(d / "text.txt"), "--ngram-order", "3", *emb],
        "events": ["--train", str(d / "sessions.jsonl"), "--valid", str(d / "valid.jsonl"),
                   "--bptt", "full", "--ngram-order", "3", *emb],
        "classify": ["--train", str(d / "labelled.tsv"), *emb],
        "tag": ["--train", str(d / "tags.tsv"), "--char-rnn", *emb],
        "seq2seq": ["--train", str(d / "pairs.tsv"), *emb],
        "regress": ["--train", str(d / "r.jsonl")],
    }  # fmt: skip
    data = {"lm": "text.txt", "events": "valid.jsonl", "classify": "labelled.tsv",
            "tag": "tags.tsv", "seq2seq": "pairs.tsv", "regress": "r.jsonl"}  # fmt: skip
    out = {}
    for task in TASKS:
        run = d / task
        assert main(["train", "--task", task, *train[task], "--out", str(run), *TINY]) == 0
        read = ["evaluate", "--checkpoint", str(run), "--data", str(d / data[task])]
        if task == "events":
            read = ["score", "--checkpoint", str(run), "--data", str(d / data[task]),
                    "--target-fpr", "0.1", "--quiet"]  # fmt: skip
        out[task] = (run, read)
    return out


def _covered(run: Path) -> list[str]:
    return sorted(json.loads((run / "manifest.json").read_text())["files"])


def _copy(runs, task: str, tmp_path: Path) -> tuple[Path, list[str]]:
    run, read = runs[task]
    copy = tmp_path / task
    if copy.exists():
        shutil.rmtree(copy)
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("snapshots", "metrics*"))
    return copy, [str(copy) if a == str(run) else a for a in read]


def _call(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    try:
        with time_limit(60):
            code = main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 2
    except Hang:
        pytest.fail(f"rnnkit {argv!r} hung")
    return code, capsys.readouterr().err


def _garble(path: Path, at: int, data: bytes) -> None:
    raw = bytearray(path.read_bytes())
    at = min(at, max(len(raw) - len(data), 0))
    raw[at : at + len(data)] = bytes(b ^ 0x5A for b in data) if data else b""
    path.write_bytes(bytes(raw))


def test_every_task_writes_a_manifest_of_its_auxiliary_files(runs) -> None:
    expected = {
        "lm": {"ngram.safetensors", "vocab.json"},
        "events": {"ngram.safetensors", "calibration.safetensors", "valid_scores.safetensors",
                   "thresholds.json", "vocab.json"},
        "classify": {"baseline.safetensors", "labels.json", "vocab.json"},
        "tag": {"baseline.safetensors", "labels.json", "vocab.json"},
        "seq2seq": {"source_vocab.json", "vocab.json"},
        "regress": set(),
    }  # fmt: skip
    for task, (run, _) in runs.items():
        files = set(_covered(run))
        assert {"config.json", "model.safetensors", "summary.json"} | expected[task] <= files
        assert not {"metrics.jsonl", "manifest.json"} & files


@pytest.mark.parametrize("task", TASKS)
def test_32_garbled_bytes_in_any_file_are_refused_naming_it(
    runs, task: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run, _ = runs[task]
    for name in _covered(run):
        copy, read = _copy(runs, task, tmp_path)
        path = copy / name
        _garble(path, path.stat().st_size // 2, b"\x00" * 32)
        code, err = _call(read, capsys)
        assert code == 2 and err.count("\n") == 1, (name, err)
        assert f"{name}: does not match its SHA-256 in manifest.json" in err, (name, err)
        code, err = _call([*read, "--skip-checksums"], capsys)
        assert "Traceback" not in err and (code == 0 or err.count("\n") == 1), (name, err)


@pytest.mark.parametrize("task", ["lm", "events"])
def test_a_run_without_manifest_needs_the_explicit_option(
    runs, task: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    copy, read = _copy(runs, task, tmp_path)
    (copy / "manifest.json").unlink()
    code, err = _call(read, capsys)
    assert code == 2 and "manifest.json: missing" in err and "--skip-checksums" in err
    code, err = _call([*read, "--skip-checksums"], capsys)
    assert code == 0, err


OPERATIONS = st.one_of(
    st.tuples(st.just("garble"), st.integers(0, 1 << 16), st.binary(min_size=1, max_size=64)),
    st.tuples(st.just("truncate"), st.integers(0, 1 << 16), st.just(b"")),
    st.tuples(st.just("append"), st.just(0), st.binary(min_size=1, max_size=64)),
    st.tuples(st.just("delete"), st.just(0), st.just(b"")),
)


@FUZZ
@given(task=st.sampled_from(TASKS), pick=st.integers(0, 100), operation=OPERATIONS)
def test_any_change_to_any_file_is_refused_and_with_skip_never_a_traceback(
    runs, tmp_path: Path, capsys: pytest.CaptureFixture[str], task, pick, operation
) -> None:
    copy, read = _copy(runs, task, tmp_path)
    names = [*_covered(copy), "manifest.json"]
    name = names[pick % len(names)]
    path = copy / name
    kind, at, data = operation
    before = path.read_bytes()
    if kind == "garble":
        _garble(path, at % max(len(before), 1), data)
    elif kind == "truncate":
        path.write_bytes(before[: at % max(len(before), 1)])
    elif kind == "append":
        path.write_bytes(before + data)
    else:
        path.unlink()
    changed = not path.exists() or path.read_bytes() != before
    if changed and name == "manifest.json" and path.exists():
        # White space around the same document vouches for the same files.
        with contextlib.suppress(ValueError):
            changed = json.loads(path.read_bytes()) != json.loads(before)
    code, err = _call(read, capsys)
    assert "Traceback" not in err, err
    if changed:
        assert code == 2 and err.count("\n") == 1, (name, kind, err)
        assert name in err or "manifest.json" in err, (name, err)
    code, err = _call([*read, "--skip-checksums"], capsys)
    assert "Traceback" not in err and (code == 0 or err.count("\n") == 1), (name, kind, err)
