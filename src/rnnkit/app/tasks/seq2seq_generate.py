"""A trained transducer's outputs for one source, as ``rnnkit generate --input`` asks:
the run's search (:func:`transduce`), or the ``num`` best hypotheses of a beam or ``num``
samples (:func:`generate_outputs`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from rnnkit import messages
from rnnkit.app.tasks.seq2seq_data import load_seq2seq
from rnnkit.app.tasks.seq2seq_decode import decode_ids, render_output
from rnnkit.data.pairs import make_pair_batch
from rnnkit.errors import ConfigError, DataError
from rnnkit.generation.options import MAX_BEAM, MAX_GENERATE_TOKENS

__all__ = ["generate_outputs", "transduce", "warn_longer"]


class EmptySource(DataError):
    """A source ``text`` with no tokens (empty, or only spaces for a word-unit run).

    Its message names the Python argument ``text``; ``rnnkit generate`` reports its own
    ``--input`` instead."""

    def __init__(self) -> None:
        super().__init__("text is empty (no tokens): nothing to transduce")


def search_options(
    beam: int | None, max_length: int | None, default_beam: int, default_max: int
) -> tuple[int, int]:
    """``(beam, max_length)``, the run's where None; either out of range is a
    ``ConfigError`` naming the Python argument (``rnnkit generate`` and ``rnnkit predict``
    check their ``--beam`` and ``--max-len`` first, naming those)."""
    if beam is not None and (
        isinstance(beam, bool) or not isinstance(beam, int) or not 1 <= beam <= MAX_BEAM
    ):
        raise ConfigError(f"beam must be an integer from 1 to {MAX_BEAM} or None, got {beam!r}")
    if max_length is not None and (
        isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1
    ):
        raise ConfigError(f"max_length must be an integer ≥ 1 or None, got {max_length!r}")
    if max_length is not None and max_length > MAX_GENERATE_TOKENS:  # as --max-len
        raise ConfigError(f"max_length must be at most {MAX_GENERATE_TOKENS:,}, got {max_length:,}")
    return (
        default_beam if beam is None else beam,
        default_max if max_length is None else max_length,
    )


def transduce(
    run_dir: str | Path,
    text: str,
    beam: int | None = None,
    max_length: int | None = None,
    device: str = "cpu",
) -> str:
    """The model's output for one source ``text`` (``rnnkit generate --input TEXT``).

    Args:
        run_dir: a seq2seq run directory.
        text: the source, in the run's ``--source-unit``.
        beam: beam width (default: the run's ``--beam``; 1 = greedy).
        max_length: most output tokens (default: the run's ``--max-len``).
        device: where the model computes.
    """
    cfg, source_vocab, target_vocab, model = load_seq2seq(run_dir, device)
    ids = source_vocab.encode_array(text, dtype=np.int64)
    if len(ids) == 0:
        raise EmptySource()
    beam, limit = search_options(beam, max_length, cfg.beam, cfg.max_len)
    if len(ids) > cfg.max_len:
        warn_longer("--input", len(ids), cfg.max_len, "answer is")
    model_device = next(model.parameters()).device
    hyp = decode_ids(model, [ids], model_device, 1, beam, limit + 1)[0]
    return render_output(target_vocab, hyp[:limit])  # limit + 1 steps leave room for </s> only


def warn_longer(where: str, tokens: int, max_len: int, outcome: str, more: int = 0) -> None:
    """One warning: a source longer than any the model trained on (training refuses one
    over ``--max-len``), whose answer is a guess out of what it learnt."""
    also = f"; {more} more source(s) of this file are longer too" if more else ""
    messages.warning(
        f"{where}: the source has {tokens} tokens, more than the --max-len {max_len} the "
        f"model trained with (it never saw such a length): its {outcome} likely wrong{also}"
    )


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
    device: str = "cpu",
) -> tuple[list[str], int]:
    """Outputs for one source (``rnnkit generate --input TEXT``), and how many of its
    tokens are outside the source vocabulary (read as ``<unk>``).

    ``sample``: ``num`` independent samples (``temperature``, ``top_k``, ``top_p``; the
    random source seeded with ``seed``); else the ``num`` best hypotheses of beam search
    of width ``max(beam, num)`` (``beam`` default: the run's ``--beam``; width 1 is greedy
    search). ``max_length``: most output tokens (default: the run's ``--max-len``).
    ``device``: where the model computes.
    """
    cfg, source_vocab, target_vocab, model = load_seq2seq(run_dir, device)
    ids, unknown = source_vocab.encode_with_unknown(text)
    if not ids:
        raise EmptySource()
    if isinstance(num, bool) or not isinstance(num, int) or num < 1:
        # the Python argument: `rnnkit generate` checks --num first
        raise ConfigError(f"num must be an integer ≥ 1, got {num!r}")
    beam, limit = search_options(beam, max_length, cfg.beam, cfg.max_len)
    if len(ids) > cfg.max_len:
        warn_longer("--input", len(ids), cfg.max_len, "answer is")
    model_device = next(model.parameters()).device
    batch = make_pair_batch([np.array(ids, dtype=np.int64)], None).to(model_device)
    if sample:
        generator = torch.Generator(device=model_device)
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
        results = model.decode(
            batch.source, batch.source_mask, beam=max(beam, num), max_length=limit + 1, num=num
        )[0]
    # limit + 1 steps leave room for </s>: an output that did not end is cut at limit
    return [render_output(target_vocab, r.ids[:limit]) for r in results], unknown
