"""The drop-ins (``rnnkit.nn``) on the paths a GPU runs, forced on the CPU, against
``torch.nn`` holding the same state dict.

``tests/models/test_forced_paths.py`` holds rnnkit's own models on the forced paths; here
the programs written for ``torch.nn`` do the same: the layer options (``batch_first``,
bidirectional, stacked, packed sequences of unsorted lengths, ``h0``/``c0``), training
with a torch optimizer, dropout, a model moved to another dtype, ``torch.autocast``,
second derivatives and a vectorized Jacobian, under ``use_fused("fused")`` (PyTorch's
fused kernels, cuDNN's functions: a drop-in layer's call is then torch's own ``forward``,
the whole stack in one fused call) and ``use_fused("triton")`` (the Triton steps, in
Triton's interpreter). Every layer call is checked to have run on the forced path
(docs/architecture.md, "Which path runs a layer"), so that a case cannot pass by silently
running the CPU's loop.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch
from torch.func import functional_call
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from rnnkit import nn as knn
from rnnkit.bptt import recurrence
from rnnkit.bptt.fused import use_fused
from rnnkit.layers import stacked, torch_nn

pytest.importorskip("triton")
pytestmark = pytest.mark.usefixtures("triton_interpreter", "single_thread")  # conftest.py

DTYPE = torch.float64
MODES = ["RNN", "LSTM", "GRU"]
PATHS = ["fused", "triton"]
LENGTHS = [5, 2, 4]  # unsorted: packed with enforce_sorted=False


@pytest.fixture
def routes(monkeypatch) -> Counter[tuple[str, str]]:
    """``(path, dtype)`` of every route: rnnkit's, one per layer and direction, and a
    drop-in layer's whole call given to torch's own ``forward`` on the fused path, or
    (under autocast) run as rnnkit's whole stack in one fused call (``"fused"``, one per
    call)."""
    seen: Counter[tuple[str, str]] = Counter()
    real, whole = recurrence.route, torch_nn._fused_computes
    real_stack = stacked.run_whole_stack

    def run_whole_stack(stack, xt, *args, **kwargs):
        seen[("fused", str(xt.dtype).removeprefix("torch."))] += 1
        return real_stack(stack, xt, *args, **kwargs)

    def route(kernel, x, *args, **kwargs):
        way = real(kernel, x, *args, **kwargs)
        seen[(way.path, str(x.dtype).removeprefix("torch."))] += 1
        return way

    def torchs_forward(x):
        taken = whole(x)
        if taken:
            seen[("fused", str(x.dtype).removeprefix("torch."))] += 1
        return taken

    monkeypatch.setattr(recurrence, "route", route)
    monkeypatch.setattr(torch_nn, "_fused_computes", torchs_forward)
    monkeypatch.setattr(stacked, "run_whole_stack", run_whole_stack)
    return seen


def _calls(path: str, layers: int, directions: int = 1) -> int:
    """Routes of one drop-in layer call on ``path``: torch's ``forward`` once on the fused
    path, else one per layer and direction."""
    return 1 if path == "fused" else layers * directions


def _pair(mode: str, dtype: torch.dtype = DTYPE, **kw):
    torch.manual_seed(0)
    reference = getattr(torch.nn, mode)(3, 4, dtype=dtype, **kw)
    mine = getattr(knn, mode)(3, 4, dtype=dtype, **kw)
    mine.load_state_dict(reference.state_dict())
    return reference, mine


def _states(state) -> list[torch.Tensor]:
    return list(state) if isinstance(state, tuple) else [state]


def _assert_close(mine, reference, tol: float = 1e-10) -> None:
    assert len(mine) == len(reference)
    for a, b in zip(mine, reference, strict=True):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)


# ---------------------------------------------------------------- the layer's options

CASES = {
    "time-major": {},
    "batch-first": {"batch_first": True},
    "bidirectional-2-layers": {"bidirectional": True, "num_layers": 2},
    "packed": {"packed": True},
    "packed-bidirectional-2-layers-hx": {
        "packed": True,
        "hx": True,
        "bidirectional": True,
        "num_layers": 2,
        "batch_first": True,
    },
    "hx-batch-first": {"hx": True, "batch_first": True},
    "unbatched-bidirectional": {"unbatched": True, "bidirectional": True},
}


def _values_and_grads(module, case: dict, seed: int = 1) -> list[torch.Tensor]:
    """Outputs, final states and the gradients of the input, the given states and every
    parameter, for one call of ``module`` as ``case`` describes it."""
    g = torch.Generator().manual_seed(seed)
    bf, B, T = module.batch_first, len(LENGTHS), max(LENGTHS)
    shape = (T, 3) if case.get("unbatched") else ((B, T, 3) if bf else (T, B, 3))
    x = torch.randn(*shape, dtype=DTYPE, generator=g).requires_grad_()
    D = 2 if module.bidirectional else 1
    hx = None
    if case.get("hx"):
        n = 2 if isinstance(module, torch.nn.LSTM) else 1
        hs = [torch.randn(module.num_layers * D, B, 4, dtype=DTYPE, generator=g) for _ in range(n)]
        hx = tuple(h.requires_grad_() for h in hs)
    inp = x
    if case.get("packed"):
        lengths = torch.tensor(LENGTHS)
        inp = pack_padded_sequence(x, lengths, batch_first=bf, enforce_sorted=False)
    out, state = module(inp, None if hx is None else (hx if len(hx) == 2 else hx[0]))
    if case.get("packed"):
        out = pad_packed_sequence(out, batch_first=bf)[0]
    states = _states(state)
    loss = out.pow(2).sum() + sum(s.sin().sum() for s in states)
    leaves = [x, *(hx or ()), *module.parameters()]
    return [out, *states, *torch.autograd.grad(loss, leaves)]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", list(CASES))
def test_outputs_states_and_gradients_are_torchs_on_each_path(routes, path, mode, case):
    options = CASES[case]
    layer = {k: v for k, v in options.items() if k not in ("packed", "hx", "unbatched")}
    reference, mine = _pair(mode, **layer)
    expected = _values_and_grads(reference, options)
    with use_fused(path):
        got = _values_and_grads(mine, options)
    _assert_close(got, expected)
    calls = _calls(path, mine.num_layers, 2 if mine.bidirectional else 1)
    assert routes == {(path, "float64"): calls}


# ---------------------------------------------------------------- second derivatives


def _penalty_grads(module, x, hx):
    """A gradient penalty (WGAN-GP-like): the input gradient with a graph, its norm added
    to the loss, differentiated again."""
    x = x.clone().requires_grad_()
    hx = tuple(h.clone().requires_grad_() for h in hx)
    inp = pack_padded_sequence(x, torch.tensor(LENGTHS), enforce_sorted=False)
    out, state = module(inp, hx if len(hx) == 2 else hx[0])
    out = pad_packed_sequence(out)[0]
    loss = out.pow(2).sum() + sum(s.sin().sum() for s in _states(state))
    (d_x,) = torch.autograd.grad(loss, x, create_graph=True)
    total = loss + d_x.pow(2).sum()
    return torch.autograd.grad(total, [x, *hx, *module.parameters()])


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("mode", MODES)
def test_a_gradient_penalty_is_torchs_on_each_path(routes, path, mode):
    # before: the Triton steps' backward was a constant of the graph (once_differentiable),
    # so the penalty's part of the gradient was lost without a word
    reference, mine = _pair(mode, bidirectional=True)
    g = torch.Generator().manual_seed(2)
    n = 2 if mode == "LSTM" else 1
    hx = tuple(torch.randn(2, 3, 4, dtype=DTYPE, generator=g) for _ in range(n))
    x = torch.randn(5, 3, 3, dtype=DTYPE, generator=g)
    expected = _penalty_grads(reference, x, hx)
    with use_fused(path):
        got = _penalty_grads(mine, x, hx)
    _assert_close(got, expected)
    assert set(routes) == {(path, "float64")}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("mode", MODES)
def test_a_hessian_is_torchs_on_each_path(routes, path, mode):
    # before, on the Triton steps: zeros (torch.autograd.functional.hessian)
    reference, mine = _pair(mode)
    x = torch.randn(3, 2, 3, dtype=DTYPE, generator=torch.Generator().manual_seed(3))

    def hessian(module):
        def loss(w):
            out, _ = functional_call(module, {"weight_hh_l0": w}, (x,))
            return out.pow(2).sum()

        return torch.autograd.functional.hessian(loss, module.weight_hh_l0.detach().clone())

    expected = hessian(reference)
    assert expected.abs().sum() > 0
    with use_fused(path):
        got = hessian(mine)
    torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-10)
    assert set(routes) == {(path, "float64")}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("mode", MODES)
def test_a_vectorized_jacobian_is_torchs_on_each_path(routes, path, mode):
    # before, on the Triton steps: "Cannot access storage of BatchedTensorImpl" (vmap over
    # the backward reached the Triton launches)
    reference, mine = _pair(mode)
    x = torch.randn(3, 2, 3, dtype=DTYPE, generator=torch.Generator().manual_seed(4))

    def jacobian(module):
        return torch.autograd.functional.jacobian(
            lambda inp: module(inp)[0], x, vectorize=True, strategy="reverse-mode"
        )

    expected = jacobian(reference)
    with use_fused(path):
        got = jacobian(mine)
    torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-10)
    assert set(routes) == {(path, "float64")}


# ---------------------------------------------------------------- programs


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("mode", MODES)
def test_training_with_a_torch_optimizer_follows_torchs_on_each_path(routes, path, mode):
    """Three Adam steps on packed batches: the losses and the parameters stay torch's."""
    kw = {"num_layers": 2, "bidirectional": True, "batch_first": True}
    reference, mine = _pair(mode, **kw)
    runs = []
    for module, way in ((reference, "loop"), (mine, path)):
        g = torch.Generator().manual_seed(3)
        optimizer = torch.optim.Adam(module.parameters(), lr=0.05)
        losses = []
        for _ in range(3):
            x = torch.randn(3, 5, 3, dtype=DTYPE, generator=g)
            inp = pack_padded_sequence(x, torch.tensor(LENGTHS), True, enforce_sorted=False)
            with use_fused(way):
                out, _ = module(inp)
            loss = pad_packed_sequence(out, batch_first=True)[0].pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.detach())
        runs.append([torch.stack(losses), *module.parameters()])
    _assert_close([t.detach() for t in runs[1]], [t.detach() for t in runs[0]])
    assert routes == {(path, "float64"): 3 * _calls(path, 2, 2)}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("mode", MODES)
def test_dropout_draws_the_loops_masks_and_eval_is_torchs(routes, path, mode):
    """Dropout between layers draws on each path the same masks as the CPU's loop from
    the same seed (which are torch's CPU masks: tests/layers/test_torch_nn.py); in eval
    mode, torch's values."""
    reference, mine = _pair(mode, num_layers=2, dropout=0.5)
    x = torch.randn(5, 3, 3, dtype=DTYPE, generator=torch.Generator().manual_seed(5))
    runs = []
    for way in ("loop", path):
        torch.manual_seed(7)
        with use_fused(way):
            out, state = mine(x)
        runs.append(
            [out, *_states(state), *torch.autograd.grad(out.pow(2).sum(), list(mine.parameters()))]
        )
    _assert_close(runs[1], runs[0])
    mine.eval()
    reference.eval()
    with use_fused(path):
        out, state = mine(x)
    _assert_close(
        [out, *_states(state)], [t.detach() for t in [reference(x)[0], *_states(reference(x)[1])]]
    )
    assert routes[(path, "float64")] == 2 * _calls(path, 2)


# ---------------------------------------------------------------- shapes and dtypes


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("mode", MODES)
def test_an_empty_sequence_returns_the_initial_state_on_each_path(path, mode):
    # before, on the fused path: torch's "Expected sequence length to be larger than 0 in
    # RNN" (the fused kernels refuse T = 0), where docs/torch-nn.md promises h_n = h_0
    _, mine = _pair(mode)
    n = 2 if mode == "LSTM" else 1
    g = torch.Generator().manual_seed(6)
    hx = tuple(torch.randn(1, 3, 4, dtype=DTYPE, generator=g) for _ in range(n))
    with use_fused(path):
        out, state = mine(torch.zeros(0, 3, 3, dtype=DTYPE), hx if n == 2 else hx[0])
    assert out.shape == (0, 3, 4)
    _assert_close(_states(state), list(hx), tol=0.0)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("mode", MODES)
def test_a_model_moved_to_float64_is_torchs_after_flatten_parameters(routes, path, mode):
    reference, mine = _pair(mode, dtype=torch.float32, num_layers=2)
    reference.to(DTYPE).flatten_parameters()
    mine.to(DTYPE).flatten_parameters()
    options = {"hx": True}
    expected = _values_and_grads(reference, options)
    with use_fused(path):
        got = _values_and_grads(mine, options)
    _assert_close(got, expected)
    assert routes == {(path, "float64"): _calls(path, 2)}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["half", "bfloat16"])
def test_half_and_bfloat16_weights_compute_in_float32_on_each_path(routes, path, mode, dtype):
    """``.half()`` / ``.bfloat16()`` (docs/torch-nn.md): on the CPU the recurrence runs in
    float32 on the forced path and its results are rounded once to the weights' dtype."""
    reference, mine = _pair(mode, dtype=torch.float32)
    low = getattr(mine, "half" if dtype == torch.float16 else "bfloat16")()
    x = torch.randn(5, 3, 3, generator=torch.Generator().manual_seed(8))
    with use_fused(path):
        out, state = low(x.to(dtype))
    assert out.dtype == dtype and all(s.dtype == dtype for s in _states(state))
    # the oracle: torch's float32 layer over the same rounded weights and input
    rounded = {k: v.to(dtype).float() for k, v in reference.state_dict().items()}
    reference.load_state_dict(rounded)
    want, want_state = reference(x.to(dtype).float())
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-3
    for a, b in zip([out, *_states(state)], [want, *_states(want_state)], strict=True):
        torch.testing.assert_close(a.float(), b.to(dtype).float(), rtol=tol, atol=tol)
    assert routes == {(path, "float32"): 1}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("mode", MODES)
def test_autocast_leaves_the_recurrence_in_the_weights_dtype_on_each_path(routes, path, mode):
    """Under ``torch.autocast`` a drop-in computes in its weights' dtype (float32) and
    returns it (docs/torch-nn.md), the fused kernel included (autocast would run it in
    bfloat16)."""
    reference, mine = _pair(mode, dtype=torch.float32)
    x = torch.randn(5, 3, 3, generator=torch.Generator().manual_seed(9)).requires_grad_()
    with use_fused(path), torch.autocast("cpu", dtype=torch.bfloat16):
        out, state = mine(x)
    assert out.dtype == torch.float32
    got = [out, *_states(state), *torch.autograd.grad(out.pow(2).sum(), [x, *mine.parameters()])]
    want, want_state = reference(x)
    grads = torch.autograd.grad(want.pow(2).sum(), [x, *reference.parameters()])
    _assert_close(got, [want, *_states(want_state), *grads], tol=1e-5)
    assert routes == {(path, "float32"): 1}


@pytest.mark.parametrize("path", PATHS)
def test_a_projected_lstm_is_torchs_own_on_each_path(routes, path):
    """``proj_size > 0``: torch's kernels compute it whatever the path (docs/torch-nn.md)."""
    reference, mine = _pair("LSTM", proj_size=2)
    options = {"hx": False}
    expected = _values_and_grads(reference, options)
    with use_fused(path):
        got = _values_and_grads(mine, options)
    _assert_close(got, expected, tol=0.0)
    assert not routes


# ---------------------------------------------------------------- what a GPU runs


@pytest.fixture
def on_a_gpu(monkeypatch):
    """``auto`` as it runs CUDA tensors, on CPU tensors (as ``tests/models/
    test_forced_paths.py`` emulates it): the fused kernels where they compute the layer,
    the Triton steps elsewhere, no compiled loop."""
    from rnnkit.bptt import fused, gpu_route
    from rnnkit.bptt.native import use_native

    monkeypatch.setattr(fused, "_path", lambda: "fused")
    monkeypatch.setattr(gpu_route, "_path", lambda: "triton")
    with use_native(False):
        yield


@pytest.mark.usefixtures("on_a_gpu")
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", ["time-major", "packed-bidirectional-2-layers-hx"])
def test_on_a_gpu_every_drop_in_layer_runs_the_fused_kernels(routes, mode, case):
    """docs/torch-nn.md: on a GPU a drop-in runs PyTorch's fused kernels (cuDNN), whose
    function every drop-in layer is, packed sequences of unsorted lengths included."""
    options = CASES[case]
    layer = {k: v for k, v in options.items() if k not in ("packed", "hx", "unbatched")}
    reference, mine = _pair(mode, **layer)
    _assert_close(_values_and_grads(mine, options), _values_and_grads(reference, options))
    assert set(routes) == {("fused", "float64")}


@pytest.mark.usefixtures("on_a_gpu")
@pytest.mark.parametrize("mode", MODES)
def test_on_a_gpu_an_empty_sequence_returns_the_initial_state(routes, mode):
    # T = 0: the fused kernels refuse it; the fused path returns h_0 without calling them
    _, mine = _pair(mode)
    n = 2 if mode == "LSTM" else 1
    g = torch.Generator().manual_seed(6)
    hx = tuple(torch.randn(1, 3, 4, dtype=DTYPE, generator=g) for _ in range(n))
    out, state = mine(torch.zeros(0, 3, 3, dtype=DTYPE), hx if n == 2 else hx[0])
    assert out.shape == (0, 3, 4)
    _assert_close(_states(state), list(hx), tol=0.0)
    assert set(routes) == {("fused", "float64")}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("mode", [*MODES], ids=[m + "Cell" for m in MODES])
def test_the_cells_run_their_own_step_on_each_path(routes, path, mode):
    """``RNNCell``, ``LSTMCell``, ``GRUCell``: torch's values and gradients on every path
    (no layer route: rnnkit's readable step, or on the fused path torch's own fused
    step)."""
    torch.manual_seed(0)
    reference = getattr(torch.nn, mode + "Cell")(3, 4, dtype=DTYPE)
    mine = getattr(knn, mode + "Cell")(3, 4, dtype=DTYPE)
    mine.load_state_dict(reference.state_dict())
    x = torch.randn(3, 3, dtype=DTYPE, generator=torch.Generator().manual_seed(12))

    def run(module):
        new = _states(module(x))
        loss = sum(s.sin().sum() for s in new)
        return [*new, *torch.autograd.grad(loss, list(module.parameters()))]

    expected = run(reference)
    with use_fused(path):
        got = run(mine)
    _assert_close(got, expected)
    assert not routes


# ---------------------------------------------------------------- whole programs

PROGRAMS = Path(__file__).parent / "programs"


def _program(name: str, swapped: bool, *args):
    """``programs/<name>.py`` run as written (``torch.nn``) or with its import line swapped
    for ``rnnkit.nn``."""
    import sys
    import types

    source = (PROGRAMS / f"{name}.py").read_text()
    if swapped:
        source = source.replace("from torch import nn\n", "from rnnkit import nn\n")
    module = types.ModuleType(f"program_{name}_paths_{int(swapped)}")
    sys.modules[module.__name__] = module  # the pickled model names its class's module
    try:
        exec(compile(source, str(PROGRAMS / f"{name}.py"), "exec"), module.__dict__)
        return module.main(*args)
    finally:
        del sys.modules[module.__name__]


@pytest.mark.slow
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("rnn_type", ["LSTM", "GRU"])
def test_the_word_language_model_program_runs_the_same_on_each_path(
    routes, tmp_path, path, rnn_type
):
    theirs = _program("word_language_model", False, rnn_type, tmp_path / "torch.pt", 3)
    with use_fused(path):
        ours = _program("word_language_model", True, rnn_type, tmp_path / "rnnkit.pt", 3)
    assert ours["losses"] == pytest.approx(theirs["losses"], rel=1e-9, abs=1e-12)
    assert ours["ppl"] == pytest.approx(theirs["ppl"], rel=1e-9)
    assert ours["words"] == theirs["words"]
    assert {p for p, _ in routes} == {path}


@pytest.mark.slow
@pytest.mark.parametrize("path", PATHS)
def test_the_bilstm_crf_program_runs_the_same_on_each_path(routes, path):
    theirs = _program("bilstm_crf", False)
    with use_fused(path):
        ours = _program("bilstm_crf", True)
    assert ours["losses"] == pytest.approx(theirs["losses"], rel=1e-5)
    assert ours["score"] == pytest.approx(theirs["score"], rel=1e-5)
    assert ours["path"] == theirs["path"]
    assert {p for p, _ in routes} == {path}


# ---------------------------------------------------------------- beneath the drop-ins


def _second_order(path: str, reset: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """A gradient penalty's gradients through one LSTM layer with recurrent dropout,
    zoneout and a mask with holes (what the Triton steps run on a GPU), on ``path``."""
    from rnnkit.bptt.recurrence import run_recurrence
    from rnnkit.bptt.regularized import RegularizedKernel
    from rnnkit.cells.kernel import Weights
    from rnnkit.cells.lstm import LSTMKernel

    T, B, I, H = 4, 3, 2, 3
    g = torch.Generator().manual_seed(10)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, dtype=DTYPE, generator=g)

    w = [randn(4 * H, I), randn(4 * H, H), randn(4 * H)]
    x, h0, c0 = randn(T, B, I), randn(B, H), randn(B, H)
    leaves = [t.requires_grad_() for t in (x, *w, h0, c0)]
    dropped = (torch.rand(B, H, generator=g) > 0.3).to(DTYPE) / 0.7
    keep = (torch.rand(T, B, H, generator=g) > 0.5).to(DTYPE)
    kernel = RegularizedKernel(LSTMKernel(), recurrent_mask=dropped, keep=(keep, None))
    mask = torch.tensor([[1, 1, 1], [1, 0, 1], [1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    with use_fused(path):
        out, (h, _) = run_recurrence(
            kernel, x, Weights(w[0], w[1], w[2], None), (h0, c0), mask, reset=reset
        )
        loss = out.pow(2).sum() + h.sin().sum()
        (d_x,) = torch.autograd.grad(loss, x, create_graph=True)
        return torch.autograd.grad(loss + d_x.pow(2).sum(), leaves)


def test_the_triton_steps_differentiate_a_gradient_with_regularizers_and_holes(routes):
    expected = _second_order("loop")
    got = _second_order("triton")
    _assert_close(list(got), list(expected))
    assert routes == {("loop", "float64"): 1, ("triton", "float64"): 1}


def test_a_differentiated_gradient_across_resets_is_one_clear_error():
    from rnnkit.errors import ConfigError

    reset = torch.zeros(4, 3, dtype=torch.bool)
    reset[1, 1] = True
    with pytest.raises(ConfigError, match="resets inside one call"):
        _second_order("triton", reset)


@pytest.mark.parametrize(
    "kind,options",
    [
        ("LSTM", {}),
        ("LSTM", {"zoneout": 0.3, "recurrent_dropout": 0.3}),
        ("GRU", {"reset": "after", "zoneout": 0.3}),
    ],
    ids=["lstm", "lstm-regularized", "gru-zoneout"],
)
def test_the_layer_normalised_triton_steps_differentiate_a_gradient(routes, kind, options):
    # before: the layer-normalised Triton steps' backward was a constant of the graph, so
    # a penalty on the parameters' gradients lost its second-order part (off by ~200)
    from rnnkit.layers import cell_stacks

    torch.manual_seed(0)
    stack = getattr(cell_stacks, kind)(3, 4, 1, layer_norm=True, **options).double()
    x = torch.randn(2, 5, 3, dtype=DTYPE, generator=torch.Generator().manual_seed(11))
    params = list(stack.parameters())
    runs = []
    for path in ("loop", "triton"):
        torch.manual_seed(1)  # the regularizers' masks: the same draw on both paths
        with use_fused(path):
            loss = stack(x, lengths=torch.tensor([5, 3])).outputs.sin().sum()
            grads = torch.autograd.grad(loss, params, create_graph=True)
            penalty = sum(g.pow(2).sum() for g in grads)
            runs.append(torch.autograd.grad(loss + penalty, params))
    _assert_close(list(runs[1]), list(runs[0]), tol=1e-9)
    assert {p for p, _ in routes} == {"loop", "triton"}
