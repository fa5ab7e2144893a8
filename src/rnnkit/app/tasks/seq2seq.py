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

The pairs, vocabularies, model building and loading are in
:mod:`rnnkit.app.tasks.seq2seq_data`; decoding, the output metrics and the baselines in
:mod:`rnnkit.app.tasks.seq2seq_decode`; ``rnnkit generate --input`` in
:mod:`rnnkit.app.tasks.seq2seq_generate`. This module trains, evaluates and predicts, and
exports their names as well.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from rnnkit.app.config import TrainConfig
from rnnkit.app.tasks.fitting import check_unchanged, make_optimizer
from rnnkit.app.tasks.run_config import (
    check_batch_size,
    load_config,
    refuse_tabbed_line,
    save_config,
)
from rnnkit.app.tasks.run_dir import guarded_run
from rnnkit.app.tasks.run_outputs import BASELINE_FILE, finish_summary, load_baseline, save_baseline
from rnnkit.app.tasks.seq2seq_data import (
    Seq2SeqData,
    _check_target_lengths,
    batch_to,
    build_model,
    load_seq2seq,
    prepare_data,
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
from rnnkit.app.tasks.seq2seq_generate import (
    generate_outputs,
    search_options,
    transduce,
    warn_longer,
)
from rnnkit.app.tasks.settings import choose_device, seed_everything, train_options
from rnnkit.data.pairs import PairBatcher, encode_pairs, read_pairs
from rnnkit.data.vocab import Vocabulary
from rnnkit.errors import ConfigError, DataError
from rnnkit.models.decoder_only import DecoderOnlyTranslator
from rnnkit.models.language_model import LossOutput
from rnnkit.models.lookup import NearestNeighbour
from rnnkit.models.seq2seq import Seq2Seq
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
    elif cfg.bidirectional and cfg.attention == "dot":
        # the model would refuse it too, but naming its Python arguments
        raise ConfigError(
            "--attention dot needs equal widths, and --bidirectional doubles the encoder "
            "states' (2 × --hidden against the decoder's --hidden); use --attention "
            "bilinear or additive"
        )


def _load_nearest(run_dir: Path, target_size: int) -> NearestNeighbour | None:
    arrays = load_baseline(run_dir)
    if arrays is None:
        return None
    where = str(run_dir / BASELINE_FILE)
    return NearestNeighbour.from_state(arrays, where=where, target_size=target_size)


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


def _write_start(out: Path, cfg: TrainConfig, data: Seq2SeqData) -> None:
    """What a new run writes before training: both vocabularies and its configuration
    (and no metrics of an earlier attempt)."""
    data.target_vocab.save(out / "vocab.json")
    data.source_vocab.save(out / "source_vocab.json")
    save_config(
        out,
        cfg,
        source_vocab_size=len(data.source_vocab),
        target_vocab_size=len(data.target_vocab),
    )
    (out / "metrics.jsonl").unlink(missing_ok=True)


def _decode_valid(cfg: TrainConfig, model: Any, data: Seq2SeqData, device: Any) -> tuple[Any, Any]:
    """The validation sources decoded with the best weights (``--beam``, at most
    ``--max-len`` tokens): their metrics and outputs."""
    load_model_weights(model, Path(cfg.out) / "model.safetensors")
    return decode_metrics(
        model,
        data.valid_pairs,
        data.valid_src,
        data.target_vocab,
        device,
        cfg.batch_size,
        cfg.beam,
        cfg.max_len + 1,
    )


@guarded_run
def train(cfg: TrainConfig, resume: bool = False, quiet: bool = False) -> dict[str, Any]:
    """Train as ``cfg`` says; write the run directory; return a summary.

    The summary's ``valid`` holds the teacher-forced metrics of the best checkpoint plus
    ``exact_match`` / ``token_error_rate`` of decoding the validation sources with it.
    """
    check_config(cfg)
    schedule = parse_schedule(cfg.scheduled_sampling)
    out = Path(cfg.out)
    device = choose_device(cfg.device, "--device")
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
        _write_start(out, cfg, data)
    save_baseline(out, nearest.to_state())
    clock = _StepClock()

    def step_fn(m: Seq2Seq | DecoderOnlyTranslator, batch: Any, carry: Any) -> LossOutput:
        p = schedule.probability(clock.step) if schedule.active else None
        return m.loss(batch_to(batch, device), sampling_p=p)

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
    decoded, outputs = _decode_valid(cfg, model, data, device)
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
        # the pairs of this call's steps over their time (a resumed run counted every
        # step of the run over this call's time; one with no step left, a huge figure)
        "sentences_per_s": (result.steps - result.first_step)
        * cfg.batch_size
        / result.train_seconds
        if result.steps > result.first_step and result.train_seconds > 0
        else None,
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
    return finish_summary(cfg, summary, result)


def evaluate(
    run_dir: str | Path,
    data_path: str,
    batch_size: int | None = None,
    device: str = "cpu",
    beam: int | None = None,
) -> dict[str, Any]:
    """Score a ``source<TAB>target`` file: teacher-forced loss and accuracy, then decoding
    (beam width ``beam``, default the run's ``--beam``; 1 is greedy) for exact match and
    token error rate.

    Tokens outside the vocabularies are counted (``source_unknown_tokens``,
    ``target_unknown_tokens``), not fatal: an unknown reference token simply cannot be
    matched.
    """
    check_batch_size(batch_size)
    cfg, source_vocab, target_vocab, model = load_seq2seq(run_dir, device)
    model_device = next(model.parameters()).device
    pairs = read_pairs(data_path)
    sources, targets = encode_pairs(pairs, source_vocab, target_vocab, data_path)
    _check_target_lengths(cfg, pairs, targets, data_path)
    bs = batch_size or cfg.batch_size
    metrics = teacher_forced_metrics(model, sources, targets, model_device, bs)
    width = cfg.beam if beam is None else beam
    decoded, _ = decode_metrics(
        model, pairs, sources, target_vocab, model_device, bs, width, cfg.max_len + 1
    )
    decoded["beam"] = width
    metrics.update(decoded)
    nearest = _load_nearest(Path(run_dir), len(target_vocab))
    if nearest is not None:
        metrics["baselines"] = baseline_metrics(nearest, pairs, sources, target_vocab)
    longer = [(p, len(s)) for p, s in zip(pairs, sources, strict=True) if len(s) > cfg.max_len]
    if longer:
        (first, n), more = longer[0], len(longer) - 1
        warn_longer(f"{data_path}:{first.line}", n, cfg.max_len, "decoding is", more)
    metrics["source_unknown_tokens"] = sum(
        source_vocab.encode_with_unknown(p.source)[1] for p in pairs
    )
    metrics["target_unknown_tokens"] = sum(
        target_vocab.encode_with_unknown(p.target)[1] for p in pairs
    )
    return metrics


def predictor(
    run_dir: str | Path,
    batch_size: int | None = None,
    device: str = "cpu",
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
    check_batch_size(batch_size)
    cfg, source_vocab, target_vocab, model = load_seq2seq(run_dir, device)
    # named as the Python arguments: `rnnkit predict` checks --beam and --max-len first
    beam, limit = search_options(beam, max_length, cfg.beam, cfg.max_len)
    bs = batch_size or cfg.batch_size
    model_device = next(model.parameters()).device

    warned: list[bool] = []

    def run(lines: list[str], where: list[tuple[str, int]]) -> list[dict[str, Any]]:
        sources, unknown = [], []
        for text, (path, line) in zip(lines, where, strict=True):
            refuse_tabbed_line(text, path, line, "source", "source<TAB>target")
            ids, n_unknown = source_vocab.encode_with_unknown(text)
            if not ids:
                raise DataError("empty source (no tokens to transduce)", path, line)
            if len(ids) > cfg.max_len and not warned:
                warned.append(True)
                warn_longer(f"{path}:{line}", len(ids), cfg.max_len, "answer is")
            sources.append(np.array(ids, dtype=np.int64))
            unknown.append(n_unknown)
        hyps = decode_ids(model, sources, model_device, bs, beam, limit + 1)
        return [
            {"input": text, "output": render_output(target_vocab, h[:limit]), "unknown": u}
            for text, h, u in zip(lines, hyps, unknown, strict=True)
        ]

    return run
