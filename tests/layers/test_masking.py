"""Padding, masks and directions at the layer level, for every cell variant (docs/math.md,
"Sequences, padding and masks").

* the stacked (bidirectional) layer equals the plain oracle (conftest ``run_layer``) with a
  mask that has holes and a zero-length row: outputs, final states, all gradients;
* a padded batch equals each sequence run alone; garbage (1e30, NaN, inf) in the padding
  changes nothing;
* the reverse direction reads each sequence from its own last step;
* zero-length rows keep the initial state, holes hold it;
* the helpers of ``rnnkit.layers.masking``.
"""

from __future__ import annotations

import pytest
import torch

from rnnkit.layers.masking import flip_sequences, lengths_to_mask, resolve_mask

pytestmark = pytest.mark.usefixtures("single_thread", "time_loop")

DT = torch.float64
TOL = {"atol": 1e-10, "rtol": 0.0}
B, T, I, H = 4, 6, 3, 4
CONFIGS = [(1, False), (1, True), (2, True)]
LENGTHS = torch.tensor([6, 3, 0, 5])


def random_state(spec, L, D, gen, batch=B):
    return tuple(
        torch.randn(L, D, batch, H, generator=gen, dtype=DT).requires_grad_()
        for _ in range(spec.num_states)
    )


def masked_loss(spec, res, mask, g_out, g_fin):
    loss = (res.outputs * mask[..., None] * g_out).sum()
    for f, g in zip(spec.unpack(res.state), g_fin, strict=True):
        loss = loss + (f * g).sum()
    return loss


@pytest.mark.parametrize(("num_layers", "bidirectional"), CONFIGS, ids=str)
def test_layer_equals_oracle_with_holes(cell_spec, gen, holey_mask, num_layers, bidirectional):
    L, D = num_layers, 2 if bidirectional else 1
    layer = cell_spec.layer(I, H, L, bidirectional)
    x = torch.randn(B, T, I, generator=gen, dtype=DT, requires_grad=True)
    s0 = random_state(cell_spec, L, D, gen)
    g_out = torch.randn(B, T, D * H, generator=gen, dtype=DT)
    g_fin = [torch.randn(L, D, B, H, generator=gen, dtype=DT) for _ in s0]
    params = list(layer.parameters())

    res = layer(x, mask=holey_mask, state=cell_spec.pack(s0))
    got = torch.autograd.grad(
        masked_loss(cell_spec, res, holey_mask, g_out, g_fin), [x, *s0, *params]
    )
    ref_out, ref_fin = cell_spec.run_layer(layer, x, holey_mask, cell_spec.pack(s0))
    ref = type(res)(ref_out, cell_spec.pack(ref_fin))
    want = torch.autograd.grad(
        masked_loss(cell_spec, ref, holey_mask, g_out, g_fin), [x, *s0, *params]
    )
    m = holey_mask[..., None]
    torch.testing.assert_close(res.outputs * m, ref_out * m, **TOL)
    # the forward direction's outputs at masked steps are the held state
    torch.testing.assert_close(res.outputs[..., :H], ref_out[..., :H], **TOL)
    for a, b in zip(cell_spec.unpack(res.state), ref_fin, strict=True):
        torch.testing.assert_close(a, b, **TOL)
    names = ["x"] + [f"state0[{k}]" for k in range(len(s0))]
    names += [n for n, _ in layer.named_parameters()]
    for name, a, b in zip(names, got, want, strict=True):
        torch.testing.assert_close(a, b, **TOL, msg=lambda msg, n=name: f"grad of {n}: {msg}")


@pytest.mark.parametrize(("num_layers", "bidirectional"), CONFIGS, ids=str)
def test_padded_batch_equals_each_sequence_alone(cell_spec, gen, num_layers, bidirectional):
    L, D = num_layers, 2 if bidirectional else 1
    layer = cell_spec.layer(I, H, L, bidirectional)
    x = torch.randn(B, T, I, generator=gen, dtype=DT, requires_grad=True)
    s0 = random_state(cell_spec, L, D, gen)
    g_out = torch.randn(B, T, D * H, generator=gen, dtype=DT)
    g_fin = [torch.randn(L, D, B, H, generator=gen, dtype=DT) for _ in s0]
    mask = lengths_to_mask(LENGTHS, T)
    params = list(layer.parameters())

    res = layer(x, lengths=LENGTHS, state=cell_spec.pack(s0))
    batch_grads = torch.autograd.grad(masked_loss(cell_spec, res, mask, g_out, g_fin), [x, *params])
    param_sum = [torch.zeros_like(p) for p in params]
    for b in range(B):
        n = int(LENGTHS[b])
        if n == 0:
            continue
        xb = x.detach()[b : b + 1, :n].clone().requires_grad_()
        sb = cell_spec.pack(tuple(s[:, :, b : b + 1] for s in s0))
        alone = layer(xb, state=sb)
        torch.testing.assert_close(res.outputs[b, :n], alone.outputs[0], **TOL)
        for a, c in zip(cell_spec.unpack(res.state), cell_spec.unpack(alone.state), strict=True):
            torch.testing.assert_close(a[:, :, b], c[:, :, 0], **TOL)
        loss_b = (alone.outputs[0] * g_out[b, :n]).sum()
        for f, g in zip(cell_spec.unpack(alone.state), g_fin, strict=True):
            loss_b = loss_b + (f[:, :, 0] * g[:, :, b]).sum()
        gx, *gp = torch.autograd.grad(loss_b, [xb, *params])
        torch.testing.assert_close(batch_grads[0][b, :n], gx[0], **TOL)
        for acc, g in zip(param_sum, gp, strict=True):
            acc += g
    assert torch.count_nonzero(batch_grads[0][~mask]) == 0  # padding gets no gradient
    for a, b in zip(batch_grads[1:], param_sum, strict=True):
        torch.testing.assert_close(a, b, **TOL)


@pytest.mark.parametrize("junk", [1e30, float("nan"), float("inf")], ids=["1e30", "nan", "inf"])
def test_garbage_in_padding_changes_nothing(cell_spec, gen, holey_mask, junk):
    layer = cell_spec.layer(I, H, 2, True)
    clean = torch.randn(B, T, I, generator=gen, dtype=DT)
    s0 = random_state(cell_spec, 2, 2, gen)
    g_out = torch.randn(B, T, 2 * H, generator=gen, dtype=DT)
    g_fin = [torch.randn(2, 2, B, H, generator=gen, dtype=DT) for _ in s0]
    params = list(layer.parameters())
    results = []
    for x in (clean, torch.where(holey_mask[..., None], clean, junk)):
        x = x.clone().requires_grad_()
        res = layer(x, mask=holey_mask, state=cell_spec.pack(s0))
        g = torch.autograd.grad(
            masked_loss(cell_spec, res, holey_mask, g_out, g_fin), [x, *s0, *params]
        )
        results.append((res, g))
    (r0, g0), (r1, g1) = results
    assert torch.isfinite(r1.outputs).all()
    assert torch.equal(r1.outputs, r0.outputs)
    for a, b in zip(cell_spec.unpack(r1.state), cell_spec.unpack(r0.state), strict=True):
        assert torch.equal(a, b)
    for a, b in zip(g1, g0, strict=True):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, **TOL)


def test_reverse_direction_reads_from_own_last_step(cell_spec, gen):
    """Backward output at step t of row b = the backward cell run (one step at a time) over
    the reversed unpadded row, at position L_b − 1 − t."""
    layer = cell_spec.layer(I, H, 1, True)
    fwd_cell, bwd_cell = layer.cells()
    x = torch.randn(B, T, I, generator=gen, dtype=DT)
    s0 = tuple(s.detach() for s in random_state(cell_spec, 1, 2, gen))
    with torch.no_grad():
        res = layer(x, lengths=LENGTHS, state=cell_spec.pack(s0))
        for b in range(B):
            n = int(LENGTHS[b])
            for d, cell in ((0, fwd_cell), (1, bwd_cell)):
                seq = x[b, :n] if d == 0 else x[b, :n].flip(0)
                state = cell_spec.pack(tuple(s[0, d, b : b + 1] for s in s0))
                hs = []
                for t in range(n):
                    state = cell(seq[t : t + 1], state)
                    hs.append(cell_spec.unpack(state)[0][0])
                got = res.outputs[b, :n, d * H : (d + 1) * H]
                if n:
                    want = torch.stack(hs) if d == 0 else torch.stack(hs).flip(0)
                    torch.testing.assert_close(got, want, **TOL)
                for a, e in zip(cell_spec.unpack(res.state), cell_spec.unpack(state), strict=True):
                    torch.testing.assert_close(a[0, d, b], e[0], **TOL)
    # the backward output at a row's first step is its backward final state (h^b_1)
    h_fin = cell_spec.unpack(res.state)[0]
    torch.testing.assert_close(res.outputs[0, 0, H:], h_fin[0, 1, 0], **TOL)
    torch.testing.assert_close(res.outputs[1, 0, H:], h_fin[0, 1, 1], **TOL)


def test_zero_length_rows_keep_initial_state(cell_spec, gen):
    layer = cell_spec.layer(I, H, 2, True)
    x = torch.randn(B, T, I, generator=gen, dtype=DT)
    s0 = tuple(s.detach() for s in random_state(cell_spec, 2, 2, gen))
    with torch.no_grad():
        res = layer(x, lengths=torch.tensor([0, 3, 0, 6]), state=cell_spec.pack(s0))
        res_zero = layer(x, lengths=torch.tensor([0, 3, 0, 6]))
    for a, s in zip(cell_spec.unpack(res.state), s0, strict=True):
        assert torch.equal(a[:, :, 0], s[:, :, 0])
        assert torch.equal(a[:, :, 2], s[:, :, 2])
        assert not torch.allclose(a[:, :, 1], s[:, :, 1])
    for a in cell_spec.unpack(res_zero.state):
        assert torch.count_nonzero(a[:, :, 0]) == 0
    # every layer's h stays at its initial value, so the top outputs are the top h0
    top = s0[0][1]  # (D, B, H)
    for t in range(T):
        assert torch.equal(res.outputs[0, t], torch.cat([top[0, 0], top[1, 0]]))


def test_an_empty_time_axis_with_lengths_or_a_mask_returns_the_initial_state(cell_spec, gen):
    # a bidirectional layer flips each sequence within its extent: with no step there is
    # no last real step to find (this was an IndexError from inside the flip)
    layer = cell_spec.layer(I, H, 2, True)
    x = torch.randn(B, 0, I, generator=gen, dtype=DT, requires_grad=True)
    s0 = tuple(s.requires_grad_() for s in random_state(cell_spec, 2, 2, gen))
    for given in (
        {"lengths": torch.zeros(B, dtype=torch.long)},
        {"mask": torch.ones(B, 0, dtype=torch.bool)},
    ):
        res = layer(x, state=cell_spec.pack(s0), **given)
        assert res.outputs.shape == (B, 0, 2 * H)
        for a, s in zip(cell_spec.unpack(res.state), s0, strict=True):
            assert torch.equal(a, s)
        grads = torch.autograd.grad(sum(a.sum() for a in cell_spec.unpack(res.state)), s0)
        assert all(torch.equal(g, torch.ones_like(g)) for g in grads)


def test_holes_hold_the_state_in_the_layer(cell_spec, gen, holey_mask):
    layer = cell_spec.layer(I, H, 1, False)
    x = torch.randn(B, T, I, generator=gen, dtype=DT)
    with torch.no_grad():
        out = layer(x, mask=holey_mask).outputs
        # row 3 is 1 0 1 1 0 1; compacting its real steps gives the same states
        real = holey_mask[3]
        compact = layer(x[3:4, real]).outputs[0]
    assert torch.equal(out[3, 1], out[3, 0])
    assert torch.equal(out[3, 4], out[3, 3])
    torch.testing.assert_close(out[3, real], compact, **TOL)


def test_lengths_and_equivalent_masks_agree(cell_spec, gen):
    layer = cell_spec.layer(I, H, 2, True)
    x = torch.randn(B, T, I, generator=gen, dtype=DT)
    mask = lengths_to_mask(LENGTHS, T)
    with torch.no_grad():
        by_lengths = layer(x, lengths=LENGTHS)
        variants = [
            layer(x, mask=mask),
            layer(x, mask=mask.to(torch.int64)),  # 0/1 integers are accepted
            layer(x, lengths=LENGTHS.tolist()),
            layer(x, lengths=LENGTHS.to(torch.int32)),
        ]
    for other in variants:
        assert torch.equal(other.outputs, by_lengths.outputs)
        for a, b in zip(
            cell_spec.unpack(other.state), cell_spec.unpack(by_lengths.state), strict=True
        ):
            assert torch.equal(a, b)


def test_full_lengths_equal_no_mask(cell_spec, gen):
    layer = cell_spec.layer(I, H, 2, True)
    x = torch.randn(B, T, I, generator=gen, dtype=DT)
    with torch.no_grad():
        a = layer(x, lengths=torch.full((B,), T))
        b = layer(x)
    torch.testing.assert_close(a.outputs, b.outputs, **TOL)


def test_time_major_when_asked(cell_spec, gen, holey_mask):
    layer = cell_spec.layer(I, H, 2, True)
    tm = cell_spec.layer(I, H, 2, True, batch_first=False)
    tm.load_state_dict(layer.state_dict())
    x = torch.randn(B, T, I, generator=gen, dtype=DT)
    with torch.no_grad():
        a = layer(x, mask=holey_mask)
        b = tm(x.transpose(0, 1).contiguous(), mask=holey_mask.T)
    torch.testing.assert_close(b.outputs.transpose(0, 1), a.outputs, **TOL)
    for u, v in zip(cell_spec.unpack(a.state), cell_spec.unpack(b.state), strict=True):
        torch.testing.assert_close(u, v, **TOL)
    with pytest.raises(ValueError, match=r"mask must have shape \(T, B\) = \(6, 4\)"):
        tm(x.transpose(0, 1), mask=holey_mask)


# ------------------------------------------------------------------ masking helpers


def test_lengths_to_mask():
    m = lengths_to_mask(torch.tensor([3, 0, 1]), 4)
    assert m.dtype == torch.bool
    assert m.int().tolist() == [[1, 1, 1, 0], [0, 0, 0, 0], [1, 0, 0, 0]]


def test_flip_sequences_reverses_within_each_extent():
    x = torch.arange(12.0).view(4, 3)  # (T, B): column b is row b's sequence
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 0], [0, 1, 0]], dtype=torch.bool)
    flipped, fmask = flip_sequences(x, mask)
    # column 0: extent 3 → [6, 3, 0] then 9 stays; column 1: a hole, extent 4 → reversed
    # whole; column 2: no real step → unchanged
    assert flipped[:, 0].tolist() == [6.0, 3.0, 0.0, 9.0]
    assert flipped[:, 1].tolist() == [10.0, 7.0, 4.0, 1.0]
    assert flipped[:, 2].tolist() == [2.0, 5.0, 8.0, 11.0]
    assert fmask[:, 1].tolist() == [True, True, False, True]
    back, bmask = flip_sequences(flipped, fmask)
    assert torch.equal(back, x)
    assert torch.equal(bmask, mask)
    x3 = torch.arange(24.0).view(4, 3, 2)  # trailing feature dimension
    assert torch.equal(flip_sequences(x3, mask)[0][..., 1], flip_sequences(x3[..., 1], mask)[0])


def test_resolve_mask_none_and_layouts():
    x = torch.zeros(2, 5, 3)
    assert resolve_mask(x, None, None) is None
    m = resolve_mask(x, torch.tensor([5, 2]), None)
    assert m.shape == (2, 5)
    mt = resolve_mask(x.transpose(0, 1), None, m.T, batch_first=False)
    assert torch.equal(mt, m)


def test_lengths_that_are_not_integers_in_a_sequence_are_named():
    # A state passed where lengths go (the second positional argument), or a string,
    # was torch's "only one element tensors can be converted" or "invalid data type".
    from rnnkit import LSTM

    layer, x = LSTM(3, 4), torch.zeros(2, 5, 3)
    state = layer(x).state
    for bad in (state, "ab"):
        with pytest.raises(TypeError, match=r"^lengths must be \(B,\) integers .*, got "):
            layer(x, bad)
    assert layer(x, [5, 2]).outputs.shape == (2, 5, 4)  # a list still works
