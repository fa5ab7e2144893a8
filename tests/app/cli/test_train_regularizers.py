"""``rnnkit train`` with the regularizer options, end to end on a tiny corpus: recorded in
``config.json``, read back by ``evaluate``, the same weights from the same seed, and one
line for an option that cannot apply."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from safetensors.torch import load_file

from rnnkit.app.cli.main import main

WORDS = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran"]
OPTIONS = {
    "input_dropout": 0.1,
    "locked_dropout": 0.2,
    "output_dropout": 0.1,
    "recurrent_dropout": 0.2,
    "weight_drop": 0.3,
    "zoneout": 0.1,
    "embedding_dropout": 0.1,
}


@pytest.fixture(autouse=True, scope="module")
def _one_thread(single_thread):
    yield


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("data")
    rng = random.Random(0)
    for name, n in (("train.txt", 60), ("valid.txt", 10)):
        lines = (" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 7))) for _ in range(n))
        (d / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return d


def _train(data: Path, out: Path, *extra: str) -> int | None:
    flags = [x for k, v in OPTIONS.items() for x in ("--" + k.replace("_", "-"), str(v))]
    return main(
        ["train", "--train", str(data / "train.txt"), "--valid", str(data / "valid.txt"),
         "--out", str(out), "--hidden", "8", "--embedding", "8", "--batch-size", "4",
         "--layers", "2", "--steps", "3", "--seed", "3", "--quiet", "--no-report", *flags,
         *extra]
    )  # fmt: skip


def test_regularized_run_is_recorded_reproducible_and_evaluates(data, tmp_path, capsys):
    assert _train(data, tmp_path / "a") in (0, None)
    assert _train(data, tmp_path / "b") in (0, None)
    config = json.loads((tmp_path / "a" / "config.json").read_text())["config"]
    assert {k: config[k] for k in OPTIONS} == OPTIONS
    a = load_file(tmp_path / "a" / "model.safetensors")
    b = load_file(tmp_path / "b" / "model.safetensors")
    assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)
    capsys.readouterr()
    code = main(["evaluate", "--checkpoint", str(tmp_path / "a"), "--data",
                 str(data / "valid.txt"), "--json"])  # fmt: skip
    assert code in (0, None)
    assert "nats" in capsys.readouterr().out


def test_an_option_that_cannot_apply_is_one_line(data, tmp_path, capsys):
    code = _train(data, tmp_path / "w", "--layer-norm", "--cell", "gru")
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.endswith("--layer-norm with --cell gru needs --reset after")
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize(
    ("extra", "key", "value"),
    [(("--bptt", "window:4"), "bptt", "window:4"), (("--recompute", "4"), "recompute", 4)],
)
def test_every_regularizer_trains_with_a_window_or_recompute(
    data, tmp_path, capsys, extra, key, value
):
    """A windowed or recomputed run takes them all (both change only the backward) and
    evaluates."""
    assert _train(data, tmp_path / "w", *extra) in (0, None)
    config = json.loads((tmp_path / "w" / "config.json").read_text())["config"]
    assert config[key] == value
    assert {k: config[k] for k in OPTIONS} == OPTIONS
    capsys.readouterr()
    code = main(["evaluate", "--checkpoint", str(tmp_path / "w"), "--data",
                 str(data / "valid.txt"), "--json"])  # fmt: skip
    assert code in (0, None)
    assert "nats" in capsys.readouterr().out
