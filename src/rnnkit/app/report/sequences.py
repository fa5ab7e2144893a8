"""The report's gradient-flow section of the tasks whose model reads whole sequences:
``classify`` (text or real-valued frames), ``tag``, ``regress``, ``events`` (its
sessions, as the event language model reads them), ``seq2seq`` (its encoder, with the
decoder's loss: through the attention and the state the decoder starts from) and
``params`` (the model of the key with the most vectors, on that key's normalised vectors).

The section (:mod:`rnnkit.app.report.flow`) runs on a few sequences of the run's own
validation file (else its training file), taken evenly through the file and cut to their
first ``max_steps`` steps; each task's loss is its model's own (``model.loss``), reading
what the stack returns through :func:`~rnnkit.app.report.flow.replaying`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.nn.utils.rnn import pad_sequence

from rnnkit.app.report.flow import FlowBatch, flow_section, replaying
from rnnkit.app.report.html import note, section
from rnnkit.app.report.run import Run, data_files
from rnnkit.data.batching import pad_sequences
from rnnkit.errors import CheckpointError, DataError
from rnnkit.types import RecurrentOutput

__all__ = ["SEQUENCE_TASKS", "sequence_sections"]

SEQUENCE_TASKS = ("classify", "tag", "regress", "events", "seq2seq", "params")
#: the sessions of an events file the batch is chosen from (the first ones)
MAX_SESSIONS = 10_000


def evenly(n: int, rows: int) -> list[int]:
    """``rows`` indices spread evenly over ``0 … n − 1`` (all of them when ``n ≤ rows``)."""
    return sorted({int(i) for i in np.linspace(0, n - 1, min(rows, n))}) if n else []


def padded(parts: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
    """``(B, T, …)`` of the parts, zero-padded, and the mask ``(B, T)`` of their steps."""
    lengths = torch.tensor([len(p) for p in parts])
    mask = torch.arange(int(lengths.max()))[None, :] < lengths[:, None]
    return pad_sequence(list(parts), batch_first=True), mask


def sequence_sections(run: Run, rows: int = 8, max_steps: int = 64) -> list[tuple[str, str, str]]:
    """The gradient-flow section of a run of one of :data:`SEQUENCE_TASKS`."""
    if run.cfg.task == "seq2seq" and run.cfg.decoder_only:
        text = (
            "Gradient-flow pictures are drawn for an encoder (this model has none: --decoder-only)."
        )
        return [section("gradients", "Gradient flow through time", note(text))]
    if run.cfg.task == "events" and run.cfg.window:
        text = (
            "Gradient-flow pictures are drawn for an events model that reads whole "
            f"sessions (this one reads the last {run.cfg.window} events: --window)."
        )
        return [section("gradients", "Gradient flow through time", note(text))]
    builders: dict[str, Callable[[Run, Path, int, int], FlowBatch | None]] = {
        "classify": _classify,
        "tag": _tag,
        "regress": _regress,
        "events": _events,
        "seq2seq": _seq2seq,
        "params": _params,
    }
    build = builders[run.cfg.task]
    for path in data_files(run):
        try:
            fb = build(run, path, rows, max_steps)
        except (DataError, OSError):
            continue  # not readable as this run's data: the next file
        except CheckpointError as exc:  # the run's own files (a damaged params run's keys)
            text = f"Gradient-flow pictures need the run's model: {exc}"
            return [section("gradients", "Gradient flow through time", note(text))]
        if fb is not None:
            return [flow_section(fb)]
    return [section("gradients", "Gradient flow through time", note("No sequences to read."))]


def _own(
    model: Any,
    x: Tensor,
    mask: Tensor,
    call: Callable[[int, int], Tensor],
    what: str,
    short_steps: int | None = None,
) -> FlowBatch:
    """The batch of a model whose loss reads its stack as ``encoder(x, mask=mask)``:
    ``call(rows, steps)`` runs the model's own loss, which reads what the stack returns
    (outputs and final states) through :func:`~rnnkit.app.report.flow.replaying`."""

    def loss(top: RecurrentOutput, rows: int, steps: int) -> Tensor:
        with replaying(model, top):
            return call(rows, steps)

    B, T = mask.shape
    return FlowBatch(model, x, mask, loss, lambda: call(B, T), what, short_steps=short_steps)


def _classify(run: Run, path: Path, rows: int, max_steps: int) -> FlowBatch | None:
    if run.cfg.inputs == "vectors":
        return _classify_vectors(run, path, rows, max_steps)
    from rnnkit.app.tasks.classify import encode_examples, load_classifier
    from rnnkit.data.labelled import read_labelled

    cfg, vocab, labels, model = load_classifier(run.path, run.device)
    examples = [e for e in read_labelled(path) if labels.get(e.label) is not None]
    chosen = [examples[i] for i in evenly(len(examples), rows)]
    if not chosen:
        return None
    enc = encode_examples(chosen, vocab, labels, min(cfg.max_len, max_steps), str(path))
    ids, mask = pad_sequences(enc.inputs)
    device = next(model.parameters()).device
    ids, mask, y = ids.to(device), mask.to(device), torch.from_numpy(enc.labels).to(device)
    assert model.embedding is not None  # a classifier of text embeds its tokens
    with torch.no_grad():
        x = model.embedding(ids)

    def call(r: int, s: int) -> Tensor:
        return model.loss(ids[:r, :s], y[:r], mask[:r, :s]).loss

    return _own(
        model, x, mask, call, f"{len(chosen)} texts from {path} (up to {ids.shape[1]} {cfg.unit}s)"
    )


def _classify_vectors(run: Run, path: Path, rows: int, max_steps: int) -> FlowBatch | None:
    from rnnkit.app.tasks.classify_vectors import encode_vectors, load_vector_classifier
    from rnnkit.data.vectors import read_vector_sequences

    cfg, width, labels, model = load_vector_classifier(run.path, run.device)
    seqs = [
        s
        for s in read_vector_sequences(path, labelled=True)
        if labels.get(s.label or "") is not None
    ]
    chosen = [seqs[i] for i in evenly(len(seqs), rows)]
    if not chosen:
        return None
    enc = encode_vectors(chosen, labels, min(cfg.max_len, max_steps), width)
    device = next(model.parameters()).device
    frames, mask = padded(enc.inputs)
    x, mask, y = frames.to(device), mask.to(device), torch.from_numpy(enc.labels).to(device)

    def call(r: int, s: int) -> Tensor:
        return model.loss(x[:r, :s], y[:r], mask[:r, :s]).loss

    return _own(
        model, x, mask, call, f"{len(chosen)} sequences from {path} (up to {x.shape[1]} steps)"
    )


def _tag(run: Run, path: Path, rows: int, max_steps: int) -> FlowBatch | None:
    from rnnkit.app.tasks.tag import load_tagger
    from rnnkit.app.tasks.tag_data import char_batch, encode_tagged
    from rnnkit.data.tagged import read_tagged

    cfg, data, model = load_tagger(run.path, run.device)
    sentences, _ = read_tagged(path, cfg.tag_column)
    chosen = [sentences[i] for i in evenly(len(sentences), rows)]
    if not chosen:
        return None
    enc = encode_tagged(
        [s._replace(tokens=s.tokens[:max_steps], tags=s.tags[:max_steps]) for s in chosen], data
    )
    words, mask = pad_sequences(enc.words)
    tags = pad_sequences(enc.tags)[0]
    known = mask & (tags < len(data.tags))  # a tag the model does not know is no target
    every = torch.arange(len(chosen))
    chars = None if enc.chars is None else char_batch(enc, every, words.shape[1])
    device = next(model.parameters()).device
    words, mask, tags, known = (t.to(device) for t in (words, mask, tags, known))
    chars = None if chars is None else chars.to(device)
    with torch.no_grad():
        x = model.features(words, mask, chars)

    def call(r: int, s: int) -> Tensor:
        c = None if chars is None else chars[:r, :s]
        return model.loss(words[:r, :s], tags[:r, :s], mask[:r, :s], c, known[:r, :s]).loss

    return _own(
        model, x, mask, call, f"{len(chosen)} sentences from {path} (up to {words.shape[1]} words)"
    )


def _regress(run: Run, path: Path, rows: int, max_steps: int) -> FlowBatch | None:
    from rnnkit.app.tasks.regress import load_regressor
    from rnnkit.data.vectors import read_vector_sequences

    cfg, _, model = load_regressor(run.path, run.device)
    return _regression_batch(cfg, model, read_vector_sequences(path), rows, max_steps, str(path))


def _regression_batch(
    cfg: Any, model: Any, seqs: Sequence[Any], rows: int, max_steps: int, source: str
) -> FlowBatch | None:
    """The batch of a ``regress`` model on ``rows`` of the sequences ``seqs``, taken evenly
    (``source``: where they come from, for the caption)."""
    from rnnkit.app.tasks.regress import encode_sequences

    chosen = [seqs[i] for i in evenly(len(seqs), rows)]
    enc = encode_sequences(chosen, cfg.target, min(cfg.max_len, max_steps))
    if not enc.inputs:
        return None
    enc_rows = evenly(len(enc), rows)  # a next-value target cuts sequences into pieces
    frames, mask = padded([enc.inputs[i] for i in enc_rows])
    parts = [enc.targets[i] for i in enc_rows]
    y = padded(parts)[0] if cfg.target == "next" else torch.stack(parts)
    device = next(model.parameters()).device
    x, mask, y = frames.to(device), mask.to(device), y.to(device)

    def call(r: int, s: int) -> Tensor:
        target = y[:r, :s] if cfg.target == "next" else y[:r]
        return model.loss(x[:r, :s], target, mask[:r, :s]).loss

    return _own(
        model,
        x,
        mask,
        call,
        f"{len(enc_rows)} sequences from {source} (up to {x.shape[1]} steps)",
        short_steps=32 if cfg.target == "next" else None,
    )


def _params(run: Run, path: Path, rows: int, max_steps: int) -> FlowBatch | None:
    """The model of the key with the most vectors in the file's first sessions (each key
    has its own small ``regress`` model over its normalised vectors)."""
    from rnnkit.app.tasks.params.keys import collect, key_sequences
    from rnnkit.app.tasks.params.scoring import load_params
    from rnnkit.app.tasks.regress import load_regressor
    from rnnkit.data.events import iter_sessions

    params = load_params(run.path, run.device)
    with open(path, "rb") as f:  # the first sessions of a long log do
        first = itertools.islice(iter_sessions(f, path), MAX_SESSIONS)
        items = [(s, str(path), line) for line, s in first if s.label != 1]
    found = collect(items, params.widths)
    counts = {k.key: found[k.key].count() for k in params.keys if k.key in found}
    if not counts:
        return None
    key = params.by_key[max(counts, key=lambda k: counts[k])]
    cfg, _, model = load_regressor(run.path / key.directory, run.device)
    seqs = key_sequences(key, found[key.key])
    source = f"{path}, the key {key.key!r} ({counts[key.key]} vectors)"
    return _regression_batch(cfg, model, seqs, rows, max_steps, source)


def _events(run: Run, path: Path, rows: int, max_steps: int) -> FlowBatch | None:
    from rnnkit.app.tasks.events.scoring import load_event_model
    from rnnkit.data.batching import lm_pairs
    from rnnkit.data.events import iter_sessions
    from rnnkit.data.vocab import BOS_ID, EOS_ID
    from rnnkit.metrics.losses import sequence_cross_entropy

    _, vocab, model = load_event_model(run.path, run.device)
    with open(path, "rb") as f:  # a log's sessions may be millions: the first ones do
        first = itertools.islice(iter_sessions(f, path), MAX_SESSIONS)
        sessions = [s for _, s in first if s.label != 1 and s.events]
    chosen = [sessions[i] for i in evenly(len(sessions), rows)]
    if not chosen:
        return None
    pairs = [lm_pairs(vocab.encode_events(s.events)[0], BOS_ID, EOS_ID) for s in chosen]
    inputs, mask = pad_sequences([p[0][:max_steps] for p in pairs])  # (B, T)
    targets, _ = pad_sequences([p[1][:max_steps] for p in pairs])
    device = next(model.parameters()).device
    inputs, targets, mask = inputs.to(device), targets.to(device), mask.to(device)
    with torch.no_grad():
        x = model.embedding(inputs)

    def loss(top: RecurrentOutput, r: int, s: int) -> Tensor:
        return sequence_cross_entropy(model.head(top.outputs), targets[:r, :s], mask[:r, :s])

    return FlowBatch(
        model,
        x,
        mask,
        loss,
        lambda: sequence_cross_entropy(model(inputs, mask=mask).logits, targets, mask),
        f"{len(chosen)} normal sessions from {path} (up to {inputs.shape[1]} events)",
        short_steps=32,
    )


def _seq2seq(run: Run, path: Path, rows: int, max_steps: int) -> FlowBatch | None:
    from rnnkit.app.tasks.seq2seq_data import load_seq2seq
    from rnnkit.data.pairs import PairBatch, encode_pairs, make_pair_batch, read_pairs
    from rnnkit.models.seq2seq import Seq2Seq

    _, source_vocab, target_vocab, model = load_seq2seq(run.path, run.device)
    pairs = read_pairs(path)
    chosen = [pairs[i] for i in evenly(len(pairs), rows)]
    if not chosen:
        return None
    sources, targets = encode_pairs(chosen, source_vocab, target_vocab, path)
    batch = make_pair_batch([a[:max_steps] for a in sources], targets)
    device = next(model.parameters()).device
    batch = PairBatch(*(t.to(device) for t in batch))
    assert isinstance(model, Seq2Seq)  # a decoder-only model is named before
    with torch.no_grad():
        x = model.source_embedding(batch.source)

    def call(r: int, s: int) -> Tensor:
        part = PairBatch(
            batch.source[:r, :s], batch.source_mask[:r, :s], *(t[:r] for t in batch[2:])
        )
        return model.loss(part).loss

    what = f"{len(chosen)} pairs from {path} (sources up to {x.shape[1]} tokens)"
    return _own(model, x, batch.source_mask, call, what)
