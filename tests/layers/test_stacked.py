"""The stacked layers: gradcheck of a 2-layer bidirectional stack, windowed BPTT through
the layer, shapes, and every argument error (the message names the argument, what was
expected and what was received)."""

from __future__ import annotations

import pytest
import torch
from torch.autograd.function import BackwardCFunction
from torch.func import functional_call

from rnnkit import GRU, LSTM, RNN, GRUCell, LSTMState, RecurrentOutput, StackedRecurrent
from rnnkit.bptt.recurrence import run_recurrence

pytestmark = pytest.mark.usefixtures("single_thread", "time_loop")

DT = torch.float64
TOL = {"atol": 1e-10, "rtol": 0.0}


def test_gradcheck_stacked_bidirectional(cell_spec, gen):
    B, T, I, H = 3, 4, 2, 2
    layer = cell_spec.layer(I, H, 2, True)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [0, 1, 1, 0]], dtype=torch.bool)
    names = [n for n, _ in layer.named_parameters()]
    params = [p.detach().clone().requires_grad_() for p in layer.parameters()]
    x = torch.randn(B, T, I, generator=gen, dtype=DT, requires_grad=True)
    s0 = [
        torch.randn(2, 2, B, H, generator=gen, dtype=DT, requires_grad=True)
        for _ in range(cell_spec.num_states)
    ]
    n_s = len(s0)

    def f(x, *rest):
        state = cell_spec.pack(tuple(rest[:n_s]))
        res = functional_call(
            layer, dict(zip(names, rest[n_s:], strict=True)), (x,), {"mask": mask, "state": state}
        )
        return (res.outputs, *cell_spec.unpack(res.state))

    # fast mode: a random projection of the full Jacobian (the cell-level gradcheck in
    # test_recurrence.py is the entry-by-entry one)
    assert torch.autograd.gradcheck(
        f, (x, *s0, *params), eps=1e-6, atol=1e-7, rtol=1e-6, fast_mode=True
    )


def test_layer_gradients_come_from_explicit_bptt(cell_spec, gen):
    layer = cell_spec.layer(3, 4, 2, True)
    out = layer(torch.randn(2, 5, 3, generator=gen, dtype=DT)).outputs
    seen, todo, custom = set(), [out.grad_fn], 0
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        custom += isinstance(node, BackwardCFunction)
        todo.extend(n for n, _ in node.next_functions)
    assert custom == 4  # one explicit-BPTT node per layer and direction


def test_output_shapes_and_types(cell_spec, gen):
    for L, bidirectional in ((1, False), (3, True)):
        D = 2 if bidirectional else 1
        layer = cell_spec.layer(3, 4, L, bidirectional)
        assert len(layer.cells()) == L * D
        res = layer(torch.randn(2, 5, 3, generator=gen, dtype=DT))
        assert isinstance(res, RecurrentOutput)
        outputs, state = res  # a NamedTuple unpacks
        assert outputs.shape == (2, 5, D * 4)
        if cell_spec.is_lstm:
            assert isinstance(state, LSTMState)
        else:
            assert isinstance(state, torch.Tensor)
        for s in cell_spec.unpack(state):
            assert s.shape == (L, D, 2, 4)
        # the top layer's final state is the last output (forward) / first output (backward)
        h = cell_spec.unpack(state)[0]
        torch.testing.assert_close(outputs[:, -1, :4], h[-1, 0], **TOL)
        if bidirectional:
            torch.testing.assert_close(outputs[:, 0, 4:], h[-1, 1], **TOL)


def test_state_none_means_zeros(cell_spec, gen):
    layer = cell_spec.layer(3, 4, 2, True)
    x = torch.randn(2, 5, 3, generator=gen, dtype=DT)
    zeros = cell_spec.pack(
        tuple(torch.zeros(2, 2, 2, 4, dtype=DT) for _ in range(cell_spec.num_states))
    )
    with torch.no_grad():
        assert torch.equal(layer(x).outputs, layer(x, state=zeros).outputs)


def test_layer_input_layer_reads_lower_layer(cell_spec, gen):
    """Layer 2 of a stack is a layer run on layer 1's outputs."""
    stack = cell_spec.layer(3, 4, 2, True)
    one = cell_spec.layer(3, 4, 1, True)
    two = cell_spec.layer(8, 4, 1, True)
    cells = stack.cells()
    for c, src in zip(one.cells() + two.cells(), cells, strict=True):
        c.load_state_dict(src.state_dict())
    x = torch.randn(2, 5, 3, generator=gen, dtype=DT)
    lengths = torch.tensor([5, 2])
    with torch.no_grad():
        want = two(one(x, lengths=lengths).outputs, lengths=lengths)
        got = stack(x, lengths=lengths)
    torch.testing.assert_close(got.outputs, want.outputs, **TOL)


# ------------------------------------------------------------------ windowed BPTT


def test_layer_window_equals_run_recurrence_window(cell_spec, gen, holey_mask):
    layer = cell_spec.layer(3, 4)
    cell = layer.cells()[0]
    x = torch.randn(4, 6, 3, generator=gen, dtype=DT, requires_grad=True)
    g = torch.randn(4, 6, 4, generator=gen, dtype=DT)
    (layer(x, mask=holey_mask, window=2).outputs * g).sum().backward()
    got = [x.grad, *(p.grad for p in cell.weights() if p is not None)]
    x2 = x.detach().clone().requires_grad_()
    for p in layer.parameters():
        p.grad = None
    s0 = tuple(torch.zeros(4, 4, dtype=DT) for _ in range(cell_spec.num_states))
    out, _ = run_recurrence(cell.kernel, x2.transpose(0, 1), cell.weights(), s0, holey_mask.T, 2)
    (out.transpose(0, 1) * g).sum().backward()
    want = [x2.grad, *(p.grad for p in cell.weights() if p is not None)]
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, **TOL)


def test_layer_window_at_least_seq_len_is_full(cell_spec, gen):
    # A path of a bidirectional stack can turn at every layer: it crosses at most
    # L·(T − 1) + 1 = 9 steps here (tests/layers/test_windowed.py has the unidirectional T).
    layer = cell_spec.layer(3, 4, 2, True)
    x = torch.randn(2, 5, 3, generator=gen, dtype=DT, requires_grad=True)
    grads = []
    for window in (None, 9, 30):
        out = layer(x, lengths=torch.tensor([5, 3]), window=window)
        grads.append(torch.autograd.grad(out.outputs.sum(), [x, *layer.parameters()]))
    for other in grads[1:]:
        for a, b in zip(other, grads[0], strict=True):
            torch.testing.assert_close(a, b, **TOL)


@pytest.mark.parametrize(
    "window",
    [
        0,
        -2,
        True,
        1.5,
    ],
)
def test_bad_window(window):
    with pytest.raises(ValueError, match="window"):
        RNN(3, 4)(torch.zeros(2, 5, 3), window=window)


# ------------------------------------------------------------------ argument errors

B, T, I, H = 2, 5, 3, 4


def x64(*shape):
    return torch.zeros(*shape, dtype=DT)


@pytest.fixture(params=["rnn", "lstm", "gru"])
def small_layer(request):
    cls = {"rnn": RNN, "lstm": LSTM, "gru": GRU}[request.param]
    return cls(I, H, num_layers=2, bidirectional=True).double()


def test_x_wrong_rank(small_layer):
    with pytest.raises(ValueError, match=r"x must have 3 dimensions \(B, T, I\).*I = 3.*\(2, 3\)"):
        small_layer(x64(B, I))


def test_x_wrong_feature_width(small_layer):
    with pytest.raises(
        ValueError, match=r"x must have shape \(B, T, I\) with I = 3, got \(2, 5, 4\)"
    ):
        small_layer(x64(B, T, 4))


def test_x_not_a_tensor(small_layer):
    with pytest.raises(TypeError, match=r"x must be a torch\.Tensor, got list"):
        small_layer([[[0.0] * I] * T] * B)


def test_lengths_exceeding_seq_len(small_layer):
    with pytest.raises(
        ValueError, match=r"lengths\[1\] = 6 exceeds the number of time steps T = 5"
    ):
        small_layer(x64(B, T, I), lengths=torch.tensor([5, 6]))


def test_negative_lengths(small_layer):
    with pytest.raises(ValueError, match=r"lengths\[0\] = -1 is negative"):
        small_layer(x64(B, T, I), lengths=torch.tensor([-1, 2]))


def test_lengths_wrong_shape(small_layer):
    with pytest.raises(ValueError, match=r"lengths must have shape \(B,\) = \(2,\), got \(3,\)"):
        small_layer(x64(B, T, I), lengths=torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match=r"lengths must have shape \(B,\) = \(2,\), got \(2, 1\)"):
        small_layer(x64(B, T, I), lengths=torch.tensor([[1], [2]]))


def test_lengths_not_integers(small_layer):
    with pytest.raises(TypeError, match=r"lengths must hold integers, got dtype torch\.float32"):
        small_layer(x64(B, T, I), lengths=torch.tensor([1.0, 2.0]))


def test_mask_wrong_shape(small_layer):
    with pytest.raises(ValueError, match=r"mask must have shape \(B, T\) = \(2, 5\), got \(5, 2\)"):
        small_layer(x64(B, T, I), mask=torch.ones(T, B, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"mask must have shape \(B, T\) = \(2, 5\), got \(2, 4\)"):
        small_layer(x64(B, T, I), mask=torch.ones(B, T - 1, dtype=torch.bool))


def test_mask_bad_values(small_layer):
    with pytest.raises(TypeError, match=r"mask must be bool.*float32"):
        small_layer(x64(B, T, I), mask=torch.ones(B, T))
    with pytest.raises(ValueError, match="mask must hold only 0 and 1"):
        small_layer(x64(B, T, I), mask=torch.full((B, T), 2))


def test_both_lengths_and_mask(small_layer):
    with pytest.raises(ValueError, match=r"either lengths or mask, not both"):
        small_layer(
            x64(B, T, I), lengths=torch.tensor([5, 5]), mask=torch.ones(B, T, dtype=torch.bool)
        )


def test_dtype_mismatch():
    layer = LSTM(I, H)  # float32
    with pytest.raises(TypeError, match=r"x is torch\.float64.*parameters are torch\.float32"):
        layer(x64(B, T, I))


def test_wrong_state_shape(small_layer):
    n = 2 if isinstance(small_layer, LSTM) else 1
    bad = [x64(2, 1, B, H) for _ in range(n)]
    state = LSTMState(*bad) if n == 2 else bad[0]
    name = "state.h" if n == 2 else "state"
    with pytest.raises(
        ValueError,
        match=rf"{name} must have shape \(L, D, B, H\) = \(2, 2, 2, 4\), got \(2, 1, 2, 4\)",
    ):
        small_layer(x64(B, T, I), state=state)


def test_lstm_state_c_wrong_shape():
    layer = LSTM(I, H, 2, True).double()
    state = LSTMState(x64(2, 2, B, H), x64(2, 2, B, H + 1))
    with pytest.raises(ValueError, match=r"state\.c must have shape .* got \(2, 2, 2, 5\)"):
        layer(x64(B, T, I), state=state)


def test_state_dtype_mismatch():
    layer = GRU(I, H).double()
    with pytest.raises(TypeError, match=r"state is torch\.float32"):
        layer(x64(B, T, I), state=torch.zeros(1, 1, B, H))


@pytest.mark.parametrize("kind", ["tensor", "tuple"])
def test_lstm_layer_needs_lstm_state(kind):
    layer = LSTM(I, H).double()
    h = x64(1, 1, B, H)
    state = h if kind == "tensor" else (h, h.clone())
    with pytest.raises(TypeError, match=r"LSTMState\(h, c\)"):
        layer(x64(B, T, I), state=state)


def test_gru_layer_rejects_a_pair_state():
    with pytest.raises(TypeError, match=r"one tensor \(L, D, B, H\)"):
        GRU(I, H).double()(x64(B, T, I), state=LSTMState(x64(1, 1, B, H), x64(1, 1, B, H)))


def test_resets_errors():
    layer = GRU(I, H, 2).double()
    with pytest.raises(TypeError, match=r"resets must be bool, got dtype torch\.int64"):
        layer(x64(B, T, I), resets=torch.zeros(B, T, dtype=torch.long))
    with pytest.raises(
        ValueError, match=r"resets must have shape \(B, T\) = \(2, 5\), got \(5, 2\)"
    ):
        layer(x64(B, T, I), resets=torch.zeros(T, B, dtype=torch.bool))
    with pytest.raises(TypeError, match=r"resets must be a torch\.Tensor, got list"):
        layer(x64(B, T, I), resets=[[False] * T] * B)
    with pytest.raises(ValueError, match="resets need a unidirectional stack"):
        GRU(I, H, bidirectional=True).double()(
            x64(B, T, I), resets=torch.ones(B, T, dtype=torch.bool)
        )


def test_resets_time_major_and_window(gen):
    """``batch_first=False`` takes ``resets (T, B)``; the window changes no value."""
    layer = LSTM(I, H, 2, batch_first=False).double()
    x = torch.randn(T, B, I, generator=gen, dtype=DT, requires_grad=True)
    resets = torch.zeros(T, B, dtype=torch.bool)
    resets[2, 1] = True
    pieces = layer(x, resets=resets)
    windowed = layer(x, resets=resets, window=2)
    torch.testing.assert_close(windowed.outputs, pieces.outputs, **TOL)
    # row 1 restarts at step 2: its outputs there equal a fresh run of steps 2…
    fresh = layer(x[2:, 1:2]).outputs
    torch.testing.assert_close(pieces.outputs[2:, 1:2], fresh, **TOL)


@pytest.mark.parametrize("num_layers", [0, -1, 1.5, True])
def test_bad_num_layers(num_layers):
    with pytest.raises(ValueError, match="num_layers"):
        RNN(I, H, num_layers=num_layers)


# ------------------------------------------------------------------ empty batch


def test_empty_batch_forward(cell_spec):
    """A (0, T, I) batch runs, as in torch.nn."""
    layer = cell_spec.layer(3, 4, 2, True)
    res = layer(torch.zeros(0, 5, 3, dtype=DT))
    assert res.outputs.shape == (0, 5, 8)
    for s in cell_spec.unpack(res.state):
        assert s.shape == (2, 2, 0, 4)


@pytest.mark.parametrize("window", [None, 2])
def test_empty_batch_backward(cell_spec, window):
    layer = cell_spec.layer(3, 4, 2)
    x = torch.zeros(0, 5, 3, dtype=DT, requires_grad=True)
    layer(x, window=window).outputs.sum().backward()
    assert x.grad.shape == (0, 5, 3)
    assert all(torch.count_nonzero(p.grad) == 0 for p in layer.parameters())


def test_a_projected_input_is_read_not_written():
    """The caller's projections — here gathered time-major and passed as a batch-first
    view, as a language model does, so that no copy comes between — are left as they
    were, and the outputs and gradients are those of the embeddings' own product."""
    from rnnkit import LSTM
    from rnnkit.bptt.native import available

    if not available():
        pytest.skip("no compiled loop here")
    torch.manual_seed(0)
    stack = LSTM(5, 8).double()
    emb = torch.randn(11, 5, dtype=DT, requires_grad=True)
    tokens = torch.randint(0, 11, (3, 7))
    table = stack.input_table(emb)
    xp_tm = table[tokens.T]  # (T, B, 4H)
    before = xp_tm.detach().clone()
    out = stack(xp_tm.transpose(0, 1), projected=True).outputs
    assert torch.equal(xp_tm.detach(), before)
    ref = stack(emb[tokens]).outputs
    torch.testing.assert_close(out, ref)
    g = torch.randn_like(out)
    d_emb = torch.autograd.grad(out, emb, g)[0]
    torch.testing.assert_close(d_emb, torch.autograd.grad(ref, emb, g)[0])


def test_projected_input_is_refused_where_it_does_not_apply():
    from rnnkit import LSTM
    from rnnkit.bptt.native import available, use_native

    if not available():
        pytest.skip("no compiled loop here")
    torch.manual_seed(0)
    stack = LSTM(5, 8)
    table = stack.input_table(torch.randn(11, 5))
    assert table.shape == (11, 32)
    xp = table[torch.randint(0, 11, (2, 6))]
    assert stack(xp, projected=True).outputs.shape == (2, 6, 8)
    with pytest.raises(ValueError, match="I = 32"):
        stack(torch.randn(2, 6, 5), projected=True)  # the embeddings, not their product
    with pytest.raises(ValueError, match="projected=True needs"):
        stack(xp, projected=True, window=2)
    with use_native(False), pytest.raises(ValueError, match="projected=True needs"):
        stack(xp, projected=True)
    both = LSTM(5, 8, bidirectional=True)
    assert not both.takes_projected(xp)


def test_dropout_between_layers_draws_the_same_masks_on_either_loop():
    """The compiled loop hands a batch-first stack's outputs on in the batch-first layout;
    nn.Dropout draws its mask in memory order, so the stack applies it over (T, B, ·)
    whatever the layout: the same seed gives the same masks, outputs and gradients on the
    compiled loop, on the PyTorch loop and with recomputation (the random draws, and so a
    trained model, do not depend on the loop or path taken)."""
    from rnnkit.bptt import native

    if not native.available():
        pytest.skip("no compiled loop here")
    B, T, I, H = 8, 6, 5, 7
    layer = LSTM(I, H, num_layers=3, dropout=0.5, batch_first=True).train()
    x = torch.randn(B, T, I, generator=torch.Generator().manual_seed(2), requires_grad=True)
    weight = torch.randn(B, T, H, generator=torch.Generator().manual_seed(3))
    runs = []
    for compiled, recompute in ((True, None), (False, None), (True, 2)):
        layer.recompute = recompute
        torch.manual_seed(7)
        with native.use_native(compiled):
            h = layer(x).outputs
            grads = torch.autograd.grad((h * weight).sum(), [x, *layer.parameters()])
        runs.append([h.detach(), *grads])
    for other in runs[1:]:
        for a, b in zip(runs[0], other, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_the_kept_cells_follow_a_replaced_layer_and_a_copy():
    """A stack keeps its list of cells between calls; a layer replaced in ``layers`` is
    listed again, and a copy (``copy.deepcopy``, ``torch.save``/``load``) lists its own."""
    import copy
    import io

    from rnnkit.cells.lstm import LSTMCell
    from rnnkit.layers.recurrent import Recurrent

    torch.manual_seed(0)
    stack = LSTM(3, 4, num_layers=2, batch_first=False)
    x = torch.randn(5, 2, 3)
    before = stack(x).outputs
    new_cell = LSTMCell(4, 4)
    stack.layers[1] = Recurrent(new_cell)
    assert stack.cells()[1] is new_cell
    assert stack.cells() == [m for m in stack.modules() if isinstance(m, LSTMCell)]
    after = stack(x).outputs
    assert not torch.equal(before, after)
    # the oracle: the two layers run one after the other by hand
    h1, _ = run_recurrence(
        stack.cells()[0].kernel,
        x,
        stack.cells()[0].weights(),
        (torch.zeros(2, 4), torch.zeros(2, 4)),
    )
    h2, _ = run_recurrence(
        new_cell.kernel, h1, new_cell.weights(), (torch.zeros(2, 4), torch.zeros(2, 4))
    )
    torch.testing.assert_close(after, h2)
    buffer = io.BytesIO()
    torch.save(stack, buffer)
    buffer.seek(0)
    for twin in (copy.deepcopy(stack), torch.load(buffer, weights_only=False)):
        own = [m for m in twin.modules() if isinstance(m, LSTMCell)]
        assert twin.cells() == own and not set(map(id, own)) & set(map(id, stack.cells()))
        with torch.no_grad():
            own[0].weight_hh.add_(1.0)  # the copy runs its own weights
        assert not torch.equal(twin(x).outputs, after)
        torch.testing.assert_close(stack(x).outputs, after)


@pytest.mark.parametrize("name", ["bidirectional", "batch_first"])
@pytest.mark.parametrize("flag", ["no", 1, None])
def test_the_switches_take_a_bool_only(name, flag):
    # "no" is truthy: bidirectional="no" built a bidirectional stack without a word
    from rnnkit.errors import ConfigError

    with pytest.raises(ConfigError, match=f"^{name} must be True or False, got {flag!r}$"):
        LSTM(3, 4, **{name: flag})


@pytest.mark.parametrize("kind", [RNN, LSTM, GRU])
def test_dropout_of_a_single_layer_is_said_to_do_nothing(kind, recwarn):
    """As ``torch.nn.LSTM`` warns: between-layer dropout on one layer drops nothing (the
    warning points at the caller's line and names what acts on one layer)."""
    with pytest.warns(UserWarning, match=r"^dropout=0\.5 does nothing with num_layers=1: ") as w:
        layer = kind(3, 4, dropout=0.5)
    assert w[0].filename == __file__ and layer.dropout == 0.5
    kind(3, 4, num_layers=2, dropout=0.5)  # between two layers: no warning
    kind(3, 4, dropout=0.0, output_dropout=0.5)
    assert not recwarn.list


def test_the_dropout_warning_names_the_users_line_through_any_subclass():
    class Mine(StackedRecurrent):  # no __init__ of its own
        pass

    with pytest.warns(UserWarning, match="does nothing with num_layers=1") as w:
        Mine(lambda width: GRUCell(width, 4), 3, 4, 1, False, 0.5)
    assert w[0].filename == __file__


def test_the_users_line_is_found_by_module_name_not_by_file():
    """An install of .pyc files compiled elsewhere (PyInstaller, ``compileall -d``) names
    rnnkit's frames by their compile-time paths: a frame of an rnnkit module there is
    still rnnkit's, and the warning passes it."""
    source = (
        "def make():\n    return StackedRecurrent(lambda w: GRUCell(w, 4), 3, 4, 1, False, 0.5)\n"
    )
    module = {"__name__": "rnnkit.elsewhere", "StackedRecurrent": StackedRecurrent}
    module["GRUCell"] = GRUCell
    exec(compile(source, "/built/elsewhere/rnnkit/elsewhere.py", "exec"), module)
    with pytest.warns(UserWarning, match="does nothing with num_layers=1") as w:
        module["make"]()
    assert w[0].filename == __file__
