"""The language-modelling task: text → vocabulary → batches → model → training → metrics.

``--bptt segment:K`` reads the corpus as B parallel streams in segments of K steps, the
state carried from segment to segment (char-rnn style); ``full`` and ``window:K`` train on
lines as separate padded sequences (``<s> w… </s>``), with full or windowed BPTT(K).
An n-gram baseline (interpolated Kneser–Ney) is fitted on the same training tokens and
scored on the same validation tokens, so the summary shows what the recurrence buys.

The other wirings (docs/math.md, "Models"), each a ``TrainConfig`` option saved in ``config.json``:

* ``--length stop|predict`` (``--bptt full``/``window:K``): a stop output per step, or a
  length predicted first (at most ``--max-len``) with the steps remaining fed to every
  step, instead of ``</s>``; ``loss_nats`` is then the exact sequence NLL per token step.
* ``--wiring jordan``: the output-to-hidden recurrence of Fig. 10.4 (:class:`JordanLM`),
  trained with no time loop.
* ``--condition init|input|both`` (``--bptt full``): a class-conditional LM on
  ``label<TAB>text`` lines; the run directory adds ``labels.json``; generation takes a
  label. An evaluation line whose label the model never saw cannot be scored: it is left
  out and reported as ``unknown_labels`` / ``unknown_label_counts``.

The corpora and their batches are read in :mod:`rnnkit.app.tasks.lm_data`; what a trained
model does with text (prompts, samples, per-line scores) is in
:mod:`rnnkit.app.tasks.lm_text`. This module trains, evaluates and loads a run, and
answers ``rnnkit predict``; the names of both are importable from here too.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.numpy import save_file as save_numpy
from torch import Tensor

from rnnkit.app.config import TrainConfig
from rnnkit.app.tasks.fitting import check_unchanged, make_optimizer
from rnnkit.app.tasks.lm_data import (
    LMData,
    ngram_streams,
    prepare_lm_data,
    stream_eval_batcher,
    train_batches,
)
from rnnkit.app.tasks.lm_text import AnyLM, join_prompt, line_logprobs, prompt_ids, sample_texts
from rnnkit.app.tasks.pretrained import load_pretrained_vectors
from rnnkit.app.tasks.run_config import check_batch_size, check_count, load_config, save_config
from rnnkit.app.tasks.run_dir import guarded_run
from rnnkit.app.tasks.run_outputs import finish_summary
from rnnkit.app.tasks.settings import choose_device, model_spec, seed_everything, train_options
from rnnkit.bptt.mask_facts import move_mask
from rnnkit.data.batching import SequenceBatcher, lm_pairs, to_device
from rnnkit.data.files import atomic_write
from rnnkit.data.labelled import LabelSet
from rnnkit.data.vocab import BOS_ID, EOS_ID, PAD_ID, Vocabulary
from rnnkit.deferred import deferring
from rnnkit.errors import CheckpointError, ConfigError, DataError
from rnnkit.models.builders import build_lm
from rnnkit.models.conditional import ConditionalLM
from rnnkit.models.jordan import JordanLM
from rnnkit.models.language_model import LanguageModel, LossOutput
from rnnkit.models.ngram import NGramModel
from rnnkit.training.checkpoint import load_arrays, load_model_weights
from rnnkit.training.distributed import DistContext, init_distributed, peer_lost_said
from rnnkit.training.loop import Trainer
from rnnkit.training.scheduled_sampling import parse_schedule

__all__ = [
    "LMData",
    "evaluate",
    "evaluate_lm",
    "join_prompt",
    "line_logprobs",
    "lm_labels",
    "lm_metrics",
    "load_lm",
    "predictor",
    "prepare_lm_data",
    "prompt_ids",
    "sample_texts",
    "train",
    "train_lm",
]

LN2 = math.log(2)


def _batch_loss(
    model: AnyLM,
    batch: Any,
    device: torch.device,
    *,
    stream: bool,
    classes: Tensor | None = None,
    state: Any = None,
    starts: Tensor | None = None,
    window: int | None = None,
) -> LossOutput:
    """The loss of one batch for any ``--wiring`` / ``--condition`` model.

    ``stream``: a segment of parallel streams carrying ``state`` (reset at ``starts``);
    else padded whole sequences (``classes``: the class of every sequence, ``--condition``).
    """
    inputs, targets = to_device(batch.inputs, device), to_device(batch.targets, device)
    if isinstance(model, JordanLM):
        # Its only memory is the previous token, i.e. the input itself: no state to carry,
        # nothing to truncate, every step computed at once.
        return model.loss(inputs, targets, mask=None if stream else move_mask(batch.mask, device))
    if isinstance(model, ConditionalLM):
        assert classes is not None and not stream  # --condition reads whole lines
        mask = move_mask(batch.mask, device)
        return model.loss(to_device(classes[batch.indices], device), inputs, targets, mask=mask)
    if stream:
        return model.loss(inputs, targets, state=state, starts=starts)
    return model.loss(inputs, targets, mask=move_mask(batch.mask, device), window=window)


def _classes(labels: np.ndarray | None) -> Tensor | None:
    return None if labels is None else torch.from_numpy(labels)


@torch.no_grad()
def lm_metrics(model: AnyLM, data: LMData, device: torch.device, batch_size: int) -> dict[str, Any]:
    """Mean nats per target token on the validation part of ``data`` (plus perplexity and,
    for characters, bits per character)."""
    was_training = model.training
    model.eval()
    nats: float | Tensor = 0.0
    tokens: int | Tensor = 0
    # the sums stay on the device: one read for the whole validation, not one per batch
    with deferring() as deferred:
        if data.mode == "segment":
            assert data.valid_stream is not None and data.k is not None
            batcher = stream_eval_batcher(data.valid_stream, batch_size, data.k, data.boundary)
            state = None
            for batch in batcher:
                # --doc-boundary line: the state zero at each line start, as in training
                starts = None if data.boundary is None else batch.starts
                out = _batch_loss(model, batch, device, stream=True, state=state, starts=starts)
                nats, tokens, state = nats + out.nats, tokens + out.tokens, out.state
            tail = _stream_tail(model, data, batcher, state, device)
            if tail is not None:
                nats, tokens = nats + tail.nats, tokens + tail.tokens
        else:
            assert data.valid_seqs is not None
            pairs = [lm_pairs(s, BOS_ID, EOS_ID) for s in data.valid_seqs]
            lines = SequenceBatcher(
                [p[0] for p in pairs], [p[1] for p in pairs], batch_size=batch_size, shuffle=False
            )
            classes = _classes(data.valid_labels)
            for batch in lines:
                out = _batch_loss(model, batch, device, stream=False, classes=classes)
                nats, tokens = nats + out.nats, tokens + out.tokens
        total, count = deferred.read(nats, tokens)
    model.train(was_training)
    return _metrics(total / max(count, 1), int(count), data.vocab.unit)


def _stream_tail(
    model: AnyLM, data: LMData, batcher: Any, state: Any, device: torch.device
) -> LossOutput | None:
    """The loss of the last ``r < rows`` targets of a validation stream, which its
    ``rows × L`` layout leaves over: they continue the last row, read from its state
    (the other rows masked: their state held, nothing scored). None when ``r = 0``."""
    assert data.valid_stream is not None
    B, L = batcher.batch_size, batcher.row_len
    ids = data.valid_stream[B * L :]
    r = len(ids) - 1
    if r <= 0:
        return None
    inputs = torch.full((B, r), PAD_ID, dtype=torch.int64)
    targets = torch.full((B, r), PAD_ID, dtype=torch.int64)
    mask = torch.zeros((B, r), dtype=torch.bool)
    inputs[-1] = torch.from_numpy(ids[:-1].astype(np.int64))
    targets[-1] = torch.from_numpy(ids[1:].astype(np.int64))
    mask[-1] = True
    x, y, m = to_device(inputs, device), to_device(targets, device), move_mask(mask, device)
    if isinstance(model, JordanLM):
        return model.loss(x, y, mask=m)
    assert not isinstance(model, ConditionalLM)  # --condition reads whole lines
    starts = None if data.boundary is None else inputs == data.boundary
    return model.loss(x, y, mask=m, state=state, starts=starts)


def _metrics(loss: float, tokens: int, unit: str) -> dict[str, Any]:
    m = {"loss_nats": loss, "tokens": tokens, "perplexity": math.exp(min(loss, 700))}
    if unit == "char":
        m["bits_per_char"] = loss / LN2
    return m


def _step_fn(data: LMData, device: torch.device, sampling: Any = None):
    """The training step of ``data``'s mode; ``sampling``: ``(schedule, steps_done)`` for
    scheduled sampling (``steps_done()`` reads the trainer's step count)."""
    if sampling is not None:
        schedule, steps_done = sampling

        # --scheduled-sampling needs the hidden wiring without --condition: a LanguageModel.
        def sampled(model: LanguageModel, batch: Any, carry: Any) -> LossOutput:
            p = schedule.probability(steps_done())
            inputs, targets = to_device(batch.inputs, device), to_device(batch.targets, device)
            return model.scheduled_loss(
                inputs, targets, move_mask(batch.mask, device), sampling_p=p
            )

        return sampled
    if data.mode == "segment":

        def step(model: AnyLM, batch: Any, carry: Any) -> LossOutput:
            # the starts stay on the host: the stack finds them without waiting for the GPU
            return _batch_loss(model, batch, device, stream=True, state=carry, starts=batch.starts)
    else:
        window = data.k if data.mode == "window" else None
        classes = _classes(data.train_labels)

        def step(model: AnyLM, batch: Any, carry: Any) -> LossOutput:
            return _batch_loss(model, batch, device, stream=False, classes=classes, window=window)

    return step


def _resume(trainer: Trainer, ctx: DistContext) -> None:
    """``trainer.resume()``; a snapshot whose epochs of whole sequences (``--bptt full``,
    ``window:K``) were cut for another number of processes is one line saying how to
    resume it: on several processes each epoch's last partial batch is dropped (it would
    not split evenly over them), on one it is trained."""
    try:
        trainer.resume()
    except CheckpointError as exc:
        if "drop_last=" not in str(exc):
            raise
        if ctx.world_size == 1:
            how = (
                "several processes with whole-sequence batches (--bptt full or window:K), "
                "whose epochs drop their last partial batch, where one process trains it: "
                "resume it on several processes (torchrun, any number)"
            )
        else:
            how = (
                "one process with whole-sequence batches (--bptt full or window:K), whose "
                "epochs end in a partial batch that several processes drop: resume it on "
                "one process"
            )
        raise CheckpointError(f"{trainer.out_dir}: this run trained on {how}") from None


@guarded_run
def train_lm(
    cfg: TrainConfig, resume: bool = False, quiet: bool = False, callbacks=None
) -> dict[str, Any]:
    """Train a language model as ``cfg`` says; write the run directory; return a summary.

    With ``resume``, the run directory's own config and vocabulary are used and training
    continues from its latest snapshot exactly.
    """
    out = Path(cfg.out)
    device = choose_device(cfg.device, "--device")
    vocab, labels = None, None
    if resume:
        saved_cfg, _ = load_config(out)
        check_unchanged(cfg, saved_cfg, out)
        vocab = Vocabulary.load(out / "vocab.json")
        labels = lm_labels(out, cfg)
    ctx = _distributed(cfg, device)
    seed_everything(cfg.seed)  # the same on every rank: identical initial weights
    data = prepare_lm_data(cfg, vocab, labels, resume=resume)
    num_labels = None if data.labels is None else len(data.labels)
    model = build_lm(model_spec(cfg), len(data.vocab), num_labels).to(device)
    model.loss_reduction = cfg.loss_reduction
    pretrained = None
    if cfg.pretrained_vectors is not None and not resume:
        assert not isinstance(model, JordanLM)  # refused with --wiring jordan
        pretrained = load_pretrained_vectors(cfg, model.embedding, data.vocab.itos)
    optimizer = make_optimizer(cfg, model)
    batches = train_batches(cfg, data, drop_last=ctx.enabled)
    if ctx.is_main:
        out.mkdir(parents=True, exist_ok=True)
    if not resume and ctx.is_main:
        _write_start(out, cfg, data)
    schedule = parse_schedule(cfg.scheduled_sampling)
    holder: dict[str, Trainer] = {}
    sampling = None
    if schedule.active:
        sampling = (schedule, lambda: holder["trainer"].step if holder else 0)
    # From the Trainer's first collective on (DistributedDataParallel's check of the
    # weights' shapes), a process gone (one that failed on its own: bad data of its own)
    # breaks this one's collective: said in one line, not gloo's traceback
    with peer_lost_said(ctx):
        trainer = Trainer(
            model,
            optimizer,
            batches,
            _step_fn(data, device, sampling),
            train_options(cfg, quiet, "bits" if cfg.unit == "char" else "ppl"),
            evaluate_fn=lambda m: lm_metrics(m, data, device, cfg.batch_size),
            out_dir=out,
            callbacks=callbacks,
            dist_ctx=ctx,
        )
        holder["trainer"] = trainer
        if resume:
            _resume(trainer, ctx)
        started = time.perf_counter()
        result = trainer.fit()
    elapsed = time.perf_counter() - started
    if not ctx.is_main:
        return {"task": "lm", "rank": ctx.rank, "steps": result.steps}
    ngram_metrics = _fit_ngram(cfg, data, out)
    summary = {
        "task": "lm",
        "steps": result.steps,
        "threads": result.threads,
        "epoch": result.epochs_done,
        "elapsed_s": elapsed,
        "train_loss_nats": result.train_loss_nats,
        "tokens_per_s": result.tokens / max(result.train_seconds, 1e-9),
        "valid": result.best_valid,
        "ngram": ngram_metrics,
        "unknown_valid_tokens": data.unknown_valid_tokens(),
        "clipped_steps": result.clipped_steps,
        "stopped_early": result.stopped_early,
        "stopped": result.stopped,
        "parameters": sum(p.numel() for p in model.parameters()),
        "processes": ctx.world_size,
    }
    if pretrained is not None:
        summary["pretrained_vectors"] = pretrained
    if schedule.active:  # the probability of feeding the model's own token, at the end
        summary["scheduled_sampling_p"] = schedule.probability(result.steps)
    return finish_summary(cfg, summary, result)


def _distributed(cfg: TrainConfig, device: torch.device) -> DistContext:
    """This process's place in a distributed run (one process: not distributed), once
    ``--batch-size``, the global batch, is checked to split evenly over the processes."""
    ctx = init_distributed(device.type)
    if ctx.enabled and cfg.batch_size % ctx.world_size:
        raise ConfigError(
            f"--batch-size {cfg.batch_size} is the global batch: it must be divisible by the "
            f"{ctx.world_size} processes"
        )
    return ctx


def _write_start(out: Path, cfg: TrainConfig, data: LMData) -> None:
    """What a new run writes before training: its vocabulary, labels and configuration
    (and no metrics of an earlier attempt)."""
    data.vocab.save(out / "vocab.json")
    info: dict[str, Any] = {"vocab_size": len(data.vocab)}
    if data.labels is not None:
        data.labels.save(out / "labels.json")
        info["num_labels"] = len(data.labels)
    save_config(out, cfg, **info)
    (out / "metrics.jsonl").unlink(missing_ok=True)


def _fit_ngram(cfg: TrainConfig, data: LMData, out: Path) -> dict[str, Any]:
    """The n-gram baseline on the same tokens, written to ``ngram.safetensors``; its
    metrics on the validation tokens."""
    ngram = NGramModel(order=cfg.ngram_order, vocab_size=len(data.vocab))
    train_ng, _ = ngram_streams(data)
    ngram.fit(train_ng)
    state = ngram.to_state()
    atomic_write(out / "ngram.safetensors", write_path=lambda tmp: save_numpy(state, tmp))
    return ngram_lm_metrics(ngram, data)


def ngram_lm_metrics(ngram: NGramModel, data: LMData) -> dict[str, Any]:
    """The n-gram baseline scored on exactly the target tokens ``lm_metrics`` scores.

    Streams: the recurrent model predicts every token of the validation stream but the
    first (the rows, then the tail the rows leave over); the n-gram is scored on the same
    tokens (with its own left context). Sequences: ``w… </s>`` of every line for both.
    """
    _, valid = ngram_streams(data)
    logprobs = ngram.logprobs(valid)
    if data.mode == "segment":
        logprobs = logprobs[1:]
    return {
        "order": ngram.order,
        **_metrics(float(-logprobs.mean()), len(logprobs), data.vocab.unit),
    }


def lm_labels(run_dir: str | Path, cfg: TrainConfig) -> LabelSet | None:
    """The classes of a ``--condition`` run (its ``labels.json``), else None."""
    if cfg.condition == "none":
        return None
    try:
        return LabelSet.load(Path(run_dir) / "labels.json")
    except DataError as exc:
        raise CheckpointError(str(exc)) from None


def load_lm(run_dir: str | Path, device: str = "cpu") -> tuple[TrainConfig, Vocabulary, AnyLM]:
    """Load a trained language model from its run directory (no code is unpickled).

    The model is a :class:`LanguageModel`, a :class:`JordanLM` (``--wiring jordan``) or a
    :class:`ConditionalLM` (``--condition``; its classes: :func:`lm_labels`).
    """
    run_dir = Path(run_dir)
    cfg, info = load_config(run_dir, task="lm")
    vocab = Vocabulary.load(run_dir / "vocab.json")
    check_count(run_dir / "vocab.json", len(vocab), "tokens", info, "vocab_size")
    labels = lm_labels(run_dir, cfg)
    num_labels = None if labels is None else len(labels)
    check_count(run_dir / "labels.json", num_labels, "labels", info, "num_labels")
    model = build_lm(model_spec(cfg), len(vocab), num_labels).to(choose_device(device))
    load_model_weights(model, run_dir / "model.safetensors")
    model.eval()
    return cfg, vocab, model


def evaluate_lm(
    run_dir: str | Path, data_path: str, batch_size: int | None = None, device: str = "cpu"
) -> dict[str, Any]:
    """Score a text file with a trained model and its n-gram baseline, side by side."""
    check_batch_size(batch_size)
    cfg, vocab, model = load_lm(run_dir, device)
    eval_cfg = TrainConfig(**{**cfg.to_dict(), "train": data_path, "valid": data_path})
    data = prepare_lm_data(eval_cfg, vocab, lm_labels(run_dir, cfg))
    model_device = next(model.parameters()).device
    metrics = lm_metrics(model, data, model_device, batch_size or cfg.batch_size)
    # tokens the training data never held, scored as the unknown symbol (as predict's
    # "unknown" and the summary's unknown_valid_tokens count them)
    metrics["unknown"] = data.unknown_valid_tokens()
    if data.labels is not None:  # lines of a label the model never saw are not scored
        metrics["unknown_labels"] = sum(data.valid_unknown.values())
        metrics["unknown_label_counts"] = dict(sorted(data.valid_unknown.items()))
    ngram_path = Path(run_dir) / "ngram.safetensors"
    if ngram_path.is_file():
        ngram = NGramModel.from_state(load_arrays(ngram_path), where=str(ngram_path))
        metrics["ngram"] = ngram_lm_metrics(ngram, data)
    return metrics


# The task interface of ``rnnkit.app.tasks.registry``.
train = train_lm
evaluate = evaluate_lm


def predictor(
    run_dir: str | Path, batch_size: int | None = None, device: str = "cpu", **_: Any
) -> Any:
    """``rnnkit predict`` for a language model: each input line is scored by
    :func:`line_logprobs`; for a class-conditional run a line is ``label<TAB>text``."""
    check_batch_size(batch_size)
    cfg, vocab, model = load_lm(run_dir, device)
    labels = lm_labels(run_dir, cfg)
    bs = batch_size or cfg.batch_size

    def run(lines: list[str], where: list[tuple[str, int]]) -> list[dict[str, Any]]:
        conditions: list[int] | None = None
        texts = lines
        if labels is not None:
            conditions, texts = [], []
            for text, (path, line) in zip(lines, where, strict=True):
                label, tab, rest = text.partition("\t")
                index = labels.get(label) if tab else None
                if index is None:
                    raise DataError(
                        f"expected label<TAB>text with a label of this run "
                        f"({', '.join(labels.labels)})",
                        path,
                        line,
                    )
                conditions.append(index)
                texts.append(rest)
        out = line_logprobs(cfg, vocab, model, texts, conditions, batch_size=bs)
        if conditions is not None:
            for record, text in zip(out, lines, strict=True):
                record["label"] = text.partition("\t")[0]
        return out

    return run
