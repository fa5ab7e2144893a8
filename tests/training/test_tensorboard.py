"""``--tensorboard DIR`` (``rnnkit.training.tensorboard``): the event file holds the
records of ``metrics.jsonl`` as scalars, read back with TensorBoard's own reader; without
the package, one line naming the extra and nothing trained."""

from __future__ import annotations

import json
import random
import sys

import pytest

from rnnkit.app.cli.main import main

TINY = ["--hidden", "8", "--embedding", "8", "--batch-size", "4", "--ngram-order", "3", "-q"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("tb-data")
    rng = random.Random(0)
    words = ["the", "cat", "sat", "on", "a", "mat", "and", "dog"]
    for name, lines in (("train.txt", 60), ("valid.txt", 10)):
        text = "".join(" ".join(rng.choice(words) for _ in range(5)) + "\n" for _ in range(lines))
        (d / name).write_text(text)
    return d


def train(corpus, out, *extra: str) -> int:
    return main(
        ["train", "--train", str(corpus / "train.txt"), "--valid", str(corpus / "valid.txt"),
         "--out", str(out), "--bptt", "segment:16", *TINY, *extra]
    )  # fmt: skip


def test_the_event_file_holds_loss_validation_figures_and_lr(corpus, tmp_path, capsys):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, logs = tmp_path / "run", tmp_path / "tb"
    args = ["--steps", "6", "--log-every", "2", "--eval-every", "3", "--tensorboard", str(logs)]
    assert train(corpus, out, *args) == 0, capsys.readouterr().err
    events = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    # --tensorboard is kept in config.json, so a resume without it logs on to the same place
    assert json.loads((out / "config.json").read_text())["config"]["tensorboard"] == str(logs)
    assert train(corpus, out, "--steps", "8", "--log-every", "2", "--resume") == 0
    events = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]

    acc = EventAccumulator(str(logs))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"train/loss_nats", "train/lr", "train/grad_norm", "valid/loss_nats"} <= tags
    assert {"valid/perplexity", "valid/bits_per_char"} <= tags  # the task's own figures
    expected: dict[str, list[tuple[int, float]]] = {}
    for e in events:
        for key in ("loss_nats", "lr", "grad_norm", "bits_per_char"):
            if e["event"] in ("train", "valid") and key in e and e[key] is not None:
                if e["event"] == "valid" and key in ("lr", "grad_norm"):
                    continue
                expected.setdefault(f"{e['event']}/{key}", []).append((e["step"], e[key]))
    assert [s for s, _ in expected["train/loss_nats"]] == [2, 4, 6, 8]
    assert [s for s, _ in expected["valid/loss_nats"]] == [3, 6, 8]
    for tag, points in expected.items():
        got = sorted((s.step, s.value) for s in acc.Scalars(tag))
        assert [s for s, _ in got] == [s for s, _ in points], tag
        for (_, value), (_, want) in zip(got, points, strict=True):
            assert value == pytest.approx(want, rel=1e-6), tag  # stored as float32


def test_without_the_package_one_line_names_the_extra(corpus, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails
    out = tmp_path / "run"
    capsys.readouterr()
    assert train(corpus, out, "--steps", "2", "--tensorboard", str(tmp_path / "tb")) == 2
    err = capsys.readouterr().err
    assert err == (
        "rnnkit train: error: --tensorboard needs the tensorboard package: pip install "
        "'rnnkit[tensorboard]' (or pip install tensorboard)\n"
    )
    assert not out.exists()  # refused before anything was made


def test_a_directory_that_cannot_be_made_is_one_line(corpus, tmp_path, capsys):
    pytest.importorskip("tensorboard")
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    capsys.readouterr()
    assert train(corpus, tmp_path / "run", "--steps", "2", "--tensorboard", str(blocker)) == 2
    err = capsys.readouterr().err
    assert err == f"rnnkit train: error: --tensorboard {blocker}: exists and is not a directory\n"
    assert not (tmp_path / "run").exists()
    # one that cannot be made below it, found when training starts: still one line
    from rnnkit.errors import ConfigError
    from rnnkit.training.tensorboard import TensorBoardWriter

    with pytest.raises(ConfigError, match="cannot write there"):
        TensorBoardWriter(blocker / "below")
