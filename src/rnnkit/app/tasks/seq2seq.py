"""The transduction task: ``source<TAB>target`` pairs → vocabularies → model → metrics.

``rnnkit train --task seq2seq`` trains an encoder–decoder (``--attention``, ``--context``,
``--scheduled-sampling``) or, with ``--decoder-only``, one language model over
``source <sep> target``. ``--source-unit`` / ``--target-unit`` choose characters or
words per side; ``--max-len`` bounds the tokens of each side of a training pair and of a
decoded output; ``--beam`` is the beam width used for validation decoding, ``evaluate``
and ``generate --input`` (1 = greedy).

Run directory (beside the training loop's snapshots and ``metrics.jsonl``)::

    config.json          the TrainConfig, format version, both vocabulary sizes
    vocab.json           the TARGET vocabulary (what the model writes)
    source_vocab.json    the source vocabulary
    model.safetensors    best weights on validation loss
    summary.json         what ``train`` returned

Metrics: ``loss_nats`` (mean per target token, ``</s>`` included, teacher forcing),
``tokens``, ``perplexity``, ``token_accuracy`` (teacher forcing), and from decoding
``exact_match``, ``token_error_rate`` (edit distance over reference tokens),
``character_error_rate`` and ``bleu``.

Baselines, scored with the same decoding metrics in the summary and by ``evaluate``
(``baselines``): ``copy`` (the source itself is the output: what a transliteration-like
task gets for free) and ``nearest_neighbour`` (the target of the training source at the
smallest edit distance, :class:`rnnkit.models.lookup.NearestNeighbour`: memorisation,
with a little generalisation to similar sources). The training pairs it searches are
kept in ``baseline.safetensors``.

``--length stop|predict`` replaces ``</s>`` by a stop output per decoder step or a target
length predicted from the encoder context (at most ``--max-len``):
:mod:`rnnkit.models.length`. Then ``</s>`` is no token: ``tokens`` and ``token_accuracy``
leave its step out, and ``loss_nats`` is the exact sequence negative log-likelihood (stop
or length terms included) per token step, the training loss. Under ``predict`` a
reference target longer than ``--max-len`` cannot be scored: a ``DataError`` naming it.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rnnkit.app.config import TrainConfig
from rnnkit.app.tasks.fitting import check_unchanged, make_optimizer
from rnnkit.app.tasks.run import (
    BASELINE_FILE,
    check_count,
    choose_device,
    finish_summary,
    guarded_run,
    load_baseline,
    load_config,
    model_spec,
    save_baseline,
    save_config,
    seed_everything,
    train_options,
)
from rnnkit.app.tasks.seq2seq_decode import (
    COPY_KIND,
    baseline_metrics,
    decode_ids,
    decode_metrics,
    nearest_kind,
    output_metrics,
    render_output,
    teacher_forced_metrics,
)
from rnnkit.data.pairs import Pair, PairBatcher, encode_pairs, make_pair_batch, read_pairs
from rnnkit.data.vocab import Vocabulary, count_tokens
from rnnkit.errors import ConfigError, DataError
from rnnkit.models.decoder_only import DecoderOnlyTranslator, build_decoder_only
from rnnkit.models.language_model import LossOutput
from rnnkit.models.lookup import NearestNeighbour
from rnnkit.models.seq2seq import Seq2Seq, build_seq2seq
from rnnkit.training.checkpoint import load_model_weights
from rnnkit.training.loop import Trainer
from rnnkit.training.scheduled_sampling import parse_schedule

__all__ = [
    "COPY_KIND",
    "Seq2SeqData",
    "baseline_metrics",
    "build_model",
    "check_config",
    "decode_ids",
    "decode_metrics",
    "evaluate",
    "generate_outputs",
    "load_seq2seq",
    "nearest_kind",
    "output_metrics",
    "predictor",
    "prepare_data",
    "teacher_forced_metrics",
    "train",
    "transduce",
]


@dataclass
class Seq2SeqData:
    """Encoded training and validation pairs with both vocabularies."""

    source_vocab: Vocabulary
    target_vocab: Vocabulary
    train_pairs: list[Pair]
    valid_pairs: list[Pair]
    train_src: list[np.ndarray]
    train_tgt: list[np.ndarray]
    valid_src: list[np.ndarray]
    valid_tgt: list[np.ndarray]
    valid_path: str


def _vocab(texts: list[str], unit: str, min_freq: int, source: str) -> Vocabulary:
    counts: Counter[str] = count_tokens("\n".join(texts), unit)
    counts.pop("\n", None)  # the joiner, not data
    return Vocabulary.from_counts(counts, unit=unit, min_freq=min_freq, source=source)


def _check_lengths(pairs: list[Pair], src, tgt, max_len: int, path: str) -> None:
    for pair, s, t in zip(pairs, src, tgt, strict=True):
        for side, ids in (("source", s), ("target", t)):
            if len(ids) > max_len:
                raise DataError(
                    f"the {side} has {len(ids)} tokens, more than --max-len {max_len}",
                    path,
                    pair.line or None,
                )


def _check_target_lengths(
    cfg: TrainConfig, pairs: list[Pair], targets: list[np.ndarray], path: str
) -> None:
    """``--length predict`` gives no probability to a target longer than ``--max-len``."""
    if cfg.length != "predict":
        return
    for pair, t in zip(pairs, targets, strict=True):
        if len(t) > cfg.max_len:
            raise DataError(
                f"the target has {len(t)} tokens, more than --max-len {cfg.max_len} "
                "(the longest length --length predict can predict)",
                path,
                pair.line or None,
            )


def check_config(cfg: TrainConfig) -> None:
    """The seq2seq-specific checks of ``cfg`` (ConfigError naming the option)."""
    schedule = parse_schedule(cfg.scheduled_sampling)
    if cfg.decoder_only:
        if schedule.active:
            raise ConfigError(
                "--scheduled-sampling applies to the encoder–decoder, not --decoder-only"
            )
        if cfg.bidirectional:
            raise ConfigError("--bidirectional does not apply to --decoder-only (one causal LM)")


def prepare_data(
    cfg: TrainConfig, vocabs: tuple[Vocabulary, Vocabulary] | None = None
) -> Seq2SeqData:
    """Read the pairs, hold out validation pairs, build or reuse the vocabularies."""
    pairs = read_pairs(cfg.train)
    if cfg.valid:
        train_pairs, valid_pairs, valid_path = pairs, read_pairs(cfg.valid), cfg.valid
    else:
        held = max(1, round(len(pairs) * cfg.valid_fraction))
        if len(pairs) - held < 1:
            raise DataError(
                f"{len(pairs)} pair(s): too few to hold out validation pairs; pass --valid",
                cfg.train,
            )
        train_pairs, valid_pairs, valid_path = pairs[:-held], pairs[-held:], cfg.train
    if vocabs is None:
        sources, targets = [p.source for p in train_pairs], [p.target for p in train_pairs]
        source_vocab = _vocab(sources, cfg.source_unit, cfg.min_freq, cfg.train)
        target_vocab = _vocab(targets, cfg.target_unit, cfg.min_freq, cfg.train)
    else:
        source_vocab, target_vocab = vocabs
    train_src, train_tgt = encode_pairs(train_pairs, source_vocab, target_vocab, cfg.train)
    valid_src, valid_tgt = encode_pairs(valid_pairs, source_vocab, target_vocab, valid_path)
    _check_lengths(train_pairs, train_src, train_tgt, cfg.max_len, cfg.train)
    _check_target_lengths(cfg, valid_pairs, valid_tgt, valid_path)
    return Seq2SeqData(
        source_vocab,
        target_vocab,
        train_pairs,
        valid_pairs,
        train_src,
        train_tgt,
        valid_src,
        valid_tgt,
        valid_path,
    )


def build_model(
    cfg: TrainConfig, source_vocab_size: int, target_vocab_size: int
) -> Seq2Seq | DecoderOnlyTranslator:
    """``Seq2Seq`` or, with ``--decoder-only``, ``DecoderOnlyTranslator``."""
    if cfg.decoder_only:
        return build_decoder_only(model_spec(cfg), source_vocab_size, target_vocab_size)
    return build_seq2seq(model_spec(cfg), source_vocab_size, target_vocab_size)


def _load_nearest(run_dir: Path) -> NearestNeighbour | None:
    arrays = load_baseline(run_dir)
    if arrays is None:
        return None
    return NearestNeighbour.from_state(arrays, where=str(run_dir / BASELINE_FILE))


class _StepClock:
    """Lets the step function read the trainer's step count (exact across resume)."""

    trainer: Trainer | None = None

    @property
    def step(self) -> int:
        return self.trainer.step if self.trainer is not None else 0


def _check_resume(out: Path, cfg: TrainConfig) -> tuple[Vocabulary, Vocabulary]:
    saved, _ = load_config(out, task="seq2seq")
    check_unchanged(cfg, saved, out)
    return Vocabulary.load(out / "source_vocab.json"), Vocabulary.load(out / "vocab.json")


@guarded_run
def train(cfg: TrainConfig, resume: bool = False, quiet: bool = False) -> dict[str, Any]:
    """Train as ``cfg`` says; write the run directory; return a summary.

    The summary's ``valid`` holds the teacher-forced metrics of the best checkpoint plus
    ``exact_match`` / ``token_error_rate`` of decoding the validation sources with it.
    """
    check_config(cfg)
    schedule = parse_schedule(cfg.scheduled_sampling)
    out = Path(cfg.out)
    device = choose_device(cfg.device)
    vocabs = _check_resume(out, cfg) if resume else None
    seed_everything(cfg.seed)
    data = prepare_data(cfg, vocabs)
    model = build_model(cfg, len(data.source_vocab), len(data.target_vocab)).to(device)
    model.loss_reduction = cfg.loss_reduction
    nearest = NearestNeighbour(data.train_src, data.train_tgt)
    optimizer = make_optimizer(cfg, model)
    batches = PairBatcher(
        data.train_src, data.train_tgt, batch_size=cfg.batch_size, shuffle=True, seed=cfg.seed
    )
    out.mkdir(parents=True, exist_ok=True)
    if not resume:
        data.target_vocab.save(out / "vocab.json")
        data.source_vocab.save(out / "source_vocab.json")
        save_config(
            out,
            cfg,
            source_vocab_size=len(data.source_vocab),
            target_vocab_size=len(data.target_vocab),
        )
        (out / "metrics.jsonl").unlink(missing_ok=True)
    save_baseline(out, nearest.to_state())
    clock = _StepClock()

    def step_fn(m: Seq2Seq | DecoderOnlyTranslator, batch: Any, carry: Any) -> LossOutput:
        p = schedule.probability(clock.step) if schedule.active else None
        return m.loss(batch.to(device), sampling_p=p)

    trainer = Trainer(
        model,
        optimizer,
        batches,
        step_fn,
        train_options(cfg, quiet, "ppl"),
        evaluate_fn=lambda m: teacher_forced_metrics(
            m, data.valid_src, data.valid_tgt, device, cfg.batch_size
        ),
        out_dir=out,
    )
    clock.trainer = trainer
    if resume:
        trainer.resume()
    started = time.perf_counter()
    result = trainer.fit()
    elapsed = time.perf_counter() - started
    # Decode the validation sources with the best weights.
    load_model_weights(model, out / "model.safetensors")
    decoded, outputs = decode_metrics(
        model,
        data.valid_pairs,
        data.valid_src,
        data.target_vocab,
        device,
        cfg.batch_size,
        cfg.beam,
        cfg.max_len + 1,
    )
    train_events = [e for e in result.history if e["event"] == "train"]
    summary = {
        "task": "seq2seq",
        "model": "decoder-only" if cfg.decoder_only else "encoder-decoder",
        "steps": result.steps,
        "threads": result.threads,
        "epoch": result.epochs_done,
        "elapsed_s": elapsed,
        "train_loss_nats": result.train_loss_nats,
        "tokens_per_s": float(np.median([e["tokens_per_s"] for e in train_events]))
        if train_events
        else None,
        "sentences_per_s": result.steps * cfg.batch_size / max(elapsed, 1e-9),
        "scheduled_sampling_p": schedule.probability(result.steps),
        "valid": {**(result.best_valid or {}), **decoded},
        "baselines": baseline_metrics(nearest, data.valid_pairs, data.valid_src, data.target_vocab),
        "samples": [
            f"{p.source} → {o}" for p, o in zip(data.valid_pairs[:3], outputs[:3], strict=False)
        ],
        "clipped_steps": result.clipped_steps,
        "stopped_early": result.stopped_early,
        "stopped": result.stopped,
        "parameters": sum(p.numel() for p in model.parameters()),
    }
    return finish_summary(cfg, summary)


def load_seq2seq(
    run_dir: str | Path, device: str = "cpu"
) -> tuple[TrainConfig, Vocabulary, Vocabulary, Seq2Seq | DecoderOnlyTranslator]:
    """``(cfg, source_vocab, target_vocab, model)`` of a run directory (no unpickling)."""
    run_dir = Path(run_dir)
    cfg, info = load_config(run_dir, task="seq2seq")
    source_vocab = Vocabulary.load(run_dir / "source_vocab.json")
    target_vocab = Vocabulary.load(run_dir / "vocab.json")
    for name, vocab, key in (
        ("source_vocab.json", source_vocab, "source_vocab_size"),
        ("vocab.json", target_vocab, "target_vocab_size"),
    ):
        check_count(run_dir / name, len(vocab), "tokens", info, key)
    model = build_model(cfg, len(source_vocab), len(target_vocab)).to(choose_device(device))
    load_model_weights(model, run_dir / "model.safetensors")
    model.eval()
    return cfg, source_vocab, target_vocab, model


def evaluate(run_dir: str | Path, data_path: str, batch_size: int | None = None) -> dict[str, Any]:
    """Score a ``source<TAB>target`` file: teacher-forced loss and accuracy, then decoding
    (beam width of the run's ``--beam``) for exact match and token error rate.

    Tokens outside the vocabularies are counted (``source_unknown_tokens``,
    ``target_unknown_tokens``), not fatal: an unknown reference token simply cannot be
    matched.
    """
    cfg, source_vocab, target_vocab, model = load_seq2seq(run_dir)
    device = next(model.parameters()).device
    pairs = read_pairs(data_path)
    sources, targets = encode_pairs(pairs, source_vocab, target_vocab, data_path)
    _check_target_lengths(cfg, pairs, targets, data_path)
    bs = batch_size or cfg.batch_size
    if bs < 1:
        raise ConfigError(f"--batch-size must be ≥ 1, got {bs}")
    metrics = teacher_forced_metrics(model, sources, targets, device, bs)
    decoded, _ = decode_metrics(
        model, pairs, sources, target_vocab, device, bs, cfg.beam, cfg.max_len + 1
    )
    metrics.update(decoded)
    nearest = _load_nearest(Path(run_dir))
    if nearest is not None:
        metrics["baselines"] = baseline_metrics(nearest, pairs, sources, target_vocab)
    metrics["source_unknown_tokens"] = sum(
        source_vocab.encode_with_unknown(p.source)[1] for p in pairs
    )
    metrics["target_unknown_tokens"] = sum(
        target_vocab.encode_with_unknown(p.target)[1] for p in pairs
    )
    return metrics


def transduce(
    run_dir: str | Path, text: str, beam: int | None = None, max_length: int | None = None
) -> str:
    """The model's output for one source ``text`` (``rnnkit generate --input TEXT``).

    Args:
        run_dir: a seq2seq run directory.
        text: the source, in the run's ``--source-unit``.
        beam: beam width (default: the run's ``--beam``; 1 = greedy).
        max_length: most output tokens (default: the run's ``--max-len``).
    """
    cfg, source_vocab, target_vocab, model = load_seq2seq(run_dir)
    ids = source_vocab.encode_array(text, dtype=np.int64)
    if len(ids) == 0:
        raise DataError("--input is empty: nothing to transduce")
    beam = cfg.beam if beam is None else beam
    if isinstance(beam, bool) or not isinstance(beam, int) or beam < 1:
        raise ConfigError(f"--beam must be an integer ≥ 1, got {beam!r}")
    limit = cfg.max_len if max_length is None else max_length
    device = next(model.parameters()).device
    hyp = decode_ids(model, [ids], device, 1, beam, limit + 1)[0]
    return render_output(target_vocab, hyp[:limit])  # limit + 1 steps leave room for </s> only


def predictor(
    run_dir: str | Path,
    batch_size: int | None = None,
    beam: int | None = None,
    max_length: int | None = None,
    **_: Any,
) -> Any:
    """``rnnkit predict`` for an encoder–decoder: each input line is one source (in the
    run's ``--source-unit``), decoded in length-sorted batches with beam width ``beam``
    (default: the run's ``--beam``; 1 = greedy), at most ``max_length`` output tokens
    (default: the run's ``--max-len``). The result is ``{"input": source, "output": text,
    "unknown": n}`` (``n`` source tokens outside the vocabulary). A line without tokens is
    a DataError naming it."""
    cfg, source_vocab, target_vocab, model = load_seq2seq(run_dir)
    beam = cfg.beam if beam is None else beam
    if isinstance(beam, bool) or not isinstance(beam, int) or beam < 1:
        raise ConfigError(f"--beam must be an integer ≥ 1, got {beam!r}")
    limit = cfg.max_len if max_length is None else max_length
    if limit < 1:
        raise ConfigError(f"--max-length must be ≥ 1, got {limit}")
    bs = batch_size or cfg.batch_size
    device = next(model.parameters()).device

    def run(lines: list[str], where: list[tuple[str, int]]) -> list[dict[str, Any]]:
        sources, unknown = [], []
        for text, (path, line) in zip(lines, where, strict=True):
            ids, n_unknown = source_vocab.encode_with_unknown(text)
            if not ids:
                raise DataError("empty source (no tokens to transduce)", path, line)
            sources.append(np.array(ids, dtype=np.int64))
            unknown.append(n_unknown)
        hyps = decode_ids(model, sources, device, bs, beam, limit + 1)
        return [
            {"input": text, "output": render_output(target_vocab, h[:limit]), "unknown": u}
            for text, h, u in zip(lines, hyps, unknown, strict=True)
        ]

    return run


def generate_outputs(
    run_dir: str | Path,
    text: str,
    *,
    sample: bool = False,
    num: int = 1,
    beam: int | None = None,
    max_length: int | None = None,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
) -> tuple[list[str], int]:
    """Outputs for one source (``rnnkit generate --input TEXT``), and how many of its
    tokens are outside the source vocabulary (read as ``<unk>``).

    ``sample``: ``num`` independent samples (``temperature``, ``top_k``, ``top_p``; the
    random source seeded with ``seed``); else the ``num`` best hypotheses of beam search
    of width ``max(beam, num)`` (``beam`` default: the run's ``--beam``; width 1 is greedy
    search). ``max_length``: most output tokens (default: the run's ``--max-len``).
    """
    cfg, source_vocab, target_vocab, model = load_seq2seq(run_dir)
    ids, unknown = source_vocab.encode_with_unknown(text)
    if not ids:
        raise DataError("--input is empty: nothing to transduce")
    if isinstance(num, bool) or not isinstance(num, int) or num < 1:
        raise ConfigError(f"--num must be an integer ≥ 1, got {num!r}")
    limit = cfg.max_len if max_length is None else max_length
    if limit < 1:
        raise ConfigError(f"--max-length must be ≥ 1, got {limit}")
    device = next(model.parameters()).device
    batch = make_pair_batch([np.array(ids, dtype=np.int64)], None).to(device)
    if sample:
        generator = torch.Generator(device=device)
        generator.manual_seed(seed)
        try:
            results = model.sample(
                batch.source,
                batch.source_mask,
                num=num,
                max_length=limit + 1,
                temperature=temperature,
                top_k=top_k,
                top_p=top_p,
                generator=generator,
            )[0]
        except ValueError as exc:  # an out-of-range sampling option, named by generation
            raise ConfigError(str(exc)) from None
    else:
        width = max(cfg.beam if beam is None else beam, num)
        if width < 1:
            raise ConfigError(f"--beam must be ≥ 1, got {width}")
        results = model.decode(
            batch.source, batch.source_mask, beam=width, max_length=limit + 1, num=num
        )[0]
    # limit + 1 steps leave room for </s>: an output that did not end is cut at limit
    return [render_output(target_vocab, r.ids[:limit]) for r in results], unknown
