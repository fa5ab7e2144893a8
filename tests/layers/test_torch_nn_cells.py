"""``rnnkit.nn.RNNCell/LSTMCell/GRUCell`` against ``torch.nn``'s with the same state dict
(float64): the new state and every gradient; unbatched input, no bias, errors."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from rnnkit import nn as knn
from rnnkit.bptt.fused import use_fused

DTYPE = torch.float64
CELLS = [("RNNCell", {}), ("RNNCell", {"nonlinearity": "relu"}), ("LSTMCell", {}), ("GRUCell", {})]


def _pair(name, seed=0, **kw):
    torch.manual_seed(seed)
    reference = getattr(torch.nn, name)(3, 5, dtype=DTYPE, **kw)
    torch.manual_seed(seed)
    mine = getattr(knn, name)(3, 5, dtype=DTYPE, **kw)
    for (n, a), (_, b) in zip(reference.named_parameters(), mine.named_parameters(), strict=True):
        assert torch.equal(a, b), n  # the same seed gives torch's initial weights
    return reference, mine


def _flat(state):
    return list(state) if isinstance(state, tuple) else [state]


@pytest.mark.parametrize("name,options", CELLS, ids=str)
@pytest.mark.parametrize("bias", [True, False])
def test_same_step_and_gradients(name, options, bias):
    reference, mine = _pair(name, bias=bias, **options)
    assert isinstance(mine, getattr(torch.nn, name))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 3, dtype=DTYPE, generator=g, requires_grad=True)
    h = torch.randn(4, 5, dtype=DTYPE, generator=g, requires_grad=True)
    hx = (h, torch.randn(4, 5, dtype=DTYPE, generator=g)) if name == "LSTMCell" else h
    results = []
    for module in (reference, mine):
        out = _flat(module(x, hx))
        loss = sum((o * (k + 1)).sin().sum() for k, o in enumerate(out))
        grads = torch.autograd.grad(loss, [x, h, *module.parameters()])
        results.append([*out, *grads])
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name,options", CELLS, ids=str)
def test_unbatched_and_without_a_state(name, options):
    reference, mine = _pair(name, **options)
    x = torch.randn(3, dtype=DTYPE)
    for a, b in zip(_flat(reference(x)), _flat(mine(x)), strict=True):
        assert b.shape == a.shape == (5,)
        torch.testing.assert_close(b, a, rtol=0, atol=1e-12)
    empty = torch.zeros(0, 3, dtype=DTYPE)
    assert [t.shape for t in _flat(mine(empty))] == [t.shape for t in _flat(reference(empty))]


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match=r"rnnkit\.nn\.GRUCell: Expected input to be 1D or 2D"):
        knn.GRUCell(3, 4)(torch.zeros(2, 2, 3))
    with pytest.raises(TypeError, match=r"hx must be the pair \(h_0, c_0\)"):
        knn.LSTMCell(3, 4)(torch.zeros(2, 3), torch.zeros(2, 4))
    with pytest.raises(RuntimeError, match="hx should be 2D for 2D input"):
        knn.RNNCell(3, 4)(torch.zeros(2, 3), torch.zeros(4))


def _state(name: str, *shape: int, **kwargs) -> Any:
    h = torch.zeros(*shape, **kwargs)
    return (h, h) if name == "LSTMCell" else h


@pytest.mark.parametrize("name", ["RNNCell", "LSTMCell", "GRUCell"])
def test_a_state_of_three_dimensions_is_torchs_value_error(name):
    """torch's cells raise a ValueError (code that catches it must catch the drop-in's)."""
    x, hx = torch.zeros(2, 3), _state(name, 1, 2, 4)
    with pytest.raises(ValueError) as theirs:
        getattr(torch.nn, name)(3, 4)(x, hx)
    word = "hx\\[0\\]" if name == "LSTMCell" else "hidden"
    with pytest.raises(ValueError, match=rf"rnnkit\.nn\.{name}: Expected {word} to be 1D or 2D"):
        getattr(knn, name)(3, 4)(x, hx)
    assert "got 3D" in str(theirs.value)
    with pytest.raises(ValueError):  # before the input's size is looked at, as torch's
        getattr(knn, name)(3, 4)(torch.zeros(2, 5), hx)


@pytest.mark.parametrize("name", ["RNNCell", "LSTMCell", "GRUCell"])
def test_a_state_or_input_on_another_device_is_said_naming_the_cell(name):
    """(The meta device stands for a GPU here: torch's autocast has no meta device, which
    the dtype check asked about before the device was checked.)"""
    cell = getattr(knn, name)(3, 4)
    with pytest.raises(RuntimeError, match=rf"rnnkit\.nn\.{name}: Input and hidden .* at meta"):
        cell(torch.zeros(2, 3), _state(name, 2, 4, device="meta"))
    with pytest.raises(RuntimeError, match=rf"rnnkit\.nn\.{name}: Input and parameter .* at meta"):
        cell(torch.zeros(2, 3, device="meta"))
    on_meta = getattr(knn, name)(3, 4, device="meta")  # torch's cells run there too
    got = on_meta(torch.zeros(2, 3, device="meta"), _state(name, 2, 4, device="meta"))
    theirs = getattr(torch.nn, name)(3, 4, device="meta")(torch.zeros(2, 3, device="meta"))
    assert [t.shape for t in _flat(got)] == [t.shape for t in _flat(theirs)]


def test_the_namespace_is_torch_nn_with_the_recurrent_classes_replaced():
    assert knn.Module is torch.nn.Module and knn.Linear is torch.nn.Linear
    assert knn.functional is torch.nn.functional and knn.utils.rnn is torch.nn.utils.rnn
    from rnnkit.nn import Embedding, Parameter

    assert Embedding is torch.nn.Embedding and Parameter is torch.nn.Parameter
    for name in ("RNN", "LSTM", "GRU", "RNNCell", "LSTMCell", "GRUCell"):
        ours, theirs = getattr(knn, name), getattr(torch.nn, name)
        assert ours is not theirs and issubclass(ours, theirs)
        assert ours.__module__ == "rnnkit.nn"
    assert {"Module", "LSTM", "quantize_dynamic"} <= set(dir(knn))
    with pytest.raises(AttributeError, match="has no attribute 'Nonsense'"):
        knn.Nonsense  # noqa: B018


class _DropConnect(torch.nn.Module):
    """A weight parametrization drawing a dropout mask at each evaluation, counted."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, weight):
        self.calls += 1
        return torch.nn.functional.dropout(weight, 0.5, self.training)


@pytest.mark.parametrize("name,options", CELLS, ids=str)
@pytest.mark.parametrize("bias", [True, False])
def test_parametrized_weights_are_evaluated_once_per_step_as_torchs(name, options, bias):
    """torch's step reads each weight once; the drop-in read ``weight_ih`` again for
    each dtype check (input, hx), so a weight-dropping parametrization drew other masks
    and left the generator elsewhere."""
    from torch.nn.utils import parametrize

    reference, mine = _pair(name, bias=bias, **options)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 3, dtype=DTYPE, generator=g)
    h = torch.randn(4, 5, dtype=DTYPE, generator=g)
    hx = (h, torch.randn(4, 5, dtype=DTYPE, generator=g)) if name == "LSTMCell" else h
    runs = []
    for module in (reference, mine):
        for weight in ("weight_ih", "weight_hh"):
            parametrize.register_parametrization(module, weight, _DropConnect())
        torch.manual_seed(2)
        out = [*_flat(module(x, hx)), *_flat(module(x))]
        calls = [module.parametrizations[w][0].calls for w in ("weight_ih", "weight_hh")]
        runs.append((out, calls, torch.rand(2)))
    (out, calls, after), (o_mine, c_mine, a_mine) = runs
    assert c_mine == calls
    assert torch.equal(a_mine, after)
    for a, b in zip(o_mine, out, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["RNNCell", "LSTMCell", "GRUCell"])
def test_on_the_cpu_a_cell_is_torchs_step_unless_the_loop_is_forced(name, monkeypatch):
    # rnnkit's step of separate operations took 1.0-2.8x torch's fused step
    # (benchmarks/README.md): torch's forward computes it; use_fused("loop") runs rnnkit's.
    from rnnkit.bptt.fused import use_fused
    from rnnkit.layers import torch_nn_cells

    step = {"RNNCell": "rnn_step", "LSTMCell": "lstm_step", "GRUCell": "gru_step"}[name]
    calls = []
    real = getattr(torch_nn_cells, step)
    monkeypatch.setattr(torch_nn_cells, step, lambda *a, **k: calls.append(1) or real(*a, **k))
    theirs, mine = _pair(name)
    x = torch.randn(2, theirs.input_size, dtype=theirs.weight_ih.dtype)
    torch.testing.assert_close(_flat(mine(x)), _flat(theirs(x)), rtol=0.0, atol=0.0)
    assert calls == []
    with use_fused("loop"):
        torch.testing.assert_close(_flat(mine(x)), _flat(theirs(x)), rtol=1e-9, atol=1e-12)
    assert calls == [1]
    with pytest.raises(RuntimeError, match=f"rnnkit.nn.{name}: "):
        mine(torch.zeros(2, theirs.input_size + 1, dtype=x.dtype))


@pytest.mark.parametrize("name", ["RNNCell", "LSTMCell", "GRUCell"])
def test_a_cell_under_vmap_is_torchs_cell_example_by_example(name):
    # torch's fused steps have no batching rule (gru_cell: a slow fallback and a warning,
    # an error under the suite's filterwarnings; lstm_cell: an error): under vmap the
    # drop-in runs rnnkit's step, not torch's
    theirs, mine = _pair(name)
    x = torch.randn(6, 4, theirs.input_size, dtype=theirs.weight_ih.dtype)

    def first(out):
        return out[0] if isinstance(out, tuple) else out

    got = torch.func.vmap(lambda xi: first(mine(xi)))(x)
    want = torch.stack([first(theirs(xi)) for xi in x])
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name,options", CELLS, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(4, 3), (3,)], ids=["batched", "unbatched"])
def test_the_common_step_is_torchs_step_bit_for_bit(name, options, dtype, bias, shape):
    # the common case (a plain float32/float64 CPU tensor, default path) calls torch's
    # fused operator on the weights in _parameters: the same bits as torch's cell, the
    # new state and every gradient, with and without an initial state
    torch.manual_seed(0)
    reference = getattr(torch.nn, name)(3, 5, bias=bias, dtype=dtype, **options)
    mine = getattr(knn, name)(3, 5, bias=bias, dtype=dtype, **options)
    mine.load_state_dict(reference.state_dict())
    g = torch.Generator().manual_seed(1)
    x0 = torch.randn(*shape, dtype=dtype, generator=g)
    h_shape = (*shape[:-1], 5)
    h0 = [torch.randn(*h_shape, dtype=dtype, generator=g) for _ in range(1 + (name == "LSTMCell"))]
    for given in (True, False):
        results = []
        for module in (reference, mine):
            x = x0.clone().requires_grad_()
            hs = [h.clone().requires_grad_() for h in h0]
            hx = (tuple(hs) if name == "LSTMCell" else hs[0]) if given else None
            out = _flat(module(x, hx))
            loss = sum((o * (k + 1)).sin().sum() for k, o in enumerate(out))
            wrt = [x, *(hs if given else []), *module.parameters()]
            results.append([*(o.detach() for o in out), *torch.autograd.grad(loss, wrt)])
        for a, b in zip(*results, strict=True):
            assert b.dtype == a.dtype and torch.equal(b, a)


@pytest.mark.parametrize("name,options", CELLS, ids=str)
def test_a_weight_kept_outside_parameters_is_read_as_torch_reads_it(name, options):
    # a weight-dropping wrapper (or torch.nn.utils.weight_norm's hook) moves a weight out
    # of _parameters and sets it as a plain attribute: the common step must not read a
    # stale or missing entry, it computes what torch's cell computes from the attribute
    reference, mine = _pair(name, **options)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 3, dtype=DTYPE, generator=g)
    for module in (reference, mine):
        raw = module._parameters.pop("weight_hh")
        module.weight_hh = raw.detach() * 0.5
    for a, b in zip(_flat(reference(x)), _flat(mine(x)), strict=True):
        assert torch.equal(b, a)


@pytest.mark.parametrize("name", ["RNNCell", "LSTMCell", "GRUCell"])
def test_where_torch_refuses_the_common_step_rnnkits_checks_speak_once(name, monkeypatch):
    # torch's operator refuses a state of the wrong size; rnnkit's checks then name the
    # cell, without running torch's forward a second time
    calls = []
    torch_class = getattr(torch.nn, name)
    real = torch_class.forward
    monkeypatch.setattr(torch_class, "forward", lambda *a: calls.append(1) or real(*a))
    _, mine = _pair(name)
    h = torch.zeros(2, 6, dtype=DTYPE)
    with pytest.raises(RuntimeError, match=f"rnnkit.nn.{name}: hx.* inconsistent hidden_size"):
        mine(torch.zeros(2, 3, dtype=DTYPE), (h, h) if name == "LSTMCell" else h)
    assert calls == []  # the batched common step calls torch's operator, not its forward
    with pytest.raises(ValueError, match=f"rnnkit.nn.{name}: Expected input to be 1D or 2D"):
        mine(torch.zeros(1, 2, 3, dtype=DTYPE))
    assert calls == [1]


def _oom(*args, **kwargs):
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


@pytest.mark.parametrize("name", ["LSTMCell", "GRUCell", "RNNCell"])
@pytest.mark.parametrize("path", ["auto", "fused"])
def test_device_failure_in_a_cells_torch_forward_is_not_computed_again(monkeypatch, name, path):
    cls = getattr(torch.nn, name)
    monkeypatch.setattr(cls, "forward", _oom)
    cell = getattr(knn, name)(3, 4)
    # the fast path's fused operators too: unbatched input takes torch's forward there
    with use_fused(path), pytest.raises(torch.OutOfMemoryError):
        cell(torch.randn(3))


@pytest.mark.parametrize("nonlinearity", ["ReLU", "sigmoid", "gelu"])
@pytest.mark.parametrize("grad", [False, True])
def test_an_rnn_cell_with_a_nonlinearity_torch_does_not_know_is_refused_as_torch_does(
    nonlinearity, grad
):
    # (rnnkit's own RNN has a sigmoid cell; torch's RNNCell has none, so neither has this)
    reference, mine = _pair("RNNCell", nonlinearity=nonlinearity)
    x, h = torch.randn(3, 3, dtype=DTYPE), torch.randn(3, 5, dtype=DTYPE)
    with torch.set_grad_enabled(grad), pytest.raises(RuntimeError, match="Unknown nonlinearity"):
        reference(x, h)
    with torch.set_grad_enabled(grad), pytest.raises(RuntimeError) as refused:
        mine(x, h)
    assert str(refused.value).startswith(f"rnnkit.nn.RNNCell: Unknown nonlinearity: {nonlinearity}")
