"""``rnnkit.load(run_dir)`` for every task: the loaded object's predict/generate agree with
the command line's own paths (``evaluate``'s figures, ``generate``/``transduce``, the events
scorer) on tiny runs trained here."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

import rnnkit
from rnnkit.app.cli.main import main
from rnnkit.app.tasks.events import load_events, score_sessions
from rnnkit.app.tasks.seq2seq import transduce
from rnnkit.app.tasks.trained import TrainedRun
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
from rnnkit.data.labelled import read_labelled
from rnnkit.data.pairs import read_pairs
from rnnkit.data.tagged import read_tagged
from rnnkit.errors import ConfigError, DataError
from rnnkit.training.manifest import write_manifest

TINY = ["--hidden", "8", "--embedding", "8", "--batch-size", "8", "--quiet"]
VECTORS = TINY[:2] + TINY[4:]  # real-valued steps: no embedding


@pytest.fixture(autouse=True, scope="module")
def _one_thread(single_thread):
    yield


def _train(out: Path, task: str, train: Path, *extra: str, tiny: list[str] = TINY) -> Path:
    argv = ["train", "--task", task, "--train", str(train), "--out", str(out), *tiny, *extra]
    assert main(argv) == 0
    return out


def _evaluate(run: Path, data: Path, capsys) -> dict:
    capsys.readouterr()
    assert main(["evaluate", "--checkpoint", str(run), "--data", str(data), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_classify_predict_matches_evaluate(tmp_path, capsys):
    write_labelled(majority_letter_examples(48, seed=0), tmp_path / "train.tsv")
    write_labelled(majority_letter_examples(20, seed=1), tmp_path / "test.tsv")
    run_dir = _train(tmp_path / "run", "classify", tmp_path / "train.tsv", "--steps", "12")
    run = rnnkit.load(run_dir)
    assert isinstance(run, TrainedRun) and run.task == "classify"
    assert isinstance(run.model, rnnkit.models.Classifier) and not run.model.training
    examples = read_labelled(str(tmp_path / "test.tsv"))
    predicted = run.predict([e.text for e in examples], batch_size=7)  # padded batches
    assert set(predicted) <= set(run.labels.labels)
    accuracy = sum(p == e.label for p, e in zip(predicted, examples, strict=True)) / len(examples)
    assert accuracy == pytest.approx(_evaluate(run_dir, tmp_path / "test.tsv", capsys)["accuracy"])
    # One at a time (no padding): the same answers.
    assert [run.predict([e.text])[0] for e in examples[:5]] == predicted[:5]
    with pytest.raises(ConfigError, match=r"generate\(\) does not apply to a run of the classify"):
        run.generate("x")
    with pytest.raises(ConfigError, match="a list of inputs"):
        run.predict("abc")
    # a line of the training file: its label would be read as text, as by the command
    with pytest.raises(DataError, match=r"^input 1 holds a tab: a label<TAB>text line\?"):
        run.predict([examples[0].text, f"{examples[1].label}\t{examples[1].text}"])


def test_tag_predict_matches_evaluate(tmp_path, capsys):
    source = stdlib_files(["json"])[1].read_text(encoding="utf-8")
    sentences = python_token_sentences(source, scheme="types", max_tokens=12)
    write_token_tags(sentences[:32], tmp_path / "train.tsv")
    write_token_tags(sentences[32:44], tmp_path / "test.tsv")
    run_dir = _train(tmp_path / "run", "tag", tmp_path / "train.tsv", "--steps", "8", "--char-rnn")
    run = rnnkit.load(run_dir)
    assert run.extras["chars"] is not None
    gold, _ = read_tagged(str(tmp_path / "test.tsv"))
    predicted = run.predict([s.tokens for s in gold], batch_size=5)
    assert [len(p) for p in predicted] == [len(s.tokens) for s in gold]
    hits = [
        p == g
        for s, pred in zip(gold, predicted, strict=True)
        for p, g in zip(pred, s.tags, strict=True)
    ]
    accuracy = sum(hits) / len(hits)
    figures = _evaluate(run_dir, tmp_path / "test.tsv", capsys)
    assert figures["unknown_labels"] == 0
    assert accuracy == pytest.approx(figures["accuracy"])
    assert run.predict([" ".join(gold[0].tokens)]) == predicted[:1]  # a string is split


def test_tag_predict_answers_a_blank_sentence_as_the_command_line(tmp_path, capsys):
    """A blank or whitespace-only sentence (or no tokens at all) gets no tags, as
    ``rnnkit predict`` answers a blank line (``{"tokens": [], "tags": []}``); the others
    are tagged as when given alone."""
    source = stdlib_files(["json"])[1].read_text(encoding="utf-8")
    write_token_tags(python_token_sentences(source, max_tokens=12)[:24], tmp_path / "tag.tsv")
    run_dir = _train(tmp_path / "tag", "tag", tmp_path / "tag.tsv", "--steps", "2", "--char-rnn")
    lines = ["def f ( x ) :", "", " \t ", "return x"]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
    capsys.readouterr()
    assert main(["predict", "--checkpoint", str(run_dir), "--input", str(tmp_path / "in.txt")]) == 0
    cli = [json.loads(line)["tags"] for line in capsys.readouterr().out.splitlines()]
    run = rnnkit.load(run_dir)
    assert run.predict(lines, batch_size=2) == cli
    assert cli[1] == cli[2] == [] and len(cli[0]) == 6 and len(cli[3]) == 2
    assert run.predict([[], "return x"]) == [[], run.predict(["return x"])[0]]
    assert run.predict(["", " "]) == [[], []]


def test_seq2seq_predict_matches_transduce_and_exact_match(tmp_path, capsys):
    write_pairs(tmp_path / "train.tsv", generate_pairs("reverse", 48, seed=0, max_len=4))
    write_pairs(tmp_path / "test.tsv", generate_pairs("reverse", 10, seed=1, max_len=4))
    run_dir = _train(tmp_path / "run", "seq2seq", tmp_path / "train.tsv", "--steps", "10")
    run = rnnkit.load(run_dir)
    assert run.source_vocab is not None
    pairs = read_pairs(str(tmp_path / "test.tsv"))
    outputs = run.predict([p.source for p in pairs], batch_size=3)
    assert outputs == [transduce(run_dir, p.source) for p in pairs]
    exact = sum(o == p.target for o, p in zip(outputs, pairs, strict=True)) / len(pairs)
    assert exact == pytest.approx(_evaluate(run_dir, tmp_path / "test.tsv", capsys)["exact_match"])
    assert run.predict([pairs[0].source], beam=2) == [transduce(run_dir, pairs[0].source, beam=2)]
    with pytest.raises(DataError, match=r"^source 0 holds a tab: a source<TAB>target line"):
        run.predict([f"{pairs[0].source}\t{pairs[0].target}"])


def test_events_predict_matches_the_scorer(tmp_path):
    write_sessions(tmp_path / "train.jsonl", generate_sessions(40, seed=1))
    run_dir = _train(
        tmp_path / "run", "events", tmp_path / "train.jsonl", "--steps", "6", "--bptt", "full"
    )
    run = rnnkit.load(run_dir)
    sessions = generate_sessions(9, anomalies=3, seed=3, prefix="t")
    mine = run.predict([s.events for s in sessions], batch_size=4)
    reference = list(score_sessions(load_events(run_dir), sessions, batch_size=4))
    assert [m["score"] for m in mine] == [r["score"] for r in reference]
    assert [m["verdict"] for m in mine] == [r["verdict"] for r in reference]
    assert run.predict(sessions, top_k=2)[0]["session"] == sessions[0].session


def test_lm_generate_matches_the_generate_command(tmp_path, capsys):
    text = "the cat sat on the mat. the dog sat on the log.\n" * 20
    (tmp_path / "train.txt").write_text(text, encoding="utf-8")
    run_dir = _train(tmp_path / "run", "lm", tmp_path / "train.txt", "--steps", "5")
    run = rnnkit.load(run_dir)
    assert isinstance(run.model, rnnkit.models.LanguageModel)
    assert run.vocab.unit == "char" and run.labels is None
    texts = run.generate("the ", num=2, max_length=12, seed=4)
    capsys.readouterr()
    argv = ["generate", "--checkpoint", str(run_dir), "--prompt", "the ", "--num", "2"]
    assert main([*argv, "--max-len", "12", "--seed", "4", "--json"]) == 0
    printed = [json.loads(line)["text"] for line in capsys.readouterr().out.splitlines()]
    assert printed == [f"the {t}" for t in texts]
    assert run.generate("the ", max_length=8, seed=4) == run.generate("the ", max_length=8, seed=4)
    assert len(run.generate(strategy="greedy", max_length=5)) == 1
    with pytest.raises(ConfigError, match="strategy='greedy' gives one text; num=3"):
        run.generate(strategy="greedy", num=3)  # the same text three times
    with pytest.raises(ConfigError, match="class-conditional run only"):
        run.generate(condition="a")
    # Inside a fine-tuning loop: each module's mode as it was (dropout stayed off after).
    run.model.train()
    run.model.head.eval()  # a module the user keeps in evaluation mode stays so
    for use in (lambda: run.generate("the ", max_length=8), lambda: run.predict(["the cat"])):
        use()
        assert run.model.training and run.model.encoder.training and not run.model.head.training


def _predicted(run_dir: Path, lines: list[str], tmp_path: Path, capsys) -> list[dict]:
    """What ``rnnkit predict`` prints for ``lines``, one record each."""
    path = tmp_path / "inputs.txt"
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    capsys.readouterr()
    assert main(["predict", "--checkpoint", str(run_dir), "--input", str(path)]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_lm_predict_scores_texts_as_the_predict_command(tmp_path, capsys):
    text = "the cat sat on the mat. the dog sat on the log.\n" * 20
    (tmp_path / "train.txt").write_text(text, encoding="utf-8")
    run_dir = _train(tmp_path / "run", "lm", tmp_path / "train.txt", "--steps", "5")
    run = rnnkit.load(run_dir)
    texts = ["the cat", "a dog on the log", "zebra"]  # z, b, r: unknown characters
    mine = run.predict(texts, batch_size=8)  # the run's batch size, as the command reads
    assert mine == _predicted(run_dir, texts, tmp_path, capsys)
    assert [m["unknown"] for m in mine] == [0, 0, 3]
    two = run.predict(texts, batch_size=2)  # other batches: the same to rounding
    assert [t["logprobs"] for t in two] == [pytest.approx(m["logprobs"]) for m in mine]
    assert sum(mine[0]["logprobs"]) == pytest.approx(-mine[0]["nats"])
    with pytest.raises(ConfigError, match="class-conditional run only"):
        run.predict(["x"], condition="a")
    with pytest.raises(ConfigError, match="input 1 is int, expected a string"):
        run.predict(["x", 5])


def test_a_class_conditional_lm_scores_each_text_under_its_class(tmp_path, capsys):
    lines = ["pos\tabab abba", "neg\txyxy yxxy"] * 30
    (tmp_path / "train.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    run_dir = _train(
        tmp_path / "run",
        "lm",
        tmp_path / "train.tsv",
        "--steps",
        "5",
        "--condition",
        "both",
        "--bptt",
        "full",
    )
    run = rnnkit.load(run_dir)
    texts = ["abba", "xyyx"]
    printed = _predicted(run_dir, [f"pos\t{texts[0]}", f"neg\t{texts[1]}"], tmp_path, capsys)
    assert run.predict(texts, condition=["pos", "neg"]) == printed
    assert run.predict(texts, condition="pos")[0] == printed[0]
    for wrong in (None, "odd", ["pos"], [1, 2]):
        with pytest.raises(ConfigError, match="condition"):
            run.predict(texts, condition=wrong)


def test_regress_predict_answers_as_the_predict_command(task_data, tmp_path, capsys):
    run_dir = _train(
        tmp_path / "run", "regress", task_data / "seq.jsonl", "--steps", "4", tiny=VECTORS
    )
    run = rnnkit.load(run_dir)
    assert run.task == "regress" and run.vocab is None and run.extras["input_size"] == 2
    lines = (task_data / "seq-valid.jsonl").read_text().splitlines()[:4]
    seqs = [json.loads(line)["seq"] for line in lines]
    printed = _predicted(run_dir, lines, tmp_path, capsys)
    mine = run.predict(seqs)
    assert mine == printed
    # an array and a tensor are the same sequence
    import numpy as np
    import torch

    assert run.predict([np.array(seqs[0])]) == mine[:1]
    assert run.predict([torch.tensor(seqs[0], dtype=torch.float64)]) == mine[:1]
    for bad, says in [
        ([[1.0, 2.0, 3.0]], "3 values a step, the run's 2"),
        ([[1.0, float("nan")]], "not finite"),
        ([[1.0, 1e39]], "float32's range"),
        ([], "has no steps"),
        ([[1.0, 2.0], [3.0]], "is not \\(T, D\\) numbers"),
        ("abc", "is str"),
        ([[[1.0, 2.0]]], "3 dimensions"),
    ]:
        with pytest.raises(rnnkit.errors.RnnkitError, match=says):
            run.predict([seqs[0], bad])
    # A model made float64 (and put in training mode) computes in float64: the inputs were
    # float32 (a TypeError), and predict left the model in evaluation mode.
    run.model.double().train()
    doubled = run.predict(seqs)
    assert run.model.training and all(m.training for m in run.model.modules())
    for got, want in zip(doubled, mine, strict=True):
        np.testing.assert_allclose(got["prediction"], want["prediction"], rtol=1e-5, atol=1e-6)


def test_a_vector_classifier_labels_sequences_as_the_predict_command(task_data, tmp_path, capsys):
    run_dir = _train(
        tmp_path / "run", "classify", task_data / "labelled.jsonl", "--inputs", "vectors",
        "--steps", "6", tiny=VECTORS,
    )  # fmt: skip
    run = rnnkit.load(run_dir)
    assert run.vocab is None and run.labels.labels == ["down", "up"]
    lines = (task_data / "labelled.jsonl").read_text().splitlines()[:6]
    printed = _predicted(run_dir, lines, tmp_path, capsys)
    seqs = [json.loads(line)["seq"] for line in lines]
    assert run.predict(seqs, batch_size=4) == [p["label"] for p in printed]
    with pytest.raises(rnnkit.errors.DataError, match="sequence 0 has 1 values a step"):
        run.predict([[0.5, 0.25]])  # (T,): one value a step
    run.model.double()  # computes in float64: its inputs were float32 (a TypeError)
    assert run.predict(seqs, batch_size=4) == [p["label"] for p in printed]


def test_params_predict_gives_the_scorers_verdicts(task_data, tmp_path, capsys):
    from rnnkit.data.events import parse_session

    run_dir = _train(
        tmp_path / "run", "params", task_data / "params.jsonl",
        "--valid", str(task_data / "params-valid.jsonl"), "--steps", "4", tiny=VECTORS,
    )  # fmt: skip
    run = rnnkit.load(run_dir)
    assert run.task == "params" and len(run.model) >= 1
    lines = (task_data / "params-valid.jsonl").read_text().splitlines()[:5]
    printed = _predicted(run_dir, lines, tmp_path, capsys)
    as_dicts = run.predict([json.loads(line) for line in lines], batch_size=2)
    sessions = run.predict([parse_session(line) for line in lines])
    for mine in (as_dicts, sessions):
        assert [m["verdict"] for m in mine] == [p["verdict"] for p in printed]
        assert [m["score"] for m in mine] == pytest.approx([p["score"] for p in printed])
    with pytest.raises(ConfigError, match="session 1 is list"):
        run.predict([json.loads(lines[0]), ["open", "close"]])
    with pytest.raises(rnnkit.errors.DataError, match="session 0 has no params"):
        run.predict([rnnkit.data.events.Session("a", ["open"])])
    short = rnnkit.data.events.Session("a", ["open", "close"], params=[[1.0]])
    with pytest.raises(rnnkit.errors.DataError, match="'params' has 1 entries for 2 events"):
        run.predict([short])  # a Session is checked as a file's line is
    with pytest.raises(ConfigError, match=r"takes no \['beam'\]"):
        run.predict([json.loads(lines[0])], beam=2)


def test_load_names_a_missing_run(tmp_path):
    with pytest.raises(rnnkit.errors.CheckpointError, match="nothing: no such checkpoint"):
        rnnkit.load(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(rnnkit.errors.RnnkitError, match=r"empty/config\.json"):
        rnnkit.load(tmp_path / "empty")


def test_predict_arguments_are_named_in_one_line(tmp_path):
    # Each of these was a deep TypeError, a torch message or a silent answer before.
    write_pairs(tmp_path / "train.tsv", generate_pairs("reverse", 24, seed=0, max_len=4))
    s2s = rnnkit.load(_train(tmp_path / "s2s", "seq2seq", tmp_path / "train.tsv", "--steps", "2"))
    assert s2s.predict([]) == []
    with pytest.raises(ConfigError, match=r"takes no \['bogus'\] \(it takes beam, max_length\)"):
        s2s.predict(["a b"], bogus=1)
    for limit in (0, -1):  # 0 answered '', -1 was "max_length ... got 0" from deep inside
        with pytest.raises(
            ConfigError, match=f"max_length must be an integer ≥ 1 or None, got {limit}"
        ):
            s2s.predict(["a b"], max_length=limit)
    for size in (None, 1.5):
        with pytest.raises(ConfigError, match=f"batch_size must be an integer ≥ 1, got {size}"):
            s2s.predict(["a b"], batch_size=size)
    assert len(s2s.predict(["a b"], max_length=1)[0].split()) <= 1
    with pytest.raises(ConfigError, match=r"^device='gpu' is not a device"):
        rnnkit.load(s2s.run_dir, device="gpu")  # the argument's name, not --device

    write_sessions(tmp_path / "train.jsonl", generate_sessions(24, seed=1))
    events = _train(tmp_path / "ev", "events", tmp_path / "train.jsonl", "--steps", "2")
    detector = rnnkit.load(events)
    session = generate_sessions(1, seed=3)[0].events
    assert detector.predict([session], top_k=0)[0]["top"] == []
    assert len(detector.predict([session], top_k=2)[0]["top"]) == 2
    with pytest.raises(ConfigError, match="top_k must be an integer ≥ 0, got -1"):
        detector.predict([session], top_k=-1)  # listed all but the last events
    with pytest.raises(ConfigError, match="top_k must be an integer ≥ 0, got -1"):
        list(score_sessions(load_events(events), generate_sessions(1, seed=3), top_k=-1))
    with pytest.raises(ConfigError, match=r"takes no \['bogus'\]"):
        detector.predict([session], bogus=1)
    with pytest.raises(ConfigError, match="session 0 is a string"):  # read char by char
        detector.predict([" ".join(session)])


def test_classify_answers_no_inputs_with_no_answers(tmp_path):
    write_labelled(majority_letter_examples(24, seed=0), tmp_path / "train.tsv")
    run = rnnkit.load(_train(tmp_path / "run", "classify", tmp_path / "train.tsv", "--steps", "2"))
    assert run.predict([]) == []  # was "no sequences to batch"


def test_generate_names_a_prompt_or_seed_it_cannot_use(tmp_path):
    (tmp_path / "train.txt").write_text("the cat sat on the mat.\n" * 20, encoding="utf-8")
    run = rnnkit.load(_train(tmp_path / "run", "lm", tmp_path / "train.txt", "--steps", "2"))
    with pytest.raises(ConfigError, match="prompt must be a string or None, got list"):
        run.generate(["the"], max_length=3)  # each word of a character run was <unk>
    with pytest.raises(ConfigError, match=r"seed must be in \[-2\*\*63, 2\*\*64\)"):
        run.generate("the", max_length=3, seed=2**64)  # was "Overflow when unpacking long long"
    with pytest.raises(ConfigError, match=r"seed must be an integer or None, got 1\.5"):
        run.generate("the", max_length=3, seed=1.5)
    assert run.generate("the", max_length=3, seed=2**64 - 1) == run.generate(
        "the", max_length=3, seed=-1
    )


def test_generate_refuses_an_option_its_strategy_does_not_read(tmp_path):
    """``strategy="beam", temperature=5`` and ``strategy="greedy", beam_size=3`` dropped
    the option without a word, as ``rnnkit generate --beam 3 --temperature 5`` did."""
    (tmp_path / "train.txt").write_text("the cat sat on the mat.\n" * 20, encoding="utf-8")
    run = rnnkit.load(_train(tmp_path / "run", "lm", tmp_path / "train.txt", "--steps", "2"))
    sample = "for strategy='sample': give one or the other"
    for options, message in [
        ({"strategy": "beam", "temperature": 5.0},
         f"strategy='beam' searches; temperature is {sample}"),
        ({"strategy": "greedy", "top_k": 2, "top_p": 0.5, "seed": 7},
         f"strategy='greedy' searches; top_k, top_p and seed are {sample}"),
        ({"strategy": "greedy", "beam_size": 3},
         "beam_size is for strategy='beam', not strategy='greedy'"),
        ({"beam_size": 3}, "beam_size is for strategy='beam', not strategy='sample'"),
    ]:  # fmt: skip
        with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
            run.generate("the", max_length=3, **options)
    assert len(run.generate("the", max_length=3, strategy="beam", beam_size=2)) == 1
    assert run.generate("the", max_length=3, strategy="beam", beam_size=1) == run.generate(
        "the", max_length=3, strategy="greedy"
    )


def test_events_score_is_named_as_given_in_python_and_on_the_command_line(tmp_path, capsys):
    # score= of predict() was refused as "--score ...", the command line's spelling
    write_sessions(tmp_path / "train.jsonl", generate_sessions(24, seed=1))
    events = _train(tmp_path / "ev", "events", tmp_path / "train.jsonl", "--steps", "2")
    session = generate_sessions(1, seed=3)[0].events
    with pytest.raises(ConfigError, match=r"^score must be one of max, .*, got 'median'$"):
        rnnkit.load(events).predict([session], score="median")
    # A run from before the calibration gives the running scores only.
    old = tmp_path / "old"
    shutil.copytree(events, old)
    (old / "calibration.safetensors").unlink()
    write_manifest(old)
    with pytest.raises(ConfigError, match=r"^score='norm' needs calibration\.safetensors"):
        rnnkit.load(old).predict([session], score="norm")
    write_sessions(tmp_path / "one.jsonl", generate_sessions(1, seed=3))
    capsys.readouterr()
    argv = ["score", "--checkpoint", str(old), "--data", str(tmp_path / "one.jsonl")]
    assert main([*argv, "--score", "norm"]) == 2
    err = capsys.readouterr().err
    assert "--score norm needs calibration.safetensors" in err and "score=" not in err


def test_inputs_that_are_not_texts_are_named_by_position(tmp_path):
    # None, a number, a token None: each was a TypeError from inside the vocabulary or
    # the tokenizer ("object of type 'int' has no len()", "expected string or bytes-like")
    write_labelled(majority_letter_examples(24, seed=0), tmp_path / "train.tsv")
    clf = rnnkit.load(_train(tmp_path / "cls", "classify", tmp_path / "train.tsv", "--steps", "2"))
    with pytest.raises(ConfigError, match=r"^predict\(\) takes a list of inputs, got NoneType$"):
        clf.predict(None)
    with pytest.raises(ConfigError, match=r"^input 1 is int, expected a string$"):
        clf.predict(["abc", 5])
    write_pairs(tmp_path / "pairs.tsv", generate_pairs("reverse", 24, seed=0, max_len=4))
    s2s = rnnkit.load(_train(tmp_path / "s2s", "seq2seq", tmp_path / "pairs.tsv", "--steps", "2"))
    with pytest.raises(ConfigError, match=r"^source 0 is NoneType, expected a string$"):
        s2s.predict([None])
    # as rnnkit predict bounds --max-len: a larger limit decoded without an end
    with pytest.raises(
        ConfigError, match=r"^max_length must be at most 1,000,000, got 1,000,000,000,000$"
    ):
        s2s.predict(["a b"], max_length=10**12)
    source = stdlib_files(["json"])[1].read_text(encoding="utf-8")
    write_token_tags(python_token_sentences(source, max_tokens=12)[:24], tmp_path / "tag.tsv")
    tagger = rnnkit.load(_train(tmp_path / "tag", "tag", tmp_path / "tag.tsv", "--steps", "2"))
    with pytest.raises(ConfigError, match=r"^sentence 0 is int: give a list of tokens"):
        tagger.predict([5])
    with pytest.raises(ConfigError, match=r"^sentence 1: token 1 is NoneType, expected a string$"):
        tagger.predict([["a"], ["a", None]])
    with pytest.raises(ConfigError, match=r"^sentence 0: token 0 is an empty string$"):
        tagger.predict([["", "b"]])  # was tagged as if it were a word


def test_events_sessions_follow_the_files_rules(tmp_path):
    # None, a number or "" among the events was scored as the unknown symbol, and an
    # empty session got a verdict: answers about events that were never given
    write_sessions(tmp_path / "train.jsonl", generate_sessions(24, seed=1))
    detector = rnnkit.load(
        _train(tmp_path / "ev", "events", tmp_path / "train.jsonl", "--steps", "2")
    )
    session = generate_sessions(1, seed=3)[0].events
    assert len(detector.predict([session])) == 1
    with pytest.raises(
        ConfigError, match=r"^session 0: events\[1\] is NoneType, expected a string$"
    ):
        detector.predict([[session[0], None]])
    with pytest.raises(ConfigError, match=r"^session 1: events\[0\] is an empty string$"):
        detector.predict([session, [""]])
    with pytest.raises(rnnkit.errors.DataError, match=r"^session 0 has no events$"):
        detector.predict([[]])
    with pytest.raises(ConfigError, match=r"^session 0 is int: give a list of event names$"):
        detector.predict([7])


def test_generate_bounds_num_and_max_length_as_the_command_does(tmp_path):
    (tmp_path / "train.txt").write_text("the cat sat on the mat.\n" * 20, encoding="utf-8")
    run = rnnkit.load(_train(tmp_path / "run", "lm", tmp_path / "train.txt", "--steps", "2"))
    with pytest.raises(ConfigError, match=r"^num must be an integer ≥ 1, got None$"):
        run.generate("the", num=None)  # was "'<' not supported between ..."
    with pytest.raises(ConfigError, match=r"^num must be at most 10,000, got 1,000,000,000,000$"):
        run.generate("the", num=10**12, max_length=2)  # was the allocator's RuntimeError
    with pytest.raises(ConfigError, match=r"^max_length must be at most 1,000,000, got"):
        run.generate("the", max_length=10**7)
    with pytest.raises(ConfigError, match=r"^max_length must be an integer ≥ 1, got 2.5$"):
        run.generate("the", max_length=2.5)
    assert len(run.generate("the", num=2, max_length=2, seed=0)) == 2


@pytest.mark.parametrize("run_dir", [None, 5])
def test_load_names_a_run_dir_that_is_no_path(run_dir):
    # pathlib's "expected str, bytes or os.PathLike object" named no argument
    with pytest.raises(
        ConfigError, match=f"^run_dir must be a path, got {type(run_dir).__name__}$"
    ):
        rnnkit.load(run_dir)
