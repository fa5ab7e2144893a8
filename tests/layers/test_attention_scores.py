"""Additive attention's scores on the compiled library equal their torch expression:
values and every gradient, one query or ``T`` per row, float64 (and float32 to its
precision)."""

from __future__ import annotations

import pytest
import torch

from rnnkit.bptt import native
from rnnkit.layers.attention import Attention
from rnnkit.layers.attention_scores import compiled_scores_library, sigmoid_scores

pytestmark = pytest.mark.skipif(not native.available(), reason="no compiled loop here")


def _reference(q2: torch.Tensor, keys: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``vᵀ tanh(q2 / 2 + k_j)``: the definition, in plain torch."""
    k = keys if q2.dim() == 2 else keys.unsqueeze(1)
    return torch.tanh(q2.unsqueeze(-2) / 2 + k) @ v


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("queries", [None, 4])
def test_scores_and_gradients_equal_the_definition(dtype, queries) -> None:
    B, S, A = 3, 5, 7
    g = torch.Generator().manual_seed(0)
    lead = (B,) if queries is None else (B, queries)
    q2 = torch.randn(*lead, A, generator=g, dtype=dtype, requires_grad=True)
    keys = torch.randn(B, S, A, generator=g, dtype=dtype, requires_grad=True)
    v = torch.randn(A, generator=g, dtype=dtype, requires_grad=True)
    lib = compiled_scores_library(q2, keys, v)
    assert lib is not None
    got = sigmoid_scores(lib, q2, keys, v)
    want = _reference(q2, keys, v)
    tol = {"atol": 1e-12, "rtol": 1e-10} if dtype == torch.float64 else {}
    torch.testing.assert_close(got, want, **tol)
    d = torch.randn(want.shape, generator=g, dtype=dtype)
    for a, b in zip(
        torch.autograd.grad(got, [q2, keys, v], d),
        torch.autograd.grad(want, [q2, keys, v], d),
        strict=True,
    ):
        torch.testing.assert_close(a, b, **tol)


def test_gradcheck_and_gradgradcheck_in_float64() -> None:
    """Differentiated twice too (create_graph=True: a gradient penalty): the torch
    expression of the same function, since the library's backward has no graph."""
    g = torch.Generator().manual_seed(1)
    q2 = torch.randn(2, 3, 4, generator=g, dtype=torch.float64, requires_grad=True)
    keys = torch.randn(2, 5, 4, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(4, generator=g, dtype=torch.float64, requires_grad=True)
    lib = compiled_scores_library(q2, keys, v)
    assert torch.autograd.gradcheck(lambda *t: sigmoid_scores(lib, *t), (q2, keys, v))
    assert torch.autograd.gradgradcheck(lambda *t: sigmoid_scores(lib, *t), (q2, keys, v))


def test_attention_uses_it_only_where_the_library_runs() -> None:
    torch.manual_seed(0)
    att = Attention("additive", query_size=6, memory_size=5).double()
    memory = torch.randn(2, 4, 5, dtype=torch.float64)
    keys = att.prepare(memory)
    query = torch.randn(2, 3, 6, dtype=torch.float64)
    compiled = att.scores_all(query, keys)
    with native.use_native(False):
        assert compiled_scores_library(query, keys) is None
        plain = att.scores_all(query, keys)
    torch.testing.assert_close(compiled, plain, atol=1e-12, rtol=1e-10)
    assert compiled.grad_fn is not None and "SigmoidScores" in type(compiled.grad_fn).__name__
    assert "SigmoidScores" not in type(plain.grad_fn).__name__
    # mixed dtypes (a query in another precision): the torch expression
    assert compiled_scores_library(query.float(), keys) is None
