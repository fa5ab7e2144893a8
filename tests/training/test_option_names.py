"""The training options' errors name what the user gave: ``TrainOptions``' fields (and the
``Trainer``'s checks of them) from Python, the options from ``rnnkit train``."""

from __future__ import annotations

import math
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
from rnnkit.errors import CheckpointError, ConfigError, RunFinished
from rnnkit.models.language_model import LanguageModel
from rnnkit.training.loop import Trainer, TrainOptions
from rnnkit.training.nonfinite import TrainingDiverged

V, E, H = 10, 5, 6
PER_EPOCH = 4  # StreamBatcher(110 ids, batch 3, segments of 9) -> 4 batches per epoch


@pytest.fixture(autouse=True)
def _one_thread(single_thread):
    yield


def make_trainer(out=None, step_fn=None, dist_ctx=None, **options):
    torch.manual_seed(0)
    model = LanguageModel(nn.Embedding(V, E), LSTM(E, H), nn.Linear(H, V))
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    batches = StreamBatcher(np.random.default_rng(0).integers(0, V, size=110), 3, 9)
    assert len(batches) == PER_EPOCH

    def step(m, batch, carry):
        return m.loss(batch.inputs, batch.targets, state=carry)

    opts = TrainOptions(quiet=True, **options)
    return Trainer(model, opt, batches, step_fn or step, opts, out_dir=out, dist_ctx=dist_ctx)


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
            {"min_gain": 1.0},
            "TrainOptions: min_gain must be a number in [0, 1) (a fraction of the validation "
            "loss), got 1.0",
            ["--min-gain", "1"],
            "--min-gain must be in [0, 1) (a fraction of the validation loss), got 1.0",
        ),
        (
            {"snapshot_every": -1.0},
            "TrainOptions: snapshot_every must be a number of seconds ≥ 0, got -1.0",
            ["--snapshot-every", "-1"],
            "--snapshot-every must be a number of seconds ≥ 0, got -1.0",
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


def cli_run(tmp_path, capsys, *extra: str) -> tuple[int, str]:
    """``rnnkit train`` on 20 tiny lines (no report): its exit status and stderr."""
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "t.txt").write_text("abc\n" * 20)
    tiny = ["--hidden", "8", "--embedding", "8", "--batch-size", "4", "--ngram-order", "2"]
    args = ["train", "--train", str(tmp_path / "t.txt"), "--out", str(tmp_path / "o"), *tiny]
    code = cli_main([*args, "--no-report", *extra])
    return code, capsys.readouterr().err.strip()


def test_the_divergence_advice_names_the_options_as_given(tmp_path, capsys):
    """The advice after a non-finite loss or an update float32 cannot hold said ``--lr``
    and ``--clip-norm`` to Python callers: from Python the rate is the optimizer's and
    ``clip_norm`` the field."""

    calls = []

    def nan_loss(m, batch, carry):  # from the second step: after an update
        out = m.loss(batch.inputs, batch.targets, state=carry)
        calls.append(1)
        return out._replace(loss=out.loss * math.nan) if len(calls) > 1 else out

    with pytest.raises(
        TrainingDiverged,
        match=r"^the training loss is nan at step 2 .*\(lower the optimizer's lr or set "
        r"clip_norm\)$",
    ):
        make_trainer(steps=2, step_fn=nan_loss).fit()
    overflowing = make_trainer(steps=2)
    for group in overflowing.optimizer.param_groups:
        group["lr"] = 1e39  # SGD's update lr·g: a rate past float32
    with pytest.raises(
        TrainingDiverged, match=r"^the update overflows float32 .*\(lower the optimizer's lr\)$"
    ):
        overflowing.fit()
    # Adam's first update (10·lr) makes the weights ~1e38: the next loss is inf (no
    # validation before it: that would find the weights' NaN first)
    code, err = cli_run(
        tmp_path / "inf", capsys, "--steps", "6", "--lr", "1e37", "--eval-every", "6", "--quiet"
    )
    # clipping is on (the command line's default, 5): lower it, not "set" it
    assert code != 0 and re.search(
        r"error: the training loss is inf at step 2 .*\(lower --lr or lower --clip-norm "
        r"\(now 5\)\)$",
        err,
    ), err
    code, err = cli_run(tmp_path / "noclip", capsys, "--steps", "6", "--lr", "1e37",
                        "--eval-every", "6", "--quiet", "--no-clip")  # fmt: skip
    assert code != 0 and re.search(r"\(lower --lr or set --clip-norm\)$", err), err
    code, err = cli_run(tmp_path / "overflow", capsys, "--steps", "2", "--lr", "1e38", "--quiet")
    assert code != 0 and re.search(r"error: the update overflows float32 .*\(lower --lr\)$", err)
    # SGD at 1e30: a finite first training loss, then weights whose validation loss is NaN
    # (the run exited 0 reporting "validation bits/char: recurrent nan"), or on other
    # processors finite weights, 1.4e30 nats a token from step 2 on (it exited 0 advising
    # to train longer)
    code, err = cli_run(tmp_path / "nan", capsys, "--steps", "3", "--lr", "1e30", "--quiet")
    assert code != 0 and re.search(
        r"error: (the validation loss is nan after step 1|the training loss is \S+ at step 2 "
        r".*, over a million times the first step's \(\S+\)): training diverged.* \(lower "
        r"--lr",
        err,
    ), err


def test_a_finished_run_names_steps_and_epochs_as_given(tmp_path, capsys):
    """``resume()`` of a finished run said ``raise --steps or --epochs`` from Python."""
    run = tmp_path / "py"
    make_trainer(run, steps=2).fit()
    (run / "summary.json").write_text("{}")  # what the run directory of a finished run holds
    with pytest.raises(RunFinished, match=r"\(raise steps or epochs to train further\)$"):
        make_trainer(run, steps=2).resume()
    cli = tmp_path / "cli"
    assert cli_run(cli, capsys, "--steps", "2", "--quiet")[0] == 0
    code, err = cli_run(cli, capsys, "--steps", "2", "--resume")
    assert code == 0 and "unchanged (raise --steps or --epochs to train further)\n" in err, err


def test_a_tensorboard_directory_that_cannot_be_made_is_named_as_given(tmp_path, capsys):
    """(``rnnkit train`` refuses a ``--tensorboard`` that is a file first, and a missing
    package: tests/training/test_tensorboard.py.)"""
    pytest.importorskip("tensorboard")
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    below = blocker / "below"
    with pytest.raises(ConfigError, match=rf"^tensorboard={re.escape(repr(str(below)))}: cannot"):
        make_trainer(steps=1, tensorboard=str(below)).fit()
    code, err = cli_run(tmp_path, capsys, "--steps", "1", "--quiet", "--tensorboard", str(below))
    assert code == 2 and err.startswith(f"rnnkit train: error: --tensorboard {below}: cannot"), err


def test_too_many_threads_are_named_as_given(tmp_path, capsys, monkeypatch):
    """``threads`` above the machine's limit said ``--threads`` to Python callers; the
    command line checks ``--threads`` itself, and ``RNNKIT_THREADS`` is named as such."""
    from rnnkit.threads import max_threads

    many = max_threads() + 1
    with pytest.raises(ConfigError, match=rf"^threads must be at most \d+ .*got {many}$"):
        make_trainer(steps=1, threads=many).fit()
    trainer = make_trainer(steps=1, threads=1)
    trainer.fit()
    assert trainer.history  # trained
    code, err = cli_run(tmp_path, capsys, "--steps", "1", "--quiet", "--threads", str(many))
    assert code == 2 and re.search(rf"error: --threads must be at most \d+ .*got {many}$", err)
    monkeypatch.setenv("RNNKIT_THREADS", str(many))
    with pytest.raises(ConfigError, match=r"^RNNKIT_THREADS must be at most "):
        make_trainer(steps=1).fit()


def test_the_note_of_the_thread_count_names_the_setting_as_given():
    from rnnkit.threads import ThreadGovernor

    python = ThreadGovernor(1).start()
    python.stop()
    assert python.note == "threads: 1 (fixed by threads/RNNKIT_THREADS)"
    cli = ThreadGovernor(1, name="--threads").start()
    cli.stop()
    assert cli.note == "threads: 1 (fixed by --threads/RNNKIT_THREADS)"
    automatic = ThreadGovernor(None, recheck_s=60.0)
    automatic.fixed = None  # whatever RNNKIT_THREADS says: choose
    assert automatic.start().note.endswith("; threads=N to fix)")
    automatic.stop()


def test_a_batch_that_cannot_be_split_over_the_processes_is_named_as_given():
    """Only a Python caller's batches get there (``rnnkit train`` checks ``--batch-size``
    against the processes first); they are not ``rnnkit train``'s option."""
    from rnnkit.training.distributed import DistContext, ShardedBatches

    batches = StreamBatcher(np.arange(110) % V, 3, 9)  # 3 rows over 2 processes
    two = DistContext(rank=0, world_size=2)
    with pytest.raises(ConfigError, match=r"; give batches of a number of rows divisible by"):
        next(iter(ShardedBatches(batches, two)))
    with pytest.raises(ConfigError, match=r"; choose --batch-size divisible by their number$"):
        next(iter(ShardedBatches(batches, two, "--batch-size")))


def test_snapshot_every_on_the_command_line_is_finite(tmp_path, capsys):
    """``inf`` (no clock) is a Python value only: config.json, strict JSON, cannot hold
    it, and the run could not be read back."""
    err = train_cli(tmp_path, capsys, "--snapshot-every", "inf")
    assert "--snapshot-every must be a number of seconds ≥ 0, got inf" in err
