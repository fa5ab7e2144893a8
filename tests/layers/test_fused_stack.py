"""A stack's call of one time step as PyTorch's fused cell operators, one per layer and
direction (``rnnkit.layers.fused_stack.one_step``), against the library's time loop with its
explicit BPTT (``use_fused("loop")``, the definition) in float64: outputs, final states and
every gradient; which calls take it and which keep the loop."""

from __future__ import annotations

import pytest
import torch

import rnnkit
from path_runs import FORMS
from path_runs import outputs_and_grads as _run
from rnnkit.bptt.fused import cell_step, step_in_one_call, use_fused
from rnnkit.layers import fused_stack
from rnnkit.types import LSTMState

pytestmark = pytest.mark.usefixtures("single_thread")

B, I, H = 5, 3, 4


@pytest.fixture
def steps(count_calls):
    """How many cells stepped through the fused cell operators."""
    return count_calls(fused_stack, "cell_step")


def _layer(cls, kw, dtype=torch.float64, **more):
    torch.manual_seed(3)
    return cls(input_size=I, hidden_size=H, **kw, **more).to(dtype)


def _state(layer, gen, dtype=torch.float64):
    L, D = layer.num_layers, layer.num_directions
    h = torch.randn(L, D, B, H, dtype=dtype, generator=gen)
    return LSTMState(h, torch.randn(L, D, B, H, dtype=dtype, generator=gen)) if layer.is_lstm else h


def _same(expected, got, tol=1e-12):
    assert len(expected) == len(got)
    for e, g in zip(expected, got, strict=True):
        torch.testing.assert_close(g, e, atol=tol, rtol=0.0)


@pytest.mark.parametrize("name, cls, kw", FORMS, ids=[f[0] for f in FORMS])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["one-way", "bidirectional"])
def test_one_step_equals_the_explicit_bptt_in_float64(name, cls, kw, bidirectional, steps):
    gen = torch.Generator().manual_seed(0)
    layer = _layer(cls, kw, num_layers=2, bidirectional=bidirectional)
    x = torch.randn(B, 1, I, dtype=torch.float64, generator=gen)
    state = _state(layer, gen)
    expected = _run(layer, x, state, "loop")
    assert steps["n"] == 0
    got = _run(layer, x, state, "auto")
    assert steps["n"] == 2 * layer.num_directions  # every cell of the stack, once
    _same(expected, got)


@pytest.mark.parametrize("name, cls, kw", FORMS, ids=[f[0] for f in FORMS])
def test_a_padded_row_keeps_its_state_and_its_nan_reaches_nothing(name, cls, kw, steps):
    # lengths 1 and 0 at T = 1: a row of length 0 holds its initial state, and the NaN in
    # its input (padding) must not reach an output, a state or a gradient
    gen = torch.Generator().manual_seed(1)
    layer = _layer(cls, kw, num_layers=2, bidirectional=True)
    x = torch.randn(B, 1, I, dtype=torch.float64, generator=gen)
    x[1] = float("nan")
    x[3] = float("nan")
    lengths = torch.tensor([1, 0, 1, 0, 1])
    state = _state(layer, gen)
    expected = _run(layer, x, state, "loop", lengths=lengths)
    got = _run(layer, x, state, "auto", lengths=lengths)
    assert steps["n"] == 4
    for t in got:
        assert torch.isfinite(t).all()
    _same(expected, got)


def test_no_initial_state_time_major_and_the_dropout_between_layers(steps):
    # Dropout between the layers in training: the same module draws the same B·H values
    # in the same order as in the loop's path, so a seeded call gives the same result and
    # leaves the generator where the loop leaves it.
    gen = torch.Generator().manual_seed(2)
    layer = _layer(rnnkit.LSTM, {}, num_layers=3, dropout=0.5, batch_first=False)
    x = torch.randn(1, B, I, dtype=torch.float64, generator=gen)
    expected = _run(layer, x, None, "loop", seed=7)
    after_loop = torch.get_rng_state()
    got = _run(layer, x, None, "auto", seed=7)
    assert torch.equal(torch.get_rng_state(), after_loop)
    assert steps["n"] == 3
    _same(expected, got)
    assert not torch.equal(got[0], _run(layer, x, None, "auto", seed=8)[0])  # it drops out


def test_float32_against_the_loop(steps):
    gen = torch.Generator().manual_seed(4)
    layer = _layer(rnnkit.GRU, {"update": "keep", "reset": "after"}, torch.float32, num_layers=2)
    x = torch.randn(B, 1, I, generator=gen)
    state = _state(layer, gen, torch.float32)
    expected = _run(layer, x, state, "loop")
    got = _run(layer, x, state, "auto")
    assert steps["n"] == 2
    _same(expected, got, tol=1e-6)


@pytest.mark.parametrize(
    "make, T, call",
    [
        (lambda: _layer(rnnkit.LSTM, {}), 2, {}),  # two steps: the loop
        (lambda: _layer(rnnkit.GRU, {}), 1, {}),  # reset="before": no fused operator
        (lambda: _layer(rnnkit.RNN, {"nonlinearity": "sigmoid"}), 1, {}),
        (lambda: _layer(rnnkit.LSTM, {}, zoneout=0.2), 1, {}),  # a regularizer inside
        (lambda: _layer(rnnkit.LSTM, {}, recompute=1), 1, {}),
        (lambda: _layer(rnnkit.GRU, {"reset": "after"}, layer_norm=True), 1, {}),
        (lambda: _layer(rnnkit.LSTM, {}), 1, {"window": 1}),
    ],
    ids=["T=2", "gru-before", "sigmoid", "zoneout", "recompute", "layer-norm", "window"],
)
def test_calls_the_cell_operators_do_not_compute_keep_the_loop(make, T, call, steps):
    layer = make()
    x = torch.randn(B, T, I, dtype=torch.float64, requires_grad=True)
    layer(x, **call).outputs.sum().backward()
    assert steps["n"] == 0


def test_the_path_decides():
    x = torch.zeros(1, 2, 3)
    assert step_in_one_call(x)
    assert step_in_one_call(x.double())
    assert not step_in_one_call(x.half())  # the CPU computes float16 in float32: the loop's
    for path in ("loop", "fused", "triton"):
        with use_fused(path):
            assert not step_in_one_call(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not step_in_one_call(x)


def test_under_vmap_the_loop_runs(steps):
    layer = _layer(rnnkit.LSTM, {})
    xs = torch.randn(3, B, 1, I, dtype=torch.float64)
    got = torch.func.vmap(lambda x: layer(x).outputs)(xs)
    with use_fused("loop"):
        expected = torch.stack([layer(x).outputs for x in xs])
    assert steps["n"] == 0
    torch.testing.assert_close(got, expected, atol=1e-12, rtol=0.0)


@pytest.mark.parametrize("name, cls, kw", FORMS, ids=[f[0] for f in FORMS])
def test_cell_step_is_the_cells_step(name, cls, kw):
    gen = torch.Generator().manual_seed(5)
    cell = _layer(cls, kw).cells()[0]
    x = torch.randn(B, I, dtype=torch.float64, generator=gen)
    h = torch.randn(B, H, dtype=torch.float64, generator=gen)
    c = torch.randn(B, H, dtype=torch.float64, generator=gen)
    state = LSTMState(h, c) if cell.is_lstm else h
    states0 = tuple(state) if cell.is_lstm else (state,)
    form = name.split("_")[0] if name.startswith("gru") or name == "lstm" else name
    got = cell_step(cell.kernel, form, x, cell.weights(), states0)
    with use_fused("loop"):
        expected = cell(x, state)
    expected = tuple(expected) if cell.is_lstm else (expected,)
    _same(list(expected), list(got))


def test_an_lstm_step_gives_torchs_cell_both_biases(monkeypatch):
    """On a GPU torch's fused LSTM cell (``_thnn_fused_lstm_cell``) refuses an input bias
    without a hidden one, where the CPU's adds what it gets: the stack's single step and
    the cell's forward, with torch's cell wrapped in that rule, give the loop's values
    (one bias per gate: the hidden one a kept zero, created once)."""
    from rnnkit.cells import lstm as lstm_module

    given: list[tuple[bool, bool]] = []
    real = torch.lstm_cell

    def as_on_a_gpu(x, hx, w_ih, w_hh, b_ih=None, b_hh=None):
        given.append((b_ih is not None, b_hh is not None))
        assert (b_ih is None) == (b_hh is None), "the CUDA kernel refuses one bias alone"
        return real(x, hx, w_ih, w_hh, b_ih, b_hh)

    monkeypatch.setattr(torch, "lstm_cell", as_on_a_gpu)
    gen = torch.Generator().manual_seed(5)
    layer = _layer(rnnkit.LSTM, {}, num_layers=2)
    x = torch.randn(B, 1, I, dtype=torch.float64, generator=gen)
    with torch.no_grad():
        got = [layer(x) for _ in range(2)]
        cell = layer.cells()[0]
        stepped = cell(x[:, 0])
        with use_fused("loop"):
            want = layer(x)
        zeros = torch.zeros(B, H, dtype=torch.float64)
        want_cell = lstm_module.lstm_step(x[:, 0], LSTMState(zeros, zeros), cell.weights())
    assert given and set(given) == {(True, True)}
    for out in got:
        torch.testing.assert_close(out.outputs, want.outputs, atol=1e-12, rtol=0.0)
    torch.testing.assert_close(stepped.h, want_cell.h, atol=1e-12, rtol=0.0)
    zero = lstm_module._zero_bias[cell.bias]  # one zero kept per bias, not one a step
    assert not zero.any() and zero.shape == cell.bias.shape


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name, cls, kw", FORMS, ids=[f[0] for f in FORMS])
def test_on_cuda_one_step_is_the_cell_operators_and_equals_the_cpu_oracle(name, cls, kw, steps):
    gen = torch.Generator().manual_seed(6)
    layer = _layer(cls, kw, num_layers=2, bidirectional=True)
    x = torch.randn(B, 1, I, dtype=torch.float64, generator=gen)
    state = _state(layer, gen)
    lengths = torch.tensor([1, 0, 1, 1, 0])
    expected = _run(layer, x, state, "loop", lengths=lengths)
    on_gpu = LSTMState(*(s.cuda() for s in state)) if layer.is_lstm else state.cuda()
    got = _run(layer.cuda(), x.cuda(), on_gpu, "auto", lengths=lengths.cuda())
    assert steps["n"] == 4
    _same(expected, [g.cpu() for g in got], tol=1e-10)


# --- the stack's quick single step (fused_stack.quick_step) --------------------------------


@pytest.fixture
def quick(monkeypatch):
    """How many calls the stack's quick single step answered (not None)."""
    from rnnkit.layers import stacked

    calls = {"n": 0}
    real = stacked.quick_step

    def counted(*args, **kwargs):
        out = real(*args, **kwargs)
        calls["n"] += out is not None
        return out

    monkeypatch.setattr(stacked, "quick_step", counted)
    return calls


def _plain_and_checked(layer, x, state):
    """The call as a generator makes it (the quick step) and the same call through the
    stack's checked route (lengths given, all 1: ``one_step`` with its mask, whose
    selections keep every value as it is)."""
    quick_out = layer(x, state=state)
    ones = torch.ones(x.shape[0 if layer.batch_first else 1], dtype=torch.long)
    checked = layer(x, state=state, lengths=ones)
    return quick_out, checked


def _equal(a, b):
    assert torch.equal(a.outputs, b.outputs)
    parts_a = list(a.state) if isinstance(a.state, LSTMState) else [a.state]
    parts_b = list(b.state) if isinstance(b.state, LSTMState) else [b.state]
    assert len(parts_a) == len(parts_b)
    for p, q in zip(parts_a, parts_b, strict=True):
        assert p.shape == q.shape
        assert torch.equal(p, q)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("name, cls, kw", FORMS, ids=[f[0] for f in FORMS])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["one-way", "bidirectional"])
@pytest.mark.parametrize("batch_first", [True, False], ids=["batch-first", "time-major"])
def test_the_quick_step_is_the_checked_route_to_the_bit(
    name, cls, kw, bidirectional, batch_first, dtype, quick, steps
):
    gen = torch.Generator().manual_seed(7)
    layer = _layer(cls, kw, dtype, num_layers=2, bidirectional=bidirectional)
    layer.batch_first = batch_first
    x = torch.randn((B, 1, I) if batch_first else (1, B, I), dtype=dtype, generator=gen)
    for state in (None, _state(layer, gen, dtype)):
        with torch.no_grad():
            got, checked = _plain_and_checked(layer, x, state)
        _equal(got, checked)
    assert quick["n"] == 2  # the calls without lengths, and only they
    assert steps["n"] == 4 * 2 * layer.num_directions


@pytest.mark.parametrize("name, cls, kw", FORMS, ids=[f[0] for f in FORMS])
def test_the_quick_step_has_the_explicit_bptts_gradients(name, cls, kw, quick):
    gen = torch.Generator().manual_seed(8)
    layer = _layer(cls, kw, num_layers=2)
    x = torch.randn(B, 1, I, dtype=torch.float64, generator=gen)
    state = _state(layer, gen)
    expected = _run(layer, x, state, "loop")
    got = _run(layer, x, state, "auto")
    assert quick["n"] == 1
    _same(expected, got)


def _fresh_copy(layer, **more):
    """A stack built anew with ``layer``'s weights (and dtype): what no kept plan knows."""
    fresh = _layer(rnnkit.LSTM, {}, num_layers=2, **more)
    fresh.load_state_dict(layer.state_dict())
    return fresh.to(next(layer.parameters()).dtype).train(layer.training)


def test_a_replaced_parameter_is_read_at_the_next_step(quick):
    gen = torch.Generator().manual_seed(9)
    layer = _layer(rnnkit.LSTM, {}, num_layers=2).eval()
    x = torch.randn(B, 1, I, dtype=torch.float64, generator=gen)
    cell = layer.cells()[1]
    new = torch.randn(cell.weight_hh.shape, dtype=torch.float64, generator=gen)
    with torch.no_grad():
        first = layer(x).state
        cell.weight_hh = torch.nn.Parameter(new)
        got = layer(x, state=first)
        expected = _fresh_copy(layer)(x, state=first)
    assert quick["n"] == 3
    assert torch.equal(layer.cells()[1].weight_hh, new)
    _equal(got, expected)


def test_weights_changed_in_place_are_read_at_the_next_step(quick):
    gen = torch.Generator().manual_seed(10)
    layer = _layer(rnnkit.LSTM, {}, num_layers=2).eval()
    x = torch.randn(B, 1, I, dtype=torch.float64, generator=gen)
    with torch.no_grad():
        first = layer(x).state
        for p in layer.parameters():  # as an optimizer's step does
            p.add_(torch.randn(p.shape, dtype=p.dtype, generator=gen))
        got = layer(x, state=first)
        expected = _fresh_copy(layer)(x, state=first)
    assert quick["n"] == 3
    _equal(got, expected)


def test_a_stack_moved_to_float32_steps_in_float32(quick):
    gen = torch.Generator().manual_seed(11)
    layer = _layer(rnnkit.LSTM, {}, num_layers=2).eval()
    x = torch.randn(B, 1, I, dtype=torch.float64, generator=gen)
    with torch.no_grad():
        first = layer(x).state
        layer.float()
        first = LSTMState(*(s.float() for s in first))
        got = layer(x.float(), state=first)
        expected = _fresh_copy(layer)(x.float(), state=first)
    assert got.outputs.dtype == torch.float32
    assert quick["n"] == 3
    _equal(got, expected)
    with pytest.raises(TypeError, match=r"x is torch\.float64 on cpu but the parameters"):
        layer(x)  # the stack's own check, as before: the quick step stands aside


def test_training_mode_is_read_at_every_step(quick):
    # dropout between the layers: at evaluation none, after .train() the module's draws
    gen = torch.Generator().manual_seed(12)
    layer = _layer(rnnkit.LSTM, {}, num_layers=2, dropout=0.5).eval()
    x = torch.randn(B, 1, I, dtype=torch.float64, generator=gen)
    with torch.no_grad():
        first = layer(x).state
        layer.train()
        torch.manual_seed(3)
        got = layer(x, state=first)
        fresh = _fresh_copy(layer, dropout=0.5)
        torch.manual_seed(3)
        expected = fresh(x, state=first)
        torch.manual_seed(3)
        with use_fused("loop"):
            looped = layer(x, state=first)
    assert quick["n"] == 3
    _equal(got, expected)
    torch.testing.assert_close(got.outputs, looped.outputs, atol=1e-12, rtol=0.0)
    assert not torch.equal(got.outputs, layer.eval()(x, state=first).outputs)


def test_a_replaced_layer_is_read_at_the_next_step(quick):
    gen = torch.Generator().manual_seed(13)
    layer = _layer(rnnkit.LSTM, {}, num_layers=2).eval()
    x = torch.randn(B, 1, I, dtype=torch.float64, generator=gen)
    other = _layer(rnnkit.GRU, {"reset": "after"}, num_layers=2).eval()
    with torch.no_grad():
        layer(x)
        layer.layers[1] = other.layers[1]  # a GRU on top: now no LSTM stack's plan
        with pytest.raises(TypeError, match="LSTMState"):
            layer(x, state=torch.zeros(2, 1, B, H, dtype=torch.float64))
        assert quick["n"] == 1
        torch.manual_seed(99)  # other weights than the layer replaced
        layer.layers[1] = rnnkit.LSTM(I, H, num_layers=2).double().layers[1]
        got = layer(x)
        expected = _fresh_copy(layer)(x)
    assert quick["n"] == 3
    _equal(got, expected)


@pytest.mark.parametrize("bidirectional", [False, True], ids=["one-way", "bidirectional"])
def test_a_cell_replaced_inside_a_layer_is_read_at_the_next_call(quick, bidirectional):
    """``stack.layers[l].cell = ...`` (or a direction's): every route reads the new cell,
    the single step as the whole sequence."""
    gen = torch.Generator().manual_seed(17)
    layer = _layer(rnnkit.LSTM, {}, num_layers=2, bidirectional=bidirectional).eval()
    x = torch.randn(B, 1, I, dtype=torch.float64, generator=gen)
    xs = torch.randn(B, 6, I, dtype=torch.float64, generator=gen)
    with torch.no_grad():
        layer(x)
        top = layer.layers[1]
        where = top.directions[1] if bidirectional else top
        torch.manual_seed(98)  # other weights than the cell replaced
        where.cell = type(where.cell)(where.cell.input_size, H).double()
        for inp in (x, xs):
            got = layer(inp)
            expected = _fresh_copy(layer, bidirectional=bidirectional)(inp)
            _equal(got, expected)
    assert quick["n"] == 3  # the steps of the stack and of its fresh copy


def test_a_parametrization_added_between_steps_is_computed(quick):
    from torch.nn.utils import parametrize

    class Double(torch.nn.Module):
        def forward(self, w):
            return 2 * w

    gen = torch.Generator().manual_seed(14)
    layer = _layer(rnnkit.LSTM, {}, num_layers=2).eval()
    x = torch.randn(B, 1, I, dtype=torch.float64, generator=gen)
    cell = layer.cells()[0]
    with torch.no_grad():
        first = layer(x).state
        expected_layer = _fresh_copy(layer)
        expected_layer.cells()[0].weight_ih.mul_(2)
        parametrize.register_parametrization(cell, "weight_ih", Double())
        got = layer(x, state=first)
        expected = expected_layer(x, state=first)
    assert quick["n"] == 3
    _equal(got, expected)


def test_a_regularizer_set_between_steps_takes_the_stacks_route(quick, steps):
    gen = torch.Generator().manual_seed(15)
    layer = _layer(rnnkit.LSTM, {}, num_layers=2).eval()
    x = torch.randn(B, 1, I, dtype=torch.float64, generator=gen)
    with torch.no_grad():
        first = layer(x).state
        layer.zoneout = 0.25  # at evaluation the mix with the previous state
        got = layer(x, state=first)
        expected = _fresh_copy(layer, zoneout=0.25)(x, state=first)
    assert quick["n"] == 1 and steps["n"] == 2
    _equal(got, expected)


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_masks_are_drawn_once_as_the_stack_draws_them(train, quick):
    # locked and output dropout: at evaluation no mask, so the quick step; in training the
    # stack draws its masks once (the generator where the loop's path leaves it)
    gen = torch.Generator().manual_seed(16)
    layer = _layer(rnnkit.LSTM, {}, num_layers=2, locked_dropout=0.3, output_dropout=0.4)
    layer.train(train)
    x = torch.randn(B, 1, I, dtype=torch.float64, generator=gen)
    state = _state(layer, gen)
    expected = _run(layer, x, state, "loop")
    after_loop = torch.get_rng_state()
    got = _run(layer, x, state, "auto")
    assert torch.equal(torch.get_rng_state(), after_loop)
    assert quick["n"] == (0 if train else 1)
    _same(expected, got)


@pytest.mark.parametrize(
    "bad, error, message",
    [
        (lambda s: s.h, TypeError, "must be LSTMState"),
        (lambda s: LSTMState(s.h[:1], s.c), ValueError, r"state.h must have shape \(L, D, B, H\)"),
        (lambda s: LSTMState(s.h, s.c[:, :, :2]), ValueError, "state.c must have shape"),
        (lambda s: LSTMState(s.h.float(), s.c), TypeError, "state.h is torch.float32"),
        (lambda s: (s.h, s.c), TypeError, "must be LSTMState"),
    ],
    ids=["tensor", "layers", "batch", "dtype", "tuple"],
)
def test_a_bad_state_gets_the_stacks_own_error(bad, error, message, quick):
    gen = torch.Generator().manual_seed(17)
    layer = _layer(rnnkit.LSTM, {}, num_layers=2).eval()
    x = torch.randn(B, 1, I, dtype=torch.float64, generator=gen)
    state = _state(layer, gen)
    with pytest.raises(error, match=message):
        layer(x, state=bad(state))
    assert quick["n"] == 0


def test_hooks_and_a_subclass_forward_see_the_quick_step(quick):
    class Shifted(rnnkit.LSTM):
        def forward(self, x, **kw):
            out = super().forward(x, **kw)
            return out._replace(outputs=out.outputs + 1)

    torch.manual_seed(18)
    layer = Shifted(I, H, num_layers=2).double().eval()
    x = torch.randn(B, 1, I, dtype=torch.float64)
    seen = []
    layer.register_forward_hook(lambda m, a, out: seen.append(out.outputs))
    with torch.no_grad():
        out = layer(x)
        plain = _fresh_copy(layer)(x)
    assert quick["n"] == 2
    assert torch.equal(out.outputs, plain.outputs + 1)
    assert len(seen) == 1 and torch.equal(seen[0], out.outputs)


def test_a_subclass_drawing_its_own_masks_is_asked(quick, steps):
    # masks drawn by a subclass (here zoneout's evaluation mix, without the option set)
    # decide the route, as they did: the quick step does not run past them
    class Zoned(rnnkit.LSTM):
        def draw_masks(self, batch_size, steps, like):
            self.zoneout = 0.25
            try:
                return super().draw_masks(batch_size, steps, like)
            finally:
                self.zoneout = 0.0

    torch.manual_seed(19)
    layer = Zoned(I, H, num_layers=2).double().eval()
    x = torch.randn(B, 1, I, dtype=torch.float64)
    with torch.no_grad():
        got = layer(x)
        expected = _fresh_copy(layer, zoneout=0.25)(x)
    assert quick["n"] == 0 and steps["n"] == 0
    _equal(got, expected)


def test_a_copied_or_reloaded_stack_steps_with_its_own_cells(quick, tmp_path):
    import copy

    gen = torch.Generator().manual_seed(20)
    layer = _layer(rnnkit.LSTM, {}, num_layers=2).eval()
    x = torch.randn(B, 1, I, dtype=torch.float64, generator=gen)
    with torch.no_grad():
        before = layer(x)  # its plan kept
        twin = copy.deepcopy(layer)
        torch.save(layer, tmp_path / "stack.pt")
        loaded = torch.load(tmp_path / "stack.pt", weights_only=False)
        for p in twin.parameters():
            p.mul_(0.5)
        for p in loaded.parameters():
            p.mul_(0.25)
        _equal(layer(x), before)  # the copies' weights are theirs alone
        _equal(twin(x), _fresh_copy(twin)(x))
        _equal(loaded(x), _fresh_copy(loaded)(x))
    assert quick["n"] == 2 + 2 + 2


@pytest.mark.parametrize("update", ["keep", "candidate"])
def test_a_grus_step_keeps_its_converted_weights_only_while_they_hold(update):
    """Without gradients a GRU's step keeps its weights in torch's form between steps
    (a generator's tokens); an in-place update, a dtype move or gradients make them
    afresh, each step equal to the cell's own step."""
    from rnnkit.bptt import fused

    torch.manual_seed(21)
    cell = rnnkit.GRU(I, H, reset="after", update=update).double().cells()[0]
    gen = torch.Generator().manual_seed(22)
    x = torch.randn(B, I, dtype=torch.float64, generator=gen)
    h = torch.randn(B, H, dtype=torch.float64, generator=gen)

    def step(x, h):
        return cell_step(cell.kernel, "gru", x, cell.weights(), (h,))[0]

    def oracle(x, h):
        with use_fused("loop"):
            return cell(x, h)

    with torch.no_grad():
        first = step(x, h)
        kept = fused._gru_kept[cell.weight_hh][1]
        assert torch.equal(step(x, h), first) and fused._gru_kept[cell.weight_hh][1] is kept
        _same([oracle(x, h)], [first])
        cell.weight_hh.mul_(0.5)  # in place, as an optimizer's step
        cell.bias_hn.add_(1.0)
        _same([oracle(x, h)], [step(x, h)])
        assert fused._gru_kept[cell.weight_hh][1] is not kept
        other = "keep" if update == "candidate" else "candidate"
        cell.update = other  # the convention, a plain attribute: the z rows' sign
        _same([oracle(x, h)], [step(x, h)])
        cell.update = update
    cell.float()  # the same Parameters, other storage
    with torch.no_grad():
        _same([oracle(x.float(), h.float())], [step(x.float(), h.float())], tol=1e-6)
    cell.double()
    got = step(x, h)  # gradients: made afresh, autograd through the conversion
    torch.autograd.backward(got, torch.ones_like(got))
    grads = [p.grad.clone() for p in cell.parameters()]
    cell.zero_grad()
    expected = oracle(x, h)
    torch.autograd.backward(expected, torch.ones_like(expected))
    _same([p.grad for p in cell.parameters()], grads)


@pytest.mark.parametrize("name, cls, kw", FORMS, ids=[f[0] for f in FORMS])
def test_under_autocast_the_whole_stack_is_one_fused_call(name, cls, kw, count_calls):
    # mixed-precision training on a GPU: the stack in one cuDNN call in the weights'
    # dtype, as without autocast (not one call per layer and direction)
    from rnnkit.bptt import fused

    calls = count_calls(fused, "_call")
    gen = torch.Generator().manual_seed(6)
    layer = _layer(cls, kw, num_layers=2, bidirectional=True)
    x = torch.randn(B, 7, I, dtype=torch.float64, generator=gen)
    lens = torch.tensor([7, 3, 1, 2, 7])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = _run(layer, x, None, "loop", lengths=lens)
        assert calls["n"] == 0
        got = _run(layer, x, None, "fused", lengths=lens)
    assert calls["n"] == 1
    assert got[0].dtype == torch.float64
    _same(expected, got)
