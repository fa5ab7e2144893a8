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
