"""``rnnkit predict``: every task on tiny trained runs, each answer checked against the
model run directly (its own forward pass, its unbatched decoder, or ``rnnkit score``), one
JSON line per input line, streaming from a pipe, and bad input as one line."""

from __future__ import annotations

import io
import json
import math
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from rnnkit.app.cli.main import main
from rnnkit.app.tasks.classify import load_classifier
from rnnkit.app.tasks.lm import load_lm
from rnnkit.app.tasks.seq2seq import transduce
from rnnkit.app.tasks.tag import encode_tagged, load_tagger, word_key
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
from rnnkit.data.tagged import TaggedSentence
from rnnkit.data.vocab import BOS_ID, EOS_ID

SRC = str(Path(__file__).resolve().parents[3] / "src")
TINY = ["--hidden", "8", "--embedding", "8", "--batch-size", "8", "--quiet", "--no-report"]


@pytest.fixture(autouse=True, scope="module")
def _one_thread(single_thread):
    yield


def predict(run_cli, run: Path, path: Path, *extra: str) -> list[dict]:
    code, out, err = run_cli("predict", "--checkpoint", str(run), "--input", str(path), *extra)
    assert code == 0, err
    return [json.loads(line) for line in out.splitlines()]


def one_line_error(code, err, *words):
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    for word in words:
        assert word in lines[0], lines[0]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """One tiny trained run per task (a few steps: the answers are checked against the
    same model, not for quality)."""
    d = tmp_path_factory.mktemp("predict")
    source = stdlib_files(["json"])[1].read_text(encoding="utf-8")
    write_token_tags(python_token_sentences(source, max_tokens=12)[:32], d / "tags.tsv")
    write_labelled(majority_letter_examples(48, seed=0), d / "labelled.tsv")
    write_pairs(d / "pairs.tsv", generate_pairs("reverse", 48, seed=0, max_len=5))
    (d / "text.txt").write_text("abc abd\nbca cab\n" * 30, encoding="utf-8")
    write_sessions(d / "sessions.jsonl", generate_sessions(80, anomalies=0, seed=1))
    write_sessions(d / "sessions_valid.jsonl", generate_sessions(40, anomalies=4, seed=2))
    tasks = {
        "tag": ["--task", "tag", "--train", str(d / "tags.tsv"), "--char-rnn"],
        "classify": ["--task", "classify", "--train", str(d / "labelled.tsv")],
        "seq2seq": ["--task", "seq2seq", "--train", str(d / "pairs.tsv"), "--beam", "2"],
        "lm": ["--task", "lm", "--train", str(d / "text.txt"), "--bptt", "full"],
        "lm_stream": ["--task", "lm", "--train", str(d / "text.txt"), "--bptt", "segment:8"],
        "lm_words": [
            "--task", "lm", "--train", str(d / "text.txt"), "--unit", "word",
            "--bptt", "segment:4", "--batch-size", "4",
        ],
        "events": [
            "--task", "events", "--train", str(d / "sessions.jsonl"),
            "--valid", str(d / "sessions_valid.jsonl"), "--bptt", "full",
        ],
    }  # fmt: skip
    out = {}
    for name, argv in tasks.items():
        out[name] = d / name
        assert main(["train", *argv, "--out", str(out[name]), "--steps", "3", *TINY]) == 0
    out["data"] = d
    return out


def _argmax_tags(data, model, tokens: list[str]) -> list[str]:
    """The oracle: the tagger's argmax tag of each token, the sentence alone."""
    enc = encode_tagged([TaggedSentence(tokens, [""] * len(tokens))], data)
    words = torch.from_numpy(enc.words[0])[None]
    chars = torch.from_numpy(enc.chars[0])[None]
    with torch.no_grad():
        best = model(words, torch.ones_like(words, dtype=torch.bool), chars).argmax(-1)[0]
    return [data.tags.labels[i] for i in best.tolist()]


def test_tag_gives_the_argmax_tag_of_every_token(runs, run_cli, tmp_path):
    lines = ["def f ( x ) :", "", "return zzunknownzz"]
    path = tmp_path / "in.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    got = predict(run_cli, runs["tag"], path, "--batch-size", "2")
    assert len(got) == len(lines)
    _, data, model = load_tagger(runs["tag"])
    for line, record in zip(lines, got, strict=True):
        tokens = line.split()
        assert record["tokens"] == tokens
        assert record["unknown"] == sum(word_key(t) not in data.vocab.stoi for t in tokens)
        if not tokens:
            assert record["tags"] == []
            continue
        assert record["tags"] == _argmax_tags(data, model, tokens)


def test_tag_reads_tab_separated_tokens_which_may_hold_spaces(runs, run_cli, tmp_path):
    """A token with a space (a token<TAB>tag file may hold ``' '`` or ``"a b"``, as the
    tutorial's does) could not be given: every line was split on whitespace. A line with
    a tab is split on tabs; the tags are those of the same tokens given from Python."""
    lines = ["print\t(\t'a b'\t)", "x = 1", "a\t' ' \t b"]
    path = tmp_path / "in.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    got = predict(run_cli, runs["tag"], path)
    # each tab-separated token without the spaces around it, as a token<TAB>tag file reads
    want = [["print", "(", "'a b'", ")"], ["x", "=", "1"], ["a", "' '", "b"]]
    assert [r["tokens"] for r in got] == want
    import rnnkit

    run = rnnkit.load(runs["tag"])
    assert run.predict(lines) == [r["tags"] for r in got]  # as Python
    assert run.predict([line + "\r\n" for line in lines]) == [r["tags"] for r in got]
    _, data, model = load_tagger(runs["tag"])
    for tokens, record in zip(want, got, strict=True):
        assert record["tags"] == _argmax_tags(data, model, tokens)
    for bad in ("x\t\ty", "x\t \ty"):
        path.write_text(f"a b\n{bad}\n", encoding="utf-8")
        code, _, err = run_cli("predict", "--checkpoint", str(runs["tag"]), "--input", str(path))
        one_line_error(code, err, f"{path}:2", "token 2 of 3 is empty")


def test_classify_gives_softmax_probabilities_and_their_argmax(runs, run_cli, tmp_path):
    texts = ["aab", "bbbbba", "c", "abcabcabc"]
    path = tmp_path / "in.txt"
    path.write_text("\n".join(texts) + "\n", encoding="utf-8")
    got = predict(run_cli, runs["classify"], path, "--batch-size", "3")
    _, vocab, labels, model = load_classifier(runs["classify"])
    for text, record in zip(texts, got, strict=True):
        ids = torch.tensor([vocab.encode(text)])
        with torch.no_grad():
            probs = F.softmax(model(ids), dim=-1)[0].double()
        want = dict(zip(labels.labels, probs.tolist(), strict=True))
        assert record["probabilities"] == pytest.approx(want, abs=1e-6)
        assert sum(record["probabilities"].values()) == pytest.approx(1.0)
        assert record["label"] == labels.labels[int(probs.argmax())]
    assert len(got) == len(texts)


def test_seq2seq_batched_beam_equals_one_source_at_a_time(runs, run_cli, tmp_path):
    sources = ["abc", "dcbae", "a", "bb", "edcba"]
    path = tmp_path / "in.txt"
    path.write_text("\n".join(sources) + "\n", encoding="utf-8")
    got = predict(run_cli, runs["seq2seq"], path, "--batch-size", "4")
    assert [r["input"] for r in got] == sources
    for source, record in zip(sources, got, strict=True):
        assert record["output"] == transduce(runs["seq2seq"], source)  # the run's beam 2
    greedy = predict(run_cli, runs["seq2seq"], path, "--beam", "1", "--max-len", "3")
    for source, record in zip(sources, greedy, strict=True):
        assert record["output"] == transduce(runs["seq2seq"], source, beam=1, max_length=3)


@pytest.mark.parametrize("name", ["lm", "lm_stream"])
def test_lm_logprobs_equal_the_teacher_forced_forward_pass(runs, run_cli, tmp_path, name):
    texts = ["abc abd", "cab", "zz"]
    path = tmp_path / "in.txt"
    path.write_text("\n".join(texts) + "\n", encoding="utf-8")
    got = predict(run_cli, runs[name], path, "--batch-size", "2")
    _, vocab, model = load_lm(runs[name])
    # only a stream holds the newline; lines read as sequences never do
    assert ("\n" in vocab) == (name == "lm_stream")
    newline = vocab.stoi.get("\n")
    for text, record in zip(texts, got, strict=True):
        ids = vocab.encode(text)
        if name == "lm":  # sequences: <s> text </s>
            inputs, targets = [BOS_ID, *ids], [*ids, EOS_ID]
        else:  # a char stream: the line follows a newline and ends with one
            inputs, targets = [newline, *ids], [*ids, newline]
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([inputs])).logits[0], dim=-1)
        want = logp.gather(1, torch.tensor(targets).view(-1, 1)).view(-1).double()
        assert record["logprobs"] == pytest.approx(want.tolist(), abs=1e-5)
        assert record["surprise"] == pytest.approx((-want / math.log(2)).tolist(), abs=1e-5)
        assert record["nats"] == pytest.approx(float(-want.sum()), abs=1e-5)
        assert len(record["tokens"]) == len(targets)
    assert got[2]["unknown"] == 2  # "z" was never seen


def test_a_blank_line_of_a_word_stream_is_answered_with_no_token(runs, run_cli, tmp_path):
    """A word model read as a stream (no line-end token) finds no token in a blank line:
    its answer is empty, and the lines around it are scored as alone (a blank line in
    the batch was an IndexError)."""
    texts = ["abc abd", "", "   ", "cab"]
    path = tmp_path / "in.txt"
    path.write_text("\n".join(texts) + "\n", encoding="utf-8")
    got = predict(run_cli, runs["lm_words"], path, "--batch-size", "4")
    for blank in got[1:3]:
        assert blank["tokens"] == blank["logprobs"] == blank["surprise"] == []
        assert blank["nats"] == 0
    alone = tmp_path / "alone.txt"
    for text, record in zip(texts[::3], got[::3], strict=True):
        alone.write_text(text + "\n", encoding="utf-8")
        (want,) = predict(run_cli, runs["lm_words"], alone)
        assert record["tokens"] == want["tokens"] == text.split()
        assert record["logprobs"] == pytest.approx(want["logprobs"], abs=1e-6)


def test_events_answers_are_the_score_records(runs, capsys, run_cli):
    sessions = runs["data"] / "sessions_valid.jsonl"
    got = predict(run_cli, runs["events"], sessions)
    code, out, err = run_cli(
        "score", "--checkpoint", str(runs["events"]), "--data", str(sessions), "--quiet"
    )
    assert code == 0, err
    assert got == [json.loads(line) for line in out.splitlines()]
    assert len(got) == len(sessions.read_text().splitlines())


def test_stdin_is_answered_line_by_line_as_it_arrives(runs):
    """A pipe gets each answer before the next line is written (batch size 8 does not make
    it wait for 8 lines)."""
    env = {**os.environ, "PYTHONPATH": SRC, "RNNKIT_NATIVE": "0"}
    argv = [sys.executable, "-m", "rnnkit", "predict", "--checkpoint", str(runs["classify"]),
            "--input", "-", "--batch-size", "8"]  # fmt: skip
    with subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    ) as proc:
        watchdog = threading.Timer(120, proc.kill)  # a process that waits fails, never hangs
        watchdog.start()
        try:
            answers = []
            for text in ("aab", "bba", "abab"):
                proc.stdin.write(text + "\n")
                proc.stdin.flush()
                answers.append(json.loads(proc.stdout.readline()))  # blocks until answered
            proc.stdin.close()
            assert proc.stdout.read() == ""
            assert proc.wait(timeout=120) == 0, proc.stderr.read()
        finally:
            watchdog.cancel()
            if proc.poll() is None:
                proc.kill()
    assert [set(a) for a in answers] == [{"label", "probabilities", "tokens", "unknown"}] * 3


def test_bad_input_is_one_line_naming_file_and_line(runs, run_cli, tmp_path):
    path = tmp_path / "in.txt"
    path.write_text("aab\n\nbb\n", encoding="utf-8")
    code, out, err = run_cli("predict", "--checkpoint", str(runs["classify"]), "--input", str(path),
        "--batch-size", "1",
    )  # fmt: skip
    one_line_error(code, err, f"{path}:2", "empty text")
    assert len(out.splitlines()) == 1  # the answer before the bad line stands
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"ab\n\xff\xfe\n")
    code, _, err = run_cli("predict", "--checkpoint", str(runs["classify"]), "--input", str(bad))
    one_line_error(code, err, f"{bad}:2: invalid UTF-8 at byte 1 of the line (byte 0xff)")
    session = tmp_path / "s.jsonl"
    session.write_text('{"session": "a", "events": ["x"]}\n{"session": 3}\n', encoding="utf-8")
    code, _, err = run_cli("predict", "--checkpoint", str(runs["events"]), "--input", str(session))
    one_line_error(code, err, f"{session}:2")
    code, _, err = run_cli(
        "predict", "--checkpoint", str(runs["tag"]), "--input", str(path), "--beam", "2"
    )
    one_line_error(code, err, "--beam does not apply to a checkpoint of --task tag")
    code, _, err = run_cli("predict", "--checkpoint", str(tmp_path / "none"), "--input", str(path))
    assert code == 2 and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("task", "training"), [("classify", "labelled.tsv"), ("seq2seq", "pairs.tsv")]
)
def test_a_training_file_given_to_predict_is_refused_at_its_first_tab(
    runs, run_cli, task, training
):
    # no text or source a run trained on holds a tab: the label or target would be read
    # as text and answered in silence
    path = runs["data"] / training
    code, out, err = run_cli("predict", "--checkpoint", str(runs[task]), "--input", str(path))
    one_line_error(code, err, f"{path}:1: holds a tab", "is read by evaluate")
    assert out == ""


@pytest.mark.parametrize(
    "name, good, bad, key",
    [
        ("classify", "aab", "", "label"),
        ("seq2seq", "abc", "", "output"),
        ("events", '{"session": "a", "events": ["x"]}', '{"session": 3}', "verdict"),
    ],
)
def test_the_lines_before_a_bad_one_are_answered_in_its_batch_too(
    runs, run_cli, tmp_path, name, good, bad, key
):
    # One batch holds every line: the bad fifth line failed the batch, and the four
    # answers before it were lost with it.
    path = tmp_path / "in.txt"
    path.write_text("\n".join([good] * 4 + [bad] + [good] * 2) + "\n", encoding="utf-8")
    code, out, err = run_cli("predict", "--checkpoint", str(runs[name]), "--input", str(path))
    one_line_error(code, err, f"{path}:5")
    answers = [json.loads(line) for line in out.splitlines()]
    assert len(answers) == 4
    alone = tmp_path / "good.txt"
    alone.write_text(f"{good}\n", encoding="utf-8")
    # (the same answer: to rounding, as batches of other sizes give)
    assert answers[0][key] == predict(run_cli, runs[name], alone)[0][key]


@pytest.mark.parametrize("bad", [b"caf\xe9", b"a" * 1_048_577], ids=["latin-1", "too-long"])
def test_the_lines_before_one_that_cannot_be_read_are_answered_in_its_batch_too(
    runs, run_cli, tmp_path, bad
):
    # A line not UTF-8 (or over the limit) in the batch of the lines before it: the error
    # alone, their answers lost, where a line that reads but is bad is answered after them.
    path = tmp_path / "in.txt"
    path.write_bytes(b"abc\n" * 3 + bad + b"\nabc\n")
    code, out, err = run_cli("predict", "--checkpoint", str(runs["seq2seq"]), "--input", str(path))
    one_line_error(code, err, f"{path}:4")
    assert [json.loads(line)["input"] for line in out.splitlines()] == ["abc"] * 3


@pytest.mark.parametrize("source", ["file", "stdin"])
def test_invalid_utf8_after_8_kb_names_its_own_line(runs, run_cli, tmp_path, monkeypatch, source):
    # A text stream decoded 8 KB ahead: the bad byte of line 1,501 was reported at 1,261.
    data = "\ufeffaab\r\n".encode() + b"ab\r\n" * 1499 + b"ba\xffb\r\n" + b"ab\r\n"
    path = tmp_path / "in.txt"
    path.write_bytes(data)
    if source == "stdin":
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    name = str(path) if source == "file" else "<stdin>"
    code, out, err = run_cli(
        "predict", "--checkpoint", str(runs["classify"]), "--input", name if source == "file"
        else "-", "--batch-size", "500",
    )  # fmt: skip
    one_line_error(code, err, f"{name}:1501: invalid UTF-8 at byte 3 of the line (byte 0xff)")
    answers = [json.loads(line) for line in out.splitlines()]
    assert len(answers) == 1500  # the three batches before the bad line's stand
    # the byte-order mark is not part of the first text, and CRLF is a line end
    clean = tmp_path / "clean.txt"
    clean.write_text("aab\nab\n", encoding="utf-8")
    assert answers[:2] == predict(run_cli, runs["classify"], clean)
    assert answers[0]["tokens"] == 3 and answers[0]["unknown"] == 0


@pytest.mark.parametrize(("name", "limit"), [("classify", "1,048,576"), ("events", "10,485,760")])
def test_an_endless_line_is_refused_after_one_bounded_read(runs, run_cli, name, limit):
    # /dev/zero is one line without end: read whole, it grew to gigabytes.
    code, out, err = run_cli("predict", "--checkpoint", str(runs[name]), "--input", "/dev/zero")
    one_line_error(code, err, "/dev/zero:1", "line too long", limit)
    assert out == ""


def test_a_long_line_is_refused_by_the_environment_limit(runs, run_cli, tmp_path, monkeypatch):
    path = tmp_path / "in.txt"
    path.write_text("ab\n" + "a" * 11 + "\nab\n", encoding="utf-8")
    monkeypatch.setenv("RNNKIT_MAX_LINE_CHARS", "10")
    code, out, err = run_cli("predict", "--checkpoint", str(runs["classify"]), "--input", str(path),
        "--batch-size", "1",
    )  # fmt: skip
    one_line_error(code, err, f"{path}:2", "line too long", "RNNKIT_MAX_LINE_CHARS")
    assert len(out.splitlines()) == 1
    path.write_text("ab\n" + "a" * 10 + "\n", encoding="utf-8")  # exactly the limit
    assert len(predict(run_cli, runs["classify"], path)) == 2


def test_regress_input_is_bounded_and_refuses_values_beyond_float32(run_cli, tmp_path):
    data = tmp_path / "r.jsonl"
    data.write_text("".join(json.dumps({"seq": [[i], [i + 1], [i + 2]]}) + "\n" for i in range(8)))
    run = tmp_path / "run"
    assert main(["train", "--task", "regress", "--train", str(data), "--out", str(run),
                 "--steps", "2", "--hidden", "8", "--batch-size", "4", "--quiet", "--no-report",
                 ]) == 0  # fmt: skip
    code, _, err = run_cli("predict", "--checkpoint", str(run), "--input", "/dev/zero")
    one_line_error(code, err, "/dev/zero:1", "line too long")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"seq": [[1], [2]]}\n{"seq": [[1], [1%s]]}\n' % ("0" * 400))
    code, out, err = run_cli("predict", "--checkpoint", str(run), "--input", str(bad),
        "--batch-size", "1",
    )  # fmt: skip
    one_line_error(code, err, f"{bad}:2", "out of float32's range")
    assert len(out.splitlines()) == 1


def test_a_missing_or_empty_input_is_one_line_in_rnnkits_words(runs, run_cli, tmp_path):
    """A missing ``--input`` was Python's ``[Errno 2] No such file or directory: 'x'``; an
    empty one the same about ``''``."""
    missing = tmp_path / "absent.txt"
    code, out, err = run_cli("predict", "--checkpoint", str(runs["lm"]), "--input", str(missing))
    assert (code, out) == (2, "")
    assert err == f"rnnkit predict: error: {missing}: file not found\n"
    code, out, err = run_cli("predict", "--checkpoint", str(runs["lm"]), "--input", "")
    assert (code, out) == (2, "")
    assert err == "rnnkit predict: error: --input is empty: name a file, or - for standard input\n"
    code, _, err = run_cli("predict", "--checkpoint", "", "--input", str(missing))
    assert err == "rnnkit predict: error: --checkpoint is an empty path: name a run directory\n"
    code, _, err = run_cli("predict", "--checkpoint", str(tmp_path), "--input", str(missing))
    assert err == (
        f"rnnkit predict: error: {tmp_path / 'config.json'}: missing: {tmp_path} is not a run "
        "directory written by rnnkit train\n"
    )


def test_max_len_out_of_range_is_named_as_typed(runs, run_cli, tmp_path):
    """``--max-len 0`` was refused as ``--max-length must be ≥ 1``: the older spelling,
    which the user had not typed; so was ``--max-len`` given to another task."""
    path = tmp_path / "in.txt"
    path.write_text("ab\n", encoding="utf-8")
    code, _, err = run_cli(
        "predict", "--checkpoint", str(runs["seq2seq"]), "--input", str(path), "--max-len", "0"
    )
    assert (code, err) == (2, "rnnkit predict: error: --max-len must be ≥ 1, got 0\n")
    code, _, err = run_cli(
        "predict", "--checkpoint", str(runs["classify"]), "--input", str(path), "--max-len", "3"
    )
    assert err == (
        "rnnkit predict: error: --max-len does not apply to a checkpoint of --task classify "
        "(only to seq2seq)\n"
    )


def test_generate_on_a_run_it_does_not_apply_to_is_one_line(runs, run_cli):
    """generate on an events run (and a classifier's): one line naming the task, in words
    that read right whatever the task's name."""
    for task in ("events", "classify"):
        code, _, err = run_cli("generate", "--checkpoint", str(runs[task]))
        one_line_error(code, err, f"generate does not apply to a checkpoint of --task {task}")


def test_a_source_longer_than_training_allowed_is_answered_with_one_warning(
    runs, run_cli, tmp_path
):
    """Training refuses a source over --max-len; predict and evaluate answered one
    (400 characters against 256) in silence, a guess out of anything the model saw."""
    max_len = json.loads((runs["seq2seq"] / "config.json").read_text())["config"]["max_len"]
    long = "ab" * (max_len // 2 + 1)
    path = tmp_path / "in.txt"
    path.write_text(f"abc\n{long}\n{long}\n", encoding="utf-8")
    code, out, err = run_cli("predict", "--checkpoint", str(runs["seq2seq"]), "--input", str(path))
    assert code == 0 and len(out.splitlines()) == 3
    assert err.strip() == (
        f"rnnkit: warning: {path}:2: the source has {len(long)} tokens, more than the "
        f"--max-len {max_len} the model trained with (it never saw such a length): its "
        "answer is likely wrong"
    )
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text(f"abc\tcba\n{long}\tx\n{long}\tx\n", encoding="utf-8")
    code, out, err = run_cli("evaluate", "--checkpoint", str(runs["seq2seq"]), "--data", str(pairs))
    assert code == 0 and err.strip().endswith(
        "its decoding is likely wrong; 1 more source(s) of this file are longer too"
    ), err
    for extra in ([], ["--num", "2"]):  # generate: one answer, or the best few
        code, out, err = run_cli(
            "generate", "--checkpoint", str(runs["seq2seq"]), "--input", long, *extra
        )
        assert (
            code == 0
            and out
            and err.strip()
            == (
                f"rnnkit: warning: --input: the source has {len(long)} tokens, more than the "
                f"--max-len {max_len} the model trained with (it never saw such a length): its "
                "answer is likely wrong"
            )
        ), err


def test_evaluate_scores_the_beam_asked_for(runs, run_cli, tmp_path):
    """evaluate decoded with the run's --beam only: comparing greedy and beam search on a
    test file meant retraining, or scoring predict's answers by hand. --beam N scores the
    decoding of that width, the exact match of predict --beam N's answers."""
    pairs = [("abc", "cba"), ("aab", "baa"), ("bca", "acb"), ("ab", "ba")]
    data = tmp_path / "pairs.tsv"
    data.write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
    sources = tmp_path / "src.txt"
    sources.write_text("".join(f"{s}\n" for s, _ in pairs), encoding="utf-8")
    for beam in ("1", "3"):
        code, out, err = run_cli("evaluate", "--checkpoint", str(runs["seq2seq"]), "--data",
                                 str(data), "--beam", beam, "--json")  # fmt: skip
        assert code == 0, err
        metrics = json.loads(out)
        answers = predict(run_cli, runs["seq2seq"], sources, "--beam", beam)
        hits = sum(a["output"] == t for a, (_, t) in zip(answers, pairs, strict=True))
        assert metrics["beam"] == int(beam) and metrics["exact_match"] == hits / len(pairs)
    code, _, err = run_cli("evaluate", "--checkpoint", str(runs["classify"]), "--data",
                           str(data), "--beam", "2")  # fmt: skip
    one_line_error(code, err, "--beam does not apply to a checkpoint of --task classify")
