"""Beam search over ``S`` sources at once, ``S·K`` rows per ``step`` call, with length
normalisation and the choice of stopping rule (``early_stopping``).

Its entry point is :func:`rnnkit.generation.search.generate_batch` with
``strategy="beam"``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from rnnkit.generation.options import GenerationResult, StepModel, _Options, mask_forbidden
from rnnkit.generation.state import Reorder

# Nothing public: searches start at rnnkit.generation.search.
__all__: list[str] = []


def _run_beam(
    model: StepModel, log_probs: Tensor, state: Any, reorder: Reorder, opt: _Options
) -> list[list[GenerationResult]]:
    """Beam search over ``S`` sources at once: ``S·K`` rows per ``step`` call.

    Live beams are ranked by raw log-probability (all have the same length); finished
    hypotheses by ``score``. A source leaves the batch when its search is over.
    """
    K = opt.beam_size
    S, V = log_probs.shape
    device = log_probs.device
    expand = torch.arange(S, device=device).repeat_interleave(K)
    state = reorder(state, expand)
    log_probs = log_probs.index_select(0, expand)  # (S·K, V)
    # Only the first beam of each source is live at first; the others are placeholders.
    beam_lp = torch.full((S, K), -math.inf, device=device)
    beam_lp[:, 0] = 0.0
    seqs = torch.zeros(S * K, 0, dtype=torch.long, device=device)  # (S·K, t)
    sources = list(range(S))  # active position -> source
    hyps: list[list[GenerationResult]] = [[] for _ in range(S)]
    for t in range(opt.max_length):
        A, n = len(sources), t + 1  # n: tokens drawn so far, this one included
        log_probs = mask_forbidden(log_probs, opt.forbid)
        cand = beam_lp.unsqueeze(-1) + log_probs.view(A, K, V).float()  # (A, K, V)
        # 2K candidates leave K live ones even if K of them are eos.
        top_lp, top_idx = cand.view(A, K * V).topk(min(2 * K, K * V), dim=-1)  # (A, C)
        parent, token = top_idx // V, top_idx % V
        finite = torch.isfinite(top_lp)
        is_eos = token == (-1 if opt.eos_id is None else opt.eos_id)
        # An eos ranked among the best K candidates closes a hypothesis.
        closes = is_eos & finite
        closes[:, K:] = False
        for a, c in closes.nonzero().tolist():
            lp = float(top_lp[a, c])
            ids = seqs[a * K + int(parent[a, c])].tolist()
            hyps[sources[a]].append(GenerationResult(ids, lp, True, opt.score(lp, n)))
        live_lp, pick = top_lp.masked_fill(is_eos | ~finite, -math.inf).topk(K, dim=-1)
        rows = (torch.arange(A, device=device) * K).view(-1, 1) + parent.gather(1, pick)
        token = token.gather(1, pick)  # (A, K)
        if t == opt.max_length - 1:
            for a, b in live_lp.isfinite().nonzero().tolist():
                lp = float(live_lp[a, b])
                ids = [*seqs[int(rows[a, b])].tolist(), int(token[a, b])]
                hyps[sources[a]].append(GenerationResult(ids, lp, False, opt.score(lp, n)))
            break
        keep = [
            a
            for a, s in enumerate(sources)
            if not _beam_done(hyps[s], float(live_lp[a, 0]), n, opt)
        ]
        if not keep:
            break
        keep_t = torch.tensor(keep, device=device)
        rows, token = rows[keep_t].view(-1), token[keep_t].view(-1)  # (A'·K,)
        seqs = torch.cat([seqs[rows], token.view(-1, 1)], dim=1)
        beam_lp = live_lp[keep_t]
        sources = [sources[a] for a in keep]
        log_probs, state = model.step(token, reorder(state, rows))
    return [sorted(h, key=lambda r: r.score, reverse=True)[: opt.num] for h in hyps]


def _beam_done(hyps: list[GenerationResult], best_live: float, n: int, opt: _Options) -> bool:
    """Whether a source's search is over after drawing its ``n``-th token."""
    if not math.isfinite(best_live):
        return True
    if len(hyps) < opt.beam_size:
        return False
    if opt.early_stopping:
        return True
    # A live hypothesis's logprob (≤ 0) only falls, so its best reachable score is at the
    # length that divides it most: the longest for alpha > 0, the shortest otherwise.
    length = opt.max_length if opt.length_penalty > 0 else n + 1
    worst_kept = sorted((h.score for h in hyps), reverse=True)[opt.beam_size - 1]
    return opt.score(best_live, length) <= worst_kept
