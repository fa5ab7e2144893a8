"""rnnkit.layers.linear: torch.nn.Linear's function on the compiled library's products."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from rnnkit.bptt import native
from rnnkit.layers.linear import Linear, linear


def _grads(fn, x, weight, bias, g):
    y = fn(x, weight, bias)
    return (y.detach(), *torch.autograd.grad(y, [x, weight, bias], g))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    "shape", [(2048, 256), (32, 64, 256), (3, 5, 256), (70, 33)], ids=["head", "3d", "few", "odd"]
)
def test_linear_equals_torch_linear(shape, threads) -> None:
    """Outputs and the three gradients agree with ``F.linear`` to 1e-6 of the largest value
    in float32 (where the library's own product runs: 64 rows or more on an AVX-512 build;
    ``F.linear`` itself otherwise), and exactly in float64."""
    torch.manual_seed(0)
    out_features = 100 if shape[-1] == 256 else 45
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for dtype in (torch.float32, torch.float64):
            x = torch.randn(*shape, dtype=dtype, requires_grad=True)
            w = torch.randn(out_features, shape[-1], dtype=dtype, requires_grad=True)
            b = torch.randn(out_features, dtype=dtype, requires_grad=True)
            g = torch.randn(*shape[:-1], out_features, dtype=dtype)
            got = _grads(linear, x, w, b, g)
            want = _grads(F.linear, x, w, b, g)
            for a, e in zip(got, want, strict=True):
                assert a.shape == e.shape and a.dtype == e.dtype
                if dtype == torch.float64:
                    assert torch.equal(a, e)
                else:
                    scale = max(float(e.abs().max()), 1.0)
                    assert float((a - e).abs().max()) <= 1e-6 * scale
    finally:
        torch.set_num_threads(before)


def test_linear_without_bias_and_without_the_library() -> None:
    torch.manual_seed(1)
    x, w = torch.randn(128, 40), torch.randn(24, 40)
    want = F.linear(x, w)
    assert float((linear(x, w) - want).abs().max()) <= 1e-6 * float(want.abs().max())
    with native.use_native(False):  # no compiled library: F.linear itself, to the bit
        assert torch.equal(linear(x, w), want)


def test_under_autocast_it_is_torchs_linear() -> None:
    """Autocast decides the dtype of a product: there ``linear`` is ``F.linear``."""
    x, w, b = torch.randn(128, 32), torch.randn(16, 32), torch.randn(16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, want = linear(x, w, b), F.linear(x, w, b)
    assert got.dtype == want.dtype == torch.bfloat16
    assert torch.equal(got, want)


def test_module_is_an_nn_linear_with_its_state_dict() -> None:
    ref = nn.Linear(32, 10)
    layer = Linear(32, 10)
    layer.load_state_dict(ref.state_dict())
    assert isinstance(layer, nn.Linear) and sorted(layer.state_dict()) == ["bias", "weight"]
    x = torch.randn(4, 100, 32)
    with torch.no_grad():
        want, got = ref(x), layer(x)
    assert got.shape == (4, 100, 10)
    assert float((got - want).abs().max()) <= 1e-6 * float(want.abs().max())


def test_second_derivatives_equal_torch_linears() -> None:
    """Under ``create_graph=True`` the backward's products are torch's (differentiable), so
    second derivatives — through the input and through the weight — equal F.linear's."""
    torch.manual_seed(2)
    x0, w0, b0 = torch.randn(128, 32), torch.randn(8, 32), torch.randn(8)
    results = []
    for fn in (linear, F.linear):
        x, w, b = (t.clone().requires_grad_() for t in (x0, w0, b0))
        (g_x,) = torch.autograd.grad(fn(x, w, b).pow(2).sum(), x, create_graph=True)
        results.append(torch.autograd.grad(g_x.pow(2).sum(), [x, w, b]))
    for a, e in zip(*results, strict=True):
        assert float((a - e).abs().max()) <= 1e-5 * max(float(e.abs().max()), 1.0)
