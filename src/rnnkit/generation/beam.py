"""Beam search over ``S`` sources at once, ``S·K`` rows per ``step`` call, with length
normalisation and the choice of stopping rule (``early_stopping``).

Its entry point is :func:`rnnkit.generation.search.generate_batch` with
``strategy="beam"``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from rnnkit.generation.options import GenerationResult, StepModel, _Options, forbid_index
from rnnkit.generation.state import Reorder

# Nothing public: searches start at rnnkit.generation.search.
__all__: list[str] = []


def _run_beam(
    model: StepModel, log_probs: Tensor, state: Any, reorder: Reorder, opt: _Options
) -> list[list[GenerationResult]]:
    """Beam search over ``S`` sources at once: ``S·K`` rows per ``step`` call.

    Live beams are ranked by raw log-probability (all have the same length); finished
    hypotheses by ``score``. A source leaves the batch when its search is over. A step's
    choices are read to the host in one copy (:func:`_choose`); the sequences are kept
    there as links (:class:`_Links`).
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
    beam_lp = beam_lp.view(S * K, 1)  # (A·K, 1): a column added to each beam's log-probs
    sources = list(range(S))  # active position -> source
    hyps = _Hypotheses(S, opt.score)
    history: list[_Links] = []  # per step: what each next beam continues
    forbid = forbid_index(opt.forbid, V, device)  # to the device once, not every step
    eos = -1 if opt.eos_id is None else opt.eos_id
    first_rows = (torch.arange(S, device=device) * K).view(-1, 1)  # a·K of source a
    base = first_rows  # (A, 1) those of the active sources
    for t in range(opt.max_length):
        A, n = len(sources), t + 1  # n: tokens drawn so far, this one included
        if forbid is not None:
            log_probs = log_probs.index_fill(-1, forbid, -math.inf)
        if base.shape[0] != A:  # sources left: a view, no kernel
            base = first_rows[:A]
        host, rows, token, live_lp = _choose(log_probs, beam_lp, base, K, eos)
        links = _Links(K, history[-1] if history else None, host)
        last = t == opt.max_length - 1
        keep: list[int] = []
        for a, (s, row) in enumerate(zip(sources, host, strict=True)):
            for _, parent, lp in _ended(row, K, V, eos):
                hyps.add(s, links, a * K + parent, None, lp, True, n)
            if last:
                for parent_row, token_id, lp in _live(row, K):
                    hyps.add(s, links, parent_row, token_id, lp, False, n)
            elif not _beam_done(hyps.scored[s], row[2 * K], n, opt):
                keep.append(a)
        if last or not keep:
            break
        links.keep = keep
        history.append(links)
        if len(keep) < A:
            keep_t = torch.tensor(keep, device=device)
            rows, token, live_lp = rows[keep_t], token[keep_t], live_lp[keep_t]
        rows, token, beam_lp = rows.view(-1), token.view(-1), live_lp.view(-1, 1)  # (A'·K, ·)
        sources = [sources[a] for a in keep]
        log_probs, state = model.step(token, reorder(state, rows))
    return hyps.best(opt.num)


def _choose(
    log_probs: Tensor, beam_lp: Tensor, base: Tensor, K: int, eos_id: int
) -> tuple[list[list[float]], Tensor, Tensor, Tensor]:
    """One step's choice for ``A`` sources of ``K`` beams, and its copy to the host.

    Args:
        log_probs: ``(A·K, V)`` the step's (forbidden ids already ``-inf``).
        beam_lp: ``(A·K, 1)`` each beam's log-probability so far.
        base: ``(A, 1)`` the first row of each source, ``a·K``.
        K: beams per source.  eos_id: the end symbol (``-1``: none).

    Returns:
        ``(host, rows, tokens, live_lp)``: ``host`` one list of ``5K`` numbers per source
        (the best ``K`` of its ``2K`` candidates' log-probabilities at ``0:K`` and flat
        ids ``parent·V + token`` at ``K:2K``; its live beams' log-probabilities at
        ``2K:3K``, parent rows at ``3K:4K`` and tokens at ``4K:5K``); the live beams'
        parent rows, tokens and log-probabilities ``(A, K)`` on the device. Live beams
        are the best ``K`` candidates that are not ``</s>`` and finite (``-inf``
        otherwise: a source with fewer has placeholders).
    """
    A, V = base.shape[0], log_probs.shape[-1]
    cand = (beam_lp + log_probs.float()).view(A, K * V)  # (A, K·V)
    # 2K candidates leave K live ones even if K of them are eos.
    top_lp, top_idx = cand.topk(min(2 * K, K * V), dim=-1)  # (A, C)
    inf = -math.inf
    live = top_lp.masked_fill(top_idx.remainder(V) == eos_id, inf)  # NaN, +inf: -inf too
    live_lp, pick = live.nan_to_num_(nan=inf, posinf=inf, neginf=inf).topk(K, dim=-1)
    chosen = top_idx.gather(1, pick)
    rows = chosen.div(V, rounding_mode="floor").add_(base)  # (A, K) parent rows
    tokens = chosen.remainder_(V)  # (A, K)
    # One copy to the host (each read waits for the device), every number exact in float64.
    host = torch.cat(
        [top_lp[:, :K].double(), top_idx[:, :K], live_lp.double(), rows, tokens], dim=1
    ).tolist()
    return host, rows, tokens, live_lp


def _ended(row: list[float], K: int, V: int, eos_id: int) -> list[tuple[int, int, float]]:
    """``(c, parent beam, log-probability)`` of each ``</s>`` among the best ``K``
    candidates of one source's row of :func:`_choose` (each ends a hypothesis), best
    first; ``c`` the candidate's rank."""
    out = []
    for c in range(K):
        idx = int(row[K + c])
        if idx % V == eos_id and math.isfinite(row[c]):
            out.append((c, idx // V, row[c]))
    return out


def _live(row: list[float], K: int) -> list[tuple[int, int, float]]:
    """``(parent row, token, log-probability)`` of each live beam of one source's row of
    :func:`_choose` (the hypotheses cut at the length limit), best first."""
    return [
        (int(row[3 * K + b]), int(row[4 * K + b]), row[2 * K + b])
        for b in range(K)
        if math.isfinite(row[2 * K + b])
    ]


class _Hypotheses:
    """Each source's ended hypotheses (and, at the length limit, the cut ones): scored
    when they end, their token ids followed back through the links only for those
    returned (a trained model's beams end several hypotheses per source)."""

    def __init__(self, S: int, score: Callable[[float, int], float]) -> None:
        #: per source, the results so far with their ids left empty
        self.scored: list[list[GenerationResult]] = [[] for _ in range(S)]
        self._where: list[list[tuple[_Links, int, int | None]]] = [[] for _ in range(S)]
        self._score = score

    def add(
        self,
        source: int,
        links: _Links,
        row: int,
        token: int | None,
        lp: float,
        finished: bool,
        n: int,
    ) -> None:
        """A hypothesis of ``n`` tokens drawn: beam ``row`` of the step of ``links``,
        then ``token`` (None: ``</s>``, not in the ids)."""
        self.scored[source].append(GenerationResult([], lp, finished, self._score(lp, n)))
        self._where[source].append((links, row, token))

    def best(self, num: int) -> list[list[GenerationResult]]:
        """Each source's ``num`` best, best score first (ties in the order added)."""
        out = []
        for results, where in zip(self.scored, self._where, strict=True):
            order = sorted(range(len(results)), key=lambda i: results[i].score, reverse=True)
            out.append([results[i]._replace(ids=_ids(*where[i])) for i in order[:num]])
        return out


def _ids(links: _Links, row: int, token: int | None) -> list[int]:
    ids = links.parent_ids(row)
    return ids if token is None else [*ids, token]


class _Links:
    """One step's choices, read to the host: for each beam of the next step, its parent
    beam (a row of this step) and the token it adds; the token sequences follow from the
    links of all steps.

    ``host``: per active source, the row of :func:`_choose`'s copy (the live beams'
    parent rows at ``3K + b``, their tokens at ``4K + b``); ``keep``: the sources that go
    on (the next step's row ``a·K + b`` is the live beam ``b`` of source ``keep[a]``).
    The sequences followed are kept (beams of a source share most of theirs).
    """

    __slots__ = ("K", "_seqs", "before", "host", "keep")

    def __init__(self, K: int, before: _Links | None, host: list[list[float]]) -> None:
        self.K, self.before, self.host = K, before, host
        self.keep: list[int] = []
        self._seqs: dict[int, tuple[int, ...]] = {}

    def parent_ids(self, row: int) -> list[int]:
        """The tokens drawn so far by beam ``row`` of this step (this step's input)."""
        return [] if self.before is None else list(self.before._seq(row))

    def _seq(self, row: int) -> tuple[int, ...]:
        """The tokens of beam ``row`` of the next step's input, this step's included: the
        links followed back to a sequence known (or the start), then each kept on the
        way forward (a loop, not a recursion: as many steps as ``max_length``)."""
        chain: list[tuple[_Links, int, int]] = []  # (links, row, token) not known yet
        links: _Links | None = self
        head: tuple[int, ...] = ()
        while links is not None:
            known = links._seqs.get(row)
            if known is not None:
                head = known
                break
            a, b = divmod(row, links.K)
            line = links.host[links.keep[a]]
            chain.append((links, row, int(line[4 * links.K + b])))
            row = int(line[3 * links.K + b])
            links = links.before
        for at, r, token in reversed(chain):
            head = at._seqs[r] = (*head, token)
        return head


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
