"""Scheduled sampling (Bengio et al. 2015): how often the decoder is fed its own output.

During training the decoder's input at step ``t`` is the true previous token ``y_{t−1}``
(teacher forcing) or, with probability ``p``, the model's own greedy choice at step
``t − 1``; the coin is tossed per sequence and per step. ``p`` grows with the training
step ``i`` (a curriculum from teacher forcing towards free running). The schedules are
Bengio et al.'s decays of the teacher-forcing probability ``ε_i``, with ``p_i = 1 − ε_i``:

* ``linear:K``           ``p_i = min(1, i / K)``              (K ≥ 1 steps to reach 1)
* ``exponential:K``      ``p_i = 1 − K^i``                    (0 < K < 1, Bengio's k)
* ``inverse-sigmoid:K``  ``p_i = 1 − K / (K + exp(i / K))``   (K ≥ 1, Bengio's k)

An optional third field caps the probability: ``linear:1000:0.5`` stops at ``p = 0.5``.
``none`` is teacher forcing throughout (``p = 0``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rnnkit.errors import ConfigError

__all__ = ["SCHEDULES", "SamplingSchedule", "parse_schedule"]

SCHEDULES = ("none", "linear", "exponential", "inverse-sigmoid")
_OPTION = "--scheduled-sampling"


@dataclass(frozen=True)
class SamplingSchedule:
    """The probability ``p_i`` of feeding the model's own sample at training step ``i``.

    Attributes:
        kind: one of ``SCHEDULES``.
        k: the schedule's constant (see the module docstring); unused for ``none``.
        max_p: the cap on ``p`` (``0 ≤ max_p ≤ 1``).

    >>> s = parse_schedule("linear:100")
    >>> s.probability(0), s.probability(50), s.probability(500)
    (0.0, 0.5, 1.0)
    >>> round(parse_schedule("exponential:0.99").probability(100), 4)
    0.634
    >>> round(parse_schedule("inverse-sigmoid:10").probability(0), 4)
    0.0909
    """

    kind: str = "none"
    k: float = 0.0
    max_p: float = 1.0

    @property
    def active(self) -> bool:
        """Whether the decoder ever sees its own output (False for ``none``)."""
        return self.kind != "none" and self.max_p > 0

    def probability(self, step: int) -> float:
        """``p`` at training step ``step`` (the number of optimizer steps already done)."""
        if step < 0:
            raise ValueError(f"step must be ≥ 0, got {step}")
        if self.kind == "none":
            return 0.0
        if self.kind == "linear":
            p = step / self.k
        elif self.kind == "exponential":
            p = 1.0 - self.k**step
        else:  # inverse-sigmoid; exp overflow means ε = 0
            z = step / self.k
            p = 1.0 if z > 700 else 1.0 - self.k / (self.k + math.exp(z))
        return min(self.max_p, max(0.0, p))


def parse_schedule(spec: str) -> SamplingSchedule:
    """Parse ``none | linear:K | exponential:K | inverse-sigmoid:K`` (``[:MAX]`` optional).

    Raises:
        ConfigError: naming ``--scheduled-sampling`` and what is wrong.

    >>> parse_schedule("inverse-sigmoid:50:0.25")
    SamplingSchedule(kind='inverse-sigmoid', k=50.0, max_p=0.25)
    >>> parse_schedule("cosine:3")
    Traceback (most recent call last):
    ...
    rnnkit.errors.ConfigError: --scheduled-sampling must be none, linear:K, exponential:K or \
inverse-sigmoid:K (optionally :MAX), got 'cosine:3'
    """
    if not isinstance(spec, str):
        raise ConfigError(f"{_OPTION} must be a string, got {spec!r}")
    spec = spec.strip()
    if spec == "none":
        return SamplingSchedule()
    parts = spec.split(":")
    if parts[0] not in SCHEDULES[1:] or len(parts) not in (2, 3):
        raise ConfigError(
            f"{_OPTION} must be none, linear:K, exponential:K or inverse-sigmoid:K "
            f"(optionally :MAX), got {spec!r}"
        )
    kind = parts[0]
    try:
        k = float(parts[1])
        max_p = float(parts[2]) if len(parts) == 3 else 1.0
    except ValueError:
        raise ConfigError(f"{_OPTION} {spec!r}: K and MAX must be numbers") from None
    if not math.isfinite(k) or not math.isfinite(max_p):
        raise ConfigError(f"{_OPTION} {spec!r}: K and MAX must be finite")
    if kind == "linear" and not k >= 1:
        raise ConfigError(f"{_OPTION} linear:K needs K ≥ 1 (steps to reach p = 1), got {k:g}")
    if kind == "exponential" and not 0 < k < 1:
        raise ConfigError(f"{_OPTION} exponential:K needs 0 < K < 1 (ε_i = K^i), got {k:g}")
    if kind == "inverse-sigmoid" and not k >= 1:
        raise ConfigError(f"{_OPTION} inverse-sigmoid:K needs K ≥ 1, got {k:g}")
    if not 0.0 <= max_p <= 1.0:
        raise ConfigError(f"{_OPTION} {spec!r}: MAX must be in [0, 1], got {max_p:g}")
    return SamplingSchedule(kind, k, max_p)
