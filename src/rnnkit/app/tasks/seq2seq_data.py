"""A seq2seq run's data and model: ``source<TAB>target`` pairs read, validation pairs held
out, both vocabularies built (or reused on ``--resume``), the pairs encoded and their
lengths checked (:func:`prepare_data`); the model a configuration describes
(:func:`build_model`) and a finished run read back from its directory
(:func:`load_seq2seq`)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from rnnkit.app.config import TrainConfig
from rnnkit.app.tasks.run_config import check_count, load_config
from rnnkit.app.tasks.settings import choose_device, model_spec
from rnnkit.bptt.mask_facts import move_mask
from rnnkit.data.batching import to_device
from rnnkit.data.pairs import Pair, PairBatch, encode_pairs, read_pairs
from rnnkit.data.vocab import Vocabulary, count_tokens
from rnnkit.errors import DataError
from rnnkit.models.decoder_only import DecoderOnlyTranslator, build_decoder_only
from rnnkit.models.seq2seq import Seq2Seq, build_seq2seq
from rnnkit.training.checkpoint import load_model_weights

__all__ = ["Seq2SeqData", "build_model", "load_seq2seq", "prepare_data"]


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


def batch_to(batch: PairBatch, device: torch.device) -> PairBatch:
    """``batch`` on ``device``, its masks with their host copies kept (the time loop asks
    them there: no wait, :func:`rnnkit.bptt.mask_facts.move_mask`)."""
    return PairBatch(
        *(move_mask(t, device) if t.dtype == torch.bool else to_device(t, device) for t in batch)
    )
