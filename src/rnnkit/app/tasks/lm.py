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
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.numpy import save_file as save_numpy
from torch import Tensor

from rnnkit.app.config import TrainConfig, parse_bptt
from rnnkit.app.tasks.fitting import check_unchanged, make_optimizer
from rnnkit.app.tasks.run import (
    check_count,
    check_labels,
    choose_device,
    finish_summary,
    guarded_run,
    load_config,
    load_pretrained_vectors,
    model_spec,
    save_config,
    seed_everything,
    train_options,
)
from rnnkit.data.batching import SequenceBatcher, StreamBatcher, lm_pairs
from rnnkit.data.files import atomic_write
from rnnkit.data.labelled import LabelledExample, LabelSet, read_labelled, split_holdout
from rnnkit.data.text import encode_text, read_text
from rnnkit.data.vocab import BOS_ID, EOS_ID, Vocabulary
from rnnkit.errors import CheckpointError, ConfigError, DataError
from rnnkit.models.builders import build_lm
from rnnkit.models.conditional import CONDITIONAL_STATE_DIM, ConditionalLM
from rnnkit.models.jordan import JordanLM
from rnnkit.models.language_model import LanguageModel, LossOutput
from rnnkit.models.length import LengthState
from rnnkit.models.ngram import NGramModel
from rnnkit.training.checkpoint import load_arrays, load_model_weights
from rnnkit.training.distributed import init_distributed
from rnnkit.training.loop import Trainer
from rnnkit.training.scheduled_sampling import parse_schedule

#: The kinds of model ``--task lm`` trains (``--wiring``, ``--condition``; ``build_lm``).
AnyLM = LanguageModel | JordanLM | ConditionalLM

__all__ = [
    "LMData",
    "evaluate",
    "evaluate_lm",
    "line_logprobs",
    "lm_labels",
    "lm_metrics",
    "load_lm",
    "predictor",
    "prepare_lm_data",
    "train",
    "train_lm",
]

LN2 = math.log(2)


@dataclass
class LMData:
    vocab: Vocabulary
    mode: str  # "segment" | "full" | "window"
    k: int | None
    train_stream: np.ndarray | None = None
    valid_stream: np.ndarray | None = None
    train_seqs: list[np.ndarray] | None = None
    valid_seqs: list[np.ndarray] | None = None
    # --condition: the classes, and the class of every sequence
    labels: LabelSet | None = None
    train_labels: np.ndarray | None = None
    valid_labels: np.ndarray | None = None
    valid_unknown: Counter[str] = field(default_factory=Counter)  # unseen label → lines


def _split_text(text: str, fraction: float, path: str) -> tuple[str, str]:
    """Hold out the last ``fraction`` of the text, cut at a line boundary."""
    cut = int(len(text) * (1 - fraction))
    newline = text.rfind("\n", 0, cut)
    if newline > 0:
        cut = newline + 1
    train, valid = text[:cut], text[cut:]
    if not train.strip() or not valid.strip():
        raise DataError("corpus too small to hold out validation text; pass --valid", path)
    return train, valid


def _sequences(text: str, vocab: Vocabulary, max_len: int) -> list[np.ndarray]:
    """Non-blank lines as id sequences, long lines cut into pieces of ``max_len``."""
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        ids = vocab.encode_array(line, dtype=np.int64)
        for lo in range(0, len(ids), max_len):
            out.append(ids[lo : lo + max_len])
    return out


def _labelled_sequences(
    examples: list[LabelledExample], data: LMData, max_len: int, path: str
) -> tuple[list[np.ndarray], np.ndarray, Counter[str]]:
    """Texts as id sequences (cut into pieces of ``max_len``), the class of each, and the
    lines whose label is not in ``data.labels`` (left out: they cannot be conditioned on)."""
    assert data.labels is not None
    seqs: list[np.ndarray] = []
    classes: list[int] = []
    unknown: Counter[str] = Counter()
    for ex in examples:
        k = data.labels.get(ex.label)
        if k is None:
            unknown[ex.label] += 1
            continue
        ids = data.vocab.encode_array(ex.text, dtype=np.int64)
        if len(ids) == 0:  # e.g. a word-unit text of only whitespace-like characters
            raise DataError("empty text (no tokens)", path, ex.line)
        for lo in range(0, len(ids), max_len):
            seqs.append(ids[lo : lo + max_len])
            classes.append(k)
    return seqs, np.array(classes, dtype=np.int64), unknown


def _prepare_conditional(
    cfg: TrainConfig, vocab: Vocabulary | None, labels: LabelSet | None, resume: bool = False
) -> LMData:
    """``--condition``: ``label<TAB>text`` lines, one sequence (and class) per line."""
    examples = read_labelled(cfg.train)
    if cfg.valid:
        valid_examples, valid_path = read_labelled(cfg.valid), cfg.valid
    else:
        examples, valid_examples = split_holdout(examples, cfg.valid_fraction, cfg.seed)
        valid_path = cfg.train
    if not examples:
        raise DataError("no label<TAB>text line to train on", cfg.train)
    if vocab is None:
        text = "\n".join(ex.text for ex in examples)
        vocab = Vocabulary.from_text(text, unit=cfg.unit, min_freq=cfg.min_freq, source=cfg.train)
    if labels is None:
        labels = LabelSet.from_data(ex.label for ex in examples)
    elif resume:  # the run's labels.json must still be the training data's labels
        check_labels(cfg.out, labels, LabelSet.from_data(ex.label for ex in examples), cfg.train)
    data = LMData(vocab, "full", None, labels=labels)
    data.train_seqs, data.train_labels, _ = _labelled_sequences(
        examples, data, cfg.max_len, cfg.train
    )
    data.valid_seqs, data.valid_labels, data.valid_unknown = _labelled_sequences(
        valid_examples, data, cfg.max_len, valid_path
    )
    if not data.valid_seqs:
        raise DataError(
            f"no line has a label the model knows ({', '.join(labels.labels)})", valid_path
        )
    return data


def prepare_lm_data(
    cfg: TrainConfig,
    vocab: Vocabulary | None = None,
    labels: LabelSet | None = None,
    resume: bool = False,
) -> LMData:
    """Read, split and encode the corpora as ``cfg`` says (``labels``: ``--condition``;
    with ``resume``, they must be exactly the training data's labels)."""
    if cfg.condition != "none":
        return _prepare_conditional(cfg, vocab, labels, resume)
    text = read_text(cfg.train)
    if cfg.valid:
        valid_text = read_text(cfg.valid)
    else:
        text, valid_text = _split_text(text, cfg.valid_fraction, cfg.train)
    if vocab is None:
        vocab = Vocabulary.from_text(text, unit=cfg.unit, min_freq=cfg.min_freq, source=cfg.train)
    mode, k = parse_bptt(cfg.bptt)
    data = LMData(vocab, mode, k)
    if mode == "segment":
        # eos and line both end every line with </s>; only line resets the state there.
        eos_lines = cfg.doc_boundary in ("eos", "line")
        data.train_stream = encode_text(text, vocab, eos_per_line=eos_lines, dtype=np.int64)
        data.valid_stream = encode_text(valid_text, vocab, eos_per_line=eos_lines, dtype=np.int64)
    else:
        data.train_seqs = _sequences(text, vocab, cfg.max_len)
        data.valid_seqs = _sequences(valid_text, vocab, cfg.max_len)
        if not data.train_seqs:
            raise DataError("no non-blank line to train on", cfg.train)
        if not data.valid_seqs:
            raise DataError("no non-blank line to validate on", cfg.valid or cfg.train)
    return data


def _stream_eval_batcher(stream: np.ndarray, batch_size: int, k: int) -> StreamBatcher:
    rows = max(1, min(batch_size, (len(stream) - 1) // max(k, 1)))
    return StreamBatcher(stream, rows, k)


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
    inputs, targets = batch.inputs.to(device), batch.targets.to(device)
    if isinstance(model, JordanLM):
        # Its only memory is the previous token, i.e. the input itself: no state to carry,
        # nothing to truncate, every step computed at once.
        return model.loss(inputs, targets, mask=None if stream else batch.mask.to(device))
    if isinstance(model, ConditionalLM):
        assert classes is not None and not stream  # --condition reads whole lines
        mask = batch.mask.to(device)
        return model.loss(classes[batch.indices].to(device), inputs, targets, mask=mask)
    if stream:
        return model.loss(inputs, targets, state=state, starts=starts)
    return model.loss(inputs, targets, mask=batch.mask.to(device), window=window)


def _classes(labels: np.ndarray | None) -> Tensor | None:
    return None if labels is None else torch.from_numpy(labels)


@torch.no_grad()
def lm_metrics(model: AnyLM, data: LMData, device: torch.device, batch_size: int) -> dict[str, Any]:
    """Mean nats per target token on the validation part of ``data`` (plus perplexity and,
    for characters, bits per character)."""
    was_training = model.training
    model.eval()
    nats, tokens = 0.0, 0
    if data.mode == "segment":
        assert data.valid_stream is not None and data.k is not None
        batcher = _stream_eval_batcher(data.valid_stream, batch_size, data.k)
        state = None
        for batch in batcher:
            out = _batch_loss(model, batch, device, stream=True, state=state)
            nats, tokens, state = nats + out.nats, tokens + out.tokens, out.state
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
    model.train(was_training)
    return _metrics(nats / max(tokens, 1), tokens, data.vocab.unit)


def _metrics(loss: float, tokens: int, unit: str) -> dict[str, Any]:
    m = {"loss_nats": loss, "tokens": tokens, "perplexity": math.exp(min(loss, 700))}
    if unit == "char":
        m["bits_per_char"] = loss / LN2
    return m


def _ngram_streams(data: LMData) -> tuple[Any, Any]:
    if data.mode == "segment":
        return data.train_stream, data.valid_stream

    def with_eos(seqs: list[np.ndarray]) -> list[np.ndarray]:
        return [np.concatenate([s, [EOS_ID]]) for s in seqs]

    assert data.train_seqs is not None and data.valid_seqs is not None
    return with_eos(data.train_seqs), with_eos(data.valid_seqs)


def _step_fn(data: LMData, device: torch.device, sampling: Any = None):
    """The training step of ``data``'s mode; ``sampling``: ``(schedule, steps_done)`` for
    scheduled sampling (``steps_done()`` reads the trainer's step count)."""
    if sampling is not None:
        schedule, steps_done = sampling

        # --scheduled-sampling needs the hidden wiring without --condition: a LanguageModel.
        def sampled(model: LanguageModel, batch: Any, carry: Any) -> LossOutput:
            p = schedule.probability(steps_done())
            inputs, targets = batch.inputs.to(device), batch.targets.to(device)
            return model.scheduled_loss(inputs, targets, batch.mask.to(device), sampling_p=p)

        return sampled
    if data.mode == "segment":

        def step(model: AnyLM, batch: Any, carry: Any) -> LossOutput:
            starts = batch.starts.to(device)
            return _batch_loss(model, batch, device, stream=True, state=carry, starts=starts)
    else:
        window = data.k if data.mode == "window" else None
        classes = _classes(data.train_labels)

        def step(model: AnyLM, batch: Any, carry: Any) -> LossOutput:
            return _batch_loss(model, batch, device, stream=False, classes=classes, window=window)

    return step


def _train_batches(cfg: TrainConfig, data: LMData, drop_last: bool = False) -> Any:
    if data.mode == "segment":
        boundary = EOS_ID if cfg.doc_boundary == "line" else None
        assert data.train_stream is not None and data.k is not None
        return StreamBatcher(data.train_stream, cfg.batch_size, data.k, boundary_id=boundary)
    assert data.train_seqs is not None
    pairs = [lm_pairs(s, BOS_ID, EOS_ID) for s in data.train_seqs]
    return SequenceBatcher(
        [p[0] for p in pairs],
        [p[1] for p in pairs],
        batch_size=cfg.batch_size,
        shuffle=True,
        seed=cfg.seed,
        drop_last=drop_last,  # distributed: every batch splits evenly over the processes
    )


@guarded_run
def train_lm(
    cfg: TrainConfig, resume: bool = False, quiet: bool = False, callbacks=None
) -> dict[str, Any]:
    """Train a language model as ``cfg`` says; write the run directory; return a summary.

    With ``resume``, the run directory's own config and vocabulary are used and training
    continues from its latest snapshot exactly.
    """
    out = Path(cfg.out)
    device = choose_device(cfg.device)
    vocab, labels = None, None
    if resume:
        saved_cfg, _ = load_config(out)
        check_unchanged(cfg, saved_cfg, out)
        vocab = Vocabulary.load(out / "vocab.json")
        labels = lm_labels(out, cfg)
    ctx = init_distributed(device.type)
    if ctx.enabled and cfg.batch_size % ctx.world_size:
        raise ConfigError(
            f"--batch-size {cfg.batch_size} is the global batch: it must be divisible by the "
            f"{ctx.world_size} processes"
        )
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
    batches = _train_batches(cfg, data, drop_last=ctx.enabled)
    if ctx.is_main:
        out.mkdir(parents=True, exist_ok=True)
    if not resume and ctx.is_main:
        data.vocab.save(out / "vocab.json")
        info: dict[str, Any] = {"vocab_size": len(data.vocab)}
        if data.labels is not None:
            data.labels.save(out / "labels.json")
            info["num_labels"] = len(data.labels)
        save_config(out, cfg, **info)
        (out / "metrics.jsonl").unlink(missing_ok=True)
    schedule = parse_schedule(cfg.scheduled_sampling)
    holder: dict[str, Trainer] = {}
    sampling = None
    if schedule.active:
        sampling = (schedule, lambda: holder["trainer"].step if holder else 0)
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
        trainer.resume()
    started = time.perf_counter()
    result = trainer.fit()
    elapsed = time.perf_counter() - started
    if not ctx.is_main:
        return {"task": "lm", "rank": ctx.rank, "steps": result.steps}
    # The n-gram baseline on the same tokens.
    ngram = NGramModel(order=cfg.ngram_order, vocab_size=len(data.vocab))
    train_ng, _ = _ngram_streams(data)
    ngram.fit(train_ng)
    state = ngram.to_state()
    atomic_write(out / "ngram.safetensors", write_path=lambda tmp: save_numpy(state, tmp))
    ngram_metrics = ngram_lm_metrics(ngram, data, cfg.batch_size)
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
        "clipped_steps": result.clipped_steps,
        "stopped_early": result.stopped_early,
        "stopped": result.stopped,
        "parameters": sum(p.numel() for p in model.parameters()),
    }
    if pretrained is not None:
        summary["pretrained_vectors"] = pretrained
    if schedule.active:  # the probability of feeding the model's own token, at the end
        summary["scheduled_sampling_p"] = schedule.probability(result.steps)
    return finish_summary(cfg, summary)


def ngram_lm_metrics(ngram: NGramModel, data: LMData, batch_size: int) -> dict[str, Any]:
    """The n-gram baseline scored on exactly the target tokens ``lm_metrics`` scores.

    Streams: the recurrent model predicts the targets of ``rows`` streams of ``L`` tokens,
    i.e. tokens ``1 … rows·L`` of the validation stream; the n-gram is scored on the same
    tokens (with its own left context). Sequences: ``w… </s>`` of every line for both.
    """
    _, valid = _ngram_streams(data)
    if data.mode == "segment":
        assert data.k is not None
        batcher = _stream_eval_batcher(valid, batch_size, data.k)
        logprobs = ngram.logprobs(valid)[1 : batcher.batch_size * batcher.row_len + 1]
    else:
        logprobs = ngram.logprobs(valid)
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
    run_dir: str | Path, data_path: str, batch_size: int | None = None
) -> dict[str, Any]:
    """Score a text file with a trained model and its n-gram baseline, side by side."""
    cfg, vocab, model = load_lm(run_dir)
    eval_cfg = TrainConfig(**{**cfg.to_dict(), "train": data_path, "valid": data_path})
    data = prepare_lm_data(eval_cfg, vocab, lm_labels(run_dir, cfg))
    device = next(model.parameters()).device
    metrics = lm_metrics(model, data, device, batch_size or cfg.batch_size)
    if data.labels is not None:  # lines of a label the model never saw are not scored
        metrics["unknown_labels"] = sum(data.valid_unknown.values())
        metrics["unknown_label_counts"] = dict(sorted(data.valid_unknown.items()))
    ngram_path = Path(run_dir) / "ngram.safetensors"
    if ngram_path.is_file():
        ngram = NGramModel.from_state(load_arrays(ngram_path), where=str(ngram_path))
        metrics["ngram"] = ngram_lm_metrics(ngram, data, batch_size or cfg.batch_size)
    return metrics


# The task interface of ``rnnkit.app.tasks.registry``.
train = train_lm
evaluate = evaluate_lm


def prompt_ids(cfg: TrainConfig, vocab: Vocabulary, prompt: str | None) -> tuple[list[int], int]:
    """Token ids that prime generation, and how many prompt tokens were unknown.

    Sequence-trained models (``--bptt full``/``window``) saw ``<s>`` first; stream-trained
    ones saw running text, so an empty prompt starts from a newline when it is known.
    """
    ids, unknown = vocab.encode_with_unknown(prompt) if prompt else ([], 0)
    if parse_bptt(cfg.bptt)[0] != "segment":
        return [BOS_ID, *ids], unknown
    if not ids:
        if cfg.doc_boundary != "none":  # lines ended with </s>: text starts after one
            return [EOS_ID], unknown
        newline = vocab.stoi.get("\n") if vocab.unit == "char" else None
        ids = [newline if newline is not None else BOS_ID]
    return ids, unknown


def sample_texts(
    cfg: TrainConfig,
    vocab: Vocabulary,
    model: AnyLM,
    prompt: str | None = None,
    *,
    num: int = 1,
    max_length: int = 200,
    strategy: str = "sample",
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    beam_size: int = 4,
    seed: int | None = None,
    condition: int | None = None,
) -> list[str]:
    """Generate ``num`` continuations of ``prompt`` as text (the prompt not repeated).

    ``condition``: the class index a :class:`ConditionalLM` generates for (required for
    one, refused otherwise). With ``--length predict`` and sampling, each sample draws its
    own length ``T`` (which counts the prompt's tokens); greedy and beam search take the
    most probable ``T``.
    """
    from rnnkit.generation.search import generate_batch

    ids, _ = prompt_ids(cfg, vocab, prompt)
    device = next(model.parameters()).device
    generator = torch.Generator(device=device)
    generator.manual_seed(cfg.seed if seed is None else seed)
    model.eval()
    if isinstance(model, ConditionalLM) != (condition is not None):
        raise ValueError("a class index is needed exactly for a class-conditional model")
    prompts, copies = [ids], num
    state: Any = None
    state_batch_dim: Any = getattr(model, "state_batch_dim", 2)
    if isinstance(model, ConditionalLM):
        state = model.start(torch.tensor([condition], device=device))
        state_batch_dim = CONDITIONAL_STATE_DIM
    length = model.length if isinstance(model, LanguageModel) else None
    if length is not None and length.mode == "predict" and strategy == "sample":
        # One draw of T per sample, from the length output reading h_0 = 0.
        h0 = torch.zeros(num, cfg.hidden, device=device)
        lengths = length.start(num, h0, sample=True, generator=generator)
        state, prompts, copies = LengthState(None, lengths), [ids] * num, 1
    results = generate_batch(
        model,
        prompts,
        max_length=max_length,
        eos_id=EOS_ID,
        strategy=strategy,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        beam_size=beam_size,
        num=copies,
        generator=generator,
        state=state,
        state_batch_dim=state_batch_dim,
    )
    return [vocab.decode(r.ids) for row in results for r in row]


# -- per-token scores of new text ---------------------------------------------------------


def _line_ends(cfg: TrainConfig, vocab: Vocabulary) -> tuple[int, int | None]:
    """The token that precedes a line and the one that ends it, as the model saw them:
    ``<s>`` … ``</s>`` for sequence-trained models (under ``--length stop`` the ``</s>``
    step is the stop output's probability); for streams ``</s>`` with ``--doc-boundary
    eos|line``, else the newline character of a char model (None: a word stream has no
    end)."""
    if parse_bptt(cfg.bptt)[0] != "segment":
        return BOS_ID, EOS_ID
    if cfg.doc_boundary in ("eos", "line"):
        return EOS_ID, EOS_ID
    newline = vocab.stoi.get("\n") if vocab.unit == "char" else None
    return (BOS_ID if newline is None else newline), newline


@torch.no_grad()
def line_logprobs(
    cfg: TrainConfig,
    vocab: Vocabulary,
    model: AnyLM,
    lines: list[str],
    conditions: list[int] | None = None,
) -> list[dict[str, Any]]:
    """Per-token log-probabilities (nats) and surprise (bits, ``−log₂ p``) of every line.

    Each line is read from the model's start of a line (:func:`_line_ends`) and scored
    token by token through the model's ``step`` (the generation interface, so every
    ``--wiring`` and ``--condition`` model is scored the same way), the end of the line
    included where the model knows one. ``conditions``: the class of every line for a
    class-conditional model.

    Returns, per line: ``{"tokens": [...], "logprobs": [...], "surprise": [...],
    "nats": total, "unknown": n}`` (``tokens`` as the vocabulary reads the line, ``"</s>"``
    or ``"\\n"`` for the end).
    """
    length = model.length if isinstance(model, LanguageModel) else None
    if length is not None and length.mode == "predict":
        raise ConfigError(
            "predict on a --length predict run: its token probabilities depend on the "
            "length chosen first; evaluate scores whole sequences"
        )
    start, end = _line_ends(cfg, vocab)
    model.eval()
    device = next(model.parameters()).device
    rows, results = [], []
    for text in lines:
        ids, unknown = vocab.encode_with_unknown(text)
        pieces = vocab.tokenize(text)
        targets = [*ids, end] if end is not None else list(ids)
        shown = [*pieces, vocab.itos[end]] if end is not None else list(pieces)
        rows.append(([start, *ids], targets))
        results.append({"tokens": shown, "unknown": unknown})
    if not rows:
        return []
    T = max(len(t) for _, t in rows)
    state: Any = None
    if isinstance(model, ConditionalLM):
        if conditions is None:
            raise ValueError("a class-conditional model needs the class of every line")
        state = model.start(torch.tensor(conditions, device=device))
    elif conditions is not None:
        raise ValueError("classes given for a model that is not class-conditional")
    got = torch.zeros(len(rows), T, dtype=torch.float64)
    for t in range(T):
        # Rows already scored feed their last token again; their outputs are not read.
        token = torch.tensor([inp[min(t, len(inp) - 1)] for inp, _ in rows], device=device)
        log_probs, state = model.step(token, state)
        want = torch.tensor([tg[min(t, len(tg) - 1)] for _, tg in rows], device=device)
        got[:, t] = log_probs.gather(1, want.view(-1, 1)).squeeze(1).double().cpu()
    for i, (_, targets) in enumerate(rows):
        lp = got[i, : len(targets)].tolist()
        results[i]["logprobs"] = lp
        results[i]["surprise"] = [-v / LN2 for v in lp]
        results[i]["nats"] = -sum(lp)
    return results


def predictor(run_dir: str | Path, batch_size: int | None = None, **_: Any) -> Any:
    """``rnnkit predict`` for a language model: each input line is scored by
    :func:`line_logprobs`; for a class-conditional run a line is ``label<TAB>text``."""
    cfg, vocab, model = load_lm(run_dir)
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
        out: list[dict[str, Any]] = []
        for lo in range(0, len(texts), bs):
            part = None if conditions is None else conditions[lo : lo + bs]
            out.extend(line_logprobs(cfg, vocab, model, texts[lo : lo + bs], part))
        if conditions is not None:
            for record, text in zip(out, lines, strict=True):
                record["label"] = text.partition("\t")[0]
        return out

    return run
