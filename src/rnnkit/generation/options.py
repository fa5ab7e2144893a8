"""What a search is given and what it gives back: the model's one-step protocol, the
result of one generated sequence, and the decoding options with their checks."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import torch
from torch import Tensor

__all__ = ["GenerationResult", "StepModel"]

STRATEGIES = ("sample", "greedy", "beam")

#: The widest beam: beyond a few dozen hypotheses a beam finds nothing a narrower one
#: misses, and its cost (beam × vocabulary scores a step) grows without a limit.
MAX_BEAM = 100
#: The most tokens ``rnnkit generate`` writes per output, and the most outputs of one call:
#: far beyond any use (a book is ~10^6 characters), near enough to keep a typo from
#: generating for hours.
MAX_GENERATE_TOKENS = 1_000_000
MAX_GENERATE_OUTPUTS = 10_000


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
    forbid: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not _is_int(self.max_length) or self.max_length < 1:
            raise ValueError(f"max_length must be an integer >= 1, got {self.max_length!r}")
        if self.strategy not in STRATEGIES:
            raise ValueError(
                f"strategy must be one of {', '.join(STRATEGIES)}, got {self.strategy!r}"
            )
        _check_sampling(self.temperature, self.top_k, self.top_p)
        if not _is_int(self.beam_size) or not 1 <= self.beam_size <= MAX_BEAM:
            raise ValueError(
                f"beam_size must be an integer from 1 to {MAX_BEAM}, got {self.beam_size!r}"
            )
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
        check_forbid(self.forbid, self.eos_id)

    def score(self, logprob: float, n: int) -> float:
        return logprob / n**self.length_penalty


def check_forbid(forbid: Sequence[int], eos_id: int | None) -> tuple[int, ...]:
    """``forbid`` as a tuple of token ids, checked: ids ≥ 0, and never ``eos_id`` (the
    end is a choice the model must be able to make)."""
    ids = tuple(forbid)
    for t in ids:
        if not _is_int(t) or t < 0:
            raise ValueError(f"forbid holds {t!r}, not a token id")
    if eos_id is not None and eos_id in ids:
        raise ValueError(f"forbid holds eos_id {eos_id}: the end of a sequence cannot be forbidden")
    return ids


def forbid_index(forbid: tuple[int, ...], V: int, device: torch.device) -> Tensor | None:
    """The ``forbid`` ids as a long tensor on ``device`` (None when there are none), checked
    against ``V`` outputs: a search makes it once and fills those columns at every step
    (:func:`mask_forbidden` makes it at every call, a copy to the device each time)."""
    if not forbid:
        return None
    if any(t >= V for t in forbid):
        raise ValueError(f"forbid holds a token id outside the {V} outputs: {forbid}")
    if len(forbid) >= V:
        raise ValueError(f"forbid leaves none of the {V} outputs to choose")
    return torch.tensor(forbid, device=device)


def mask_forbidden(
    log_probs: Tensor, forbid: tuple[int, ...], index: Tensor | None = None
) -> Tensor:
    """``log_probs (B, V)`` with the ``forbid`` columns set to ``-inf`` (a new tensor when
    any; the others keep the model's own values, so ``logprob`` stays the model's).
    ``index``: those ids from :func:`forbid_index`, made once by a search.

    >>> mask_forbidden(torch.zeros(1, 3), (0, 2))
    tensor([[-inf, 0., -inf]])
    """
    if not forbid:
        return log_probs
    if index is None:
        index = forbid_index(forbid, log_probs.shape[-1], log_probs.device)
        assert index is not None
    return log_probs.index_fill(-1, index, -math.inf)


def greedy_choice(scores: Tensor, forbid: tuple[int, ...]) -> Tensor:
    """``argmax`` of ``scores (B, V)`` over the tokens not in ``forbid`` (those ``< V``):
    the model's own greedy choice, as greedy search makes it (scheduled sampling feeds it).

    >>> greedy_choice(torch.tensor([[5.0, 1.0, 2.0]]), (0,))
    tensor([2])
    """
    ids = tuple(t for t in forbid if t < scores.shape[-1])
    if not ids or len(ids) >= scores.shape[-1]:
        return scores.argmax(dim=-1)
    return mask_forbidden(scores, ids).argmax(dim=-1)


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
