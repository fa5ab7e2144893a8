"""The training options' errors name what the user gave: ``TrainOptions``' fields (and the
``Trainer``'s checks of them) from Python, the options from ``rnnkit train``."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import rnnkit.training.precision as precision_module
from rnnkit import LSTM
from rnnkit.app.cli.main import main as cli_main
from rnnkit.data.batching import StreamBatcher
from rnnkit.errors import CheckpointError, ConfigError
from rnnkit.models.language_model import LanguageModel
from rnnkit.training.loop import Trainer, TrainOptions

V, E, H = 10, 5, 6
PER_EPOCH = 4  # StreamBatcher(110 ids, batch 3, segments of 9) -> 4 batches per epoch


@pytest.fixture(autouse=True)
def _one_thread(single_thread):
    yield


def make_trainer(out=None, **options):
    torch.manual_seed(0)
    model = LanguageModel(nn.Embedding(V, E), LSTM(E, H), nn.Linear(H, V))
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    batches = StreamBatcher(np.random.default_rng(0).integers(0, V, size=110), 3, 9)
    assert len(batches) == PER_EPOCH

    def step(m, batch, carry):
        return m.loss(batch.inputs, batch.targets, state=carry)

    return Trainer(model, opt, batches, step, TrainOptions(quiet=True, **options), out_dir=out)


def train_cli(tmp_path, capsys, *extra: str) -> str:
    """``rnnkit train`` on 20 tiny lines: the one line it prints for a configuration
    error."""
    (tmp_path / "t.txt").write_text("abc\n" * 20)
    tiny = ["--hidden", "8", "--embedding", "8", "--batch-size", "4", "--ngram-order", "2"]
    args = ["train", "--train", str(tmp_path / "t.txt"), "--out", str(tmp_path / "o"), *tiny]
    code = cli_main([*args, "--quiet", *extra])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(
    ("options", "python", "cli", "command_line"),
    [
        (
            {"log_every": 0},
            "TrainOptions: log_every must be an integer ≥ 1 or None, got 0",
            ["--log-every", "0"],
            "--log-every must be ≥ 1, got 0",
        ),
        (
            {"init_range": 0.0},
            "TrainOptions: init_range must be a number > 0 or None, got 0.0",
            ["--init-range", "0"],
            "--init-range must be > 0",
        ),
        (
            {"warmup": -1},
            "TrainOptions: warmup must be an integer ≥ 0 (steps), got -1",
            ["--warmup", "-1"],
            "--warmup must be an integer ≥ 0 (steps), got -1",
        ),
        (
            {"lr_schedule": "linear"},
            "TrainOptions: lr_schedule must be one of constant, plateau, step:E:F, cosine, "
            "got 'linear'",
            ["--lr-schedule", "linear"],
            "--lr-schedule must be one of constant, plateau, step:E:F, cosine, got 'linear'",
        ),
        (
            {"lr_schedule": "step:0:0.5"},
            "TrainOptions: lr_schedule step:E:F needs E ≥ 1, got 0",
            ["--lr-schedule", "step:0:0.5"],
            "--lr-schedule step:E:F needs E ≥ 1, got 0",
        ),
        (
            {"precision": "fp8"},
            "TrainOptions: precision must be one of fp32, bf16, fp16, got 'fp8'",
            ["--precision", "fp8"],
            None,  # argparse's choices: "invalid choice: 'fp8'"
        ),
    ],
)
def test_fields_out_of_range_are_named_when_made(
    tmp_path, capsys, options, python, cli, command_line
):
    with pytest.raises(ConfigError, match=f"^{re.escape(python)}$"):
        TrainOptions(**options)
    if command_line is None:
        with pytest.raises(SystemExit):
            train_cli(tmp_path, capsys, *cli)
        assert "invalid choice: 'fp8'" in capsys.readouterr().err
        return
    assert command_line in train_cli(tmp_path, capsys, *cli)


@pytest.mark.parametrize(
    ("options", "python", "cli", "command_line"),
    [
        (
            {"steps": 3, "warmup": 3, "lr_schedule": "constant"},
            "warmup=3 is not shorter than the run (3 steps)",
            ["--steps", "3", "--warmup", "3"],
            "--warmup 3 is not shorter than the run (3 steps)",
        ),
        (
            {"steps": 2 * PER_EPOCH, "lr_schedule": "step:3:0.5"},
            "lr_schedule='step:3:0.5' never decays: the run ends after 2 epochs",
            ["--steps", "2", "--lr-schedule", "step:3:0.5"],  # at least a batch an epoch
            "--lr-schedule step:3:0.5 never decays: the run ends after ",
        ),
    ],
)
def test_what_the_run_decides_is_named_as_given(
    tmp_path, capsys, options, python, cli, command_line
):
    """The warm-up against the run's length and a step schedule's first decay depend on
    the batches an epoch, known when the Trainer is made: its message names the field
    for a TrainOptions made in Python, the option for one the command line made."""
    with pytest.raises(ConfigError, match=f"^{re.escape(python)}"):
        make_trainer(**options)
    assert command_line in train_cli(tmp_path, capsys, *cli)


def test_cosine_without_a_length_names_the_fields():
    """(``rnnkit train`` refuses ``--lr-schedule cosine`` without ``--steps`` or
    ``--epochs`` first, naming them: tests/training/test_schedules.py.)"""
    with pytest.raises(
        ConfigError,
        match=r"^lr_schedule='cosine' needs the run's length: give steps or epochs$",
    ):
        make_trainer(lr_schedule="cosine", epochs=None, max_time=60.0)


def test_a_precision_the_device_cannot_autocast_is_named_as_given(tmp_path, capsys, monkeypatch):
    real = torch.autocast

    def unsupported(*args, **kwargs):
        warnings.warn("In CPU autocast, but the target dtype is not supported.", stacklevel=2)
        return real("cpu", enabled=False)

    monkeypatch.setattr(precision_module.torch, "autocast", unsupported)
    with pytest.raises(
        ConfigError, match=r"^precision='fp16': torch .* on cpu \(use precision='fp32'\)$"
    ):
        make_trainer(steps=2, precision="fp16")
    err = train_cli(tmp_path, capsys, "--steps", "2", "--precision", "fp16")
    assert re.search(r"--precision fp16: torch .* on cpu \(use --precision fp32\)$", err), err


def test_resuming_in_another_precision_names_it_as_given(tmp_path):
    """(``rnnkit train --resume --precision`` is refused by the run's configuration
    first: tests/training/test_precision.py.)"""
    make_trainer(tmp_path, steps=2, precision="bf16").fit()
    other = make_trainer(tmp_path, steps=4)
    with pytest.raises(CheckpointError, match=r"trained with precision='bf16', not 'fp32'$"):
        other.resume()
    cli_made = make_trainer(tmp_path, steps=4, command_line=True)
    with pytest.raises(CheckpointError, match=r"trained with --precision bf16, not fp32$"):
        cli_made.resume()
