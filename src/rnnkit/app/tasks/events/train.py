"""Training an ``events`` run: the next-event LM on the normal sessions (pieces of at most
``--max-len`` events, or of the history window), the n-gram baseline on the same
sessions, the calibration, and the thresholds from both models' validation scores.

``--bptt`` is honoured as named: ``full`` backpropagates through each whole piece (the
task's default), ``window:K`` is the exact windowed BPTT(K) (O(T·K) work), and
``segment:K`` runs each piece in segments of K steps, the state's value carried across
a segment boundary and its gradient cut there (:func:`segment_loss`, O(T) work).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from rnnkit.anomaly.calibration import Calibration, all_scores
from rnnkit.anomaly.surprise import event_surprises, ngram_surprises, surprise_loss
from rnnkit.app.config import TrainConfig, parse_bptt
from rnnkit.app.tasks.events.data import EventsData, EventVocabulary, prepare_events_data
from rnnkit.app.tasks.events.options import options
from rnnkit.app.tasks.events.summary import Validation, summarise
from rnnkit.app.tasks.events.thresholds import save_arrays, write_thresholds
from rnnkit.app.tasks.fitting import check_unchanged, make_optimizer
from rnnkit.app.tasks.run_config import load_config, save_config
from rnnkit.app.tasks.run_dir import guarded_run
from rnnkit.app.tasks.run_outputs import finish_summary
from rnnkit.app.tasks.settings import choose_device, model_spec, seed_everything, train_options
from rnnkit.bptt.mask_facts import host_mask, move_mask
from rnnkit.data.batching import SequenceBatcher, lm_pairs, to_device
from rnnkit.data.vocab import BOS_ID, EOS_ID
from rnnkit.errors import ConfigError
from rnnkit.messages import warning as warn
from rnnkit.models.builders import build_language_model
from rnnkit.models.language_model import LanguageModel, LossOutput
from rnnkit.models.ngram import NGramModel
from rnnkit.training.checkpoint import load_model_weights
from rnnkit.training.loop import Trainer
from rnnkit.training.options import TrainResult

__all__ = ["init_output_bias", "segment_loss", "train"]


@guarded_run
def train(cfg: TrainConfig, resume: bool = False, quiet: bool = False) -> dict[str, Any]:
    """Train the next-event model and the baseline, pick thresholds, write the run.

    Returns the summary (also written to ``summary.json``).
    """
    opts = options(cfg)
    if parse_bptt(cfg.bptt)[0] == "segment" and cfg.loss_reduction == "sequence":
        raise ConfigError(
            "--loss-reduction sequence needs whole sequences: --bptt full or window:K, "
            f"not {cfg.bptt}"
        )
    out = Path(cfg.out)
    device = choose_device(cfg.device, "--device")
    vocab = _resumed_vocab(cfg, out) if resume else None
    seed_everything(cfg.seed)
    data = prepare_events_data(cfg, vocab)
    if data.excluded:
        warn(f"{cfg.train}: {data.excluded} session(s) labelled 1 left out of training")
    if cfg.top_g >= len(data.vocab):
        # every rank is below g: the count score (DeepLog's rule) can never fire
        warn(
            f"--top-g {cfg.top_g} is at least the {len(data.vocab)} symbols the model ranks "
            "(the event types, <unk> and the specials): no event can fall outside the top "
            f"{cfg.top_g}, so the count score is 0 for every session; pass a --top-g below "
            f"{len(data.vocab)}"
        )
    if opts["window"] is None:
        # A session trains as <s> and its events: longer than --max-len, it is cut into
        # pieces, each from a zero state, while scores read it whole: say so once.
        steps = [len(s) + 1 for s in data.train if len(s) + 1 > cfg.max_len]
        if steps:
            warn(
                f"{cfg.train}: {len(steps)} of {len(data.train)} sessions are longer than "
                f"--max-len {cfg.max_len} steps (the longest: {max(steps) - 1} events, "
                f"{max(steps)} steps with <s>): each is trained as pieces of {cfg.max_len} "
                "steps, each piece from a zero state, while scoring reads whole sessions; "
                f"give --max-len {max(steps)} to train on every session whole"
            )
    model, result, elapsed = _fit_model(cfg, opts, data, device, resume, quiet)
    ngram = NGramModel(order=cfg.ngram_order, vocab_size=len(data.vocab))
    ngram.fit([np.concatenate([s, [EOS_ID]]) for s in data.train])
    save_arrays(ngram.to_state(), out / "ngram.safetensors")
    valid = _validate(cfg, opts, data, model, ngram)
    parameters = sum(p.numel() for p in model.parameters())
    summary = summarise(cfg, opts, data, result, elapsed, parameters, valid)
    return finish_summary(cfg, summary, result)


def _resumed_vocab(cfg: TrainConfig, out: Path) -> EventVocabulary:
    """The vocabulary of the run to resume, once its options are known to fit."""
    saved, _ = load_config(out)
    check_unchanged(cfg, saved, out)
    return EventVocabulary.load(out / "vocab.json")


def _fit_model(
    cfg: TrainConfig,
    opts: dict[str, Any],
    data: EventsData,
    device: torch.device,
    resume: bool,
    quiet: bool,
) -> tuple[LanguageModel, TrainResult, float]:
    """Train the next-event LM into ``cfg.out``; ``(the best model on validation, the
    loop's result, seconds)``."""
    out = Path(cfg.out)
    model = build_language_model(model_spec(cfg), len(data.vocab)).to(device)
    model.loss_reduction = cfg.loss_reduction
    init_output_bias(model, data.train)  # (resume then loads the saved weights over it)
    optimizer = make_optimizer(cfg, model)
    # A window of h events: train on pieces of h (each from a zero state), as it scores.
    piece_len = cfg.max_len if opts["window"] is None else min(cfg.max_len, opts["window"])
    pieces = [p for s in data.train for p in _pieces(s, piece_len)]
    batches = SequenceBatcher(
        [p[0] for p in pieces],
        [p[1] for p in pieces],
        batch_size=cfg.batch_size,
        shuffle=True,
        seed=cfg.seed,
        bucket=cfg.batch_order == "length",
    )
    mode, k = parse_bptt(cfg.bptt)

    def step(m: LanguageModel, batch: Any, carry: Any) -> LossOutput:
        inputs, targets = to_device(batch.inputs, device), to_device(batch.targets, device)
        mask = move_mask(batch.mask, device)
        if mode == "segment":
            assert k is not None
            return segment_loss(m, inputs, targets, mask, k)
        return m.loss(inputs, targets, mask=mask, window=k if mode == "window" else None)

    def evaluate(m: LanguageModel) -> dict[str, Any]:
        return surprise_loss(event_surprises(m, data.valid, cfg.batch_size, opts["window"]))

    out.mkdir(parents=True, exist_ok=True)
    if not resume:
        data.vocab.save(out / "vocab.json")
        save_config(out, cfg, vocab_size=len(data.vocab))
        (out / "metrics.jsonl").unlink(missing_ok=True)
    trainer = Trainer(
        model,
        optimizer,
        batches,
        step,
        train_options(cfg, quiet),
        evaluate_fn=evaluate,
        out_dir=out,
    )
    if resume:
        trainer.resume()
    started = time.perf_counter()
    result = trainer.fit()
    elapsed = time.perf_counter() - started
    load_model_weights(model, out / "model.safetensors")  # the best on validation
    return model, result, elapsed


def _validate(
    cfg: TrainConfig,
    opts: dict[str, Any],
    data: EventsData,
    model: LanguageModel,
    ngram: NGramModel,
) -> Validation:
    """Calibrate both models on the training sessions, score the validation sessions and
    pick the thresholds (``calibration.safetensors``, ``valid_scores.safetensors``,
    ``thresholds.json``)."""
    out = Path(cfg.out)
    g, h, bs, size = int(opts["top_g"]), opts["window"], cfg.batch_size, len(data.vocab)
    calibration = {
        "rnn": Calibration.fit(event_surprises(model, data.train, bs, h), data.train, size, g),
        "ngram": Calibration.fit(ngram_surprises(ngram, data.train), data.train, size, g),
    }
    arrays = {k: v for m, c in calibration.items() for k, v in c.arrays(m).items()}
    save_arrays(arrays, out / "calibration.safetensors")
    per_event = {
        "rnn": event_surprises(model, data.valid, bs, h),
        "ngram": ngram_surprises(ngram, data.valid),
    }
    scores = {m: all_scores(per, data.valid, g, calibration[m]) for m, per in per_event.items()}
    anomalous_per_event = anomalous_scores = None
    if data.valid_anomalous:
        anomalous_per_event = {
            "rnn": event_surprises(model, data.valid_anomalous, bs, h),
            "ngram": ngram_surprises(ngram, data.valid_anomalous),
        }
        anomalous_scores = {
            m: all_scores(per, data.valid_anomalous, g, calibration[m])
            for m, per in anomalous_per_event.items()
        }
    thresholds = write_thresholds(out, opts, scores, anomalous_scores)
    return Validation(per_event, scores, anomalous_per_event, anomalous_scores, thresholds)


@torch.no_grad()
def init_output_bias(model: LanguageModel, seqs: Sequence[np.ndarray]) -> None:
    """Start the output bias at the log-frequencies of the training targets (add-½).

    Training then starts from the unigram model instead of the uniform one, and an id that
    is never a target (``<unk>`` when every event is in the vocabulary, ``<pad>``, ``<s>``)
    starts at ``ln(½ / N)``, below every seen event: an event never seen in training is
    surprising from the first step, not only after the softmax has slowly pushed it down.

    >>> from rnnkit.models import ModelSpec, build_language_model
    >>> lm = build_language_model(ModelSpec(hidden=4, embedding=3), 6)
    >>> init_output_bias(lm, [np.array([4, 4, 5])])
    >>> np.round(lm.head.bias.detach().numpy().astype(float), 2).tolist()  # ln(c / 7)
    [-2.64, -2.64, -2.64, -1.54, -1.03, -1.54]
    """
    bias = getattr(model.head, "bias", None)
    if not isinstance(bias, torch.Tensor) or bias.shape != (model.vocab_size,):
        return
    counts = np.full(model.vocab_size, 0.5)
    for s in seqs:
        counts += np.bincount(s, minlength=model.vocab_size)[: model.vocab_size]
    counts[EOS_ID] += len(seqs)  # every session ends once
    bias.copy_(torch.from_numpy(np.log(counts / counts.sum())).to(bias))


def _pieces(seq: np.ndarray, max_len: int) -> list[tuple[np.ndarray, np.ndarray]]:
    inputs, targets = lm_pairs(seq, BOS_ID, EOS_ID)
    return [
        (inputs[lo : lo + max_len], targets[lo : lo + max_len])
        for lo in range(0, len(inputs), max_len)
    ]


def _detached(state: Any) -> Any:
    """The state's value without its history: what crosses a segment boundary."""
    if state is None or isinstance(state, torch.Tensor):
        return None if state is None else state.detach()
    return type(state)(*(_detached(s) for s in state))


def segment_loss(
    model: LanguageModel, inputs: Tensor, targets: Tensor, mask: Tensor, k: int
) -> LossOutput:
    """The loss of a padded batch of sessions under segment truncation (``--bptt
    segment:K``): the steps run in segments of ``k``, each starting from the state the
    previous one ended in — its value carried, its gradient cut — so that ``∂L/∂h`` never
    crosses a segment boundary, while every step still sees the whole session so far.

    One forward over the ``T`` steps in all (O(T), as full BPTT). The loss is the masked
    token mean over the whole batch, as :meth:`LanguageModel.loss` (token reduction).

    Args:
        inputs, targets: ``(B, T)`` ids.  mask: ``(B, T)`` bool, True at real steps.
        k: the segment length ``K ≥ 1``.
    """
    total = inputs.new_zeros((), dtype=torch.float32)
    nats: float | Tensor = 0.0
    counted = host_mask(mask)  # the segments' token counts, without a wait per segment
    tokens = int(counted.sum())
    state: Any = None
    for lo in range(0, inputs.shape[1], k):
        part = mask[:, lo : lo + k]
        n = int(counted[:, lo : lo + k].sum())
        if n == 0:  # padding only from here on (rows end with their padding)
            break
        out = model.loss(inputs[:, lo : lo + k], targets[:, lo : lo + k], part, _detached(state))
        total = total + out.loss * n  # the segment's token mean back to a sum
        nats, state = nats + out.nats, out.state
    return LossOutput(total / max(tokens, 1), nats, tokens)
