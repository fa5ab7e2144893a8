"""Every command of every task keeps its tensors on the model's device, checked on the CPU
(``tests/device_placement.py``: ``--device cpu`` loads onto a stand-in device, and an
operation that mixes host and device tensors, a ``.numpy()`` of a device tensor or a
generator of the other device is recorded). The same mistakes fail on a GPU, where the
CUDA tier runs these commands for real; here they cannot hide between GPU runs. The
report's pictures converted on the device and its host-made ids were such mistakes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from device_placement import DEVICE, DevicePlacement, simulated_device

TINY = ["--hidden", "8", "--batch-size", "8", "--steps", "3", "--seed", "0", "--quiet"]
TINY += ["--no-report", "--device", "cpu"]
EMB = ["--embedding", "8"]


@pytest.fixture(autouse=True, scope="module")
def _one_thread(single_thread):
    yield


def _tasks(d: Path) -> dict[str, list[str]]:
    events = ["--train", str(d / "sessions.jsonl"), "--valid", str(d / "valid.jsonl"), *EMB]
    return {
        "lm": ["--task", "lm", "--train", str(d / "text.txt"), *EMB],
        "tag": ["--task", "tag", "--train", str(d / "tags.tsv"), "--char-rnn", *EMB],
        "classify": ["--task", "classify", "--train", str(d / "labels.tsv"), *EMB],
        "classify-vectors": ["--task", "classify", "--inputs", "vectors", "--train",
                             str(d / "labelled.jsonl")],
        "events": ["--task", "events", *events],
        # DeepLog's history window: trained on pieces of 3 events, scored on windows of 3
        "events-window": ["--task", "events", *events, "--window", "3"],
        "params": ["--task", "params", "--train", str(d / "params.jsonl"), "--valid",
                   str(d / "params-valid.jsonl")],
        "regress": ["--task", "regress", "--train", str(d / "seq.jsonl"), "--valid",
                    str(d / "seq-valid.jsonl")],
        "seq2seq": ["--task", "seq2seq", "--train", str(d / "pairs.tsv"), "--attention",
                    "additive", "--bidirectional", *EMB],
        "seq2seq-decoder-only": ["--task", "seq2seq", "--train", str(d / "pairs.tsv"),
                                 "--decoder-only", *EMB],
        # trained only (below): streams with document starts carried between segments
        "lm-segments": ["--task", "lm", "--train", str(d / "text.txt"), "--bptt", "segment:8",
                        "--doc-boundary", "line", "--cell", "gru", *EMB],
    }  # fmt: skip


#: In a command's arguments: the ``params`` run of the ``runs`` fixture.
PARAMS_RUN = "<the params run>"


def _commands(d: Path) -> dict[str, dict[str, list[str]]]:
    """The commands that load a run of each task (``lines.txt``, ``sources.txt``: written
    by the ``runs`` fixture)."""
    lines, sources = str(d / "lines.txt"), str(d / "sources.txt")
    params_valid = str(d / "params-valid.jsonl")
    return {
        "lm": {
            "evaluate": ["evaluate", "--data", str(d / "text.txt")],
            "predict": ["predict", "--input", lines],
            "generate": ["generate", "--prompt", "ab", "--max-len", "5", "--num", "2"],
            "generate-beam": ["generate", "--prompt", "ab", "--max-len", "5", "--beam", "2"],
            "report": ["report"],
        },
        "tag": {
            "evaluate": ["evaluate", "--data", str(d / "tags.tsv")],
            "predict": ["predict", "--input", lines],
            "report": ["report"],
        },
        "classify": {
            "evaluate": ["evaluate", "--data", str(d / "labels.tsv")],
            "predict": ["predict", "--input", lines],
            "report": ["report"],
        },
        "classify-vectors": {
            "evaluate": ["evaluate", "--data", str(d / "labelled.jsonl")],
            "predict": ["predict", "--input", str(d / "labelled.jsonl")],
        },
        "events": {
            "evaluate": ["evaluate", "--data", str(d / "valid.jsonl")],
            "score": ["score", "--data", str(d / "valid.jsonl"), "--ngram"],
            # sessions streamed event by event (stream.jsonl: written by `runs`)
            "score-follow": [
                "score",
                "--data",
                str(d / "stream.jsonl"),
                "--follow",
                "--until-idle",
                "0.3",
                "--poll",
                "0.05",
            ],
            "predict": ["predict", "--input", str(d / "valid.jsonl")],
            "report": ["report"],
            # both models' verdicts: the key sequence's and the parameter values'
            "score-params": ["score", "--data", params_valid, "--params", PARAMS_RUN],
            "predict-params": ["predict", "--input", params_valid, "--params", PARAMS_RUN],
        },
        "events-window": {
            "evaluate": ["evaluate", "--data", str(d / "valid.jsonl")],
            "score": ["score", "--data", str(d / "valid.jsonl")],
            "predict": ["predict", "--input", str(d / "valid.jsonl")],
        },
        "params": {
            "evaluate": ["evaluate", "--data", params_valid],
            "score": ["score", "--data", params_valid],
            "predict": ["predict", "--input", params_valid],
        },
        "regress": {
            "evaluate": ["evaluate", "--data", str(d / "seq-valid.jsonl")],
            "predict": ["predict", "--input", str(d / "seq-valid.jsonl")],
            "report": ["report"],
        },
        "seq2seq": {
            "evaluate": ["evaluate", "--data", str(d / "pairs.tsv")],
            "predict": ["predict", "--input", sources, "--beam", "2"],
            "generate": ["generate", "--input", "abc", "--seed", "1", "--num", "2"],
            "report": ["report"],
        },
        "seq2seq-decoder-only": {
            "predict": ["predict", "--input", sources, "--beam", "2"],
            "generate": ["generate", "--input", "abc", "--greedy"],
        },
    }


CASES = [(task, c) for task, commands in _commands(Path(".")).items() for c in commands]


@pytest.fixture(scope="module")
def runs(task_data, tmp_path_factory) -> dict[str, Path]:
    """A run of each task, trained on the CPU (a few steps)."""
    from rnnkit.app.cli.main import main

    (task_data / "lines.txt").write_text("abc abd\nbca\n", encoding="utf-8")
    (task_data / "sources.txt").write_text("abc\nba\n", encoding="utf-8")
    stream = []  # three validation sessions, interleaved a step at a time, then ended
    valid = (task_data / "valid.jsonl").read_text(encoding="utf-8").splitlines()
    sessions = [json.loads(line) for line in valid[:3]]
    for step in range(max(len(s["events"]) for s in sessions)):
        stream += [{"session": s["session"], "event": s["events"][step]}
                   for s in sessions if step < len(s["events"])]  # fmt: skip
    stream += [{"session": s["session"], "end": True} for s in sessions]
    (task_data / "stream.jsonl").write_text("".join(json.dumps(x) + "\n" for x in stream))
    root = tmp_path_factory.mktemp("placed")
    out = {}
    for name, argv in _tasks(task_data).items():
        if name not in _commands(task_data):
            continue
        out[name] = root / name
        assert main(["train", *argv, "--out", str(out[name]), *TINY]) == 0, name
    return out


def _placed(monkeypatch, run_cli, *argv: str) -> DevicePlacement:
    with simulated_device(monkeypatch) as placed:
        code, _, err = run_cli(*argv)
    assert code == 0, err[-2000:]
    return placed


@pytest.mark.parametrize("task, command", CASES, ids=[f"{t}-{c}" for t, c in CASES])
def test_each_command_keeps_its_tensors_on_the_models_device(
    task_data, runs, run_cli, monkeypatch, tmp_path, task, command
):
    argv = [str(runs["params"]) if a == PARAMS_RUN else a
            for a in _commands(task_data)[task][command]]  # fmt: skip
    where = ["--out", str(tmp_path / "r.html")] if command == "report" else []
    placed = _placed(monkeypatch, run_cli, argv[0], "--checkpoint", str(runs[task]), *argv[1:],
                     *where)  # fmt: skip
    assert not placed.violations, dict(placed.violations)


@pytest.mark.parametrize(
    "task",
    [
        "lm",
        "lm-segments",
        "tag",
        "classify",
        "events",
        "events-window",
        "params",
        "regress",
        "seq2seq",
    ],
)
def test_training_keeps_its_tensors_on_the_device(task_data, run_cli, monkeypatch, tmp_path, task):
    """Training too, its batches moved to the device, its end-of-run report drawn there
    (the suite turns reports off for its many runs: on here)."""
    monkeypatch.setenv("RNNKIT_REPORT", "1")
    argv = [*_tasks(task_data)[task], "--out", str(tmp_path / "run"), *TINY[:-3], "--device"]
    placed = _placed(monkeypatch, run_cli, "train", *argv, "cpu")
    assert not placed.violations, dict(placed.violations)
    assert (tmp_path / "run" / "report.html").exists()


def test_the_check_sees_each_kind_of_mistake(monkeypatch):
    """The mistakes it is there to find, each made once on purpose."""
    layer = torch.nn.Linear(3, 2)
    with simulated_device(monkeypatch) as placed:
        layer(torch.zeros(4, 3))  # a host batch into the device's weights
        out = layer(torch.zeros(4, 3).to(DEVICE))
        out.detach().numpy()  # read on the device
        out.detach().cpu().numpy()  # fine: copied to the host first
        index = torch.tensor([0, 1], device=DEVICE)
        torch.zeros(4)[index]  # a host tensor indexed on the device
        gen = torch.Generator(device=DEVICE)
        torch.rand(3, generator=gen)  # a device generator drawing on the host
        assert out.device == DEVICE and out.cpu().device == torch.device("cpu")
        layer(torch.zeros(4, 3, device=DEVICE))  # fine: made on the device
    kinds = sorted(key.split(" (")[0] for key in placed.violations)
    assert kinds == [
        ".numpy() of a tensor on the device",
        "a generator of the other device",
        "a host tensor indexed on the device",
        "host and device tensors in one operation",
    ], placed.violations


API_INPUTS = {
    "lm": ["abc abd", "b"],
    "tag": [["abc", "abd"], "b a"],
    "classify": ["abc", "ba"],
    "seq2seq": ["abc", "ba"],
    "regress": [torch.zeros(3, 2)],
    "events": [["login:user", "open", "read", "close", "logout"], ["login:admin"]],
    "events-window": [["login:user", "open", "read", "close", "logout"], ["login:admin"]],
    "params": [
        {"session": "a", "events": ["open", "read", "close"], "params": [[990.0], [11.0], []]},
        {"session": "b", "events": ["open", "close"], "params": [[1200.0], []]},
    ],
}


@pytest.mark.parametrize("task", list(API_INPUTS))
def test_a_loaded_run_answers_from_python_on_its_device(runs, monkeypatch, task):
    """``rnnkit.load(run, device=...)``'s answers: the same placement as the commands'."""
    import rnnkit

    with simulated_device(monkeypatch) as placed:
        answers = rnnkit.load(runs[task], device="cpu").predict(API_INPUTS[task])
    assert len(answers) == len(API_INPUTS[task])
    assert not placed.violations, dict(placed.violations)
