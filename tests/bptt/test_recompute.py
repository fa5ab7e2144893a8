"""Recompute instead of store (``rnnkit.bptt.recompute``, the layers' ``recompute=k``).

The same function and the same gradients as the default path for every cell, on both
time loops, with holes, empty rows and NaN in the padding; what is stored for the
backward is exactly the input and one state per segment.
"""

from __future__ import annotations

import math

import pytest
import torch

from rnnkit.bptt.recompute import run_recomputed
from rnnkit.types import LSTMState

pytestmark = pytest.mark.usefixtures("single_thread", "time_loop")

DT = torch.float64


def _grads(layer, x, mask, state, recompute):
    layer.recompute = recompute
    out = layer(x, mask=mask, state=state)
    final = out.state
    finals = tuple(final) if isinstance(final, LSTMState) else (final,)
    w = torch.linspace(-1, 1, out.outputs.shape[-1], dtype=DT)
    loss = (out.outputs * w).sum() + sum((f * f).sum() for f in finals)
    inputs = [x, *layer.parameters(), *(state if isinstance(state, tuple) else (state,))]
    return out, torch.autograd.grad(loss, inputs)


@pytest.mark.parametrize("k", [1, 3, 7, 50])
def test_recompute_equals_the_default_path(cell_spec, holey_mask, k) -> None:
    """Outputs, final states and every gradient (input, parameters, initial state) of a
    2-layer bidirectional stack equal the stored path to 1e-12, for segments shorter
    than, dividing, and longer than T."""
    B, T, I, H = holey_mask.shape[0], holey_mask.shape[1], 3, 4
    layer = cell_spec.layer(I, H, num_layers=2, bidirectional=True)
    torch.manual_seed(1)
    x = torch.randn(B, T, I, dtype=DT)
    x[~holey_mask] = float("nan")  # padding never leaks, here too
    x.requires_grad_(True)
    states = tuple(
        torch.randn(2, 2, B, H, dtype=DT, requires_grad=True) for _ in range(cell_spec.num_states)
    )
    state = cell_spec.pack(states)
    ref, ref_g = _grads(layer, x, holey_mask, state, None)
    got, got_g = _grads(layer, x, holey_mask, state, k)
    torch.testing.assert_close(got.outputs, ref.outputs, atol=1e-12, rtol=0, equal_nan=True)
    for a, b in zip(cell_spec.unpack(got.state), cell_spec.unpack(ref.state), strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)
    for a, b in zip(got_g, ref_g, strict=True):
        assert not a.isnan().any()
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)


def test_gradcheck_through_segments(cell_spec, holey_mask) -> None:
    T, B, I, H = holey_mask.shape[1], holey_mask.shape[0], 2, 3
    cell = cell_spec.cell(I, H)
    x = torch.randn(T, B, I, dtype=DT, requires_grad=True)
    s0 = tuple(torch.randn(B, H, dtype=DT, requires_grad=True) for _ in range(cell_spec.num_states))
    params = [p for p in cell.weights() if p is not None]

    def f(x, *rest):
        out, finals = run_recomputed(
            cell.kernel, x, cell.weights(), rest[len(params) :], holey_mask.T, 4
        )
        return (out, *finals)

    assert torch.autograd.gradcheck(f, (x, *params, *s0))


@pytest.mark.parametrize("layer_norm", [False, True])
def test_second_derivatives_and_batched_gradients_equal_the_default_path(
    cell_spec, holey_mask, layer_norm
) -> None:
    """``create_graph=True`` and ``is_grads_batched=True`` (they were a RuntimeError): the
    node's inputs run again in differentiable steps, as on the default path; a gradient
    penalty's gradient and a batch of vector–Jacobian products equal the default path's."""
    if layer_norm and (cell_spec.kind == "rnn" or cell_spec.options.get("reset") == "before"):
        pytest.skip("no layer-normalised form")
    B, T, I, H = holey_mask.shape[0], holey_mask.shape[1], 3, 4
    extra = {"layer_norm": True} if layer_norm else {}
    layer = cell_spec.layer(I, H, num_layers=2, **extra)
    x = torch.randn(B, T, I, dtype=DT, generator=torch.Generator().manual_seed(2))
    x.requires_grad_(True)
    vectors = torch.randn(3, B, T, H, dtype=DT, generator=torch.Generator().manual_seed(3))
    results = []
    for recompute in (None, 3):
        layer.recompute = recompute
        out = layer(x, mask=holey_mask).outputs
        (d_x,) = torch.autograd.grad(out.pow(2).sum(), x, create_graph=True)
        penalty = torch.autograd.grad(d_x.pow(2).sum(), [x, *layer.parameters()])
        out = layer(x, mask=holey_mask).outputs
        (batched,) = torch.autograd.grad(out, x, vectors, is_grads_batched=True)
        results.append([d_x, *penalty, batched])
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0)


def _saved_bytes(layer, x, params) -> int:
    """Bytes the autograd graph stores for the backward, parameters not counted."""
    own = {p.data_ptr() for p in params}
    seen: dict[int, int] = {}

    def pack(t):
        if t.data_ptr() not in own:
            seen[t.data_ptr()] = max(seen.get(t.data_ptr(), 0), t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = layer(x)
    del out
    return sum(seen.values())


def test_what_is_stored(cell_spec) -> None:
    """Default: the input, every state and the gate cache. With recompute=k: the input
    and the states entering each of the ⌈T/k⌉ segments — nothing else."""
    T, B, I, H, k = 120, 4, 5, 8, 11
    layer = cell_spec.layer(I, H)
    x = torch.randn(B, T, I, dtype=DT, requires_grad=True)
    params = list(layer.parameters())
    layer.recompute = k
    stored = _saved_bytes(layer, x, params)
    layer.recompute = None
    default = _saved_bytes(layer, x, params)
    n = cell_spec.num_states
    assert stored == 8 * (T * B * I + math.ceil(T / k) * n * B * H)
    assert default >= 8 * (T * B * I + n * T * B * H)  # states alone, before any cache
    assert default > 2 * stored


def test_no_grad_stores_nothing_and_matches(cell_spec) -> None:
    layer = cell_spec.layer(3, 4)
    x = torch.randn(2, 9, 3, dtype=DT)
    with torch.no_grad():
        layer.recompute = 2
        a = layer(x).outputs
        layer.recompute = None
        b = layer(x).outputs
    torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_zero_length_time_axis(cell_spec) -> None:
    layer = cell_spec.layer(3, 4, recompute=5)
    x = torch.randn(2, 0, 3, dtype=DT, requires_grad=True)
    out = layer(x)
    assert out.outputs.shape == (2, 0, 4)


@pytest.mark.parametrize("bad", [0, -2, 2.5, "8", True])
def test_bad_recompute_is_a_clear_error(cell_spec, bad) -> None:
    with pytest.raises(ValueError, match="recompute must be a positive integer"):
        cell_spec.layer(3, 4, recompute=bad)


def test_recompute_with_window_is_a_clear_error(cell_spec) -> None:
    layer = cell_spec.layer(3, 4, recompute=4)
    with pytest.raises(ValueError, match="window=2 cannot be combined with recompute=4"):
        layer(torch.randn(2, 6, 3, dtype=DT), window=2)
