"""The regularizers of a stack: the masks outside the loop (input, locked, output dropout,
weight drop) against the same computation written with plain stacks and products, the
evaluation (no mask; zoneout's expectation), p = 0, seeding, the fused path, refusals."""

from __future__ import annotations

import pytest
import torch

from rnnkit import GRU, LSTM, RNN, LSTMState
from rnnkit.bptt import fused
from rnnkit.bptt.fused import use_fused
from rnnkit.errors import ConfigError
from rnnkit.layers.regularization import (
    CellMasks,
    DropoutEmbedding,
    StackMasks,
    check_probability,
    dropout_mask,
    embedding_dropout,
)

pytestmark = pytest.mark.usefixtures("single_thread", "time_loop")

B, T, I, H = 3, 5, 2, 4
OPTIONS = ("input_dropout", "locked_dropout", "output_dropout", "recurrent_dropout")
ALL = (*OPTIONS, "weight_drop", "zoneout")


def _copy(src, dst):
    dst.load_state_dict(src.state_dict())
    return dst


def _grads(out, inputs, gen):
    g = torch.randn(out.shape, generator=gen, dtype=out.dtype)
    return torch.autograd.grad(out, inputs, g)


@pytest.mark.parametrize("cls", [LSTM, GRU, RNN])
def test_outside_masks_equal_plain_layers_and_products(cls, gen):
    """input, locked and output dropout and weight drop of a 2-layer stack, fixed masks,
    equal the plain one-layer stacks fed the masked tensors, with every gradient."""
    torch.manual_seed(0)
    kw = {k: 0.5 for k in ("input_dropout", "locked_dropout", "output_dropout", "weight_drop")}
    stack = cls(I, H, num_layers=2, **kw).double()
    bottom = _copy_layer(stack, 0, cls(I, H).double())
    top = _copy_layer(stack, 1, cls(H, H).double())
    x = torch.randn(B, T, I, generator=gen, dtype=torch.float64, requires_grad=True)

    def mask(*shape):
        return dropout_mask(shape, 0.5, x)

    cells = tuple(CellMasks(mask(*c.weight_hh.shape), None, None) for c in stack.cells())
    masks = StackMasks(mask(B, I), (None, mask(B, H)), mask(B, H), cells)
    got = stack(x, masks=masks).outputs
    # the reference: each layer's weight_hh replaced by the masked one (a plain product)
    for layer, m in ((bottom, cells[0]), (top, cells[1])):
        cell = layer.cells()[0]
        w = cell.weight_hh.detach() * m.weight_hh
        del cell.weight_hh
        cell.weight_hh = w.requires_grad_()
    h = bottom(x * masks.input[:, None]).outputs
    want = top(h * masks.between[1][:, None]).outputs * masks.output[:, None]
    torch.testing.assert_close(got, want)
    ours = _grads(got, [x, *stack.parameters()], torch.Generator().manual_seed(5))
    ref_params = []
    for layer in (bottom, top):
        c = layer.cells()[0]
        ref_params += [c.weight_ih, c.weight_hh, c.bias] + (
            [c.bias_hn] if getattr(c, "bias_hn", None) is not None else []
        )
    theirs = _grads(want, [x, *ref_params], torch.Generator().manual_seed(5))
    torch.testing.assert_close(ours[0], theirs[0])
    # weight_hh: ∂L/∂W = ∂L/∂(W ⊙ M) ⊙ M
    names = [n for n, _ in stack.named_parameters()]
    flat = dict(zip(names, ours[1:], strict=True))
    ref_iter = iter(theirs[1:])
    for index, m in enumerate(cells):
        prefix = f"layers.{index}.cell."
        layer_names = [n for n in names if n.startswith(prefix)]
        for n in layer_names:
            ref = next(ref_iter)
            if n.endswith("weight_hh"):
                ref = ref * m.weight_hh
            torch.testing.assert_close(flat[n], ref)


def _copy_layer(stack, index, layer):
    src = stack.layers[index].cell
    layer.layers[0].cell.load_state_dict(src.state_dict())
    return layer


@pytest.mark.parametrize("cls", [LSTM, GRU, RNN])
def test_probability_zero_is_the_plain_layer_exactly(cls, gen):
    torch.manual_seed(1)
    plain = cls(I, H, num_layers=2).double()
    zero = _copy(plain, cls(I, H, num_layers=2, **dict.fromkeys(ALL, 0.0)).double())
    x = torch.randn(B, T, I, generator=gen, dtype=torch.float64)
    assert zero.draw_masks(B, T, x) is None
    assert torch.equal(plain(x).outputs, zero(x).outputs)


@pytest.mark.parametrize("cls", [LSTM, GRU, RNN])
def test_evaluation_uses_no_dropout_mask_and_is_deterministic(cls, gen):
    torch.manual_seed(2)
    plain = cls(I, H, num_layers=2).double().eval()
    kw = dict.fromkeys((*OPTIONS, "weight_drop"), 0.5)
    reg = _copy(plain, cls(I, H, num_layers=2, **kw).double()).eval()
    x = torch.randn(B, T, I, generator=gen, dtype=torch.float64)
    assert torch.equal(reg(x).outputs, plain(x).outputs)
    reg.train()
    assert not torch.equal(reg(x).outputs, plain(x).outputs)


@pytest.mark.parametrize("cls", [LSTM, GRU, RNN])
def test_zoneout_at_evaluation_is_the_expectation(cls, gen):
    """At evaluation h_t = p h_{t-1} + (1 − p) h̃_t: the layer with the constant factor p
    passed as its mask, run twice (deterministic)."""
    torch.manual_seed(3)
    layer = cls(I, H, zoneout=0.3).double()
    x = torch.randn(B, T, I, generator=gen, dtype=torch.float64)
    layer.eval()
    first, second = layer(x).outputs, layer(x).outputs
    assert torch.equal(first, second)
    n = 2 if cls is LSTM else 1
    keep = tuple(torch.full((T, B, H), 0.3, dtype=torch.float64) for _ in range(n))
    fixed = StackMasks(None, (None,), None, (CellMasks(None, None, keep),))
    torch.testing.assert_close(first, layer(x, masks=fixed).outputs)
    # and it differs from the plain step (p = 0 mixes nothing in)
    plain = _copy(layer, cls(I, H).double()).eval()
    assert not torch.allclose(first, plain(x).outputs)


def test_seeded_training_runs_draw_the_same_masks(gen):
    x = torch.randn(B, T, I, generator=gen, dtype=torch.float64)
    layer = LSTM(I, H, num_layers=2, **dict.fromkeys(ALL, 0.3)).double()
    torch.manual_seed(7)
    a = layer(x).outputs
    torch.manual_seed(7)
    b = layer(x).outputs
    c = layer(x).outputs
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_masks_are_per_sequence_and_scaled(gen):
    layer = GRU(I, H, num_layers=3, bidirectional=True, **dict.fromkeys(ALL, 0.25)).double()
    x = torch.zeros(T, B, I, dtype=torch.float64)
    torch.manual_seed(0)
    masks = layer.draw_masks(B, T, x)
    assert masks is not None
    assert masks.input.shape == (B, I) and masks.output.shape == (B, 2 * H)
    assert masks.between[0] is None and all(m.shape == (B, 2 * H) for m in masks.between[1:])
    assert len(masks.cells) == 6
    for m in (masks.input, masks.output, *masks.between[1:], *(c.recurrent for c in masks.cells)):
        assert set(m.unique().tolist()) <= {0.0, 1 / 0.75}
    for c in masks.cells:
        assert c.weight_hh.shape == (3 * H, H) and c.keep[0].shape == (T, B, H)
        assert set(c.keep[0].unique().tolist()) <= {0.0, 1.0}


def test_mask_mean_is_one():
    torch.manual_seed(0)
    m = dropout_mask((200, 500), 0.3, torch.zeros(()))
    assert abs(m.mean().item() - 1.0) < 0.01
    assert abs((m == 0).double().mean().item() - 0.3) < 0.01


def test_embedding_dropout_drops_whole_rows_and_rescales():
    torch.manual_seed(0)
    w = torch.randn(50, 6)
    dropped = embedding_dropout(w, 0.4, training=True)
    zero_rows = (dropped == 0).all(1)
    assert 0 < int(zero_rows.sum()) < 50
    torch.testing.assert_close(dropped[~zero_rows], w[~zero_rows] / 0.6)
    assert embedding_dropout(w, 0.4, training=False) is w


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("value", [-0.1, 1.0, 1.5, True, "0.2"])
def test_bad_probabilities_are_one_config_error(name, value):
    with pytest.raises(ConfigError, match=f"^{name} must be a probability in \\[0, 1\\), got"):
        LSTM(I, H, **{name: value})


def test_check_probability_accepts_the_range():
    assert check_probability("p", 0) == 0.0 and check_probability("p", 0.99) == 0.99


@pytest.mark.parametrize("name", ["recurrent_dropout", "zoneout", "weight_drop"])
def test_one_layer_under_a_window_is_the_stacks_windowed_node(name, gen):
    """The layer alone (``Recurrent``, the one-unit sweep) and the stack's windowed node
    take the same masks under a window: the same outputs and gradients."""
    layer = LSTM(I, H, **{name: 0.3}).double()
    x = torch.randn(B, T, I, generator=gen, dtype=torch.float64, requires_grad=True)
    masks = layer.draw_masks(B, T, x)
    out = layer(x, window=2, masks=masks).outputs
    alone, _ = layer.layers[0](x.transpose(0, 1), window=2, masks=masks.cells[0])
    g = torch.randn(out.shape, generator=gen, dtype=out.dtype)
    params = [x, *layer.parameters()]
    torch.testing.assert_close(alone.transpose(0, 1), out, rtol=0, atol=1e-14)
    for a, b in zip(
        torch.autograd.grad(out, params, g),
        torch.autograd.grad(alone.transpose(0, 1), params, g),
        strict=True,
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-13)


@pytest.mark.parametrize(
    ("cls", "options"),
    [(LSTM, {}), (GRU, {"reset": "before"}), (RNN, {}), (LSTM, {"layer_norm": True})],
    ids=["lstm", "gru-before", "rnn", "ln-lstm"],
)
@pytest.mark.parametrize("name", ["recurrent_dropout", "zoneout", "all"])
def test_in_loop_options_under_recompute_equal_full_bptt(cls, options, name, gen):
    """Segments of 2 over 5 steps (the last one short), each recomputed with its own
    steps' zoneout factors and the rows' recurrent mask: the outputs, states and gradients
    of full BPTT with the same masks (two layers, both directions, a hole)."""
    chosen = {"recurrent_dropout": 0.3, "zoneout": 0.2, "weight_drop": 0.2}
    if name != "all":
        chosen = {name: chosen[name]}
    layer = cls(I, H, num_layers=2, bidirectional=True, **chosen, **options).double()
    x = torch.randn(B, T, I, generator=gen, dtype=torch.float64, requires_grad=True)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, 2] = mask[2, 3:] = False
    masks = layer.draw_masks(B, T, x)
    results = []
    for segment in (None, 2):
        layer.recompute = segment
        out = layer(x, mask=mask, masks=masks)
        g = torch.randn(
            out.outputs.shape, generator=torch.Generator().manual_seed(1), dtype=x.dtype
        )
        loss = (out.outputs * g).sum() + (out.state[0] ** 2).sum()
        results.append([out.outputs, *torch.autograd.grad(loss, [x, *layer.parameters()])])
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_locked_dropout_in_the_windowed_stack_is_the_same_multiplier(gen):
    """Under a window, locked/input/output dropout multiply the same tensors: the
    outputs equal the full-BPTT forward with the same masks (a window changes only
    gradients)."""
    layer = LSTM(I, H, num_layers=2, **dict.fromkeys(OPTIONS[:3], 0.5)).double()
    x = torch.randn(B, T, I, generator=gen, dtype=torch.float64, requires_grad=True)
    masks = layer.draw_masks(B, T, x)
    windowed = layer(x, window=2, masks=masks).outputs
    full = layer(x, masks=masks).outputs
    torch.testing.assert_close(windowed, full)


def test_resets_keep_one_mask_per_sequence(gen):
    """Document starts split the batch into pieces: the pieces use the same per-sequence
    masks and their steps' zoneout factors."""
    layer = GRU(I, H, **dict.fromkeys(ALL, 0.3)).double()
    x = torch.randn(B, T, I, generator=gen, dtype=torch.float64)
    masks = layer.draw_masks(B, T, x)
    resets = torch.zeros(B, T, dtype=torch.bool)
    resets[1, 2] = True
    got = layer(x, resets=resets, masks=masks).outputs
    # row 0 never resets: the same as running it alone with its masks
    alone = layer(x, masks=masks).outputs
    torch.testing.assert_close(got[0], alone[0])
    torch.testing.assert_close(got[1, :2], alone[1, :2])


def test_only_input_dropout_in_training_refuses_a_projected_input():
    from rnnkit.bptt.native import available

    like = torch.zeros(3, 70)
    layer = LSTM(70, 8, input_dropout=0.2)
    assert not layer.takes_projected(like)  # its mask is on the input, not its product
    if not available():
        pytest.skip("no compiled loop here")
    assert layer.eval().takes_projected(like)
    for option in ("recurrent_dropout", "zoneout", "weight_drop"):
        assert LSTM(70, 8, **{option: 0.2}).takes_projected(like)


def test_weight_drop_runs_fused_with_the_masked_weight(count_calls, gen):
    count = count_calls(fused, "_call")
    layer = LSTM(I, H, num_layers=2, weight_drop=0.5).double()
    x = torch.randn(B, T, I, generator=gen, dtype=torch.float64, requires_grad=True)
    masks = layer.draw_masks(B, T, x)
    with use_fused("fused"):
        a = layer(x, masks=masks).outputs
    assert count["n"] == 2
    ga = _grads(a, [x, *layer.parameters()], torch.Generator().manual_seed(1))
    with use_fused("loop"):
        b = layer(x, masks=masks).outputs
    gb = _grads(b, [x, *layer.parameters()], torch.Generator().manual_seed(1))
    torch.testing.assert_close(a, b)
    for u, v in zip(ga, gb, strict=True):
        torch.testing.assert_close(u, v)


@pytest.mark.parametrize("name", ["recurrent_dropout", "zoneout"])
def test_in_loop_options_refuse_the_fused_path(name, count_calls, gen):
    """Forced to the fused path, a layer with these options runs the PyTorch loop (the
    fused kernels do not compute its function) and equals the loop's result."""
    count = count_calls(fused, "_call")
    layer = LSTM(I, H, **{name: 0.5}).double()
    x = torch.randn(B, T, I, generator=gen, dtype=torch.float64)
    masks = layer.draw_masks(B, T, x)
    with use_fused("fused"):
        a = layer(x, masks=masks).outputs
    assert count["n"] == 0
    with use_fused("loop"):
        b = layer(x, masks=masks).outputs
    assert torch.equal(a, b)


def test_lstm_state_is_zoned_on_h_and_c(gen):
    layer = LSTM(I, H, zoneout=0.5).double()
    x = torch.randn(B, T, I, generator=gen, dtype=torch.float64)
    ones = torch.ones(T, B, H, dtype=torch.float64)
    s0 = LSTMState(
        torch.randn(1, 1, B, H, dtype=torch.float64), torch.randn(1, 1, B, H, dtype=torch.float64)
    )
    keep_all = StackMasks(None, (None,), None, (CellMasks(None, None, (ones, ones)),))
    out = layer(x, state=s0, masks=keep_all)
    torch.testing.assert_close(out.state.h, s0.h)  # every unit kept at every step
    torch.testing.assert_close(out.state.c, s0.c)


def test_dropout_embedding_gradient_is_that_of_the_masked_rows(gen):
    """Training: the lookup of ``diag(m) E`` with the row mask drawn from the same seed;
    the gradient reaches only the kept rows, scaled; evaluation: nn.Embedding's."""
    emb = DropoutEmbedding(12, 3, dropout=0.5).double()
    ids = torch.randint(0, 12, (4, 6), generator=gen)
    torch.manual_seed(4)
    out = emb(ids)
    torch.manual_seed(4)
    mask = dropout_mask((12, 1), 0.5, emb.weight)
    weight = emb.weight.detach().clone().requires_grad_()
    want = torch.nn.functional.embedding(ids, weight * mask)
    torch.testing.assert_close(out, want)
    g = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    (got,) = torch.autograd.grad(out, emb.weight, g)
    (ref,) = torch.autograd.grad(want, weight, g)
    torch.testing.assert_close(got, ref)
    emb.eval()
    plain = torch.nn.Embedding(12, 3).double()
    plain.load_state_dict(emb.state_dict())
    assert torch.equal(emb(ids), plain(ids))


def test_to_torch_refuses_what_torch_nn_lacks():
    from rnnkit.layers.interop import to_torch

    with pytest.raises(ValueError, match=r"no zoneout=0\.2"):
        to_torch(LSTM(I, H, zoneout=0.2).eval())
    with pytest.raises(ValueError, match=r"no weight_drop=0\.3 in training"):
        to_torch(LSTM(I, H, weight_drop=0.3))
    layer = LSTM(I, H, weight_drop=0.3, recurrent_dropout=0.1).eval()
    x = torch.randn(B, T, I)
    torch.testing.assert_close(layer(x).outputs, to_torch(layer)(x)[0])


@pytest.mark.parametrize("cls", [LSTM, GRU, RNN])
def test_gradcheck_bidirectional_stack_with_every_regularizer(cls, holey_mask):
    """Central finite differences in float64 over the input, the initial state and every
    parameter of a 2-layer bidirectional stack with holes in its mask and all six
    regularizers at fixed masks (the reverse directions and the locked layer between)."""
    from torch.func import functional_call

    torch.manual_seed(0)
    Bn, Tn = holey_mask.shape
    layer = cls(2, 2, num_layers=2, bidirectional=True, **dict.fromkeys(ALL, 0.3)).double()
    x = torch.randn(Bn, Tn, 2, dtype=torch.float64, requires_grad=True)
    masks = layer.draw_masks(Bn, Tn, x)
    n_s = 2 if cls is LSTM else 1
    s0 = [torch.randn(2, 2, Bn, 2, dtype=torch.float64, requires_grad=True) for _ in range(n_s)]
    names = [n for n, _ in layer.named_parameters()]
    params = [p.detach().clone().requires_grad_() for p in layer.parameters()]

    def f(x, *rest):
        state = LSTMState(*rest[:n_s]) if cls is LSTM else rest[0]
        out = functional_call(
            layer,
            dict(zip(names, rest[n_s:], strict=True)),
            (x,),
            {"mask": holey_mask, "state": state, "masks": masks},
        )
        finals = tuple(out.state) if cls is LSTM else (out.state,)
        return (out.outputs, *finals)

    assert torch.autograd.gradcheck(f, (x, *s0, *params), eps=1e-6, atol=1e-6)


def test_the_repr_names_the_regularizers_in_force():
    assert "zoneout=0.1" in repr(GRU(I, H, zoneout=0.1))
    assert "zoneout" not in repr(GRU(I, H)) and "weight_drop" not in repr(GRU(I, H))


def test_given_masks_of_the_wrong_shape_are_one_config_error():
    layer = LSTM(I, H, num_layers=2, zoneout=0.2)
    x = torch.zeros(B, T, I)
    masks = layer.draw_masks(B, T, x)
    message = r"masks.cells\[0\].keep must have shape \(4, 3, 4\), got \(5, 3, 4\)"
    with pytest.raises(ConfigError, match=message):
        layer(x[:, :4], masks=masks)
    with pytest.raises(ConfigError, match="this stack has 1 and 1"):
        LSTM(I, H)(x, masks=masks)
    with pytest.raises(ConfigError, match="masks must be a StackMasks"):
        layer(x, masks=(None,))
