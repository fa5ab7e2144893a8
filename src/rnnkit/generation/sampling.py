"""Sampling: the filtered distribution (temperature, top-k, top-p) and the free-running
loop that samples, or picks greedily, for independent rows."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from rnnkit.generation.options import (
    GenerationResult,
    StepModel,
    _check_sampling,
    _Options,
    forbid_index,
)
from rnnkit.generation.state import Reorder

__all__ = ["filter_log_probs"]


def filter_log_probs(
    log_probs: Tensor,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
) -> Tensor:
    """Sampling distribution: temperature, then top-k, then nucleus (top-p), renormalised.

    Tokens outside the kept set get ``-inf``. Top-k keeps exactly ``k`` tokens (ties at
    the boundary broken by ``torch.topk``); top-p keeps the smallest set of most probable
    tokens whose mass (after temperature and top-k) is at least ``p``, never fewer than one.

    Args:
        log_probs: ``(B, V)`` log-probabilities (or logits).
        temperature: ``> 0``; ``T → 0`` approaches greedy, ``T = 1`` is the model.
        top_k: keep the ``k`` most probable tokens (None: all).
        top_p: in ``(0, 1]`` (None or 1: all).

    Returns:
        ``(B, V)`` normalised log-probabilities.

    >>> lp = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    >>> filter_log_probs(lp, top_p=0.8).exp()
    tensor([[0.6250, 0.3750, 0.0000, 0.0000]])
    >>> filter_log_probs(lp, top_k=1).exp()
    tensor([[1., 0., 0., 0.]])
    """
    _check_sampling(temperature, top_k, top_p)
    return _filtered(log_probs.double(), temperature, top_k, top_p)


def _filtered(x: Tensor, temperature: float, top_k: int | None, top_p: float | None) -> Tensor:
    """:func:`filter_log_probs` of ``x (B, V)`` in float64, options already checked."""
    # In float64 and from the maximum: a temperature of 1e-45 makes float32 logits / T
    # inf (and inf - inf NaN); (x - max) / T is 0 at the maximum and finite or -inf
    # elsewhere, so the distribution tends to greedy instead of failing. At T = 1 the
    # shift is log_softmax's own: it subtracts the maximum first and computes
    # (x - max) - log Σ exp(x - max), the same values to the last bit (tested) in two
    # operations fewer.
    if temperature != 1.0:
        x = (x - x.amax(dim=-1, keepdim=True)) / temperature
    exact = torch.log_softmax(x, dim=-1)  # float64: the nucleus is measured in it
    scores = exact.float()
    nucleus = top_p if top_p is not None and top_p < 1.0 else None  # its mass
    if top_k is not None and top_k < scores.shape[-1]:
        keep = torch.zeros_like(scores, dtype=torch.bool)
        keep.scatter_(-1, scores.topk(top_k, dim=-1).indices, True)
        scores = torch.log_softmax(scores.masked_fill(~keep, -math.inf), dim=-1)
        if nucleus is not None:
            exact = torch.log_softmax(exact.masked_fill(~keep, -math.inf), dim=-1)
    if nucleus is not None:
        probs, order = exact.exp().sort(dim=-1, descending=True)  # (B, V)
        mass_before = _mass_before(probs)
        drop_sorted = mass_before >= nucleus
        drop_sorted[..., 0] = False  # the most probable token always stays
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scores = torch.log_softmax(scores.masked_fill(drop, -math.inf), dim=-1)
    return scores


def _cumsum_refused(t: Tensor) -> bool:
    """Whether torch refuses a floating-point ``cumsum`` of ``t``: on a GPU under
    ``torch.use_deterministic_algorithms(True)`` (it has no deterministic kernel there)."""
    return t.is_cuda and torch.are_deterministic_algorithms_enabled()


def _mass_before(probs: Tensor) -> Tensor:
    """``(B, V)`` float64: the sum of each row's probabilities ``probs (B, V)`` (float64,
    sorted descending) before each of its tokens. In float64 (the probabilities too): in
    float32 the rounding over thousands of tokens (~1e-5) exceeds the tail tokens' own
    probabilities, and the nucleus would end a token early or late. Where torch refuses
    the floating-point ``cumsum``, in fixed point (multiples of 2⁻⁵²) instead: a sum of
    integers is exact in any order of adding, and differs from the float64 sum by far
    less than a float32 probability's last bit."""
    if not _cumsum_refused(probs):
        return probs.cumsum(-1) - probs
    fixed = torch.round(probs * 2.0**52).long()
    return (fixed.cumsum(-1) - fixed).double() * 2.0**-52


def _draw(probs: Tensor, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
    """One token per row of ``probs (B, V)``: ``(index (B, 1), race (B, 1))``.

    The exponential race ``index = argmax_v p_v / q_v``, ``q_v ~ Exp(1)`` independent (the
    index is distributed as ``p``): ``torch.multinomial(probs, 1)``'s own draw, the same
    exponentials from the same generator and the same index (tested), in four operations
    where ``multinomial`` adds eight that check ``probs`` and two reads of the host at
    every step. ``race``, the winning ``p / q``, is NaN where the row held NaN: the
    search reads it with the draws and reports it (:func:`_check_races`).
    """
    q = torch.empty_like(probs).exponential_(generator=generator)
    race, index = torch.div(probs, q, out=q).max(dim=-1, keepdim=True)
    return index, race


def _check_races(races: list[float], sizes: list[int]) -> None:
    """A clear error where a step's distribution held NaN (``races``: :func:`_draw`'s, the
    ``sizes[t]`` rows of step ``t`` after one another)."""
    at = 0
    for t, n in enumerate(sizes):
        if any(math.isnan(v) for v in races[at : at + n]):
            raise ValueError(
                f"the model's log-probabilities hold NaN at generated token {t + 1}: "
                "nothing can be sampled from them"
            )
        at += n


def _forbid_bias(forbid: Tensor, like: Tensor) -> Tensor:
    """``(V,)`` float64 on ``like``'s device: ``-inf`` at the ``forbid`` ids, 0 elsewhere."""
    zeros = torch.zeros(like.shape[-1], dtype=torch.float64, device=like.device)
    return zeros.index_fill_(0, forbid, -math.inf)


def _run_sampling(
    model: StepModel, log_probs: Tensor, state: Any, reorder: Reorder, opt: _Options
) -> list[GenerationResult]:
    """Sample (or pick greedily) for independent rows; finished rows leave the batch.

    Sampling takes finished rows out at once (the draws of the others then do not depend
    on them). Greedy search keeps them until a quarter of the batch has ended: taking rows
    out copies every part of the state (an encoder's states and keys too), and a trained
    model's rows end within a few steps of each other, so one copy for several ended rows
    costs less than one per step; what the kept rows draw after their end is not recorded.
    """
    B = log_probs.shape[0]
    tokens: list[Tensor] = []  # per step: the token of every row in the batch then
    chosen_lps: list[Tensor] = []  # per step: their log-probabilities
    # (step, rows kept after it): which output row each row of a step is, followed on the
    # host at the end (no device tensor of output rows selected at every selection)
    kept: list[tuple[int, Tensor]] = []
    races: list[Tensor] = []  # sampling: the winning p / q of every row, per step (_draw)
    lazy = opt.strategy == "greedy" and opt.eos_id is not None
    # greedy: the rows not ended since the last selection (None: none drawn since; every
    # row kept then is live, so the next step's test is the whole of it)
    live: Tensor | None = None
    # never drawn, never chosen; the ids copied to the device once, not at every step
    forbid = forbid_index(opt.forbid, log_probs.shape[-1], log_probs.device)
    sample = opt.strategy != "greedy"
    # Sampling: the forbidden tokens are a float64 row of 0 and -inf added to the
    # log-probabilities, one operation that is also their exact float64 copy (x + 0 = x),
    # where the sampler read them (float64, then the fill) in two.
    bias = None if forbid is None or not sample else _forbid_bias(forbid, log_probs)
    # Draw where the generator lives (a CPU seed reproduces on any device).
    gen = opt.generator
    draw_on = None if gen is None or gen.device == log_probs.device else gen.device
    for t in range(opt.max_length):
        if not sample:
            if forbid is not None:
                log_probs = log_probs.index_fill(-1, forbid, -math.inf)
            chosen, token = log_probs.max(dim=-1)  # (B',) each: one op for both
        else:
            x = log_probs.double() if bias is None else log_probs + bias  # (B', V) float64
            probs = _filtered(x, opt.temperature, opt.top_k, opt.top_p).exp()
            if draw_on is not None:
                probs = probs.to(draw_on)
            drawn_t, race = _draw(probs, gen)  # (B', 1) each
            if draw_on is not None:
                drawn_t, race = drawn_t.to(log_probs.device), race.to(log_probs.device)
            races.append(race.view(-1))
            chosen, token = log_probs.gather(1, drawn_t).view(-1), drawn_t.view(-1)
        tokens.append(token)
        chosen_lps.append(chosen)
        if t == opt.max_length - 1:
            break
        if opt.eos_id is None:  # only the length limit ends a row: nothing to read
            log_probs, state = model.step(token, state)
            continue
        rows = token.shape[0]
        going = token != opt.eos_id
        # greedy: rows stay until a quarter of them has ended
        live = going if live is None or not lazy else live.bitwise_and_(going)
        alive = int(live.sum())  # the step's one read of the host
        if alive == 0:
            break
        if alive < rows and (not lazy or 4 * alive <= 3 * rows):
            # the count is known: the rows' indices without a second read of the host
            keep = torch.nonzero_static(live, size=alive).view(-1)
            state, token = reorder(state, keep), token.index_select(0, keep)
            kept.append((t, keep))
            live = None
        log_probs, state = model.step(token, state)
    # The bookkeeping once at the end, in the order drawn (the same float sums); a row's
    # draws after its </s> (greedy keeps ended rows for a while) are not its output. The
    # draws of all steps are read in two copies to the host, not three per step (each
    # waits for the device).
    sizes = [len(d) for d in tokens]
    flat_ids = torch.cat(tokens + [k for _, k in kept]).tolist()
    flat_lps = torch.cat(chosen_lps + races).tolist()  # the races read with them
    if races:
        _check_races(flat_lps[len(flat_lps) // 2 :], sizes)
    ids: list[list[int]] = [[] for _ in range(B)]
    logprob = [0.0] * B
    finished = [False] * B
    origin = list(range(B))  # the output row of each row of the batch
    at, kept_at, selections = 0, sum(sizes), iter(kept)
    selection = next(selections, None)
    for t, n in enumerate(sizes):
        drawn, lps = flat_ids[at : at + n], flat_lps[at : at + n]
        at += n
        for r, k, lp in zip(origin, drawn, lps, strict=True):
            if finished[r]:
                continue
            logprob[r] += lp
            if k == opt.eos_id:
                finished[r] = True
            else:
                ids[r].append(k)
        if selection is not None and selection[0] == t:
            m = len(selection[1])
            origin = [origin[i] for i in flat_ids[kept_at : kept_at + m]]
            kept_at += m
            selection = next(selections, None)
    return [
        GenerationResult(i, lp, f, opt.score(lp, len(i) + f))
        for i, lp, f in zip(ids, logprob, finished, strict=True)
    ]
