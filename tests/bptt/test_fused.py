"""PyTorch's fused kernels (cuDNN on a GPU) against the explicit BPTT, and the path choice.

The fused path is forced on the CPU (``use_fused("fused")``): PyTorch's CPU kernels
compute the same function as cuDNN's, so the conversions (one bias per gate, the GRU's
update convention, lengths, held states, reversed directions) are checked here without a
GPU. Oracle: the library's own time loop with its explicit BPTT, in float64.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import rnnkit
from path_runs import FORMS
from path_runs import outputs_and_grads as _run
from rnnkit.bptt import fused
from rnnkit.bptt.fused import fused_form, prefix_lengths, use_fused, wants_fused
from rnnkit.types import LSTMState

pytestmark = pytest.mark.usefixtures("single_thread")

NOT_FUSED = [
    ("gru_keep_before", rnnkit.GRU, {"update": "keep", "reset": "before"}),
    ("gru_candidate_before", rnnkit.GRU, {"update": "candidate", "reset": "before"}),
    ("rnn_sigmoid", rnnkit.RNN, {"nonlinearity": "sigmoid"}),
]
B, T, I, H = 5, 7, 3, 4


@pytest.fixture
def calls(count_calls):
    """How many fused calls ran."""
    count = count_calls(fused, "_call")
    return count


def _layer(cls, kw, dtype, bidirectional=True, dropout=0.0):
    torch.manual_seed(3)
    layer = cls(
        input_size=I,
        hidden_size=H,
        num_layers=2,
        bidirectional=bidirectional,
        dropout=dropout,
        **kw,
    )
    return layer.to(dtype)


def _initial(cls, dtype, gen):
    shape = (2, 2, B, H)
    h = torch.randn(*shape, dtype=dtype, generator=gen)
    if cls is rnnkit.LSTM:
        return LSTMState(h, torch.randn(*shape, dtype=dtype, generator=gen))
    return h


# With no dropout drawn between the layers the whole stack is one fused call; with it,
# each layer is one, both directions in it (the dropout between them is rnnkit's module).
WAYS = [(0.0, 1), (0.5, 2)]
WAY_IDS = ["whole-stack", "per-layer"]


@pytest.mark.parametrize("name, cls, kw", FORMS, ids=[f[0] for f in FORMS])
@pytest.mark.parametrize(
    "lengths",
    [None, [T, 3, 0, 1, T], [T] * B],
    ids=["no-mask", "lengths-with-0-and-T", "all-full"],
)
@pytest.mark.parametrize("dropout, fused_calls", WAYS, ids=WAY_IDS)
def test_fused_path_equals_the_explicit_bptt_in_float64(
    name, cls, kw, lengths, dropout, fused_calls, calls
):
    dtype = torch.float64
    gen = torch.Generator().manual_seed(0)
    layer = _layer(cls, kw, dtype, dropout=dropout)
    x = torch.randn(B, T, I, dtype=dtype, generator=gen)
    state = _initial(cls, dtype, gen)
    lens = None if lengths is None else torch.tensor(lengths)
    expected = _run(layer, x, state, "loop", lengths=lens)
    assert calls["n"] == 0
    got = _run(layer, x, state, "fused", lengths=lens)
    assert calls["n"] == fused_calls
    for e, g in zip(expected, got, strict=True):
        torch.testing.assert_close(g, e, atol=1e-12, rtol=0.0)


@pytest.mark.parametrize("name, cls, kw", FORMS, ids=[f[0] for f in FORMS])
@pytest.mark.parametrize("dropout, fused_calls", WAYS, ids=WAY_IDS)
def test_fused_path_equals_the_loop_in_float32(name, cls, kw, dropout, fused_calls, calls):
    gen = torch.Generator().manual_seed(1)
    layer = _layer(cls, kw, torch.float32, dropout=dropout)
    x = torch.randn(B, T, I, generator=gen)
    state = _initial(cls, torch.float32, gen)
    lens = torch.tensor([T, 2, 5, 0, 6])
    expected = _run(layer, x, state, "loop", lengths=lens)
    got = _run(layer, x, state, "fused", lengths=lens)
    assert calls["n"] == fused_calls
    for e, g in zip(expected, got, strict=True):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name, cls, kw", FORMS, ids=[f[0] for f in FORMS])
@pytest.mark.parametrize("steps, lengths", [(0, None), (T, [0] * B)], ids=["T=0", "all-empty"])
def test_where_no_step_runs_every_gradient_is_the_loops_zeros(name, cls, kw, steps, lengths):
    # No fused call runs; the gradients must still be there (zeros), as the loop's are,
    # so that an optimizer or a gradient-norm clip sees every parameter.
    gen = torch.Generator().manual_seed(2)
    layer = _layer(cls, kw, torch.float64)
    x = torch.randn(B, steps, I, dtype=torch.float64, generator=gen)
    state = _initial(cls, torch.float64, gen)
    lens = None if lengths is None else torch.tensor(lengths)
    expected = _run(layer, x, state, "loop", lengths=lens)
    got = _run(layer, x, state, "fused", lengths=lens)
    for e, g in zip(expected, got, strict=True):  # (the held states' sums: rounding)
        torch.testing.assert_close(g, e, atol=1e-12, rtol=0.0)


def test_nan_in_the_padding_reaches_nothing_on_the_fused_path(calls):
    layer = _layer(rnnkit.LSTM, {}, torch.float64)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(B, T, I, dtype=torch.float64, generator=gen)
    state = _initial(rnnkit.LSTM, torch.float64, gen)
    lens = torch.tensor([T, 3, 0, 1, 4])
    dirty = x.clone()
    for b, n in enumerate(lens.tolist()):
        dirty[b, n:] = float("nan")
    clean = _run(layer, x, state, "fused", lengths=lens)
    got = _run(layer, dirty, state, "fused", lengths=lens)
    assert calls["n"] == 2  # each call the whole stack in one
    for c, g in zip(clean, got, strict=True):
        torch.testing.assert_close(g, c, atol=0.0, rtol=0.0)


@pytest.mark.parametrize("name, cls, kw", NOT_FUSED, ids=[f[0] for f in NOT_FUSED])
def test_forms_the_fused_kernels_lack_run_the_loop_even_when_forced(name, cls, kw, calls):
    layer = _layer(cls, kw, torch.float64)
    x = torch.randn(B, T, I, dtype=torch.float64)
    state = _initial(cls, torch.float64, torch.Generator())
    expected = _run(layer, x, state, "loop")
    got = _run(layer, x, state, "fused")
    assert calls["n"] == 0
    for e, g in zip(expected, got, strict=True):
        torch.testing.assert_close(g, e, atol=0.0, rtol=0.0)


def test_holes_and_windows_run_the_loop_even_when_forced(calls):
    layer = _layer(rnnkit.LSTM, {}, torch.float64, bidirectional=False)
    x = torch.randn(B, T, I, dtype=torch.float64)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, 2] = False  # a hole inside a sequence: the state is held there
    state = LSTMState(
        torch.zeros(2, 1, B, H, dtype=torch.float64), torch.zeros(2, 1, B, H, dtype=torch.float64)
    )
    expected = _run(layer, x, state, "loop", mask=mask)
    got = _run(layer, x, state, "fused", mask=mask)
    assert calls["n"] == 0  # both layers see the hole
    for e, g in zip(expected, got, strict=True):
        torch.testing.assert_close(g, e, atol=1e-12, rtol=0.0)


def test_a_window_runs_the_loop_even_when_forced(calls):
    layer = _layer(rnnkit.GRU, {"update": "keep", "reset": "after"}, torch.float64, False)
    x = torch.randn(B, T, I, dtype=torch.float64)
    state = torch.zeros(2, 1, B, H, dtype=torch.float64)
    expected = _run(layer, x, state, "loop", window=2)
    got = _run(layer, x, state, "fused", window=2)
    assert calls["n"] == 0
    for e, g in zip(expected, got, strict=True):
        torch.testing.assert_close(g, e, atol=0.0, rtol=0.0)


def test_inference_runs_fused_and_equals_the_loop(calls):
    layer = _layer(rnnkit.GRU, {"update": "candidate", "reset": "after"}, torch.float64)
    x = torch.randn(B, T, I, dtype=torch.float64)
    lens = torch.tensor([1, T, 0, 3, 2])
    with torch.no_grad():
        with use_fused("loop"):
            expected = layer(x, lengths=lens)
        with use_fused("fused"):
            got = layer(x, lengths=lens)
    assert calls["n"] == 1
    torch.testing.assert_close(got.outputs, expected.outputs, atol=1e-12, rtol=0.0)
    torch.testing.assert_close(got.state, expected.state, atol=1e-12, rtol=0.0)


@pytest.mark.parametrize("update", ["keep", "candidate"])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["one-way", "bidirectional"])
@pytest.mark.parametrize("lengths", [None, [1, T, 0, 3, 2]], ids=["no-mask", "lengths"])
def test_a_grus_fused_calls_keep_its_converted_weights_while_they_hold(
    update, bidirectional, lengths, calls
):
    """Without gradients a GRU's weights in torch's form are made once and kept between
    calls (an evaluation's batches); an in-place update makes them afresh. Every call
    equals the library's loop."""
    kw = {"update": update, "reset": "after"}
    layer = _layer(rnnkit.GRU, kw, torch.float64, bidirectional=bidirectional).eval()
    cells = layer.cells()
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(B, T, I, dtype=torch.float64, generator=gen)
    lens = None if lengths is None else torch.tensor(lengths)

    def check():
        with use_fused("loop"):
            expected = layer(x, lengths=lens)
        with use_fused("fused"):
            got = layer(x, lengths=lens)
        torch.testing.assert_close(got.outputs, expected.outputs, atol=1e-12, rtol=0.0)
        torch.testing.assert_close(got.state, expected.state, atol=1e-12, rtol=0.0)
        return [fused._gru_kept[c.weight_hh][1] for c in cells]

    with torch.no_grad():
        kept = check()
        again = check()
        assert all(a is k for a, k in zip(again, kept, strict=True))
        cells[-1].weight_hh.mul_(0.5)  # in place, as an optimizer's step
        after = check()
        assert after[-1] is not kept[-1]
        assert all(a is k for a, k in zip(after[:-1], kept[:-1], strict=True))
    assert calls["n"] == 3


@pytest.mark.parametrize("update", ["keep", "candidate"])
def test_a_grus_kept_weights_do_not_outlive_it(update):
    """The weights kept in torch's form are keyed weakly on the cell's recurrent weight,
    and hold no reference to it (in the ``keep`` convention torch's form IS the cell's
    own weights): a model deleted after evaluating or generating is freed."""
    import gc
    import weakref

    layer = _layer(rnnkit.GRU, {"update": update, "reset": "after"}, torch.float64).eval()
    x = torch.randn(B, T, I, dtype=torch.float64)
    with torch.no_grad(), use_fused("fused"):
        layer(x)
        layer(x[:, :1])  # a single step too
    cell = layer.cells()[0]
    assert cell.weight_hh in fused._gru_kept
    gone = weakref.ref(cell.weight_hh)
    del layer, cell
    gc.collect()
    assert gone() is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_grus_weights_made_inside_a_cuda_graph_capture_are_not_kept():
    """Inside a capture the conversion is recorded, not run: what it made holds values
    only after a replay, so an eager call after the capture must not read it."""
    kw = {"update": "candidate", "reset": "after"}
    layer = _layer(rnnkit.GRU, kw, torch.float32).cuda().eval()
    x = torch.randn(B, T, I, device="cuda")
    with torch.no_grad():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            layer(x)  # the warm-up torch asks for before a capture: the weights kept
        torch.cuda.current_stream().wait_stream(side)
        for cell in layer.cells():
            cell.weight_hh.mul_(1.0)  # a new version: the kept weights are stale
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = layer(x)
        eager = layer(x)
        with use_fused("loop"):
            expected = layer(x)
        graph.replay()
    torch.testing.assert_close(eager.outputs, expected.outputs, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(captured.outputs, expected.outputs, atol=1e-5, rtol=1e-5)


def test_auto_keeps_cpu_tensors_on_the_library_loop(calls):
    layer = _layer(rnnkit.LSTM, {}, torch.float32)
    with use_fused("auto"):
        layer(torch.randn(B, T, I)).outputs.sum().backward()
    assert calls["n"] == 0


def test_the_choice_of_path():
    mask = torch.ones(T, B, dtype=torch.bool)
    lstm = rnnkit.LSTMCell(I, H).kernel
    x = torch.zeros(T, B, I)
    with use_fused("fused"):
        assert wants_fused(lstm, x, None, None, False) == ("lstm", None)
        assert wants_fused(lstm, x, mask, None, False) == ("lstm", None)  # all real
        assert wants_fused(lstm, x, None, 3, False) is None  # BPTT(3)
        assert wants_fused(lstm, x, None, None, True) is None  # a projected input
        mask[4:, 0] = False
        _, lengths = wants_fused(lstm, x, mask, None, False)
        assert lengths.tolist() == [4, T, T, T, T]
        mask[1, 1] = False  # a hole
        assert wants_fused(lstm, x, mask, None, False) is None
    with use_fused("loop"):
        assert wants_fused(lstm, x, None, None, False) is None
    with use_fused("auto"):
        assert wants_fused(lstm, x, None, None, False) is None  # the CPU
    assert fused_form(rnnkit.RNNCell(I, H, nonlinearity="sigmoid").kernel) is None
    assert fused_form(rnnkit.GRUCell(I, H, update="candidate", reset="after").kernel) == "gru"


def test_prefix_lengths():
    m = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]]).bool()
    assert prefix_lengths(m).tolist() == [2, 1, 0]
    m[2, 1] = True  # a real step after a padded one: not a prefix
    assert prefix_lengths(m) is None
    assert prefix_lengths(torch.zeros(0, 2, dtype=torch.bool)).tolist() == [0, 0]


def test_a_wrong_path_is_refused_in_one_line(monkeypatch):
    with pytest.raises(ValueError, match="choose one of auto, fused, loop"), use_fused("cudnn"):
        pass
    monkeypatch.setitem(fused._choice, "path", "cudnn")
    with pytest.raises(ValueError, match="RNNKIT_GPU_PATH='cudnn'"):
        wants_fused(rnnkit.LSTMCell(I, H).kernel, torch.zeros(2, 1, I), None, None, False)


def test_the_reference_results_outlive_a_move_of_the_layer():
    """The CUDA tier runs the layer on the CPU, then moves it (``layer.cuda()``, which moves
    each ``.grad`` in place) and runs it again: the CPU results stay as they were (here
    ``.float()`` converts the same way)."""
    layer = _layer(rnnkit.LSTM, {}, torch.float64)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(B, T, I, dtype=torch.float64, generator=gen)
    expected = _run(layer, x, _initial(rnnkit.LSTM, torch.float64, gen), "loop")
    layer.float()
    assert all(e.dtype == torch.float64 for e in expected if e is not None)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name, cls, kw", FORMS, ids=[f[0] for f in FORMS])
@pytest.mark.parametrize("widths, fused_calls", [(H, 1), ((H, H - 1), 4)], ids=WAY_IDS)
def test_on_cuda_the_default_path_is_cudnn_and_equals_the_cpu_oracle(
    name, cls, kw, widths, fused_calls, calls
):
    # the whole stack in one call; directions of different widths, one call each
    dtype = torch.float64
    gen = torch.Generator().manual_seed(2)
    torch.manual_seed(3)
    layer = cls(I, widths, num_layers=2, bidirectional=True, **kw).to(dtype)
    x = torch.randn(B, T, I, dtype=dtype, generator=gen)
    state = _initial(cls, dtype, gen)
    lens = torch.tensor([T, 3, 0, 1, 6])
    expected = _run(layer, x, state, "loop", lengths=lens)
    cuda_state = (
        LSTMState(*(s.cuda() for s in state)) if isinstance(state, LSTMState) else state.cuda()
    )
    got = _run(layer.cuda(), x.cuda(), cuda_state, "auto", lengths=lens.cuda())
    assert calls["n"] == fused_calls
    for e, g in zip(expected, got, strict=True):
        torch.testing.assert_close(g.cpu(), e, atol=1e-10, rtol=0.0)


@pytest.mark.parametrize(
    "make, train, fused_calls",
    [
        (lambda: _layer(rnnkit.LSTM, {}, torch.float64, dropout=0.5), False, 1),  # evaluation
        (lambda: _layer(rnnkit.LSTM, {}, torch.float64, dropout=0.5), True, 2),  # drawn
        (lambda: _layer(rnnkit.GRU, {"reset": "after"}, torch.float64, False), True, 1),
        (lambda: _layer(rnnkit.LSTM, {"locked_dropout": 0.3}, torch.float64), True, 2),
        (
            lambda: _layer(
                rnnkit.GRU,
                {"reset": "after", "input_dropout": 0.2, "output_dropout": 0.4},
                torch.float64,
            ),
            True,
            1,  # around the stack, not between its layers
        ),
        (
            lambda: _layer(rnnkit.LSTM, {"locked_dropout": 0.3}, torch.float64, dropout=0.2),
            True,
            2,
        ),
        (lambda: _layer(rnnkit.LSTM, {"weight_drop": 0.3}, torch.float64), True, 4),
        (lambda: _layer(rnnkit.LSTM, {"zoneout": 0.3}, torch.float64), False, 0),  # the loop's
        (
            lambda: rnnkit.LSTM(I, (H, H - 1), num_layers=2, bidirectional=True).double(),
            True,
            4,  # directions of different widths
        ),
        (lambda: _layer(rnnkit.LSTM, {"recompute": 2}, torch.float64), True, 0),  # the loop's
    ],
    ids=[
        "eval",
        "dropout-drawn",
        "one-way",
        "locked-dropout",
        "input-output-dropout",
        "locked-and-dropout",
        "weight-drop",
        "zoneout-eval",
        "widths",
        "recompute",
    ],
)
def test_what_runs_the_stack_in_whole_layers(make, train, fused_calls, calls):
    layer = make().train(train)
    x = torch.randn(B, T, I, dtype=torch.float64)
    lens = torch.tensor([T, 3, 1, 2, T])
    expected = _run(layer, x, None, "loop", lengths=lens)
    got = _run(layer, x, None, "fused", lengths=lens)
    assert calls["n"] == fused_calls
    for e, g in zip(expected, got, strict=True):
        torch.testing.assert_close(g, e, atol=1e-12, rtol=0.0)


@pytest.mark.parametrize("name, cls, kw", FORMS, ids=[f[0] for f in FORMS])
@pytest.mark.parametrize("lengths", [None, [T, 3, 0, 1, 6]], ids=["full", "lengths"])
def test_a_state_that_is_not_contiguous_reaches_the_kernel_contiguous(
    name, cls, kw, lengths, monkeypatch
):
    """cuDNN refuses an initial state that is not contiguous (the CPU kernels take any): a
    state sliced out of a wider batch reaches the fused kernel contiguous, with the loop's
    result. The kernel is wrapped here with cuDNN's own check."""
    form = {rnnkit.LSTM: "lstm", rnnkit.GRU: "gru"}.get(cls)
    seen: list[bool] = []

    def checked(op):
        def run(*args):
            h = args[2] if len(args) == 9 and isinstance(args[1], torch.Tensor) else args[1]
            states = h if isinstance(h, (list, tuple)) else [h]
            seen.append(all(s.is_contiguous() for s in states))
            return op(*args)

        return run

    for op_name in ("lstm", "gru", "rnn_tanh", "rnn_relu"):
        if form is None or op_name == form:
            monkeypatch.setattr(torch._VF, op_name, checked(getattr(torch._VF, op_name)))
    gen = torch.Generator().manual_seed(4)
    layer = _layer(cls, kw, torch.float64)
    x = torch.randn(B, T, I, dtype=torch.float64, generator=gen)
    wide = _initial(cls, torch.float64, torch.Generator().manual_seed(5))
    parts = list(wide) if isinstance(wide, LSTMState) else [wide]
    sliced = [torch.cat([p, p], dim=2)[:, :, ::2] for p in parts]  # every other row: strided
    assert not sliced[0].is_contiguous()
    state = LSTMState(*sliced) if isinstance(wide, LSTMState) else sliced[0]
    lens = None if lengths is None else torch.tensor(lengths)
    with torch.no_grad():  # the state itself, not a copy, goes in
        with use_fused("loop"):
            want = layer(x, state=state, lengths=lens)
        with use_fused("fused"):
            got = layer(x, state=state, lengths=lens)
    assert seen and all(seen)
    torch.testing.assert_close(got.outputs, want.outputs, atol=1e-12, rtol=0.0)
    for g, w in zip(_leaves(got.state), _leaves(want.state), strict=True):
        torch.testing.assert_close(g, w, atol=1e-12, rtol=0.0)


def _leaves(state):
    return list(state) if isinstance(state, LSTMState) else [state]


# Second derivatives. cuDNN's backward cannot be differentiated again; on the CPU torch's
# fused kernels can. The stand-in below gives the CPU kernel cuDNN's limit (its backward
# marked once differentiable), so the way around it is tested here without a GPU.


class _Refused(torch.autograd.Function):
    """A value whose own gradient is refused, as cuDNN's backward's is."""

    @staticmethod
    def forward(ctx, value, *inputs):
        return value.clone()

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError("Double backwards is not supported for CuDNN RNNs")


def _cudnn_like(op):
    """``op`` (``torch._VF.lstm`` ...) whose backward, like cuDNN's, cannot itself be
    differentiated (its results, taken with a graph, refuse their own backward); counts
    its backwards in ``run.backwards``."""

    def run(*args):
        flat, spec = torch.utils._pytree.tree_flatten(args)
        at = [
            i for i, a in enumerate(flat) if isinstance(a, torch.Tensor) and a.is_floating_point()
        ]

        class Once(torch.autograd.Function):
            @staticmethod
            def forward(ctx, *tensors):
                leaves = [t.detach().requires_grad_(t.requires_grad) for t in tensors]
                values = list(flat)
                for i, leaf in zip(at, leaves, strict=True):
                    values[i] = leaf
                with torch.enable_grad():
                    outputs = op(*torch.utils._pytree.tree_unflatten(values, spec))
                ctx.inner = (leaves, outputs)
                ctx.save_for_backward(*tensors)
                ctx.set_materialize_grads(False)
                return tuple(o.detach() for o in outputs)

            @staticmethod
            def backward(ctx, *grads):
                leaves, outputs = ctx.inner
                if all(g is None for g in grads):  # as torch's nodes: nothing to compute
                    return (None,) * len(leaves)
                run.backwards += 1
                outputs, grads = zip(
                    *((o, g) for o, g in zip(outputs, grads, strict=True) if g is not None),
                    strict=True,
                )
                inputs = [t for t in ctx.saved_tensors if t.requires_grad]
                need = [leaf for leaf in leaves if leaf.requires_grad]
                with torch.no_grad():
                    got = torch.autograd.grad(
                        outputs, need, grads, allow_unused=True, retain_graph=True
                    )
                got = iter(_Refused.apply(g, *inputs) if g is not None else None for g in got)
                return tuple(next(got) if leaf.requires_grad else None for leaf in leaves)

        return Once.apply(*(flat[i] for i in at))

    run.backwards = 0
    return run


@pytest.fixture
def cudnn_like(monkeypatch):
    """The CPU's fused kernels with cuDNN's limit, and the CPU treated as such a device;
    returns the stand-ins by form."""
    ops = {}
    for form in ("lstm", "gru", "rnn_tanh", "rnn_relu"):
        ops[form] = _cudnn_like(getattr(torch._VF, form))
        monkeypatch.setattr(torch._VF, form, ops[form])
    monkeypatch.setattr(fused, "_ONCE_DIFFERENTIABLE_ON", frozenset({"cpu", "cuda"}))
    return ops


def _penalty_grads(layer, x, state, path, lengths=None):
    """The parameters' gradients of a gradient penalty, ‖∂L/∂x‖² + ‖∂L/∂h0‖², with ``L``
    a fixed weighting of the outputs: a second derivative through the layer."""
    layer.zero_grad()
    x = x.detach().clone().requires_grad_()
    parts = list(state) if isinstance(state, LSTMState) else [state]
    parts = [p.detach().clone().requires_grad_() for p in parts]
    s0 = LSTMState(*parts) if isinstance(state, LSTMState) else parts[0]
    torch.manual_seed(5)
    with use_fused(path):
        out = layer(x, state=s0, lengths=lengths)
        w = torch.randn(
            out.outputs.shape, dtype=x.dtype, generator=torch.Generator().manual_seed(7)
        ).to(x.device)
        loss = (out.outputs * w).sum() + sum(f.sum() for f in _leaves(out.state))
        gx, *gs = torch.autograd.grad(loss, [x, *parts], create_graph=True)
        penalty = (gx**2).sum() + sum((g**2).sum() for g in gs)
        penalty.backward()
    return [p.grad.clone() for p in layer.parameters()]


@pytest.mark.parametrize("name, cls, kw", FORMS, ids=[f[0] for f in FORMS])
@pytest.mark.parametrize("lengths", [None, [T, 3, 0, 1, 6]], ids=["full", "lengths"])
@pytest.mark.parametrize("dropout, fused_calls", WAYS, ids=WAY_IDS)
def test_a_gradient_through_cudnns_kernel_can_be_differentiated_again(
    name, cls, kw, lengths, dropout, fused_calls, calls, cudnn_like, monkeypatch
):
    gen = torch.Generator().manual_seed(8)
    layer = _layer(cls, kw, torch.float64, dropout=dropout)
    x = torch.randn(B, T, I, dtype=torch.float64, generator=gen)
    state = _initial(cls, torch.float64, gen)
    lens = None if lengths is None else torch.tensor(lengths)
    want = _penalty_grads(layer, x, state, "loop", lens)
    assert calls["n"] == 0
    got = _penalty_grads(layer, x, state, "fused", lens)
    assert calls["n"] == fused_calls
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-10, rtol=1e-10)
    # the stand-in has cuDNN's limit: taken as it comes, its gradient cannot be differentiated
    monkeypatch.setattr(fused, "_ONCE_DIFFERENTIABLE_ON", frozenset())
    with pytest.raises(RuntimeError, match="Double backwards is not supported"):
        _penalty_grads(layer, x, state, "fused", lens)


@pytest.mark.parametrize("name, cls, kw", FORMS[:2], ids=[f[0] for f in FORMS[:2]])
def test_a_gradient_without_a_graph_is_the_fused_kernels_own(
    name, cls, kw, cudnn_like, count_calls
):
    form = "lstm" if cls is rnnkit.LSTM else "gru"
    decomposed = count_calls(fused._Call, "decomposed")
    gen = torch.Generator().manual_seed(9)
    layer = _layer(cls, kw, torch.float64)
    x = torch.randn(B, T, I, dtype=torch.float64, generator=gen, requires_grad=True)
    lens = torch.tensor([T, 3, 0, 1, 6])

    def loss_on(path):
        with use_fused(path):
            out = layer(x, lengths=lens)
        weights = torch.Generator().manual_seed(11)
        parts = [out.outputs, *_leaves(out.state)]
        return sum(
            (p * torch.randn(p.shape, dtype=p.dtype, generator=weights)).sum() for p in parts
        )

    want = torch.autograd.grad(loss_on("loop"), [x, *layer.parameters()])
    loss = loss_on("fused")
    first = torch.autograd.grad(loss, [x, *layer.parameters()], retain_graph=True)
    assert cudnn_like[form].backwards == 1 and decomposed["n"] == 0
    again = torch.autograd.grad(loss, [x, *layer.parameters()])
    assert cudnn_like[form].backwards == 2 and decomposed["n"] == 0
    for f, a, w in zip(first, again, want, strict=True):
        torch.testing.assert_close(f, w, atol=1e-12, rtol=0.0)
        torch.testing.assert_close(a, w, atol=1e-12, rtol=0.0)


def test_a_layer_under_activation_checkpointing_differentiates_again(cudnn_like):
    """``torch.utils.checkpoint`` (without reentry) recomputes the forward in the backward;
    the kept kernel graph and the recomputation must not disturb it."""
    gen = torch.Generator().manual_seed(10)
    layer = _layer(rnnkit.LSTM, {}, torch.float64)
    x = torch.randn(B, T, I, dtype=torch.float64, generator=gen)
    grads = {}
    for path in ("loop", "fused"):
        layer.zero_grad()
        xi = x.clone().requires_grad_()
        with use_fused(path):
            out = torch.utils.checkpoint.checkpoint(
                lambda v: layer(v).outputs, xi, use_reentrant=False
            )
            (gx,) = torch.autograd.grad(out.square().sum(), xi, create_graph=True)
            gx.square().sum().backward()
        grads[path] = [p.grad.clone() for p in layer.parameters()]
    for g, w in zip(grads["fused"], grads["loop"], strict=True):
        torch.testing.assert_close(g, w, atol=1e-10, rtol=1e-10)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name, cls, kw", FORMS, ids=[f[0] for f in FORMS])
def test_on_cuda_a_gradient_penalty_through_cudnn_equals_the_cpu_oracle(name, cls, kw, calls):
    gen = torch.Generator().manual_seed(8)
    layer = _layer(cls, kw, torch.float64)
    x = torch.randn(B, T, I, dtype=torch.float64, generator=gen)
    state = _initial(cls, torch.float64, gen)
    lens = torch.tensor([T, 3, 0, 1, 6])
    want = _penalty_grads(layer, x, state, "loop", lens)
    cuda_state = (
        LSTMState(*(s.cuda() for s in state)) if isinstance(state, LSTMState) else state.cuda()
    )
    got = _penalty_grads(layer.cuda(), x.cuda(), cuda_state, "auto", lens)
    assert calls["n"] == 1
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g.cpu(), w, atol=1e-10, rtol=1e-10)


# The fused call off the CPU does not reset Python's record of warnings shown.


def _user_code_warns():
    warnings.warn("shown once per place (the default action)", UserWarning, stacklevel=1)


def test_a_fused_call_off_the_cpu_keeps_warnings_shown_once():
    # a meta tensor takes the branch a CUDA tensor takes (device type not "cpu")
    x = torch.zeros(4, 2, 3, device="meta")
    h = torch.zeros(1, 2, 5, device="meta")
    params = [torch.zeros(20, 3, device="meta"), torch.zeros(20, 5, device="meta")]
    params += [torch.zeros(20, device="meta"), torch.zeros(20, device="meta")]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("default")
        # first calls: torch's lazy imports add filters of their own (sympy's), and the
        # patched call puts its one filter in front once
        for _ in range(2):
            fused._call("lstm", x, (h, h), params, None, False)
        for _ in range(4):
            _user_code_warns()
            fused._call("lstm", x, (h, h), params, None, False)
    shown = [w for w in seen if "shown once per place" in str(w.message)]
    assert len(shown) == 1
