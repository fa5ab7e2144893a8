"""The training loop: carried state, exact resume, non-finite losses, clipping, stopping."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch
from torch import nn

from rnnkit import GRU, LSTM
from rnnkit.data.batching import SequenceBatcher, StreamBatcher, lm_pairs
from rnnkit.errors import CheckpointError, ConfigError
from rnnkit.models.language_model import LanguageModel
from rnnkit.training.budget import CAP_EPOCHS, CAP_MIN_STEPS, default_patience
from rnnkit.training.checkpoint import load_model_weights, load_snapshot
from rnnkit.training.loop import Trainer, TrainOptions
from rnnkit.training.nonfinite import TrainingDiverged
from rnnkit.types import LSTMState

V, E, H = 12, 6, 8
BOUNDARY = 3  # a document separator inside the stream


@pytest.fixture(autouse=True)
def _one_thread(single_thread):
    # Tiny models: threads only add contention (and time) on a shared machine.
    yield


def stream_ids(n=200, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(4, V, size=n)
    ids[rng.choice(n, size=12, replace=False)] = BOUNDARY
    return ids


def sequences(n=17, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(4, V, size=int(rng.integers(2, 9))) for _ in range(n)]


def stream_step(model, batch, carry):
    return model.loss(batch.inputs, batch.targets, state=carry, starts=batch.starts)


def window_step(model, batch, carry):
    return model.loss(batch.inputs, batch.targets, mask=batch.mask, window=2)


def make_trainer(
    out=None,
    mode="stream",
    seed=0,
    dropout=0.3,
    step_fn=None,
    evaluate_fn=None,
    optimizer="adam",
    plateau=False,
    **options,
):
    """A tiny LM with dropout, Adam, and stream (carried state) or sequence batches."""
    torch.manual_seed(seed)
    enc = (LSTM if mode == "stream" else GRU)(E, H, num_layers=2, dropout=dropout)
    model = LanguageModel(nn.Embedding(V, E), enc, nn.Linear(H, V), dropout=dropout)
    if optimizer == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
    if mode == "stream":
        batches = StreamBatcher(stream_ids(), 3, 7, boundary_id=BOUNDARY)  # 10 per epoch
        default_step = stream_step
    else:
        pairs = [lm_pairs(s, 1, 2) for s in sequences()]
        batches = SequenceBatcher(
            [p[0] for p in pairs], [p[1] for p in pairs], batch_size=4, seed=7
        )  # 5 per epoch, shuffled
        default_step = window_step
    opts = TrainOptions(**{"quiet": True, "clip_norm": 1.0, "log_every": 1, **options})
    return Trainer(
        model,
        opt,
        batches,
        step_fn or default_step,
        opts,
        evaluate_fn=evaluate_fn,
        plateau=(
            torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=0)
            if plateau
            else None
        ),
        out_dir=out,
    )


def weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs by {float((a[k] - b[k]).abs().max())}"


# -- options ----------------------------------------------------------------------------------
def test_options_are_fixed_once_the_trainer_is_made_and_a_new_budget_is_a_new_trainer():
    t = make_trainer(steps=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.options.steps = 5  # would be ignored: the budget was resolved when t was made
    assert t.fit().steps == 3
    options = dataclasses.replace(t.options, steps=2)
    more = Trainer(t.model, t.optimizer, t.batches, stream_step, options)
    assert more.fit().steps == 2


# -- carried state ----------------------------------------------------------------------------
def test_carry_is_the_detached_previous_state_and_resets_each_epoch():
    seen, returned = [], []

    def step(model, batch, carry):
        seen.append(carry)
        out = stream_step(model, batch, carry)
        returned.append(out.state)
        return out

    trainer = make_trainer(step_fn=step, steps=13)
    trainer.fit()
    assert len(seen) == 13
    for i, carry in enumerate(seen):
        if i % 10 == 0:  # first segment of an epoch: streams start over
            assert carry is None
            continue
        prev = returned[i - 1]
        assert isinstance(carry, LSTMState)
        for got, before in zip(carry, prev, strict=True):
            assert before.requires_grad  # the state as computed is in a graph ...
            assert got.grad_fn is None and not got.requires_grad  # ... the carry is not
            assert torch.equal(got, before)


# -- exact resume -----------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["stream", "sequence"])
def test_n_steps_resume_m_steps_equals_n_plus_m(tmp_path, mode):
    n, total = 6, 14  # crosses an epoch boundary after the resume
    straight = make_trainer(tmp_path / "a", mode, steps=total)
    straight.fit()

    first = make_trainer(tmp_path / "b", mode, steps=n)
    first.fit()
    after_n = weights(first.model)
    if mode == "stream":
        assert first.carry is not None  # the snapshot must carry the state mid-epoch
    torch.manual_seed(12345)  # another process: other RNG state, other initial weights
    resumed = make_trainer(tmp_path / "b", mode, seed=99, steps=total)
    resumed.resume()
    assert resumed.step == n
    assert_same(weights(resumed.model), after_n)
    # the log marks where this attempt went on (readers drop what a killed one logged past)
    last = json.loads((tmp_path / "b" / "metrics.jsonl").read_text().splitlines()[-1])
    assert last == {"event": "resumed", "step": n}
    resumed.fit()

    assert_same(weights(resumed.model), weights(straight.model))
    assert not torch.equal(after_n["head.weight"], straight.model.head.weight)
    # The run directory's weights are the final ones (no validation: latest = best).
    for run in ("a", "b"):
        fresh = make_trainer(mode=mode, seed=5).model
        load_model_weights(fresh, tmp_path / run / "model.safetensors")
        assert_same(weights(fresh), weights(straight.model))


def test_a_shuffling_dataloader_trains_and_resumes_exactly(tmp_path):
    """A torch DataLoader (no state_dict, no position) is a batcher too: fit() read its
    ``position`` and failed. n steps and a resume to 14 equal 14 straight, across epochs."""
    data = torch.utils.data.TensorDataset(
        torch.randint(4, V, (20, 5)), torch.randint(4, V, (20, 5))
    )

    def trainer(out, seed, steps):
        torch.manual_seed(seed)
        model = LanguageModel(nn.Embedding(V, E), GRU(E, H), nn.Linear(H, V), dropout=0.3)
        batches = torch.utils.data.DataLoader(data, batch_size=4, shuffle=True)  # 5 an epoch
        opts = TrainOptions(quiet=True, steps=steps, log_every=1)
        step = lambda m, b, carry: m.loss(b[0], b[1])  # noqa: E731
        return Trainer(
            model, torch.optim.Adam(model.parameters(), lr=0.01), batches, step, opts, out_dir=out
        )

    straight = trainer(tmp_path / "a", 0, 14)
    straight.fit()
    trainer(tmp_path / "b", 0, 7).fit()
    torch.manual_seed(12345)
    resumed = trainer(tmp_path / "b", 99, 14)
    resumed.resume()
    assert resumed.step == 7
    resumed.fit()
    assert_same(weights(resumed.model), weights(straight.model))


def test_resume_into_a_differently_shaped_batcher_is_refused(tmp_path):
    make_trainer(tmp_path, steps=3).fit()
    other = make_trainer(tmp_path, steps=5)
    other.batches = StreamBatcher(stream_ids(), 4, 7)
    with pytest.raises(CheckpointError, match="batch_size"):
        other.resume()


@pytest.mark.parametrize("split", [8, 3], ids=["after-a-validation", "before-any"])
def test_resume_is_exact_with_sgd_and_plateau_decay(tmp_path, split):
    """Before its first validation the plateau's best is inf, which the snapshot's strict
    JSON writes as null: resumed, it is inf again (it was None: a TypeError at the next
    validation)."""

    def flat(model):
        return {"loss_nats": 1.0}  # never improves: the plateau decays at every validation

    common = dict(mode="stream", optimizer="sgd", plateau=True, evaluate_fn=flat, eval_every=5)
    straight = make_trainer(tmp_path / "a", steps=14, **common)
    straight.fit()
    make_trainer(tmp_path / "b", steps=split, **common).fit()
    resumed = make_trainer(tmp_path / "b", steps=14, **common)
    resumed.resume()
    resumed.fit()
    assert_same(weights(resumed.model), weights(straight.model))


# -- when snapshots are taken -----------------------------------------------------------------
def _snapshot_steps(monkeypatch) -> list[int]:
    """The steps at which the trainer writes a snapshot, recorded as it goes."""
    from rnnkit.training import loop

    steps: list[int] = []
    real = loop.save_trainer

    def recording(trainer):
        steps.append(trainer.step)
        real(trainer)

    monkeypatch.setattr(loop, "save_trainer", recording)
    return steps


@pytest.mark.parametrize(
    ("every", "expected"),
    [(math.inf, [1, 2, 5, 7]), (0, [1, 2, 3, 4, 5, 6, 7]), (1e-12, [1, 2, 3, 4, 5, 6, 7])],
    ids=["no-clock", "zero", "clock-always-due"],
)
def test_a_snapshot_at_the_first_validation_each_new_best_and_the_end(
    tmp_path, monkeypatch, every, expected
):
    """Between those, at most every ``snapshot_every`` seconds: with no clock (inf) only
    the first validation (step 1), the new bests (2, 5) and the end (7)."""
    steps = _snapshot_steps(monkeypatch)
    losses = [3.0, 2.0, 2.5, 2.6, 1.0, 1.1, 1.2]
    trainer = make_trainer(
        tmp_path, evaluate_fn=_worsening(losses), steps=7, eval_every=1, snapshot_every=every
    )
    trainer.fit()
    assert steps == expected
    assert json.loads((tmp_path / "latest.json").read_text())["step"] == 7


def test_early_stopping_takes_a_snapshot_where_it_stops(tmp_path, monkeypatch):
    steps = _snapshot_steps(monkeypatch)
    losses = [3.0, 2.0, 2.5, 2.4, 2.1]  # best at step 2; patience 3 stops at step 5
    make_trainer(
        tmp_path, evaluate_fn=_worsening(losses), steps=50, eval_every=1, patience=3,
        snapshot_every=math.inf,
    ).fit()  # fmt: skip
    assert steps == [1, 2, 5]


class _Killed(BaseException):
    """The process dies inside a step (as by SIGKILL: nothing is saved)."""


def test_a_run_killed_between_snapshots_resumes_from_the_last_and_ends_as_the_straight_run(
    tmp_path, monkeypatch
):
    """Killed in step 7 with its last snapshot at step 2 (the last new best; the clock
    never due), the run resumes at step 2, trains steps 3-6 again, and ends with the
    weights, best and files of the run that was never killed."""
    losses = [3.0, 2.0, 2.5, 2.6, 2.7, 2.8, 2.9, 1.5]  # new bests at steps 1, 2 and 8
    options = dict(steps=8, eval_every=1, snapshot_every=math.inf)
    straight = make_trainer(tmp_path / "a", evaluate_fn=_worsening(losses), **options)
    straight.fit()

    calls = []

    def dies_in_step_7(model, batch, carry):
        calls.append(1)
        if len(calls) == 7:
            raise _Killed
        return stream_step(model, batch, carry)

    killed = make_trainer(
        tmp_path / "b", evaluate_fn=_worsening(losses), step_fn=dies_in_step_7, **options
    )
    with pytest.raises(_Killed):
        killed.fit()
    assert json.loads((tmp_path / "b" / "latest.json").read_text())["step"] == 2
    resumed = make_trainer(tmp_path / "b", evaluate_fn=_worsening(losses[2:]), seed=9, **options)
    resumed.resume()
    assert resumed.step == 2
    result = resumed.fit()
    assert result.best_valid == {"step": 8, "loss_nats": 1.5}
    assert_same(weights(resumed.model), weights(straight.model))
    for run in ("a", "b"):
        saved = make_trainer(seed=5).model
        load_model_weights(saved, tmp_path / run / "model.safetensors")
        assert_same(weights(saved), weights(straight.model))


def test_processes_take_a_snapshot_where_any_one_wants_it():
    """Saving is collective: a process whose clock or validation loss says no saves too
    when another says yes (its all-reduce is faked here: the other process's flag)."""
    import time

    from rnnkit.training.distributed import DistContext

    @dataclasses.dataclass(frozen=True)
    class TwoProcesses(DistContext):
        other: float = 0.0  # the other process's flag

        def all_sum(self, *values: float) -> list[float]:
            return [v + self.other for v in values]

    trainer = make_trainer(snapshot_every=math.inf)
    trainer._saved_at = time.perf_counter()  # a snapshot was just written
    for other, anyway, wanted in [(0.0, False, False), (1.0, False, True), (0.0, True, True)]:
        trainer.dist = TwoProcesses(world_size=2, other=other)
        assert trainer._snapshot_wanted(anyway) is wanted, (other, anyway)


def test_snapshot_every_must_be_seconds_at_least_zero():
    for bad in (-1.0, math.nan, True, "30"):
        with pytest.raises(ConfigError, match="snapshot_every must be a number of seconds ≥ 0"):
            TrainOptions(snapshot_every=bad)


# -- non-finite losses ------------------------------------------------------------------------
def poisoned(at, what="loss"):
    """A step function whose ``at``-th call (1-based) yields a NaN loss or NaN gradient."""
    calls = []

    def step(model, batch, carry):
        calls.append(carry)
        out = stream_step(model, batch, carry)
        if len(calls) == at:
            if what == "loss":
                out = out._replace(loss=out.loss * float("nan"))
            else:  # finite loss, NaN gradient: 0 · d sqrt(x)/dx at x = 0
                p = model.head.weight
                out = out._replace(loss=out.loss + 0.0 * torch.sqrt(p - p.detach()).sum())
        return out

    return step, calls


@pytest.mark.parametrize(("what", "words"), [("loss", "training loss"), ("grad", "gradient norm")])
def test_nan_stops_training_naming_the_step_and_keeps_the_last_good_checkpoint(
    tmp_path, what, words
):
    step, _ = poisoned(5, what)
    trainer = make_trainer(tmp_path, step_fn=step, steps=10, eval_every=2, snapshot_every=0)
    with pytest.raises(
        TrainingDiverged, match=rf"{words} is nan at step 5\b.*; the last good checkpoint is kept"
    ):
        trainer.fit()
    assert trainer.step == 4
    pointer = json.loads((tmp_path / "latest.json").read_text())
    assert pointer["step"] == 4
    names = sorted(p.name for p in (tmp_path / "snapshots").iterdir())
    assert [n.rsplit("-", 1)[0] for n in names] == ["step-000000004"]
    # The NaN step changed nothing: the model is still the step-4 model, and so are both
    # the snapshot and model.safetensors.
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    fresh = make_trainer(seed=3)
    state, _ = load_snapshot(tmp_path, fresh.model, fresh.optimizer)
    assert state["step"] == 4
    assert_same(weights(fresh.model), weights(trainer.model))
    fresh2 = make_trainer(seed=4)
    load_model_weights(fresh2.model, tmp_path / "model.safetensors")
    assert_same(weights(fresh2.model), weights(trainer.model))


@pytest.mark.parametrize("out", [True, False], ids=["fresh run", "no output directory"])
def test_a_divergence_before_any_checkpoint_does_not_claim_one(tmp_path, out):
    # before: "the last good checkpoint is kept" where no checkpoint had been written
    step, _ = poisoned(3)
    trainer = make_trainer(tmp_path if out else None, step_fn=step, steps=10, eval_every=5)
    with pytest.raises(TrainingDiverged, match=r"at step 3 .*; no checkpoint was written \("):
        trainer.fit()
    assert not (tmp_path / "latest.json").exists()


def test_an_update_float32_cannot_hold_stops_naming_the_step(tmp_path):
    """Adam's first update is lr / (1 - β1) = 10·lr: with lr 1e38 it is past float32, which
    torch refused with a RuntimeError traceback. Now a divergence naming the step and the
    rate; no snapshot is written."""
    trainer = make_trainer(tmp_path, steps=3, eval_every=1)
    for group in trainer.optimizer.param_groups:
        group["lr"] = 1e38
    with pytest.raises(
        TrainingDiverged,
        match=r"update overflows float32 at step 1 .*1e\+38\); no checkpoint was written",
    ):
        trainer.fit()
    assert trainer.step == 0 and not (tmp_path / "latest.json").exists()


@pytest.mark.parametrize("on_nonfinite", ["stop", "skip"])
def test_a_non_finite_validation_loss_stops_as_a_divergence(tmp_path, on_nonfinite):
    """Finite training losses can leave weights whose validation loss is NaN (a rate far
    too large): the run went on, reported NaN and picked those weights as its best."""
    seen = []

    def nan_after_the_first(model):
        seen.append(1)
        return {"loss_nats": 1.0 if len(seen) == 1 else math.nan, "tokens": 5}

    trainer = make_trainer(
        tmp_path, steps=6, eval_every=2, evaluate_fn=nan_after_the_first,
        on_nonfinite=on_nonfinite,
    )  # fmt: skip
    with pytest.raises(
        TrainingDiverged, match=r"^the validation loss is nan after step 4: training diverged"
    ):
        trainer.fit()
    assert trainer.best is not None and trainer.best["step"] == 2  # not the NaN weights


@pytest.mark.parametrize(("rise", "diverged"), [(1.1e6, True), (0.9e6, False)])
def test_a_training_loss_a_million_times_the_first_is_a_divergence(tmp_path, rise, diverged):
    """A rate far too large can leave weights that stay finite: a character model's
    training loss went from 2.07 nats a token to 1.4e29 at step 2, its validation loss
    was 1.5e30, and the run ended as if well, advising to train longer. A million times
    the first step's training loss (or than 1 nat, where that was less) is a divergence."""
    calls: list[float] = []

    def step(model, batch, carry):
        out = stream_step(model, batch, carry)
        calls.append(float(out.nats) / float(out.tokens))  # the loss a token, as read
        if len(calls) == 3:  # nats and loss, as the loop reads them, times rise·max(first, 1)
            scale = rise * max(calls[0], 1.0) * out.tokens / out.nats.detach()
            out = out._replace(loss=out.loss * scale, nats=out.nats * scale)
        return out

    trainer = make_trainer(tmp_path, step_fn=step, steps=4, eval_every=2)
    if diverged:
        with pytest.raises(
            TrainingDiverged,
            match=r"^the training loss is \S+ at step 3 \(batch 3 of epoch 0\), over a "
            r"million times the first step's \(\S+\): training diverged; the last good "
            r"checkpoint is kept \(lower",
        ):
            trainer.fit()
        assert trainer.step == 2
        # a regressor's squared error has its data's scale (one batch of values in the
        # thousands among ones): not held to it
        calls.clear()
        trainer = make_trainer(tmp_path / "values", step_fn=step, steps=4, counts="values")
        assert trainer.fit().steps == 4
    else:
        assert trainer.fit().steps == 4


def test_on_nonfinite_skip_skips_the_step(tmp_path):
    step, calls = poisoned(3)
    trainer = make_trainer(tmp_path, step_fn=step, steps=8, on_nonfinite="skip")
    before = weights(make_trainer().model)
    result = trainer.fit()
    assert result.steps == 8 and len(calls) == 9  # one extra batch replaced the bad one
    skipped = [e for e in result.history if e["event"] == "skipped"]
    assert len(skipped) == 1 and skipped[0]["step"] == 3
    assert calls[3] is None  # the state after a skipped batch is not carried
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    assert not torch.equal(before["head.weight"], trainer.model.head.weight)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert any(json.loads(line)["event"] == "skipped" for line in lines)


def test_skipping_stops_when_every_step_is_nonfinite(tmp_path):
    """Skipping is for a bad batch; weights that turned bad make every batch non-finite, and
    then training must end (it would otherwise skip forever without counting a step)."""
    from rnnkit.training.nonfinite import MAX_SKIPPED_STEPS

    def always_nan(model, batch, carry):
        out = stream_step(model, batch, carry)
        return out._replace(loss=out.loss * float("nan"))

    trainer = make_trainer(tmp_path, step_fn=always_nan, steps=5, on_nonfinite="skip")
    with pytest.raises(TrainingDiverged, match=rf"{MAX_SKIPPED_STEPS} steps in a row were skipped"):
        trainer.fit()
    skipped = [e for e in trainer.history if e["event"] == "skipped"]
    assert len(skipped) == MAX_SKIPPED_STEPS


def test_unknown_on_nonfinite_is_refused():
    with pytest.raises(ValueError, match="on_nonfinite"):
        make_trainer(on_nonfinite="ignore")


# -- clipping, validation, early stopping -----------------------------------------------------
def test_clip_norm_bounds_the_update_gradient():
    seen = []

    def hook(model, grad_norm, clipped):
        norm = torch.linalg.vector_norm(
            torch.stack([torch.linalg.vector_norm(p.grad) for p in model.parameters()])
        )
        seen.append((grad_norm, clipped, float(norm)))

    trainer = make_trainer(steps=5, clip_norm=0.05)
    trainer.grad_hook = hook
    result = trainer.fit()
    assert len(seen) == 5
    for pre, clipped, after in seen:
        assert clipped == (pre > 0.05)
        assert after == pytest.approx(min(pre, 0.05), rel=1e-5)
    assert result.clipped_steps == sum(c for _, c, _ in seen) > 0


def test_early_stopping_after_patience_validations(tmp_path):
    losses = iter([3.0, 2.0, 2.5, 2.4, 2.1, 1.0])

    def evaluate(model):
        assert not model.training
        return {"loss_nats": next(losses)}

    trainer = make_trainer(tmp_path, evaluate_fn=evaluate, steps=50, eval_every=2, patience=3)
    result = trainer.fit()
    assert result.stopped_early and result.steps == 10
    assert result.best_valid == {"step": 4, "loss_nats": 2.0}
    events = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [e["best"] for e in events if e["event"] == "valid"] == [
        True,
        True,
        False,
        False,
        False,
    ]
    assert events[-1] == {"event": "early_stop", "step": 10}
    assert all(math.isfinite(e["loss_nats"]) for e in events if e["event"] == "train")


# min_gain 0.25 (relative): each value a power-of-two fraction, so every threshold is exact.
# Gains (ref r, a gain below r - r/4): 2.0 (first: r = 2, below 1.5 next), 1.25 (< 1.5:
# r = 1.25, below 0.9375 next; 1.5 itself, equal, was none), 0.875 (< 0.9375; 0.9375 was
# none: r = 0.875, below 0.65625 next). Each validation (every 2 steps) is a new lowest
# loss, so the best weights move at every one; the patience of 3 counts from the last gain.
MIN_GAIN_LOSSES = [2.0, 1.75, 1.5, 1.25, 1.0, 0.9375, 0.875, 0.8125, 0.75, 0.6875, 0.0]
#                  s2   s4    s6   s8    s10  s12     s14    s16     s18   s20


def test_min_gain_decides_the_patience_and_the_best_is_still_the_lowest_loss(tmp_path):
    trainer = make_trainer(
        tmp_path, evaluate_fn=_worsening(MIN_GAIN_LOSSES), steps=22, eval_every=2,
        patience=3, min_gain=0.25,
    )  # fmt: skip
    result = trainer.fit()
    # 3 validations after the gain at step 14 (0.8125, 0.75, 0.6875): stopped at step 20
    assert result.stopped_early and result.steps == 20
    assert result.stopped == "no gain above min_gain=0.25 for 3 validations (best at step 20)"
    assert result.best_valid == {"step": 20, "loss_nats": 0.6875}
    valids = [e for e in result.history if e["event"] == "valid"]
    assert [e["best"] for e in valids] == [True] * 10
    # the oracle of the weights kept: the same run stopped at step 20
    at_best = make_trainer(steps=20)
    at_best.fit()
    saved = make_trainer(seed=3).model
    load_model_weights(saved, tmp_path / "model.safetensors")
    assert_same(weights(saved), weights(at_best.model))
    # The other side of the threshold: with min_gain 0 every fall is a gain, so it never
    # stops early; at 0.1 every fall is a gain (1.75 < 1.8, 1.5 < 1.575, ...) but 0.9375
    # (>= 0.9), 0.8125 (>= 0.7875) and 0.6875 (>= 0.675), none 3 in a row: it runs its 22.
    for gain in (0.0, 0.1):
        other = make_trainer(
            evaluate_fn=_worsening(MIN_GAIN_LOSSES), steps=22, eval_every=2, patience=3,
            min_gain=gain,
        )  # fmt: skip
        assert other.fit().stopped == "22 steps done"


def test_min_gain_stops_a_run_whose_loss_creeps_down():
    # A fall of 1e-9 nats a validation: a gain for min_gain 0 (the run goes to its end),
    # none for the default 1e-4 (stopped after the patience of 3: at step 8).
    creeping = [2.0 - k * 1e-9 for k in range(10)]
    assert make_trainer(
        evaluate_fn=_worsening(creeping), steps=20, eval_every=2, patience=3, min_gain=0.0
    ).fit().stopped == "20 steps done"  # fmt: skip
    trainer = make_trainer(evaluate_fn=_worsening(creeping), steps=20, eval_every=2, patience=3)
    assert trainer.options.min_gain == 1e-4
    result = trainer.fit()
    assert result.steps == 8 and result.best_valid["step"] == 8
    assert result.stopped == "no gain above min_gain=0.0001 for 3 validations (best at step 8)"


def test_a_resumed_run_keeps_the_last_gain_and_the_count_since(tmp_path):
    # Snapshot at step 10: the last gain 1.25 (step 8), one validation since (1.0, the
    # best). Resumed, it stops at step 20 as the straight run did; counting from the best
    # (1.0: a gain below 0.75) it would stop at step 14.
    options = dict(eval_every=2, patience=3, min_gain=0.25)
    first = make_trainer(tmp_path, evaluate_fn=_worsening(MIN_GAIN_LOSSES[:5]), steps=10,
                         **options)  # fmt: skip
    first.fit()
    assert (first.gain_loss, first.bad_evals, first.best["loss_nats"]) == (1.25, 1, 1.0)
    resumed = make_trainer(tmp_path, evaluate_fn=_worsening(MIN_GAIN_LOSSES[5:]), steps=22,
                           **options)  # fmt: skip
    resumed.resume()
    assert (resumed.gain_loss, resumed.bad_evals) == (1.25, 1)
    result = resumed.fit()
    assert result.steps == 20 and result.best_valid["step"] == 20
    assert result.stopped == "no gain above min_gain=0.25 for 3 validations (best at step 20)"


# -- restoring the best weights; training until validation stops improving --------------------
def _worsening(losses):
    it = iter(losses)
    return lambda model: {"loss_nats": next(it)}


@pytest.mark.parametrize("on_disk", [True, False])
def test_early_stopping_restores_the_best_weights(tmp_path, on_disk):
    out = tmp_path / "run" if on_disk else None
    losses = [3.0, 2.0, 2.5, 2.4, 2.1]  # best at the second validation (step 4)
    trainer = make_trainer(out, evaluate_fn=_worsening(losses), steps=50, eval_every=2, patience=3)
    result = trainer.fit()
    assert result.steps == 10 and result.best_valid["step"] == 4
    assert result.stopped == "no improvement for 3 validations (best at step 4)"
    # The oracle: the same run stopped at step 4 (same seed, same batches, same dropout).
    at_best = make_trainer(steps=4)
    at_best.fit()
    assert_same(weights(trainer.model), weights(at_best.model))
    if on_disk:
        saved = make_trainer(seed=3).model
        load_model_weights(saved, out / "model.safetensors")
        assert_same(weights(saved), weights(at_best.model))


def test_restoring_a_best_found_before_the_resume_reads_model_safetensors(tmp_path):
    losses = [2.0, 3.0, 3.5, 4.0]  # best at step 2, before the resume at step 4
    first = make_trainer(tmp_path, evaluate_fn=_worsening(losses[:2]), steps=4, eval_every=2)
    first.fit()
    resumed = make_trainer(tmp_path, evaluate_fn=_worsening(losses[2:]), steps=8, eval_every=2)
    resumed.resume()
    result = resumed.fit()
    assert result.best_valid["step"] == 2 and result.stopped == "8 steps done"
    at_best = make_trainer(steps=2)
    at_best.fit()
    assert_same(weights(resumed.model), weights(at_best.model))


def test_restore_best_can_be_turned_off(tmp_path):
    trainer = make_trainer(
        evaluate_fn=_worsening([1.0, 2.0]), steps=4, eval_every=2, restore_best=False
    )
    trainer.fit()
    straight = make_trainer(steps=4)
    straight.fit()
    assert_same(weights(trainer.model), weights(straight.model))


def test_with_no_budget_training_stops_when_validation_stops_improving(tmp_path):
    # Random tokens: nothing beyond the unigram to learn, so validation soon worsens.
    valid = StreamBatcher(stream_ids(90, seed=1), 3, 7)

    def evaluate(model):
        nats = tokens = 0.0
        with torch.no_grad():
            for batch in valid:
                out = stream_step(model, batch, None)
                nats, tokens = nats + float(out.nats), tokens + out.tokens
        return {"loss_nats": nats / tokens}

    trainer = make_trainer(tmp_path, evaluate_fn=evaluate, epochs=None, dropout=0.0)
    assert trainer.until_converged and trainer.eval_every == 1  # 10 steps per epoch
    assert trainer.patience == default_patience(10, 1) == 100
    result = trainer.fit()
    assert result.stopped_early
    assert result.stopped.startswith("no improvement for 100 validations")
    assert result.steps == result.best_valid["step"] + 100 < trainer.total_steps
    valids = [e for e in result.history if e["event"] == "valid"]
    assert len(valids) == result.steps >= 10
    assert weights(trainer.model)["head.weight"].equal(
        trainer._best_weights["head.weight"]  # the best, not the last
    )


def test_with_no_budget_the_cap_ends_training_and_says_so():
    # No validation: nothing can stop it early, the cap does (patched small for the test).
    trainer = make_trainer(epochs=None)
    assert trainer.until_converged and trainer.patience is None
    assert trainer.total_steps == max(CAP_EPOCHS * 10, CAP_MIN_STEPS)
    trainer.total_steps = 12
    result = trainer.fit()
    assert result.steps == 12 and result.stopped.startswith("cap reached: 1.2 epochs (12 steps)")


def test_a_time_budget_alone_has_no_step_total(tmp_path):
    trainer = make_trainer(epochs=None, max_time=0.3)
    assert trainer.total_steps is None and not trainer.until_converged
    result = trainer.fit()
    assert result.steps > 0 and result.stopped == "time budget of 0.3 s reached"


# -- training records ----------------------------------------------------------------------------
def _train_steps(path):
    events = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    return [e["step"] for e in events if e["event"] == "train"]


@pytest.mark.parametrize(
    ("budget", "log_every", "expected"),
    [
        ({"steps": 10}, 4, [4, 8, 10]),  # every N, and the last step
        ({"steps": 7}, None, list(range(1, 8))),  # a short run: every step
        ({"steps": 120}, None, list(range(2, 121, 2))),  # ⌊120/50⌋ = 2: 60 records
        ({"epochs": 3}, None, list(range(1, 31))),  # 30 steps of a known length
    ],
)
def test_training_records_every_log_every_steps(tmp_path, budget, log_every, expected):
    trainer = make_trainer(out=tmp_path, log_every=log_every, **{"epochs": None, **budget})
    trainer.fit()
    assert _train_steps(tmp_path) == expected


def test_a_run_of_unknown_length_records_about_twenty_times_per_epoch(tmp_path):
    # 10 steps per epoch, no budget but time: ⌈10/20⌉ = 1, every step.
    trainer = make_trainer(out=tmp_path, log_every=None, epochs=None, max_time=3600, steps=None)
    assert trainer.log_every == 1


def test_the_logged_rate_leaves_out_the_time_of_validations(tmp_path):
    # A small data set validated at every step: the rate of each training record counted
    # the validations in its window and showed a fraction of the training's speed.
    import time

    def slow(model):
        time.sleep(0.3)
        return {"loss_nats": 1.0}

    trainer = make_trainer(tmp_path, evaluate_fn=slow, steps=6, eval_every=1, log_every=2)
    result = trainer.fit()
    overall = result.tokens / result.train_seconds  # the run's rate: training time only
    events = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    rates = [e["tokens_per_s"] for e in events if e["event"] == "train"]
    assert len(rates) == 3
    # each window held two validations (0.6 s) and two tiny steps: counted in, its rate
    # would be under a tenth of the run's
    assert all(rate > overall / 3 for rate in rates), (rates, overall)


@pytest.mark.parametrize("bad", [0, -3])
def test_log_every_below_one_is_refused(bad):
    with pytest.raises(ConfigError, match=r"^TrainOptions: log_every must be an integer ≥ 1"):
        make_trainer(log_every=bad, steps=3)


def test_verbose_prints_one_line_per_record(tmp_path, capsys):
    from rnnkit import messages

    evaluate = lambda model: {"loss_nats": 1.0}  # noqa: E731
    trainer = make_trainer(out=tmp_path, log_every=3, steps=6, evaluate_fn=evaluate, eval_every=6)
    messages.set_verbosity(1)
    try:
        trainer.fit()
    finally:
        messages.set_verbosity(0)
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(":")[1].strip() for line in lines if "/6 (epoch" in line] == [
        "step 3/6 (epoch 0)",
        "step 6/6 (epoch 0)",
    ], lines
    assert any(line.startswith("rnnkit: validation at step 6: loss_nats 1") for line in lines)
    # without -v: nothing (the progress bar is off: quiet)
    make_trainer(out=tmp_path / "b", log_every=3, steps=6).fit()
    assert capsys.readouterr().err == ""


def test_the_rate_is_named_by_what_the_loss_counts(tmp_path, capsys, monkeypatch):
    """A classifier's loss counts examples: its bar and -v lines say so, not tokens."""
    import functools

    from rnnkit import messages
    from rnnkit.training.progress import Progress

    # a plain progress line at every step (not every 30 s)
    monkeypatch.setattr("rnnkit.training.loop.Progress", functools.partial(Progress, interval=0))
    messages.set_verbosity(1)
    try:
        make_trainer(out=tmp_path / "a", steps=2, quiet=False, counts="examples").fit()
        examples = capsys.readouterr().err
        make_trainer(out=tmp_path / "b", steps=2, quiet=False).fit()
        tokens = capsys.readouterr().err
    finally:
        messages.set_verbosity(0)
    assert "ex_s=" in examples and "examples/s" in examples
    assert "tok_s" not in examples and "tokens/s" not in examples
    assert "tok_s=" in tokens and "tokens/s" in tokens and "examples" not in tokens


@pytest.mark.parametrize(
    ("counts", "units", "shown"),
    [
        ("tokens", "ppl", "ppl"),  # a word-level language model, a tagger, seq2seq, events
        ("tokens", "bits", "bits"),  # a character-level language model
        ("examples", "ppl", None),  # a classifier: nats per example
        ("values", "ppl", None),  # a regressor: the loss per predicted value
    ],
)
def test_the_bar_shows_perplexity_or_bits_only_for_a_loss_per_token(
    tmp_path, capsys, monkeypatch, counts, units, shown
):
    import functools

    from rnnkit.training.progress import Progress

    # a plain progress line at every step (not every 30 s)
    monkeypatch.setattr("rnnkit.training.loop.Progress", functools.partial(Progress, interval=0))
    trainer = make_trainer(out=tmp_path, steps=3, quiet=False, counts=counts, units=units)
    result = trainer.fit()
    line = [x for x in capsys.readouterr().err.splitlines() if x.startswith("train: ")][-1]
    # "train: 100% 3/3 [00:00<00:00, 193.11step/s, loss=2.432, ppl=11.38, lr=0.01, ...]"
    fields = dict(f.split("=") for f in line.split("[")[-1].rstrip("]").split(", ") if "=" in f)
    # one training record a step: the bar's loss is the last record's
    loss = [e for e in result.history if e["event"] == "train"][-1]["loss_nats"]
    assert fields["loss"] == f"{loss:.3f}"
    assert ("ppl" in fields) == (shown == "ppl") and ("bits" in fields) == (shown == "bits")
    if shown == "ppl":
        assert float(fields["ppl"]) == pytest.approx(math.exp(loss), abs=0.006)
    if shown == "bits":
        assert float(fields["bits"]) == pytest.approx(loss / math.log(2), abs=6e-4)


@pytest.mark.parametrize(
    ("budget", "done"), [({"epochs": 2}, 2), ({"steps": 13}, 1), ({"steps": 20}, 2)]
)
def test_epochs_done_counts_whole_passes(budget, done):
    """``epochs=2`` ended with ``epochs_done`` 1 (the report's "epochs completed" 1 after
    "2 epochs done"): the last pass is whole once its last batch is trained on."""
    assert make_trainer(**budget).fit().epochs_done == done  # 10 batches an epoch


def test_a_trainer_without_dist_ctx_under_torchrun_is_refused(tmp_path, monkeypatch):
    """Under ``torchrun --nproc-per-node 2`` a Trainer made as the docs' one-process
    example trained alone in each process, both writing one run directory (one crashed
    with ``latest.json: cannot write``); it is refused in one line saying what to pass."""
    from rnnkit.training.distributed import DistContext

    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match=r"^this process is one of 2 that torchrun started.*"
                       r"pass dist_ctx=init_distributed\(\)"):  # fmt: skip
        make_trainer(tmp_path)
    assert not any(tmp_path.iterdir())
    # a process that trains alone says so
    model = LanguageModel(nn.Embedding(V, E), LSTM(E, H), nn.Linear(H, V))
    alone = Trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        StreamBatcher(stream_ids(), 3, 7),
        stream_step,
        TrainOptions(quiet=True, steps=2),
        dist_ctx=DistContext(),
    )
    assert alone.fit().steps == 2


def test_a_budget_of_one_step_or_epoch_is_said_in_the_singular() -> None:
    """ "stopped: 1 steps done" and "1 epochs done" read as slips."""
    assert make_trainer(steps=1).fit().stopped == "1 step done"
    assert make_trainer(steps=2).fit().stopped == "2 steps done"
    assert make_trainer(epochs=1).fit().stopped == "1 epoch done (10 steps)"


@pytest.mark.parametrize(("at", "out"), [(4, False), (10, False), (4, True), (2, "early")])
def test_a_signal_stops_after_the_step_it_came_in(tmp_path, at, out) -> None:
    """The flag was read before each step: a SIGTERM in step 4 stopped after step 5, and
    one in a step that ended the run (the last, early stopping) was lost: fit returned
    and the program's own handler never heard of it (a service's shutdown request gone).
    The message said "the checkpoint is saved (continue with --resume)" to a Python
    caller with no out_dir."""
    import os
    import signal

    from rnnkit.training import TrainingInterrupted

    calls, heard = [], []

    def step(model, batch, carry):
        calls.append(1)
        if len(calls) == at:
            os.kill(os.getpid(), signal.SIGTERM)
        return stream_step(model, batch, carry)

    before = signal.signal(signal.SIGTERM, lambda signum, frame: heard.append(signum))
    try:
        options = {"steps": 10}
        if out == "early":  # a validation every step; the second ends the run
            options = {"eval_every": 1, "patience": 1, "min_gain": 0.99}
        trainer = make_trainer(out=tmp_path / "run" if out is True else None, step_fn=step,
                               evaluate_fn=lambda m: {"loss_nats": 1.0}, **options)  # fmt: skip
        if at == 10 or out == "early":  # the run ends as it would have; the signal goes on
            trainer.fit()
            assert heard == [signal.SIGTERM] and trainer.step == at
            return
        with pytest.raises(TrainingInterrupted) as info:
            trainer.fit()
        kept = (
            "the checkpoint is saved (continue with Trainer.resume())"
            if out
            else "nothing is saved (the Trainer has no out_dir)"
        )
        assert str(info.value) == f"SIGTERM after step {at}; {kept}"
        assert trainer.step == at and heard == []
    finally:
        signal.signal(signal.SIGTERM, before)


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_fit_with_gradients_off_is_refused_clearly(mode) -> None:
    """Inside a program's ``torch.no_grad()`` fit failed with torch's "element 0 of
    tensors does not require grad", after the step had drawn from the generator."""
    trainer = make_trainer(steps=2)
    rng = torch.get_rng_state()
    with getattr(torch, mode)(), pytest.raises(ConfigError, match=r"^Trainer.fit\(\) runs with"):
        trainer.fit()
    assert torch.equal(torch.get_rng_state(), rng) and trainer.step == 0
