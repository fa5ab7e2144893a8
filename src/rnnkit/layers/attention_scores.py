"""Additive attention's scores as one autograd node on the compiled library.

With ``q2 = 2 (W_q q + b)`` (one product, in autograd) the scores of every query ``t`` and
source position ``j`` are

    s_tj = vᵀ tanh(W_q q_t + b + k_j) = 2 vᵀ σ_tj − Σ v,   σ_tj = σ(q2_t + 2 k_j)

(``tanh a = 2σ(2a) − 1``). Eager torch computes them in three passes over the
``(B, [T,] S, A)`` block — an add, a sigmoid, a product with ``v`` — and autograd goes back
over it several more times; the compiled library's ``sigmoid_scores`` does the forward in
one pass and ``sigmoid_scores_backward`` the backward in one more, from the kept ``σ``:

    ∂L/∂q2_t = 2 v ⊙ Σ_j d_s_tj σ_tj (1 − σ_tj)
    ∂L/∂k_j  = 4 v ⊙ Σ_t d_s_tj σ_tj (1 − σ_tj)
    ∂L/∂v    = 2 Σ d_s σ − Σ d_s

Used by :class:`~rnnkit.layers.attention.Attention` where the compiled library runs
(CPU float32/float64, not while tracing); elsewhere its torch expression is the same
function. float32 differs from torch's sigmoid by a few units in the last place.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from rnnkit.bptt import native
from rnnkit.bptt.tracing import tracing
from rnnkit.cells.kernel import batched_gradients

__all__ = ["compiled_scores_library", "sigmoid_scores", "torch_scores"]


def compiled_scores_library(*tensors: Tensor) -> Any:
    """The compiled library's operators where they apply to ``tensors``, else None."""
    if tracing() or torch.jit.is_tracing() or not native.supports(*tensors):
        return None
    if len({t.dtype for t in tensors}) != 1:  # e.g. a query in bf16 under autocast
        return None
    return native.library()


class _SigmoidScores(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, lib: Any, q2: Tensor, keys: Tensor, v: Tensor) -> Tensor:
        S, A = keys.shape[1], keys.shape[2]
        lead = q2.shape[:-1]  # (B,) or (B, T)
        scores = q2.new_empty(*lead, S)
        sig = q2.new_empty(*lead, S, A)
        # the keys' factor 2 inside the pass: no doubled copy of them per call
        lib.sigmoid_scores(keys.contiguous(), q2.contiguous(), 2 * v, scores, sig, key_scale=2.0)
        scores.sub_(v.sum())
        ctx.lib = lib
        ctx.save_for_backward(sig, v, q2, keys)
        return scores

    @staticmethod
    def backward(ctx: Any, d_scores: Tensor) -> tuple[Tensor | None, ...]:
        if torch.is_grad_enabled() or batched_gradients(d_scores):
            # create_graph=True or a batch of gradients under vmap: torch's expression of
            # the same function, differentiated by autograd (the library's has no graph)
            _, v, q2, keys = ctx.saved_tensors
            inputs = (q2, keys, v)
            wanted = [
                i for i, t in enumerate(inputs) if ctx.needs_input_grad[1 + i] and t.requires_grad
            ]
            with torch.enable_grad():
                views = [t.view_as(t) for t in inputs]
                got = torch.autograd.grad(
                    torch_scores(*views),
                    [views[i] for i in wanted],
                    d_scores,
                    create_graph=True,
                )
            grads: list[Tensor | None] = [None, None, None]
            for i, g in zip(wanted, got, strict=True):
                grads[i] = g
            return (None, *grads)
        return _SigmoidScores.explicit_backward(ctx, d_scores)

    @staticmethod
    @once_differentiable
    def explicit_backward(ctx: Any, d_scores: Tensor) -> tuple[Tensor | None, ...]:
        """The one pass of the compiled library (module docstring)."""
        sig, v = ctx.saved_tensors[:2]
        B, S, A = sig.shape[0], sig.shape[-2], sig.shape[-1]
        d_s = d_scores.contiguous()
        s_sig = sig.new_empty(*sig.shape[:-2], A)  # Σ_j d_s σ
        d_q2 = sig.new_empty(*sig.shape[:-2], A)
        need_keys = ctx.needs_input_grad[2]
        acc = sig.new_zeros(B, S, A) if need_keys else None  # Σ_t d_s σ(1 − σ)
        ctx.lib.sigmoid_scores_backward(d_s, sig, 2 * v, s_sig, d_q2, acc)
        d_keys = acc.mul_(4 * v) if acc is not None else None
        d_v = None
        if ctx.needs_input_grad[3]:
            d_v = s_sig.reshape(-1, A).sum(0).mul_(2).sub_(d_s.sum())
        return None, d_q2 if ctx.needs_input_grad[1] else None, d_keys, d_v


def torch_scores(q2: Tensor, keys: Tensor, v: Tensor) -> Tensor:
    """:func:`sigmoid_scores` in torch's operators (where the library does not run, and
    for a gradient with a graph): ``q2 (B, A)`` or ``(B, T, A)`` → ``(B, S)`` or
    ``(B, T, S)``."""
    if q2.dim() == 2:
        q2, k = q2.unsqueeze(1), keys  # (B, 1, A), (B, S, A)
    else:
        q2, k = q2.unsqueeze(2), keys.unsqueeze(1)  # (B, T, 1, A), (B, 1, S, A)
    sig = torch.sigmoid(torch.add(q2, k, alpha=2))  # σ(2a): (B, [T,] S, A)
    return (sig @ v).mul(2).sub(v.sum())


def sigmoid_scores(lib: Any, q2: Tensor, keys: Tensor, v: Tensor) -> Tensor:
    """``2 vᵀ σ(q2_t + 2 k_j) − Σ v`` (module docstring), differentiable.

    Args:
        lib: the compiled library (:func:`compiled_scores_library`).
        q2: ``(B, A)`` or ``(B, T, A)``, ``2 (W_q q + b)`` of one or ``T`` queries per row.
        keys: ``(B, S, A)``, ``W_e h^e`` from ``Attention.prepare``.
        v: ``(A,)``.

    Returns:
        ``(B, S)`` or ``(B, T, S)``.
    """
    return _SigmoidScores.apply(lib, q2, keys, v)
