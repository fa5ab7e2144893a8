"""The ``regress`` task: real-valued vector sequences (:mod:`rnnkit.data.vectors`).

``--target next`` (default) predicts ``x_{t+1}`` from ``x_1 … x_t`` at every step;
``--target value`` predicts each sequence's ``"y"`` from the state after its last step.
``--loss mse`` (default) or ``gaussian`` (mean and variance, the full Gaussian negative
log-likelihood). Sequences are padded and masked as token sequences are; ``--max-len``
cuts a long sequence into pieces of at most that many predictions (next) or keeps its
first ``--max-len`` steps (value), as the token tasks do.

Beside the model the summary and ``evaluate`` give the persistence baseline: the last
value seen is the prediction (``x_t`` for ``x_{t+1}``; for ``value``, the last step when
``y`` has the width of a step, else the mean training target).

Run directory: ``config.json`` (with ``input_size``, ``output_size``), ``model.safetensors``,
``summary.json``, snapshots, ``metrics.jsonl``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.nn.utils.rnn import pad_sequence

from rnnkit.app.config import TrainConfig
from rnnkit.app.tasks.fitting import check_resume, fit, run_summary
from rnnkit.app.tasks.run_config import check_batch_size, load_config, save_config
from rnnkit.app.tasks.run_dir import guarded_run
from rnnkit.app.tasks.run_outputs import finish_summary
from rnnkit.app.tasks.settings import choose_device, model_spec, seed_everything
from rnnkit.bptt.mask_facts import move_mask
from rnnkit.data.batching import SequenceBatcher, to_device
from rnnkit.data.labelled import split_holdout
from rnnkit.data.vectors import VectorSequence, parse_vector_line, read_vector_sequences
from rnnkit.deferred import deferring
from rnnkit.errors import CheckpointError, DataError
from rnnkit.models.builders import build_encoder
from rnnkit.models.language_model import LossOutput
from rnnkit.models.regressor import Regressor
from rnnkit.training.checkpoint import load_model_weights

__all__ = [
    "MEAN_TARGET_KIND",
    "PERSISTENCE_KIND",
    "Encoded",
    "build_regressor",
    "encode_sequences",
    "evaluate",
    "fit_sequences",
    "load_regressor",
    "predict_sequences",
    "predictor",
    "regression_metrics",
    "train",
]


class Encoded:
    """Model inputs ``x (T_i, D)`` and targets (``(T_i, D)`` for next, ``(K,)`` for value),
    one pair per piece, and the persistence baseline's prediction of each target."""

    def __init__(self, inputs: list[Tensor], targets: list[Tensor], persistence: list[Tensor]):
        self.inputs, self.targets, self.persistence = inputs, targets, persistence

    def __len__(self) -> int:
        return len(self.inputs)


PERSISTENCE_KIND = "persistence forecast (the last value)"
# the baseline of a value target wider or narrower than a step: no last value to repeat
MEAN_TARGET_KIND = "the mean training target"


def encode_sequences(
    seqs: list[VectorSequence], target: str, max_len: int, fallback: Tensor | None = None
) -> Encoded:
    """Pieces as the model reads them (see the module doc). ``fallback``: the persistence
    prediction of a value target whose width is not a step's (the mean training target)."""
    inputs, targets, persistence = [], [], []
    for s in seqs:
        x = torch.from_numpy(s.values)
        if target == "next":
            if len(x) < 2:
                raise DataError("a sequence needs 2 steps or more to predict a next value",
                                s.path, s.line)  # fmt: skip
            for lo in range(0, len(x) - 1, max_len):
                piece = x[lo : lo + max_len + 1]
                inputs.append(piece[:-1])
                targets.append(piece[1:])
                persistence.append(piece[:-1])  # x_t for x_{t+1}
            continue
        if s.target is None:
            raise DataError('--target value needs "y" on every line', s.path, s.line)
        x = x[:max_len]
        y = torch.from_numpy(s.target)
        inputs.append(x)
        targets.append(y)
        if y.shape[0] == x.shape[1]:
            persistence.append(x[-1])
        elif fallback is not None:
            persistence.append(fallback)
        else:
            persistence.append(torch.zeros_like(y))
    return Encoded(inputs, targets, persistence)


def build_regressor(cfg: TrainConfig, input_size: int, output_size: int) -> Regressor:
    """The encoder of ``cfg`` over ``D``-wide inputs, a linear head of ``K`` outputs."""
    target, loss = cfg.target, cfg.loss
    bidirectional = cfg.bidirectional if target == "value" else False
    encoder = build_encoder(model_spec(cfg), input_size, bidirectional=bidirectional)
    return Regressor(encoder, output_size, target, loss, dropout=cfg.dropout)


def _batches(
    enc: Encoded, batch_size: int, shuffle: bool, seed: int = 0, bucket: bool = True
) -> SequenceBatcher:
    lengths = [np.zeros(len(x), dtype=np.int64) for x in enc.inputs]  # only the lengths count
    return SequenceBatcher(
        lengths, batch_size=batch_size, shuffle=shuffle, seed=seed, bucket=bucket
    )


def _batch(enc: Encoded, batch: Any, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
    idx = batch.indices.tolist()
    x = to_device(pad_sequence([enc.inputs[i] for i in idx], batch_first=True), device)
    mask = move_mask(batch.mask, device)
    parts = [enc.targets[i] for i in idx]
    y = pad_sequence(parts, batch_first=True) if parts[0].dim() == 2 else torch.stack(parts)
    return x, to_device(y, device), mask


@torch.no_grad()
def regression_metrics(
    model: Regressor, enc: Encoded, device: torch.device, batch_size: int
) -> dict[str, Any]:
    """``loss`` (mean per value: squared error, or Gaussian NLL in nats), ``loss_nats``
    (the Gaussian NLL per value; unit variance for mse), ``mse``, ``rmse``, ``mae``,
    ``elements``, and the persistence baseline's ``mse`` beside them."""
    was_training = model.training
    model.eval()
    # float64 sums on the device, read once for the whole evaluation (with the model's
    # checks); the count is the batch masks', known on the host
    total, sq, ab = (torch.zeros((), dtype=torch.float64, device=device) for _ in range(3))
    count = 0
    with deferring() as deferred:
        for batch in _batches(enc, batch_size, shuffle=False):
            x, y, mask = _batch(enc, batch, device)
            out = model(x, mask)
            total = total + model.loss_of(out, y, mask).nats
            # float64: the square of an error beyond 1.8e19 overflows float32 (inf, not a figure)
            err = (out.mean - y).double()
            if y.dim() == 3:  # next: the real steps only
                err = torch.where(mask.unsqueeze(-1), err, 0.0)
                count += int(batch.mask.sum()) * y.shape[-1]
            else:
                count += y.numel()
            sq = sq + (err * err).sum()
            ab = ab + err.abs().sum()
        summed, squares, errors = deferred.read(total, sq, ab)
    model.train(was_training)
    base = torch.cat(
        [(p - t).reshape(-1).double() for p, t in zip(enc.persistence, enc.targets, strict=True)]
    )
    mse = squares / max(count, 1)
    # for mse the loss is the mse: taken from the float64 sum, not the model's float32 one
    loss = summed / max(count, 1) if model.loss_kind == "gaussian" else mse
    # The negative log-likelihood per value in nats: the Gaussian's own, or for mse that of
    # a unit-variance Gaussian, ½ (mse + ln 2π) (the trainer keeps the lowest).
    nats = loss if model.loss_kind == "gaussian" else 0.5 * (mse + math.log(2 * math.pi))
    return {
        "loss": loss,
        "loss_nats": nats,
        "mse": mse,
        "rmse": mse**0.5,
        "mae": errors / max(count, 1),
        "elements": count,
        "baseline_mse": float((base * base).mean()) if len(base) else None,
    }


def _read(path: str) -> list[VectorSequence]:
    return read_vector_sequences(path)


def _check_width(seqs: list[VectorSequence], width: int, what: str) -> None:
    for s in seqs:
        if s.values.shape[1] != width:
            raise DataError(
                f"steps have {s.values.shape[1]} values; the model reads {width} ({what})",
                s.path,
                s.line,
            )


def _check_targets(seqs: list[VectorSequence], width: int, what: str) -> None:
    """Each given ``"y"`` of a ``--target value`` run has ``width`` values."""
    for s in seqs:
        if s.target is not None and s.target.shape[0] != width:
            raise DataError(f'"y" has {s.target.shape[0]} values; {what} {width}', s.path, s.line)


@guarded_run
def train(
    cfg: TrainConfig, resume: bool = False, quiet: bool = False, callbacks: Any = None
) -> dict[str, Any]:
    """Train a regressor as ``cfg`` says; write the run directory; return the summary."""
    seqs = _read(cfg.train)
    if cfg.valid:
        train_seqs, valid_seqs = seqs, _read(cfg.valid)
    else:
        train_seqs, valid_seqs = split_holdout(seqs, cfg.valid_fraction, cfg.seed, cfg.train)
        if not valid_seqs:
            raise DataError("too few sequences to hold some out for validation", cfg.train)
    return fit_sequences(cfg, train_seqs, valid_seqs, resume=resume, quiet=quiet,
                         callbacks=callbacks)  # fmt: skip


def fit_sequences(
    cfg: TrainConfig,
    train_seqs: list[VectorSequence],
    valid_seqs: list[VectorSequence],
    *,
    resume: bool = False,
    quiet: bool = False,
    callbacks: Any = None,
    **info: Any,
) -> dict[str, Any]:
    """Train a regressor on sequences already read into ``cfg.out`` (no lock taken: the
    caller holds the run directory; :func:`train` for files, the ``params`` task for one
    model per log key). ``info`` goes into ``config.json`` beside the sizes."""
    out = Path(cfg.out)
    device = choose_device(cfg.device, "--device")
    target = cfg.target
    D = train_seqs[0].values.shape[1]
    _check_width(train_seqs, D, "the first sequence's width")
    _check_width(valid_seqs, D, "the training data's width")
    if resume:
        check_resume(cfg, out)
    seed_everything(cfg.seed)
    fallback = None
    if target == "value":
        ys = [s.target for s in train_seqs if s.target is not None]
        if ys:
            _check_targets(train_seqs, ys[0].shape[0], "the first target has")
        fallback = torch.from_numpy(np.mean(ys, axis=0)) if ys else None
    if fallback is not None:  # evaluate's baseline is this one (not a prediction of 0)
        info = {**info, "target_mean": fallback.tolist()}
    train_enc = encode_sequences(train_seqs, target, cfg.max_len, fallback)
    valid_enc = encode_sequences(valid_seqs, target, cfg.max_len, fallback)
    K = D if target == "next" else int(train_enc.targets[0].shape[0])
    if target == "value":
        _check_targets(valid_seqs, K, "the training targets have")
    model = build_regressor(cfg, D, K).to(device)
    batches = _batches(
        train_enc, cfg.batch_size, shuffle=True, seed=cfg.seed, bucket=cfg.batch_order == "length"
    )

    def step(m: Regressor, batch: Any, carry: Any) -> LossOutput:
        x, y, mask = _batch(train_enc, batch, device)
        return m.loss(x, y, mask)

    out.mkdir(parents=True, exist_ok=True)
    if not resume:
        save_config(out, cfg, input_size=D, output_size=K, **info)
        (out / "metrics.jsonl").unlink(missing_ok=True)
    result, elapsed = fit(
        cfg,
        model,
        batches,
        step,
        lambda m: _valid_metrics(m, valid_enc, valid_seqs, train_enc, device, cfg.batch_size),
        resume,
        quiet,
        callbacks,
    )
    summary = run_summary(
        "regress",
        result,
        elapsed,
        model,
        target=target,
        loss=cfg.loss,
        input_size=D,
        output_size=K,
        baselines={
            "persistence": {
                "kind": PERSISTENCE_KIND if target == "next" or K == D else MEAN_TARGET_KIND,
                "mse": regression_metrics(model, valid_enc, device, cfg.batch_size)["baseline_mse"],
            }
        },
    )
    return finish_summary(cfg, summary, result)


def load_regressor(run_dir: str | Path, device: str = "cpu") -> tuple[TrainConfig, dict, Regressor]:
    """``(cfg, info, model)`` of a regress run directory (no code is unpickled)."""
    run_dir = Path(run_dir)
    cfg, info = load_config(run_dir, task="regress")
    D, K = info.get("input_size"), info.get("output_size")
    if not (isinstance(D, int) and D >= 1 and isinstance(K, int) and K >= 1):
        raise CheckpointError(f"{run_dir / 'config.json'}: no valid input_size/output_size")
    model = build_regressor(cfg, D, K).to(choose_device(device))
    load_model_weights(model, run_dir / "model.safetensors")
    model.eval()
    return cfg, info, model


def evaluate(
    run_dir: str | Path, data_path: str, batch_size: int | None = None, device: str = "cpu"
) -> dict[str, Any]:
    """Score sequences (same format as training) with a trained regressor, and the
    persistence baseline beside it."""
    check_batch_size(batch_size)
    cfg, info, model = load_regressor(run_dir, device)
    seqs = _read(data_path)
    _check_width(seqs, info["input_size"], "the run's input width")
    if cfg.target == "value":
        _check_targets(seqs, info["output_size"], "the run's model predicts")
    # the training targets' mean, as training scored the baseline (runs from before it
    # was recorded: 0)
    mean = info.get("target_mean")
    fallback = None
    if isinstance(mean, list) and len(mean) == info["output_size"]:
        fallback = torch.tensor([float(v) for v in mean], dtype=torch.float32)
    enc = encode_sequences(seqs, cfg.target, cfg.max_len, fallback)
    model_device = next(model.parameters()).device
    metrics = regression_metrics(model, enc, model_device, batch_size or cfg.batch_size)
    _check_finite(metrics, seqs, Path(run_dir))
    return metrics


def _largest(s: VectorSequence) -> float:
    """The largest magnitude of a sequence's values and its ``"y"``."""
    top = float(np.abs(s.values).max(initial=0.0))
    return top if s.target is None else max(top, float(np.abs(s.target).max(initial=0.0)))


def _valid_metrics(
    model: Regressor,
    valid_enc: Encoded,
    valid_seqs: list[VectorSequence],
    train_enc: Encoded,
    device: torch.device,
    batch_size: int,
) -> dict[str, Any]:
    """The validation metrics; a non-finite validation loss whose weights give the
    training data a finite one is the validation data's fault (the Gaussian NLL of a
    value of 1e20 overflows float32), one :class:`DataError` naming the sequence of its
    largest value, not a divergence that advises a lower rate. When the training data's
    loss is not finite either, the weights went bad: the trainer says so."""
    metrics = regression_metrics(model, valid_enc, device, batch_size)
    loss = float(metrics["loss_nats"])
    if math.isfinite(loss) or not valid_seqs:
        return metrics
    if not math.isfinite(
        float(regression_metrics(model, train_enc, device, batch_size)["loss_nats"])
    ):
        return metrics
    worst = max(valid_seqs, key=lambda s: float(np.abs(s.values).max(initial=0.0)))
    step, dim = np.unravel_index(int(np.abs(worst.values).argmax()), worst.values.shape)
    raise DataError(
        f"the validation loss is {loss} while the same weights give the training data a "
        f"finite one: the validation data is at fault (its largest value, "
        f"{float(worst.values[step, dim]):.3g} at step {step + 1} of this sequence, is "
        "beyond what float32 arithmetic can score; rescale the data)",
        worst.path,
        worst.line,
    )


#: Data whose largest magnitude (steps and ``"y"``) is below this cannot make the loss
#: overflow float32 by itself: a squared error of 1e24, over the smallest variance the
#: Gaussian loss allows (1e-6), summed over a million values, is 1e36 < 3.4e38. A figure
#: that overflows on such data is the model's outputs' doing.
_DATA_CANNOT_OVERFLOW = 1e12


def _check_finite(metrics: dict[str, Any], seqs: list[VectorSequence], run_dir: Path) -> None:
    """A figure that overflowed (the Gaussian NLL of errors near float32's range) is one
    error naming the sequence of the largest value (of its steps or its ``"y"``), not
    ``inf`` printed as a result; on data of ordinary size, one naming the run's weights."""
    bad = [k for k, v in metrics.items() if isinstance(v, float) and not math.isfinite(v)]
    if not bad:
        return
    worst = max(seqs, key=_largest)
    top = _largest(worst)
    if top < _DATA_CANNOT_OVERFLOW:
        raise CheckpointError(
            f"{run_dir}: the {bad[0]} is not finite on data whose values stay within "
            f"{top:.3g}: the run's weights give outputs beyond float32 (a damaged or "
            "diverged run)"
        )
    raise DataError(
        f"the {bad[0]} is not finite: values reach {top:.3g}, beyond what float32 "
        "arithmetic can score; rescale the data",
        worst.path,
        worst.line,
    )


def predictor(
    run_dir: str | Path, batch_size: int | None = None, device: str = "cpu", **_: Any
) -> Any:
    """``rnnkit predict`` for a regressor: each input line is a JSON sequence ``{"seq":
    [...]}``; the answer is ``{"prediction": [...]}``: for ``next`` the predicted next
    vector after every step (the last one forecasts the step after the sequence), for
    ``value`` the predicted ``y``; with ``--loss gaussian`` also ``"variance"``."""
    check_batch_size(batch_size)
    cfg, info, model = load_regressor(run_dir, device)

    def run(lines: list[str], where: list[tuple[str, int]]) -> list[dict[str, Any]]:
        seqs = [parse_vector_line(t, p, n) for t, (p, n) in zip(lines, where, strict=True)]
        _check_width(seqs, info["input_size"], "the run's input width")
        return predict_sequences(cfg, model, [s.values for s in seqs])

    return run


@torch.no_grad()
def predict_sequences(
    cfg: TrainConfig, model: Regressor, sequences: list[np.ndarray]
) -> list[dict[str, Any]]:
    """The answers of ``rnnkit predict`` for sequences ``(T, D)`` float32 of the run's
    width: ``{"prediction": [...]}``, with ``"variance"`` for ``--loss gaussian``.

    ``next``: a prediction after every step, the sequence read in pieces of
    ``cfg.max_len`` steps each from a zero state, as training and ``evaluate`` read it
    (so the predictions ``evaluate`` scores are these); ``value``: ``y`` from the first
    ``cfg.max_len`` steps, as training reads them."""
    model.eval()
    weight = next(model.parameters())
    answers = []
    for values in sequences:
        # in the weights' dtype: a model made float64 (or bfloat16) computes in it
        x = torch.from_numpy(values).to(device=weight.device, dtype=weight.dtype)
        if cfg.target != "next":
            x = x[: cfg.max_len]
        outs = [model(x[lo : lo + cfg.max_len][None]) for lo in range(0, len(x), cfg.max_len)]
        record: dict[str, Any] = {"prediction": torch.cat([o.mean[0] for o in outs]).tolist()}
        if outs[0].log_var is not None:
            variance = torch.cat([o.log_var[0] for o in outs if o.log_var is not None]).exp()
            record["variance"] = variance.tolist()
        answers.append(record)
    return answers
