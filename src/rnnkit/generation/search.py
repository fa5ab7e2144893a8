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

* ``forbid`` names tokens never generated (rnnkit's models pass ``<pad>``, ``<unk>``
  and ``<s>``): they are masked to ``-inf`` before every choice; ``logprob`` of what is
  drawn stays the model's own (not renormalised over the allowed tokens).
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
  Greedy search drops them once a quarter of the batch has ended (one copy of the state
  for several rows); until then ended rows are stepped but what they draw is not kept.
* The model's train/eval mode is left as it is: call ``model.eval()`` first (dropout).

States are tensors or nested tuples / NamedTuples / lists / dicts of tensors; rows are
selected along a batch dimension (``state_batch_dim``, 2 for rnnkit's ``(L, D, B, H)``,
or a matching nested spec of dims) or by a ``reorder(state, index)`` callable.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from rnnkit.deferred import deferring
from rnnkit.generation.beam import _run_beam
from rnnkit.generation.options import (
    GenerationResult,
    StepModel,
    _check_prompts,
    _is_int,
    _Options,
    check_forbid,
)
from rnnkit.generation.sampling import _run_sampling, filter_log_probs
from rnnkit.generation.state import (
    DimSpec,
    Reorder,
    _batch_size,
    _device,
    _where_state,
    select_state,
)

__all__ = [
    "GenerationResult",
    "StepModel",
    "filter_log_probs",
    "generate",
    "generate_batch",
    "select_state",
]


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
    forbid: Sequence[int] = (),
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
        forbid: token ids never generated (e.g. ``<pad>``, ``<unk>``, ``<s>``): their
            log-probabilities are set to ``-inf`` before every choice, in greedy, sampling
            (before temperature, top-k and top-p) and beam search alike; ``eos_id`` cannot
            be forbidden.

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
    # Over 80 lines by its docstring (one entry per keyword); the code is under 80.
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
        forbid=check_forbid(forbid, eos_id),
    )
    vocab_size = getattr(model, "vocab_size", None)
    vocab = vocab_size if _is_int(vocab_size) else None
    if prompts is None:
        if bos_id is None:
            raise ValueError("give prompt_ids or bos_id: generation needs a first token")
        rows = _batch_size(state, state_batch_dim) if state is not None else None
        if rows is None:
            raise ValueError("generate_batch needs prompts or an initial state with rows")
        if rows == 0:  # an empty batch of sources (B = 0): nothing to generate
            return []
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
    # deferring(): on a GPU a model's check of each step's token ids (rnnkit's models
    # check that they are in range) is read once at the end, not at every step (each read
    # waits for the device); the ids the search draws are in range by construction, and
    # the prompts were checked above. On the CPU nothing changes.
    with torch.no_grad(), deferring():
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
    forbid: Sequence[int] = (),
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
        forbid=forbid,
    )[0]
