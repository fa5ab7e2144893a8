"""Learning-rate schedules: the rates the Trainer uses equal torch.optim.lr_scheduler's
reference schedules (and the closed forms); exact resume; --init-range; bad input."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from torch import nn

from rnnkit import LSTM
from rnnkit.app.cli.main import main as cli_main
from rnnkit.app.config import TrainConfig
from rnnkit.data.batching import StreamBatcher
from rnnkit.errors import ConfigError
from rnnkit.models.language_model import LanguageModel
from rnnkit.training.loop import Trainer, TrainOptions
from rnnkit.training.schedules import LRSchedule, build_lr_schedulers, parse_lr_schedule

V, E, H = 10, 5, 6
PER_EPOCH = 4  # StreamBatcher(110 ids, batch 3, segments of 9) -> 4 batches per epoch


@pytest.fixture(autouse=True)
def _one_thread(single_thread):
    yield


def make_trainer(out=None, optimizer="sgd", lr=1.0, seed=0, **options):
    torch.manual_seed(seed)
    model = LanguageModel(nn.Embedding(V, E), LSTM(E, H), nn.Linear(H, V))
    opt = (torch.optim.SGD if optimizer == "sgd" else torch.optim.Adam)(model.parameters(), lr=lr)
    ids = np.random.default_rng(0).integers(0, V, size=110)
    batches = StreamBatcher(ids, 3, 9)
    assert len(batches) == PER_EPOCH

    def step(m, batch, carry):
        return m.loss(batch.inputs, batch.targets, state=carry)

    scheduler = options.pop("scheduler", None)
    opts = TrainOptions(**{"quiet": True, "clip_norm": 1.0, "log_every": 1, **options})
    return Trainer(model, opt, batches, step, opts, out_dir=out, scheduler=scheduler)


def trainer_rates(trainer):
    """The learning rate of every step the trainer took (from its train events)."""
    return [e["lr"] for e in trainer.history if e["event"] == "train"]


def reference_rates(make_scheduler, steps, epoch_level=False, lr=1.0):
    """The rates a torch scheduler gives, stepped per step (or per epoch)."""
    p = nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=lr)
    sched = make_scheduler(opt)
    rates = []
    for s in range(steps):
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        if not epoch_level or (s + 1) % PER_EPOCH == 0:
            sched.step()
    return rates


# -- the schedules ------------------------------------------------------------------------------
@pytest.mark.parametrize("factor", [0.5, 0.3])
def test_step_schedule_is_multistep_decay_after_epoch_e(factor):
    epochs, after = 6, 2
    trainer = make_trainer(epochs=epochs, lr_schedule=f"step:{after}:{factor}")
    trainer.fit()
    # The reference: torch's MultiStepLR stepped at the end of each epoch, decaying at the
    # end of epochs E, E+1, ... (Zaremba et al.'s "halve after epoch 4" is step:4:0.5).
    want = reference_rates(
        lambda o: torch.optim.lr_scheduler.MultiStepLR(
            o, milestones=list(range(after, epochs)), gamma=factor
        ),
        epochs * PER_EPOCH,
        epoch_level=True,
    )
    got = trainer_rates(trainer)
    assert got == pytest.approx(want, rel=1e-12, abs=0)
    # and by hand: epochs 1..E at lr, then lr·F, lr·F², ...
    by_hand = [factor ** max(0, s // PER_EPOCH + 1 - after) for s in range(epochs * PER_EPOCH)]
    assert got == pytest.approx(by_hand, rel=1e-12, abs=0)
    if factor == 0.5:
        assert got == want  # powers of two: bit for bit


def test_cosine_with_warmup_matches_the_closed_form_and_torch():
    steps, warm, lr = 14, 3, 0.8
    trainer = make_trainer(steps=steps, lr=lr, lr_schedule="cosine", warmup=warm)
    trainer.fit()
    got = trainer_rates(trainer)
    want = reference_rates(
        lambda o: torch.optim.lr_scheduler.SequentialLR(
            o,
            [
                torch.optim.lr_scheduler.LinearLR(o, 1 / (warm + 1), 1.0, total_iters=warm),
                torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=steps - warm),
            ],
            milestones=[warm],
        ),
        steps,
        lr=lr,
    )
    assert got == want
    closed = [lr * (k + 1) / (warm + 1) for k in range(warm)] + [
        lr * (1 + math.cos(math.pi * k / (steps - warm))) / 2 for k in range(steps - warm)
    ]
    assert got == pytest.approx(closed, rel=1e-9, abs=1e-12)


def test_constant_with_warmup_ramps_then_holds():
    trainer = make_trainer(steps=8, lr=0.4, optimizer="adam", lr_schedule="constant", warmup=3)
    trainer.fit()
    assert trainer_rates(trainer) == pytest.approx([0.1, 0.2, 0.3] + [0.4] * 5, rel=1e-12)


def test_a_warmup_without_a_schedule_ramps_to_the_constant_rate():
    # before: TrainOptions(warmup=3) without lr_schedule was ignored (the rate was 0.4 from
    # the first step)
    trainer = make_trainer(steps=8, lr=0.4, optimizer="adam", warmup=3)
    trainer.fit()
    assert trainer_rates(trainer) == pytest.approx([0.1, 0.2, 0.3] + [0.4] * 5, rel=1e-12)


def test_a_warmup_beside_ones_own_scheduler_is_refused():
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    mine = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1.0)
    with pytest.raises(ValueError, match=r"options\.warmup or scheduler/plateau"):
        make_trainer(warmup=2, scheduler=mine)


def test_constant_keeps_the_rate():
    trainer = make_trainer(steps=6, lr=0.25, lr_schedule="constant")
    trainer.fit()
    assert trainer_rates(trainer) == [0.25] * 6


def test_plateau_multiplies_by_the_decay_at_each_flat_validation():
    calls = []

    def flat(model):
        calls.append(1)
        return {"loss_nats": 1.0}  # never improves after the first

    trainer = make_trainer(steps=12, lr_schedule="plateau", lr_decay=0.5)
    trainer.evaluate_fn = flat  # validation at each epoch's end (steps 4, 8, 12)
    trainer.fit()
    rates = trainer_rates(trainer)
    # ReduceLROnPlateau(factor 0.5, patience 0): the first validation sets the best, each
    # later one without improvement halves the rate.
    assert rates == [1.0] * 8 + [0.5] * 4
    valid = [e for e in trainer.history if e["event"] == "valid"]
    assert [e["lr"] for e in valid] == [1.0, 1.0, 0.5]


def test_exact_resume_with_a_schedule_and_warmup(tmp_path):
    common = dict(epochs=5, lr=0.5, lr_schedule="step:2:0.5", warmup=3)
    straight = make_trainer(tmp_path / "a", **common)
    straight.fit()
    first = make_trainer(tmp_path / "b", **{**common, "epochs": None, "steps": 10})
    first.fit()
    resumed = make_trainer(tmp_path / "b", seed=9, **common)
    resumed.resume()
    resumed.fit()
    for k, v in straight.model.state_dict().items():
        assert torch.equal(v, resumed.model.state_dict()[k]), k
    assert trainer_rates(first) + trainer_rates(resumed) == trainer_rates(straight)
    logged = [
        json.loads(line)["lr"]
        for line in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()
        if json.loads(line)["event"] == "train"
    ]
    assert logged == trainer_rates(straight)


# -- --init-range -------------------------------------------------------------------------------
def test_init_range_draws_every_parameter_uniformly_in_the_range():
    r = 0.05
    trainer = make_trainer(steps=1, init_range=r)
    values = torch.cat([p.detach().flatten() for p in trainer.model.parameters()])
    assert float(values.abs().max()) <= r
    # uniform on [-r, r]: mean ≈ 0, variance r²/3 (the model's own init is wider)
    assert abs(float(values.mean())) < 0.1 * r
    assert float(values.var()) == pytest.approx(r * r / 3, rel=0.15)
    for name, p in trainer.model.named_parameters():
        assert float(p.detach().abs().max()) > 0.5 * r, name  # every tensor re-drawn


# -- bad input ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "spec, message",
    [
        ("linear", r"^lr_schedule must be one of"),
        ("step", "needs an epoch E and a factor F"),
        ("step:4", "needs an epoch E and a factor F"),
        ("step:x:0.5", "integer epoch E"),
        ("step:4:half", "a number F"),
        ("step:0:0.5", "E ≥ 1"),
        ("step:4:0", "F > 0"),
        ("step:4:-0.5", "F > 0"),
        ("step:4:nan", "F > 0"),
    ],
)
def test_bad_schedules_name_the_option(spec, message):
    with pytest.raises(ConfigError, match=message):
        parse_lr_schedule(spec)


def test_parse_accepts_the_four_forms():
    assert parse_lr_schedule("step:4:0.5") == LRSchedule("step", 4, 0.5)
    assert [parse_lr_schedule(s).kind for s in ("constant", "plateau", "cosine")] == [
        "constant",
        "plateau",
        "cosine",
    ]


def test_step_past_the_last_epoch_is_refused():
    with pytest.raises(ConfigError, match=r"--lr-schedule step:13:0\.5 never decays"):
        TrainConfig(train="x", epochs=13, lr_schedule="step:13:0.5").validate()
    TrainConfig(train="x", epochs=13, lr_schedule="step:12:0.5").validate()
    # with a step budget, the Trainer knows the epochs
    p = nn.Parameter(torch.zeros(1))
    with pytest.raises(ConfigError, match="never decays"):
        build_lr_schedulers(
            torch.optim.SGD([p], lr=1.0),
            parse_lr_schedule("step:3:0.5"),
            steps_per_epoch=4,
            total_steps=12,
        )


def test_cosine_needs_a_length():
    with pytest.raises(ConfigError, match="cosine needs the run's length"):
        TrainConfig(train="x", epochs=None, lr_schedule="cosine").validate()


@pytest.mark.parametrize("r", [0.0, -0.1])
def test_init_range_must_be_positive(r):
    with pytest.raises(ConfigError, match="--init-range must be > 0"):
        TrainConfig(train="x", init_range=r).validate()


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--lr-schedule", "exp"], "--lr-schedule must be one of"),
        (["--lr-schedule", "step:4:0"], "--lr-schedule step:E:F needs a factor F > 0"),
        (["--epochs", "3", "--lr-schedule", "step:4:0.5"], "never decays"),
        (["--init-range", "0"], "--init-range must be > 0"),
        (["--init-range", "-0.1"], "--init-range must be > 0"),
        (["--warmup", "-1"], "--warmup must be"),
    ],
)
def test_cli_bad_schedule_options_are_one_line_exit_2(tmp_path, capsys, extra, message):
    (tmp_path / "t.txt").write_text("abc\n" * 20)
    code = cli_main(
        ["train", "--train", str(tmp_path / "t.txt"), "--out", str(tmp_path / "o"), *extra]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and message in err, err
    assert not (tmp_path / "o").exists()
