"""Sequence-length mechanisms (Goodfellow et al., *Deep Learning*, §10.2.3) other than ``</s>``.

Batches keep their usual form, inputs ``<s> y_1 … y_m`` and targets ``y_1 … y_m </s>``;
with a mechanism, the ``</s>`` step carries no token loss and ``</s>`` is never a token
(its logit is masked out of the softmax). Instead:

* ``"stop"``: an extra Bernoulli output per step, ``s_t = σ(w_s · f_t + b_s)`` read from the
  features ``f_t`` the token head reads, is the probability that ``y_t`` is the LAST token.
  Loss per token step: ``−ln p(y_t | h_t) − [t = m] ln s_t − [t < m] ln(1 − s_t)`` (the
  token cross-entropy plus the binary cross-entropy of "this is the last token").
* ``"predict"``: first an output over the length, ``P(T = k | c) = softmax(W_T c + b_T)_k``
  for ``k = 1..max_length``, read from a context vector ``c`` (an LM's initial state, an
  encoder's final state); then the steps remaining after each token, ``r_t = T − t``,
  enter the recurrence at every step as an embedding ``E_r[min(r_t, max_length − 1)]``
  appended to the step's input. Loss: ``−Σ_t ln p(y_t | h_t) − ln P(T = m | c)``.

Either way the training loss is the model's exact sequence negative log-likelihood, summed
over the batch and divided by the number of token steps (the models' ``LossOutput.loss``,
nats per token; ``LossOutput.nats`` is the sum, length terms included).

Generation keeps :func:`rnnkit.generation.search.generate_batch` unchanged: the model's ``step``
returns log-probabilities over the vocabulary in which ``</s>`` means "stop here".

* ``"stop"``: at step ``t`` (fed ``y_{t−1}``), ``ln P(</s>) = ln s_{t−1}`` and
  ``ln P(y) = ln(1 − s_{t−1}) + ln p(y | h_t)``, with ``s_0 = 0``. Sampling draws the stop
  bit exactly; greedy search stops when ``s_{t−1} > (1 − s_{t−1}) max_y p(y | h_t)`` (the
  more probable continuation of the joint, ≈ ``s > 0.5`` for a confident model); the
  returned ``logprob`` is the exact sequence log-probability.
* ``"predict"``: ``T`` is chosen once (greedy: the most probable; or sampled; or given),
  then ``</s>`` has probability 0 for ``T`` steps and 1 at step ``T + 1``: exactly ``T``
  tokens (``max_length`` counts the ``</s>``, so give at least ``T + 1``). ``logprob`` is
  conditional on ``T`` (add ``length_log_probs(c)[T − 1]`` for the joint).

The extra per-row value carried between steps (the previous stop logit, or the tokens
left) lives in the model's generation state, batch dimension 0.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rnnkit.data.vocab import EOS_ID
from rnnkit.deferred import active_for, count_of
from rnnkit.errors import ConfigError

__all__ = [
    "LENGTH_MODES",
    "LengthState",
    "LengthTargets",
    "SequenceLength",
    "length_targets",
]

LENGTH_MODES = ("eos", "stop", "predict")


class LengthTargets(NamedTuple):
    """What the length losses need of a batch.

    Attributes:
        token_mask: ``(B, T)`` the steps with a token target (the ``</s>`` step excluded).
        lengths: ``(B,)`` ``m``, tokens before ``</s>``.
        last: ``(B, T)`` True at each row's last token step.
    """

    token_mask: Tensor
    lengths: Tensor
    last: Tensor


class LengthState(NamedTuple):
    """An LM's generation state with a mechanism: the recurrent state and the extra value
    (``(B,)``: previous stop logit, or tokens left). Batch dims: ``LengthState(2, 0)``."""

    hidden: Any
    extra: Tensor


def length_targets(targets: Tensor, mask: Tensor | None, eos_id: int = EOS_ID) -> LengthTargets:
    """Token mask, lengths and last steps of ``y_1 … y_m </s>`` rows.

    Every row must end with ``</s>`` after at least one token (a mechanism models whole
    sequences, not stream segments).

    >>> t = torch.tensor([[5, 6, 3], [7, 3, 0]])
    >>> lt = length_targets(t, t != 0)
    >>> lt.lengths.tolist(), lt.last.nonzero().tolist()
    ([2, 1], [[0, 1], [1, 0]])
    """
    if mask is None:
        mask = torch.ones_like(targets, dtype=torch.bool)
    is_eos = (targets == eos_id) & mask
    token_mask = mask & ~is_eos
    lengths = token_mask.sum(1)  # (B,)
    first_eos = torch.where(is_eos.any(1), is_eos.int().argmax(1), -1)
    misplaced = first_eos != lengths

    def misplaced_error() -> ValueError:
        bad = int(torch.nonzero(misplaced)[0])
        return ValueError(
            f"row {bad}: a length mechanism needs every row to be y_1 … y_m </s> with m ≥ 1 "
            "real tokens (one </s>, right after them)"
        )

    def empty_error() -> ValueError:
        return ValueError("a length mechanism cannot model an empty sequence (m = 0)")

    deferred = active_for(targets)  # on a GPU inside deferring(): read with the step's figures
    if deferred is not None:
        deferred.check(misplaced.any(), misplaced_error)
        deferred.check((lengths == 0).any(), empty_error)
    else:
        if bool(misplaced.any()):
            raise misplaced_error()
        if bool((lengths == 0).any()):
            raise empty_error()
    steps = torch.arange(targets.shape[1], device=targets.device)
    last = steps.view(1, -1) == (lengths - 1).view(-1, 1)  # (B, T)
    return LengthTargets(token_mask, lengths, last)


def _mask_eos(logits: Tensor, eos_id: int) -> Tensor:
    """Logits with ``</s>`` removed from the softmax (it is not a token under a mechanism)."""
    # the index made on the device (torch.tensor(..., device=cuda) is a copy that waits)
    index = torch.full((1,), eos_id, dtype=torch.long, device=logits.device)
    return logits.index_fill(-1, index, float("-inf"))


class SequenceLength(nn.Module):
    """The ``"stop"`` or ``"predict"`` mechanism, shared by the LM and the seq2seq decoder.

    Args:
        mode: ``"stop"`` or ``"predict"``.
        features_size: ``F``, the width of what the token head reads (stop output).
        context_size: ``C``, the width of the context the length output reads (predict).
        max_length: the longest ``T`` (predict): classes ``1..max_length``.
        remaining_size: ``R``, the width of the steps-remaining embedding (predict).
        eos_id: the ``</s>`` id of the vocabulary.

    >>> m = SequenceLength("predict", features_size=6, context_size=4, max_length=5)
    >>> m.input_size, m.remaining_steps(torch.tensor([3]), 4).tolist()
    (8, [[2, 1, 0, 0]])
    """

    def __init__(
        self,
        mode: str,
        features_size: int,
        context_size: int | None = None,
        max_length: int | None = None,
        remaining_size: int = 8,
        eos_id: int = EOS_ID,
    ) -> None:
        super().__init__()
        if mode not in LENGTH_MODES[1:]:
            raise ConfigError(f"length must be one of stop, predict (eos: no module), got {mode!r}")
        self.mode = mode
        self.features_size = features_size
        self.eos_id = eos_id
        self.stop: nn.Linear | None = None
        self.length: nn.Linear | None = None
        self.remaining: nn.Embedding | None = None
        self.context_size = context_size
        self.max_length = max_length
        if mode == "stop":
            self.stop = nn.Linear(features_size, 1)
            return
        if context_size is None or context_size < 1:
            raise ValueError(f"length='predict' needs context_size >= 1, got {context_size!r}")
        if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
            raise ValueError(f"length='predict' needs max_length >= 1, got {max_length!r}")
        if remaining_size < 1:
            raise ValueError(f"remaining_size must be >= 1, got {remaining_size!r}")
        self.length = nn.Linear(context_size, max_length)
        self.remaining = nn.Embedding(max_length, remaining_size)

    @property
    def input_size(self) -> int:
        """Extra width of each step's input: ``R`` (predict) or 0 (stop)."""
        return 0 if self.remaining is None else self.remaining.embedding_dim

    # ----------------------------------------------------------------- training
    def token_logits(self, logits: Tensor) -> Tensor:
        """``logits (…, V)`` with ``</s>`` out of the softmax: it is never a token here."""
        return _mask_eos(logits, self.eos_id)

    def remaining_steps(self, lengths: Tensor, T: int) -> Tensor:
        """``r_t = T_i − t`` for ``t = 1..T`` (0 past the end): ``(B, T)`` long."""
        steps = torch.arange(1, T + 1, device=lengths.device)
        return (lengths.view(-1, 1) - steps.view(1, -1)).clamp(min=0)

    def remaining_inputs(self, remaining: Tensor) -> Tensor:
        """``E_r[min(r, max_length − 1)]``: ``(…)`` → ``(…, R)``."""
        assert self.remaining is not None and self.max_length is not None
        return self.remaining(remaining.clamp(0, self.max_length - 1))

    def check_lengths(self, lengths: Tensor) -> None:
        if self.max_length is None:
            return
        too_long = (lengths > self.max_length).any()
        max_length = self.max_length

        def error() -> ValueError:
            return ValueError(
                f"a sequence of {int(lengths.max())} tokens exceeds max_length = "
                f"{max_length} of length='predict'"
            )

        deferred = active_for(lengths)
        if deferred is not None:
            deferred.check(too_long, error)
        elif bool(too_long):
            raise error()

    def loss(
        self,
        logits: Tensor,
        targets: Tensor,
        features: Tensor,
        context: Tensor | None,
        lt: LengthTargets,
    ) -> tuple[Tensor, int | Tensor]:
        """Token cross-entropy without ``</s>`` plus the mechanism's term.

        Returns ``(nats, tokens)``: the summed negative log-likelihood of the batch and the
        number of token steps (the training loss is ``nats / tokens``); ``tokens`` a
        0-dim tensor inside :func:`rnnkit.deferred.deferring` (read with the step's
        figures), else an int.

        Args:
            logits: ``(B, T, V)``.  targets: ``(B, T)``.  features: ``(B, T, F)`` what the
            head read.  context: ``(B, C)`` (predict) or None.  lt: :func:`length_targets`.
        """
        m = lt.token_mask
        if active_for(logits) is not None:
            return self._deferred_loss(logits, targets, features, context, lt)
        log_probs = torch.log_softmax(_mask_eos(logits[m], self.eos_id), dim=-1)  # (N, V)
        nats = -log_probs.gather(1, targets[m].view(-1, 1)).sum()
        if self.stop is not None:
            stop_logits = self.stop(features[m]).view(-1)  # (N,)
            bce = F.binary_cross_entropy_with_logits(
                stop_logits, lt.last[m].to(stop_logits.dtype), reduction="sum"
            )
            nats = nats + bce
        else:
            assert self.length is not None and context is not None
            self.check_lengths(lt.lengths)
            nats = nats + F.cross_entropy(self.length(context), lt.lengths - 1, reduction="sum")
        return nats, int(m.sum())

    def _deferred_loss(
        self,
        logits: Tensor,
        targets: Tensor,
        features: Tensor,
        context: Tensor | None,
        lt: LengthTargets,
    ) -> tuple[Tensor, int | Tensor]:
        """:meth:`loss` without a host read (:mod:`rnnkit.deferred`): every step computed,
        those that are no token step replaced by zeros before and after (no boolean-mask
        selection, whose size is a read); the checks are flags, the indices clamped (a GPU
        kernel would stop the process on one out of range), refused when they are read."""
        m = lt.token_mask  # (B, T)
        V = logits.shape[-1]
        deferred = active_for(logits)
        assert deferred is not None
        bad = m & ((targets < 0) | (targets >= V))
        deferred.check(
            bad.any(), lambda: ValueError(f"token targets must lie in [0, {V}), the vocabulary")
        )
        safe = torch.where(m.unsqueeze(-1), logits, logits.new_zeros(()))
        log_probs = torch.log_softmax(_mask_eos(safe, self.eos_id), dim=-1)  # (B, T, V)
        picked = log_probs.gather(-1, targets.clamp(0, V - 1).unsqueeze(-1)).squeeze(-1)
        nats = -torch.where(m, picked, picked.new_zeros(())).sum()
        if self.stop is not None:
            stop_logits = self.stop(features).squeeze(-1)  # (B, T)
            stop_logits = torch.where(m, stop_logits, stop_logits.new_zeros(()))
            bce = F.binary_cross_entropy_with_logits(
                stop_logits, lt.last.to(stop_logits.dtype), reduction="none"
            )
            nats = nats + torch.where(m, bce, bce.new_zeros(())).sum()
        else:
            assert self.length is not None and context is not None
            assert self.max_length is not None
            self.check_lengths(lt.lengths)
            classes = (lt.lengths - 1).clamp(0, self.max_length - 1)
            nats = nats + F.cross_entropy(self.length(context), classes, reduction="sum")
        return nats, count_of(m.sum())

    # --------------------------------------------------------------- generation
    def start(
        self,
        batch_size: int,
        context: Tensor | None = None,
        lengths: Tensor | None = None,
        sample: bool = False,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """The extra value of every row before its first step, ``(B,)``.

        Stop: ``s_0 = 0`` (stop logit ``−inf``). Predict: ``T`` from ``lengths`` if given,
        else the most probable (or, ``sample=True``, a draw) under ``P(T | context)``.
        """
        if self.stop is not None:
            return torch.full((batch_size,), float("-inf"), device=self.stop.weight.device)
        if context is None:
            raise ValueError("length='predict' needs the context to choose T")
        log_p = self.length_log_probs(context)  # (B, max_length)
        if lengths is not None:
            lengths = torch.as_tensor(lengths, device=log_p.device).view(-1)
            self.check_lengths(lengths)
            if bool((lengths < 1).any()):
                raise ValueError("lengths must be >= 1")
        elif sample:
            where = generator.device if generator is not None else log_p.device
            draw = torch.multinomial(log_p.exp().to(where), 1, generator=generator)
            lengths = draw.view(-1).to(log_p.device) + 1
        else:
            lengths = log_p.argmax(-1) + 1
        return lengths.long()

    def length_log_probs(self, context: Tensor) -> Tensor:
        """``ln P(T = k | c)`` for ``k = 1..max_length``: ``(B, C)`` → ``(B, max_length)``."""
        if self.length is None:
            raise ValueError("length_log_probs needs length='predict'")
        return torch.log_softmax(self.length(context), dim=-1)

    def step_input(self, extra: Tensor) -> Tensor | None:
        """Predict: ``(B, R)`` embedding of the steps remaining after this step's token."""
        if self.remaining is None:
            return None
        return self.remaining_inputs(extra - 1)

    def step_output(self, logits: Tensor, features: Tensor, extra: Tensor) -> tuple[Tensor, Tensor]:
        """Log-probabilities ``(B, V)`` in which ``</s>`` means stop, and the next extra.

        Args:
            logits: ``(B, V)`` the token head's output.  features: ``(B, F)``.
            extra: ``(B,)`` the previous stop logit (stop) or the tokens left (predict).
        """
        log_probs = torch.log_softmax(_mask_eos(logits, self.eos_id), dim=-1)  # (B, V)
        eos = self.eos_id
        if self.stop is not None:
            z_prev = extra.to(log_probs.dtype).view(-1, 1)
            out = log_probs + F.logsigmoid(-z_prev)  # ln(1 − s_{t−1}) + ln p(y | h_t)
            out[:, eos] = F.logsigmoid(z_prev).view(-1)  # ln s_{t−1}
            return out, self.stop(features).view(-1)
        done = (extra <= 0).view(-1, 1)  # T tokens drawn: only </s> is left
        forced = torch.full_like(log_probs, float("-inf"))
        forced[:, eos] = 0.0
        return torch.where(done, forced, log_probs), (extra - 1).clamp(min=0)
