"""Attention over encoder states with source masks (docs/math.md, "Attention").

At decoder step ``i`` the query is the previous decoder state ``q = h^d_{i−1}`` (attention
before the step; after it, the new state ``h^d_i``) and the memory the encoder states
``h^e_1..h^e_S``. Scores:

* ``dot``:      ``s_j = qᵀ h^e_j``                   (needs equal widths)
* ``bilinear``: ``s_j = qᵀ W_s h^e_j``               (``W_s: d_q × d_e``, widths may differ)
* ``additive``: ``s_j = vᵀ tanh(W_q q + W_e h^e_j)``  (Bahdanau et al. 2015)

``α = softmax_j(s_j)`` over the REAL source positions only: padded positions get the score
``-inf`` (through ``torch.where``, never ``score × 0``), so their weight is exactly 0; a
row with no real position at all gets all-zero weights and a zero context instead of NaN.
The context is ``c = Σ_j α_j h^e_j``. The part of the score that depends only on the
memory (``W_s h^e_j``, ``W_e h^e_j``) is computed once per source by :meth:`Attention.
prepare`, not at every decoder step. :meth:`Attention.attend_all` scores the queries of
all steps at once, when they are known in advance (attention after a decoder that ran
over the whole target).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

from rnnkit.errors import ConfigError
from rnnkit.layers.attention_scores import (
    compiled_scores_library,
    sigmoid_scores,
    torch_scores,
)

__all__ = ["ATTENTION_KINDS", "Attention", "AttentionOutput", "masked_softmax"]

ATTENTION_KINDS = ("dot", "bilinear", "additive")


class AttentionOutput(NamedTuple):
    """What one attention step returns.

    Attributes:
        context: ``(B, d_e)`` the weighted sum of the memory.
        weights: ``(B, S)`` the attention distribution ``α`` (rows sum to 1, or are all
            zero when a row has no real source position); exactly 0 at padding.
    """

    context: Tensor
    weights: Tensor


def masked_softmax(scores: Tensor, mask: Tensor | None) -> Tensor:
    """Softmax over the last dimension restricted to ``mask``; exactly 0 elsewhere.

    Args:
        scores: ``(B, S)`` (or any ``(..., S)``).
        mask: bool of the same shape, True at real positions; None = all real.

    Returns:
        The weights, same shape; a row without any real position is all zeros (no NaN,
        and no NaN gradient either).

    >>> s = torch.tensor([[1.0, 2.0, 50.0], [0.0, 0.0, 0.0]])
    >>> m = torch.tensor([[True, True, False], [False, False, False]])
    >>> masked_softmax(s, m)
    tensor([[0.2689, 0.7311, 0.0000],
            [0.0000, 0.0000, 0.0000]])
    """
    if mask is None:
        return torch.softmax(scores, dim=-1)
    mask = mask.to(device=scores.device, dtype=torch.bool)
    if mask.shape != scores.shape:
        raise ValueError(
            f"mask must have the shape of the scores {tuple(scores.shape)}, got {tuple(mask.shape)}"
        )
    any_real = mask.any(dim=-1, keepdim=True)
    # -inf at padding; rows with nothing real get finite zeros so softmax stays defined.
    # (Scalar operands: no filled tensors to allocate, this runs at every decoder step.)
    masked = torch.where(mask, scores, float("-inf"))
    masked = torch.where(any_real, masked, 0.0)
    weights = torch.softmax(masked, dim=-1)
    return torch.where(mask, weights, 0.0)


class Attention(nn.Module):
    """Score a query against a memory of encoder states, softmax over real positions.

    Args:
        kind: ``"dot"``, ``"bilinear"`` or ``"additive"``.
        query_size: ``d_q``, the decoder state width.
        memory_size: ``d_e``, the encoder state width (``D·H`` for a bidirectional
            encoder).
        attention_size: ``additive`` only: the width of ``tanh(W_q q + W_e h_e)``
            (default ``query_size``).

    Raises:
        ConfigError: unknown kind, or ``dot`` with ``query_size != memory_size`` (the
            message names both widths).

    Parameters: none for ``dot``; ``W_s (d_q, d_e)`` for ``bilinear``;
    ``W_q (A, d_q)``, ``W_e (A, d_e)``, bias ``(A,)`` and ``v (A,)`` for ``additive``.

    >>> att = Attention("bilinear", query_size=3, memory_size=5)
    >>> memory = torch.randn(2, 4, 5)
    >>> mask = torch.tensor([[True, True, True, False], [True, False, False, False]])
    >>> out = att(torch.randn(2, 3), att.prepare(memory), memory, mask)
    >>> out.context.shape, torch.allclose(out.weights.sum(-1), torch.ones(2))
    (torch.Size([2, 5]), True)
    >>> out.weights[0, 3].item(), out.weights[1, 1:].tolist()
    (0.0, [0.0, 0.0, 0.0])
    """

    def __init__(
        self,
        kind: str,
        query_size: int,
        memory_size: int,
        attention_size: int | None = None,
    ) -> None:
        super().__init__()
        if kind not in ATTENTION_KINDS:
            raise ConfigError(
                f"attention kind must be one of {', '.join(ATTENTION_KINDS)}, got {kind!r}"
            )
        if kind == "dot" and query_size != memory_size:
            # named as in Python (Attention's kind, ModelSpec's attention): `rnnkit train`
            # refuses --attention dot with --bidirectional before a model is built
            raise ConfigError(
                f"attention 'dot' needs equal widths: the decoder state has {query_size} but "
                f"the encoder states have {memory_size} (a bidirectional encoder doubles "
                "it); use 'bilinear' or 'additive'"
            )
        self.kind = kind
        self.query_size = query_size
        self.memory_size = memory_size
        self.weight: nn.Parameter | None = None
        if kind == "bilinear":
            self.weight = nn.Parameter(torch.empty(query_size, memory_size))  # W_s
            bound = 1.0 / (query_size * memory_size) ** 0.25
            nn.init.uniform_(self.weight, -bound, bound)
        elif kind == "additive":
            A = attention_size or query_size
            self.attention_size = A
            self.query_proj = nn.Linear(query_size, A, bias=True)  # W_q, b
            self.memory_proj = nn.Linear(memory_size, A, bias=False)  # W_e
            self.v = nn.Parameter(torch.empty(A))
            nn.init.uniform_(self.v, -(A**-0.5), A**-0.5)

    def extra_repr(self) -> str:
        return f"{self.kind}, query_size={self.query_size}, memory_size={self.memory_size}"

    def prepare(self, memory: Tensor) -> Tensor:
        """The query-independent part of the scores, once per source.

        Args:
            memory: ``(B, S, d_e)`` encoder states.

        Returns:
            ``dot``: the memory itself ``(B, S, d_e)``; ``bilinear``: ``h^e W_sᵀ``
            ``(B, S, d_q)`` so that ``s_j = q · (W_s h^e_j)``; ``additive``: ``W_e h^e``
            ``(B, S, A)``.
        """
        if memory.dim() != 3 or memory.shape[-1] != self.memory_size:
            raise ValueError(
                f"memory must have shape (B, S, {self.memory_size}), got {tuple(memory.shape)}"
            )
        if self.kind == "dot":
            return memory
        if self.kind == "bilinear":
            assert self.weight is not None
            return memory @ self.weight.T  # (B, S, d_q)
        return self.memory_proj(memory)  # (B, S, A)

    def scores(self, query: Tensor, keys: Tensor) -> Tensor:
        """Raw scores ``(B, S)`` of ``query (B, d_q)`` against prepared ``keys``."""
        if query.dim() != 2 or query.shape[-1] != self.query_size:
            raise ValueError(
                f"query must have shape (B, {self.query_size}), got {tuple(query.shape)}"
            )
        if self.kind == "additive":
            return self._additive(query, keys)
        # a row times Kᵀ: torch's batched matrix-times-column product is several times slower
        return torch.bmm(query.unsqueeze(1), keys.transpose(1, 2)).squeeze(1)  # (B, S)

    def _additive(self, query: Tensor, keys: Tensor) -> Tensor:
        """``vᵀ tanh(W_q q + b + k_j)`` for ``query (B, d_q)`` → ``(B, S)``, or ``(B, T,
        d_q)`` → ``(B, T, S)``.

        Computed as ``2 vᵀ σ(2 (W_q q + b) + 2 k_j) − Σ v`` (``tanh a = 2σ(2a) − 1``): one
        sigmoid pass over the ``(·, S, A)`` block, where a tanh costs 3–4 times a
        sigmoid on the CPU (the LSTM kernel's trick); the same function to float rounding.
        """
        proj = self.query_proj
        flat = query.reshape(-1, query.shape[-1])
        q2 = torch.addmm(proj.bias, flat, proj.weight.T, beta=2, alpha=2)  # 2 (W_q q + b)
        A = q2.shape[-1]
        lib = compiled_scores_library(q2, keys, self.v)
        if query.dim() == 3:  # (B·T, A) rows back to (B, T, A); a decoding step's are (B, A)
            q2 = q2.view(*query.shape[:-1], A)
        if lib is not None:  # one pass forward, one backward (attention_scores.py)
            return sigmoid_scores(lib, q2, keys, self.v)
        return torch_scores(q2, keys, self.v)

    def scores_all(self, queries: Tensor, keys: Tensor) -> Tensor:
        """Raw scores ``(B, T, S)`` of ``T`` queries per row, ``queries (B, T, d_q)``:
        :meth:`scores` of every step at once."""
        if queries.dim() != 3 or queries.shape[-1] != self.query_size:
            raise ValueError(
                f"queries must have shape (B, T, {self.query_size}), got {tuple(queries.shape)}"
            )
        if self.kind == "additive":
            return self._additive(queries, keys)
        return torch.bmm(queries, keys.transpose(1, 2))  # (B, T, S)

    def attend_all(
        self, queries: Tensor, keys: Tensor, memory: Tensor, mask: Tensor | None = None
    ) -> AttentionOutput:
        """:meth:`forward` for ``T`` queries per row at once (attention after a decoder
        that ran over all steps): ``queries (B, T, d_q)`` → ``AttentionOutput(context
        (B, T, d_e), weights (B, T, S))``, each step as :meth:`forward` computes it."""
        scores = self.scores_all(queries, keys)  # (B, T, S)
        if mask is not None:
            mask = mask.to(device=scores.device, dtype=torch.bool).unsqueeze(1).expand_as(scores)
        weights = masked_softmax(scores, mask)
        return AttentionOutput(torch.bmm(weights, memory), weights)

    def forward(
        self, query: Tensor, keys: Tensor, memory: Tensor, mask: Tensor | None = None
    ) -> AttentionOutput:
        """One attention step.

        Args:
            query: ``(B, d_q)`` the previous decoder state.
            keys: ``(B, S, ·)`` from :meth:`prepare` (of this ``memory``).
            memory: ``(B, S, d_e)`` the encoder states.
            mask: ``(B, S)`` bool, True at real source positions; None = all real.

        Returns:
            ``AttentionOutput(context (B, d_e), weights (B, S))``.
        """
        weights = masked_softmax(self.scores(query, keys), mask)  # (B, S)
        context = torch.bmm(weights.unsqueeze(1), memory).squeeze(1)  # (B, d_e)
        return AttentionOutput(context, weights)
