"""Batched decoding of transduction models: greedy and beam search with length
normalisation, for any model with ``step(token (B,), state) -> (log_probs (B, V), state)``.

Greedy search is :func:`rnnkit.generation.search.generate_batch`. Beam search is written here
because its stopping rule matters for transduction: with ``early_stopping``, generation's
beam search ends a source as soon as ``K`` hypotheses have ended, and a confident model
ends low-probability beams early (their ``</s>`` ranks among the top ``K`` candidates
while the one good beam is still going), so the search can stop before the best
hypothesis is finished. The rule here (OpenNMT's, counting ``K`` rather than ``num``): a
source is done once the most probable candidate of a step has been ``</s>`` (the top
beam has ended, at this step or an earlier one) and at least ``K`` hypotheses have
ended; or when no live beam is left; or at ``max_length``. Counting ``num`` (OpenNMT's
``n_best``), one hypothesis asked for ended the search at the first step whose top
candidate was ``</s>``, before a longer hypothesis of a better length-normalised score
could finish: the best answer then depended on how many were asked for. (Asking for the
top candidate's ``</s>`` at the step the count is reached, instead of at any step, kept
a trained string-reversal model's searches going to ``max_length``: 46 times slower.)

Conventions are generation's: ``</s>`` ends a hypothesis and is not in ``ids``; its
log-probability is counted; ``score = logprob / n ** length_penalty`` with ``n`` the
tokens drawn (``</s>`` included); live beams are ranked by log-probability (they all
have the same length), finished ones by ``score``; a source whose search is over leaves
the batch. With ``beam = 1`` this is exactly greedy search.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from rnnkit.deferred import deferring
from rnnkit.generation.beam import _choose, _ended, _Hypotheses, _Links, _live
from rnnkit.generation.options import check_forbid, forbid_index
from rnnkit.generation.search import GenerationResult, generate_batch, select_state

__all__ = ["beam_search", "decode_batch"]


@torch.no_grad()
def _check_search(beam: int, max_length: int, num: int) -> None:
    if not isinstance(beam, int) or beam < 1:
        raise ValueError(f"beam must be an integer ≥ 1, got {beam!r}")
    if not isinstance(max_length, int) or max_length < 1:
        raise ValueError(f"max_length must be an integer ≥ 1, got {max_length!r}")
    if not 1 <= num <= beam:
        raise ValueError(f"num must be in [1, beam = {beam}], got {num!r}")


def _reorder(
    state: Any, rows: torch.Tensor, state_batch_dim: Any, per_source: tuple[bool, ...] | None
) -> Any:
    """The rows ``rows`` of ``state``; with ``per_source`` (beams reordered within their
    sources only, no source gone), the parts the same in all beams of a source stand."""
    if per_source is None:
        return select_state(state, rows, state_batch_dim)
    return type(state)(
        *(
            part if same else select_state(part, rows, dim)
            for part, dim, same in zip(state, state_batch_dim, per_source, strict=True)
        )
    )


def beam_search(
    model: Any,
    state: Any,
    state_batch_dim: Any,
    *,
    beam: int,
    max_length: int,
    bos_id: int,
    eos_id: int,
    length_penalty: float = 1.0,
    num: int = 1,
    per_source: tuple[bool, ...] | None = None,
    forbid: Sequence[int] = (),
) -> list[list[GenerationResult]]:
    """Beam search for the ``S`` rows of ``state``, ``S·K`` rows per ``step`` call.

    Args:
        model: has ``step(token (B,), state) -> (log_probs (B, V), state)``.
        state: the initial state of ``S`` sources (e.g. an encoder's).
        state_batch_dim: the batch dimension of every state tensor (see
            :func:`rnnkit.generation.search.select_state`).
        beam: ``K ≥ 1``.  max_length: most tokens drawn per hypothesis (``</s>`` included).
        bos_id, eos_id: the start and end symbols.
        length_penalty: ``α`` in ``score = logprob / n ** α``.
        num: hypotheses returned per source (``≤ K``).
        per_source: for a tuple state, which of its parts are the same in all the beams
            of a source (e.g. the encoder states a decoder attends to): those are selected
            only when sources leave the batch, not when beams are reordered (a copy of
            every beam's rows per step saved). None: every part is selected every step.
        forbid: token ids never generated (masked to ``-inf`` before every choice).

    Returns:
        ``S`` lists of at most ``num`` results, best score first.

    >>> from torch import nn
    >>> from rnnkit import GRU
    >>> from rnnkit.models.language_model import LanguageModel
    >>> _ = torch.manual_seed(0)
    >>> lm = LanguageModel(nn.Embedding(6, 4), GRU(4, 8), nn.Linear(8, 6)).eval()
    >>> start = torch.zeros(1, 1, 2, 8)  # two sources
    >>> out = beam_search(lm, start, 2, beam=3, max_length=4, bos_id=2, eos_id=3, num=2)
    >>> [len(h) for h in out], out[0][0].score >= out[0][1].score
    ([2, 2], True)
    """
    # One loop over the steps, not split: its tensors (scores, state, the sources still
    # searched) shrink together as sources finish. A step's decisions are read to the host
    # in one copy (the first K candidates, the live beams chosen and their parents); the
    # sequences are kept there as links to the parent beam, followed back when a
    # hypothesis is written out, instead of a device tensor of sequences reordered at
    # every step and read one hypothesis at a time (each read waits for the device).
    _check_search(beam, max_length, num)
    forbidden = check_forbid(forbid, eos_id)
    K = beam
    sizes: list[int] = []
    _leaves(state, state_batch_dim, sizes)
    S = sizes[0]
    device = _device(state)
    rows = torch.arange(S, device=device).repeat_interleave(K)
    state = select_state(state, rows, state_batch_dim)
    token = torch.full((S * K,), bos_id, dtype=torch.long, device=device)
    beam_lp = torch.full((S, K), -math.inf, device=device)
    beam_lp[:, 0] = 0.0  # one live beam per source at first; the others are placeholders
    beam_lp = beam_lp.view(S * K, 1)  # (A·K, 1): a column added to each beam's log-probs
    sources = list(range(S))  # active position -> source
    hyps = _Hypotheses(S, lambda lp, n: lp / n**length_penalty)
    top_ended = [False] * S  # per source: a step's most probable candidate was </s>
    history: list[_Links] = []  # per step: what each next beam continues
    forbid_ids: torch.Tensor | None = None
    first_rows = (torch.arange(S, device=device) * K).view(-1, 1)  # a·K of source a
    base = first_rows  # (A, 1) those of the active sources

    for t in range(max_length):
        log_probs, state = model.step(token, state)
        A, n = len(sources), t + 1
        V = log_probs.shape[-1]
        if t == 0:
            forbid_ids = forbid_index(forbidden, V, log_probs.device)
        if forbid_ids is not None:
            log_probs = log_probs.index_fill(-1, forbid_ids, -math.inf)
        if base.shape[0] != A:  # sources left: a view, no kernel
            base = first_rows[:A]
        host, rows, tok, live_lp = _choose(log_probs, beam_lp, base, K, eos_id)
        links = _Links(K, history[-1] if history else None, host)
        keep: list[int] = []
        last = t == max_length - 1
        for a, (s, row) in enumerate(zip(sources, host, strict=True)):
            for c, parent, lp in _ended(row, K, V, eos_id):
                top_ended[s] = top_ended[s] or c == 0  # once, for good (OpenNMT's too)
                hyps.add(s, links, a * K + parent, None, lp, True, n)
            if last:
                for parent_row, token_id, lp in _live(row, K):
                    hyps.add(s, links, parent_row, token_id, lp, False, n)
            elif math.isfinite(row[2 * K]) and not (top_ended[s] and len(hyps.scored[s]) >= K):
                keep.append(a)
        if last or not keep:
            break
        links.keep = keep
        history.append(links)
        if len(keep) < A:
            keep_t = torch.tensor(keep, device=device)
            rows, tok, live_lp = rows[keep_t], tok[keep_t], live_lp[keep_t]
        rows, token, beam_lp = rows.view(-1), tok.view(-1), live_lp.view(-1, 1)  # (A'·K, ·)
        state = _reorder(state, rows, state_batch_dim, per_source if len(keep) == A else None)
        sources = [sources[a] for a in keep]
    return hyps.best(num)


def decode_batch(
    model: Any,
    state: Any,
    state_batch_dim: Any,
    *,
    beam: int,
    max_length: int,
    bos_id: int,
    eos_id: int,
    length_penalty: float = 1.0,
    num: int = 1,
    per_source: tuple[bool, ...] | None = None,
    forbid: Sequence[int] = (),
) -> list[list[GenerationResult]]:
    """Greedy search (``beam = 1``, through ``generate_batch``) or :func:`beam_search`."""
    if beam == 1 and num == 1:
        return generate_batch(
            model,
            None,
            max_length=max_length,
            eos_id=eos_id,
            bos_id=bos_id,
            strategy="greedy",
            length_penalty=length_penalty,
            state=state,
            state_batch_dim=state_batch_dim,
            forbid=forbid,
        )
    # deferring(): on a GPU a model's check of each step's token ids (a decoder-only
    # model's language model checks them) is read once at the end, as in generate_batch;
    # the ids the search draws are in range by construction
    with deferring():
        return beam_search(
            model,
            state,
            state_batch_dim,
            beam=beam,
            max_length=max_length,
            bos_id=bos_id,
            eos_id=eos_id,
            length_penalty=length_penalty,
            num=num,
            per_source=per_source,
            forbid=forbid,
        )


def _leaves(state: Any, dim: Any, sizes: list[int]) -> None:
    """Batch sizes of the tensor leaves of a nested state (``sizes`` is filled)."""
    if state is None:
        return
    if isinstance(state, torch.Tensor):
        sizes.append(state.shape[dim])
        return
    if isinstance(state, dict):
        for k, v in state.items():
            _leaves(v, dim[k] if isinstance(dim, dict) else dim, sizes)
        return
    dims = dim if isinstance(dim, (tuple, list)) else (dim,) * len(state)
    for part, d in zip(state, dims, strict=True):
        _leaves(part, d, sizes)


def _device(state: Any) -> torch.device:
    if isinstance(state, torch.Tensor):
        return state.device
    parts = state.values() if isinstance(state, dict) else (state or ())
    for part in parts:
        if part is not None:
            return _device(part)
    return torch.device("cpu")
