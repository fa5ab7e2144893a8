"""Free running: carry the state step to step, choose the next token, stop.

Any model with ``step(token (B,), state) -> (log_probs (B, V), new_state)`` can generate
(``state=None`` is the zero initial state). The prompt primes the state one token at a
time (or in one call if the model offers ``prime(ids (B, P), state)`` returning the
log-probabilities of the last position and the state); the last prompt position's
distribution gives the first generated token, and each drawn token is fed back once, so
drawing ``n`` tokens after a prompt of length ``P`` costs exactly ``P + n − 1`` calls of
``step`` (the last drawn token is never fed: nothing needs its successor). The prefix is
never re-run.

Decisions, stated once:

* ``eos_id`` stops a sequence and is **not** part of ``GenerationResult.ids``;
  ``finished`` says whether it was drawn, and its log-probability **is** counted in
  ``logprob`` (it is part of the sequence's probability).
* ``max_length`` bounds the tokens drawn, the ``eos`` included; a sequence that reaches it
  without ``eos`` has ``finished=False``.
* ``logprob`` is always under the model's own distribution (no temperature, no top-k/top-p
  truncation); ``score = logprob / n ** length_penalty`` with ``n = len(ids) + finished``
  (the tokens drawn). Beam search ranks finished hypotheses by ``score``.
* Rows of a batch that have drawn ``eos`` leave the batch: their state is dropped from
  the next ``step`` call, so they consume nothing and their output never changes.
* The model's train/eval mode is left as it is: call ``model.eval()`` first (dropout).

States are tensors or nested tuples / NamedTuples / lists / dicts of tensors; rows are
selected along a batch dimension (``state_batch_dim``, 2 for rnnkit's ``(L, D, B, H)``,
or a matching nested spec of dims) or by a ``reorder(state, index)`` callable.
"""

from __future__ import annotations

import contextlib
import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import torch
from torch import Tensor

__all__ = [
    "GenerationResult",
    "StepModel",
    "filter_log_probs",
    "generate",
    "generate_batch",
    "select_state",
]

STRATEGIES = ("sample", "greedy", "beam")

# A batch-dimension spec: one int for every tensor, or a structure matching the state's.
DimSpec = Any
Reorder = Callable[[Any, Tensor], Any]


class StepModel(Protocol):
    """What generation needs of a model (``LanguageModel.step``, a seq2seq decoder...)."""

    def step(self, token: Tensor, state: Any) -> tuple[Tensor, Any]: ...


class GenerationResult(NamedTuple):
    """One generated sequence.

    Attributes:
        ids: the generated token ids, prompt and ``eos`` excluded.
        logprob: natural-log probability of the drawn tokens under the model (``eos``
            included when drawn).
        finished: True when the sequence ended with ``eos`` (False: cut at ``max_length``).
        score: ``logprob / n ** length_penalty``, ``n`` the tokens drawn (``eos``
            included); what beam search ranks by.
    """

    ids: list[int]
    logprob: float
    finished: bool
    score: float


# ----------------------------------------------------------------------------- states


def _map_state(fn: Callable[..., Tensor], dim: DimSpec, *states: Any) -> Any:
    """Apply ``fn(tensor..., dim)`` leaf-wise over matching nested states."""
    first = states[0]
    if first is None:
        return None
    if isinstance(first, Tensor):
        if not isinstance(dim, int):
            raise TypeError(f"state_batch_dim {dim!r} does not match a tensor leaf")
        return fn(*states, dim)
    if isinstance(first, dict):
        by_key = dim if isinstance(dim, dict) else dict.fromkeys(first, dim)
        return {k: _map_state(fn, by_key[k], *(s[k] for s in states)) for k in first}
    if isinstance(first, (tuple, list)):
        dims = dim if isinstance(dim, (tuple, list)) else (dim,) * len(first)
        if len(dims) != len(first):
            raise TypeError(f"state_batch_dim {dim!r} does not match the state's structure")
        items = [
            _map_state(fn, d, *parts)
            for d, parts in zip(dims, zip(*states, strict=True), strict=True)
        ]
        if isinstance(first, list):
            return items
        return type(first)(*items) if hasattr(first, "_fields") else tuple(items)
    raise TypeError(f"cannot select rows of a state of type {type(first).__name__}")


def select_state(state: Any, index: Tensor, dim: DimSpec = 2) -> Any:
    """Rows ``index`` of every tensor of a (nested) state, along its batch dimension.

    Args:
        state: a tensor, None, or tuples / NamedTuples / lists / dicts of them.
        index: ``(B',)`` long row indices (repeats allowed: this also expands a state).
        dim: the batch dimension of every tensor (rnnkit states ``(L, D, B, H)``: 2), or
            a structure matching the state's with one dim per leaf.

    >>> from rnnkit.types import LSTMState
    >>> s = LSTMState(torch.arange(3.0).view(1, 1, 3, 1), torch.zeros(1, 1, 3, 1))
    >>> select_state(s, torch.tensor([2, 0, 0])).h.view(-1).tolist()
    [2.0, 0.0, 0.0]
    >>> select_state((torch.arange(3), s), torch.tensor([1]), dim=(0, 2))[0].tolist()
    [1]
    """
    return _map_state(lambda t, d: t.index_select(d, index.to(t.device)), dim, state)


def _where_state(rows: Tensor, new: Any, old: Any, dim: DimSpec) -> Any:
    """``new`` where ``rows (B,)`` is True, else ``old`` (None: the zero state)."""

    def pick(n: Tensor, o: Tensor | None, d: int) -> Tensor:
        shape = [1] * n.dim()
        shape[d] = -1
        return torch.where(rows.to(n.device).view(shape), n, 0.0 if o is None else o)

    if old is None:
        return _map_state(lambda n, d: pick(n, None, d), dim, new)
    return _map_state(pick, dim, new, old)


def _collect(into: list[Any], item: Any, leaf: Tensor) -> Tensor:
    """``into.append(item)``, then ``leaf``: a leaf function that reads and keeps."""
    into.append(item)
    return leaf


def _batch_size(state: Any, dim: DimSpec) -> int | None:
    sizes: list[int] = []
    try:
        _map_state(lambda t, d: _collect(sizes, t.shape[d], t), dim, state)
    except (IndexError, TypeError) as e:
        raise ValueError(
            f"cannot read the rows of the state with state_batch_dim={dim!r}: give "
            "state_batch_dim matching the state, or prompts"
        ) from e
    return sizes[0] if sizes else None


def _device(model: Any, state: Any) -> torch.device:
    leaves: list[Tensor] = []
    # A state only its own reorder callable understands tells nothing: TypeError ignored.
    with contextlib.suppress(TypeError):
        _map_state(lambda t, d: _collect(leaves, t, t), 0, state)
    if leaves:
        return leaves[0].device
    params = getattr(model, "parameters", None)
    if callable(params):
        for p in params():
            return p.device
    return torch.device("cpu")


# --------------------------------------------------------------------------- sampling


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
    scores = torch.log_softmax(log_probs.float() / temperature, dim=-1)
    if top_k is not None and top_k < scores.shape[-1]:
        keep = torch.zeros_like(scores, dtype=torch.bool)
        keep.scatter_(-1, scores.topk(top_k, dim=-1).indices, True)
        scores = torch.log_softmax(scores.masked_fill(~keep, -math.inf), dim=-1)
    if top_p is not None and top_p < 1.0:
        probs, order = scores.exp().sort(dim=-1, descending=True)  # (B, V)
        mass_before = probs.cumsum(-1) - probs
        drop_sorted = mass_before >= top_p
        drop_sorted[..., 0] = False  # the most probable token always stays
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scores = torch.log_softmax(scores.masked_fill(drop, -math.inf), dim=-1)
    return scores


# ----------------------------------------------------------------------------- checks


def _is_int(x: object) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _is_real(x: object) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _check_sampling(temperature: float, top_k: int | None, top_p: float | None) -> None:
    if not _is_real(temperature) or not (math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
    if top_k is not None and (not _is_int(top_k) or top_k < 1):
        raise ValueError(f"top_k must be an integer >= 1 or None, got {top_k!r}")
    if top_p is not None and not (_is_real(top_p) and 0 < top_p <= 1):
        raise ValueError(f"top_p must be in (0, 1] or None, got {top_p!r}")


@dataclass(frozen=True)
class _Options:
    """The validated decoding options, passed around as one value."""

    max_length: int
    eos_id: int | None
    bos_id: int | None
    strategy: str
    temperature: float
    top_k: int | None
    top_p: float | None
    beam_size: int
    length_penalty: float
    early_stopping: bool
    num: int
    generator: torch.Generator | None

    def __post_init__(self) -> None:
        if not _is_int(self.max_length) or self.max_length < 1:
            raise ValueError(f"max_length must be an integer >= 1, got {self.max_length!r}")
        if self.strategy not in STRATEGIES:
            raise ValueError(
                f"strategy must be one of {', '.join(STRATEGIES)}, got {self.strategy!r}"
            )
        _check_sampling(self.temperature, self.top_k, self.top_p)
        if not _is_int(self.beam_size) or self.beam_size < 1:
            raise ValueError(f"beam_size must be an integer >= 1, got {self.beam_size!r}")
        alpha = self.length_penalty
        if not (_is_real(alpha) and math.isfinite(alpha)):
            raise ValueError(f"length_penalty must be a finite number, got {alpha!r}")
        if not _is_int(self.num) or self.num < 1:
            raise ValueError(f"num must be an integer >= 1, got {self.num!r}")
        if self.strategy == "beam" and self.num > self.beam_size:
            raise ValueError(f"num ({self.num}) must not exceed beam_size ({self.beam_size})")
        for name in ("eos_id", "bos_id"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or value < 0):
                raise ValueError(f"{name} must be a non-negative integer or None, got {value!r}")

    def score(self, logprob: float, n: int) -> float:
        return logprob / n**self.length_penalty


def _check_prompts(prompts: Sequence[Sequence[int]], vocab_size: int | None) -> list[list[int]]:
    out = []
    for i, prompt in enumerate(prompts):
        ids = prompt.view(-1).tolist() if isinstance(prompt, Tensor) else list(prompt)
        if not ids:
            raise ValueError(f"prompt_ids must not be empty (prompt {i})")
        for t in ids:
            if not _is_int(t) or t < 0 or (vocab_size is not None and t >= vocab_size):
                raise ValueError(f"prompt_ids holds {t!r}, not a token id (prompt {i})")
        out.append([int(t) for t in ids])
    return out


# ------------------------------------------------------------------------------- core


def _prime(
    model: StepModel,
    prompts: list[list[int]],
    state: Any,
    dim: DimSpec,
    device: torch.device,
    uniform_only: bool,
) -> tuple[Tensor, Any]:
    """Feed each source's prompt; return the last position's log-probs ``(S, V)``, state."""
    lengths = [len(p) for p in prompts]
    uniform = len(set(lengths)) == 1
    if uniform and callable(getattr(model, "prime", None)):
        return model.prime(torch.tensor(prompts, device=device), state)  # type: ignore[attr-defined]
    if not uniform and uniform_only:
        raise ValueError(
            "prompts of different lengths need state_batch_dim to hold finished rows "
            "(a reorder callable cannot merge states)"
        )
    last: Tensor | None = None
    for t in range(max(lengths)):
        token = torch.tensor([p[min(t, len(p) - 1)] for p in prompts], device=device)
        log_probs, new_state = model.step(token, state)
        if uniform:
            state, last = new_state, log_probs
            continue
        # Rows whose prompt has ended hold their state; their step output is discarded.
        alive = torch.tensor([t < n for n in lengths], device=device)
        state = _where_state(alive, new_state, state, dim)
        ends = torch.tensor([t == n - 1 for n in lengths], device=device).view(-1, 1)
        last = log_probs if last is None else torch.where(ends, log_probs, last)
    assert last is not None
    return last, state


def _run_sampling(
    model: StepModel, log_probs: Tensor, state: Any, reorder: Reorder, opt: _Options
) -> list[GenerationResult]:
    """Sample (or pick greedily) for independent rows; finished rows leave the batch."""
    B = log_probs.shape[0]
    origin = torch.arange(B, device=log_probs.device)  # active row -> output row
    drawn: list[tuple[Tensor, Tensor, Tensor]] = []  # (origin, token, log-prob) per step
    for t in range(opt.max_length):
        if opt.strategy == "greedy":
            token = log_probs.argmax(dim=-1)  # (B',)
        else:
            probs = filter_log_probs(
                log_probs, temperature=opt.temperature, top_k=opt.top_k, top_p=opt.top_p
            ).exp()
            if opt.generator is not None and opt.generator.device != probs.device:
                # Draw where the generator lives (a CPU seed reproduces on any device).
                probs = probs.to(opt.generator.device)
            token = torch.multinomial(probs, 1, generator=opt.generator).view(-1)  # (B',)
            token = token.to(log_probs.device)
        drawn.append((origin, token, log_probs.gather(1, token.view(-1, 1)).view(-1)))
        if t == opt.max_length - 1:
            break
        live = token != (-1 if opt.eos_id is None else opt.eos_id)
        alive = int(live.sum())
        if alive == 0:
            break
        if alive < live.shape[0]:
            keep = live.nonzero().view(-1)
            state, token, origin = reorder(state, keep), token[keep], origin[keep]
        log_probs, state = model.step(token, state)
    # The bookkeeping once at the end, in the order drawn (the same float sums).
    ids: list[list[int]] = [[] for _ in range(B)]
    logprob = [0.0] * B
    finished = [False] * B
    for rows, tokens, lps in drawn:
        for r, k, lp in zip(rows.tolist(), tokens.tolist(), lps.tolist(), strict=True):
            logprob[r] += lp
            if k == opt.eos_id:
                finished[r] = True
            else:
                ids[r].append(k)
    return [
        GenerationResult(i, lp, f, opt.score(lp, len(i) + f))
        for i, lp, f in zip(ids, logprob, finished, strict=True)
    ]


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


# -------------------------------------------------------------------------------- API


def generate_batch(
    model: StepModel,
    prompts: Sequence[Sequence[int]] | None = None,
    *,
    max_length: int,
    eos_id: int | None = None,
    bos_id: int | None = None,
    strategy: str = "greedy",
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    beam_size: int = 4,
    length_penalty: float = 1.0,
    early_stopping: bool = True,
    num: int = 1,
    generator: torch.Generator | None = None,
    state: Any = None,
    state_batch_dim: DimSpec = 2,
    reorder: Reorder | None = None,
) -> list[list[GenerationResult]]:
    """Generate for ``S`` sources at once (prompts and/or initial states, e.g. encoders').

    Every source is primed with its prompt (``[bos_id]`` when ``prompts`` is None), then
    all rows advance together, one ``step`` call per token for the whole batch.

    Args:
        model: has ``step(token (B,), state) -> (log_probs (B, V), state)``.
        prompts: ``S`` non-empty lists of token ids, or None: ``[bos_id]`` for each of the
            ``S`` rows of ``state``.
        max_length: the most tokens drawn per sequence, ``eos`` included (``>= 1``).
        eos_id: the end-of-sequence id (None: stop only at ``max_length``).
        bos_id: the start id used when ``prompts`` is None.
        strategy: ``"sample"``, ``"greedy"`` or ``"beam"``.
        temperature, top_k, top_p: the sampling distribution (see ``filter_log_probs``);
            used by ``"sample"`` only.
        beam_size: beams per source (``"beam"``); ``1`` is greedy search.
        length_penalty: ``alpha`` in ``score = logprob / n ** alpha``; 0 ranks by raw
            log-probability, 1 by log-probability per token.
        early_stopping: beam only: stop a source once ``beam_size`` hypotheses have ended
            (the usual rule). False: go on until no live hypothesis can still beat the
            ``beam_size``-th best finished one (exact under the length normalisation).
        num: results per source: independent samples (``S·num`` rows in one batch), or
            the ``num`` best beam hypotheses (``<= beam_size``; fewer when fewer exist).
        generator: the random source of sampling, for reproducibility.
        state: initial state with ``S`` rows (None: the zero state).
        state_batch_dim: batch dim of every state tensor, or a nested spec matching the
            state (e.g. ``(2, 0)`` for ``(LSTMState, encoder_outputs)``).
        reorder: ``reorder(state, index)`` selecting rows, instead of ``state_batch_dim``
            (then prompts must share one length).

    Returns:
        ``S`` lists of ``GenerationResult``: samples in draw order, beam hypotheses best
        first.

    >>> from torch import nn
    >>> from rnnkit import LSTM
    >>> from rnnkit.models.language_model import LanguageModel
    >>> _ = torch.manual_seed(0)
    >>> lm = LanguageModel(nn.Embedding(6, 4), LSTM(4, 8), nn.Linear(8, 6)).eval()
    >>> out = generate_batch(lm, [[1], [2, 3]], max_length=4, eos_id=0, strategy="beam",
    ...                      beam_size=2, num=2)
    >>> [len(hyps) for hyps in out], out[0][0].score >= out[0][1].score
    ([2, 2], True)
    """
    opt = _Options(
        max_length=max_length,
        eos_id=eos_id,
        bos_id=bos_id,
        strategy=strategy,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        beam_size=beam_size,
        length_penalty=length_penalty,
        early_stopping=bool(early_stopping),
        num=num,
        generator=generator,
    )
    vocab_size = getattr(model, "vocab_size", None)
    vocab = vocab_size if _is_int(vocab_size) else None
    if prompts is None:
        if bos_id is None:
            raise ValueError("give prompt_ids or bos_id: generation needs a first token")
        rows = _batch_size(state, state_batch_dim) if state is not None else None
        if not rows:
            raise ValueError("generate_batch needs prompts or an initial state with rows")
        prompt_list = _check_prompts([[bos_id]], vocab) * rows  # every row: the same one id
    else:
        if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence) or not prompts:
            raise ValueError("prompts must be a non-empty list of token-id lists")
        prompt_list = _check_prompts(prompts, vocab)
    S = len(prompt_list)
    if state is not None and reorder is None:
        rows = _batch_size(state, state_batch_dim)
        if rows is not None and rows != S:
            raise ValueError(f"state has {rows} rows but {S} prompts were given")

    def select(s: Any, index: Tensor) -> Any:
        return reorder(s, index) if reorder is not None else select_state(s, index, state_batch_dim)

    device = _device(model, state)
    with torch.no_grad():
        log_probs, state = _prime(
            model, prompt_list, state, state_batch_dim, device, uniform_only=reorder is not None
        )
        if strategy == "beam":
            return _run_beam(model, log_probs, state, select, opt)
        if num > 1:
            expand = torch.arange(S, device=log_probs.device).repeat_interleave(num)
            log_probs, state = log_probs.index_select(0, expand), select(state, expand)
        flat = _run_sampling(model, log_probs, state, select, opt)
    return [flat[i * num : (i + 1) * num] for i in range(S)]


def generate(
    model: StepModel,
    prompt_ids: Sequence[int] | None = None,
    *,
    max_length: int,
    eos_id: int | None = None,
    bos_id: int | None = None,
    strategy: str = "sample",
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    beam_size: int = 4,
    length_penalty: float = 1.0,
    early_stopping: bool = True,
    num: int = 1,
    generator: torch.Generator | None = None,
    state: Any = None,
    state_batch_dim: DimSpec = 2,
    reorder: Reorder | None = None,
) -> list[GenerationResult]:
    """Generate ``num`` sequences from one prompt (default ``[bos_id]``).

    The decoding rules are in docs/math.md, "Generation".

    The ``num`` samples are drawn as one batch after priming once; ``state`` (one row,
    or None for zeros) is where priming starts. Arguments as in ``generate_batch``
    (sampling is the default strategy here).

    Returns:
        ``num`` results: samples in draw order, or the ``num`` best beam hypotheses.

    >>> from torch import nn
    >>> from rnnkit import LSTM
    >>> from rnnkit.models.language_model import LanguageModel
    >>> _ = torch.manual_seed(0)
    >>> lm = LanguageModel(nn.Embedding(6, 4), LSTM(4, 8), nn.Linear(8, 6)).eval()
    >>> g = torch.Generator().manual_seed(1)
    >>> a = generate(lm, [1, 2], max_length=5, eos_id=0, num=3, top_k=3, generator=g)
    >>> _ = g.manual_seed(1)
    >>> b = generate(lm, [1, 2], max_length=5, eos_id=0, num=3, top_k=3, generator=g)
    >>> a == b, len(a), all(len(r.ids) + r.finished <= 5 for r in a)
    (True, 3, True)
    """
    if isinstance(prompt_ids, Tensor):
        prompt_ids = prompt_ids.view(-1).tolist()
    if prompt_ids is not None and not isinstance(prompt_ids, Sequence):
        raise ValueError(f"prompt_ids must be a list of token ids, got {prompt_ids!r}")
    if prompt_ids is None:
        if bos_id is None:
            raise ValueError("give prompt_ids or bos_id: generation needs a first token")
        prompt_ids = [bos_id]
    return generate_batch(
        model,
        [prompt_ids],
        max_length=max_length,
        eos_id=eos_id,
        bos_id=bos_id,
        strategy=strategy,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        beam_size=beam_size,
        length_penalty=length_penalty,
        early_stopping=early_stopping,
        num=num,
        generator=generator,
        state=state,
        state_batch_dim=state_batch_dim,
        reorder=reorder,
    )[0]
