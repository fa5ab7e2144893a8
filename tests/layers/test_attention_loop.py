"""The teacher-forced attention decoder as one node equals autograd through the step loop:
outputs, attention weights and every gradient, in float64, for every cell variant and
attention kind, with padded sources (a row without any real position included) and
padded targets; with the compiled loop's one-step operators (an LSTM's gate math, the
additive scores) and without them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rnnkit.bptt.native import use_native
from rnnkit.layers.attention_loop import attention_decoder
from rnnkit.models.seq2seq import build_seq2seq
from rnnkit.models.seq2seq_decoder import _unstack
from rnnkit.models.spec import ModelSpec

V, B, S, T = 11, 4, 5, 6


def _model(spec, kind: str, context: str):
    torch.manual_seed(0)
    shape = ModelSpec(
        cell=spec.kind,
        hidden=6,
        embedding=4,
        attention=kind,
        context=context,
        bidirectional=kind != "dot",
        **spec.options,
    )
    return build_seq2seq(shape, V, V).double()


def _batch(empty_row: bool):
    g = torch.Generator().manual_seed(1)
    source = torch.randint(4, V, (B, S), generator=g)
    source_mask = torch.ones(B, S, dtype=torch.bool)
    source_mask[1, 3:] = False
    source_mask[2, 1:] = False
    if empty_row:
        source_mask[3] = False
    target_in = torch.randint(4, V, (B, T), generator=g)
    target_mask = torch.ones(B, T, dtype=torch.bool)
    target_mask[0, 4:] = False
    target_mask[2, 2:] = False
    return source, source_mask, target_in, target_mask


def _step_loop(m, source, source_mask, target_in):
    """Head inputs and attention weights, step by step through ``Seq2Seq._step`` (the
    cells' own forward, autograd)."""
    state = m.encode(source, source_mask)
    emb = m.target_embedding(target_in)
    hidden = _unstack(state.hidden)
    features, weights = [], []
    for t in range(target_in.shape[1]):
        feat, hidden, w = m._step(emb[:, t], hidden, state)
        features.append(feat)
        weights.append(w)
    return torch.stack(features, 1), torch.stack(weights, 1)


@pytest.mark.parametrize(
    ("kind", "context", "empty_row"),
    [("dot", "init", False), ("bilinear", "both", True), ("additive", "input", True)],
)
@pytest.mark.parametrize("compiled", [True, False])
def test_node_equals_autograd_through_the_step_loop(cell_spec, kind, context, empty_row, compiled):
    m = _model(cell_spec, kind, context)
    source, source_mask, target_in, target_mask = _batch(empty_row)
    with use_native(compiled):
        out = m(source, source_mask, target_in, target_mask)
    features, weights = _step_loop(m, source, source_mask, target_in)
    logits = m.head(features)
    torch.testing.assert_close(out.logits, logits, atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(out.attention, weights, atol=1e-12, rtol=1e-10)
    assert torch.all(out.attention[~source_mask.unsqueeze(1).expand_as(weights)] == 0)
    if empty_row:
        assert torch.equal(out.attention[3], torch.zeros(T, S, dtype=torch.float64))
    # A loss on the logits (real target steps only) and on the attention weights.
    g = torch.Generator().manual_seed(2)
    d_logits = torch.randn(logits.shape, generator=g, dtype=torch.float64)
    d_logits[~target_mask] = 0
    d_weights = torch.randn(weights.shape, generator=g, dtype=torch.float64)
    params = list(m.parameters())

    def grads(lg, w):
        loss = (lg * d_logits).sum() + (w * d_weights).sum()
        return torch.autograd.grad(loss, params, allow_unused=True)

    got = grads(out.logits, out.attention)  # the node's backward: chosen with its forward
    for (name, _), a, b in zip(m.named_parameters(), got, grads(logits, weights), strict=True):
        assert (a is None) == (b is None), name
        if a is not None:
            torch.testing.assert_close(a, b, atol=1e-11, rtol=1e-9, msg=name)
            assert torch.isfinite(a).all(), name


@pytest.mark.parametrize("kind", ["dot", "additive"])
@pytest.mark.parametrize("compiled", [True, False])
def test_a_gradient_penalty_and_batched_gradients_equal_the_step_loops(cell_spec, kind, compiled):
    """create_graph=True and is_grads_batched=True (a RuntimeError before: the node's
    backward had no graph): the node runs its steps again in differentiable operations;
    the penalty's gradient and a batch of vector–Jacobian products equal autograd's
    through the step loop."""
    m = _model(cell_spec, kind, "init")
    source, source_mask, target_in, target_mask = _batch(True)
    with use_native(compiled):
        node = m(source, source_mask, target_in, target_mask).logits
    loop = m.head(_step_loop(m, source, source_mask, target_in)[0])
    params = [p for p in m.parameters() if p.requires_grad]
    vectors = torch.randn(
        3, *loop.shape, generator=torch.Generator().manual_seed(4), dtype=loop.dtype
    )

    def penalty_and_batched(logits):
        first = torch.autograd.grad(
            logits.pow(2).sum(), params, create_graph=True, allow_unused=True
        )
        penalty = sum(g.pow(2).sum() for g in first if g is not None)
        second = torch.autograd.grad(penalty, params, retain_graph=True, allow_unused=True)
        batched = torch.autograd.grad(logits, params[:4], vectors, is_grads_batched=True)
        return [*second, *batched]

    for a, b in zip(penalty_and_batched(node), penalty_and_batched(loop), strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-8)


@pytest.mark.parametrize("compiled", [True, False])
def test_only_the_logits_may_carry_a_loss(compiled):
    # Gradients of the hidden states and contexts only (the attention weights unused),
    # and of the weights only: each output may come back without a gradient.
    m = _model(SimpleNamespace(kind="lstm", options={}), "additive", "init")
    source, source_mask, target_in, _ = _batch(False)
    state = m.encode(source, source_mask)
    emb = m.target_embedding(target_in)
    cell = m.decoder.cells()[0]
    w = cell.weights()
    E = emb.shape[-1]
    D = m.memory_size

    def run():
        return attention_decoder(
            cell.kernel,
            emb.transpose(0, 1),
            w.weight_ih[:, :E],
            w.weight_ih[:, E : E + D],
            w,
            m.attention,
            state.keys,
            state.memory,
            source_mask,
            (state.hidden.h[0, 0], state.hidden.c[0, 0]),
        )

    with use_native(compiled):
        out = run()
    (g_h,) = torch.autograd.grad(out.hidden.sum(), [m.attention.v], retain_graph=True)
    (g_w,) = torch.autograd.grad(out.weights.pow(2).sum(), [m.attention.v])
    feats, w_loop = _step_loop(m, source, source_mask, target_in)
    (r_h,) = torch.autograd.grad(
        feats[..., : m.decoder.hidden_size].sum(), [m.attention.v], retain_graph=True
    )
    (r_w,) = torch.autograd.grad(w_loop.pow(2).sum(), [m.attention.v])
    torch.testing.assert_close(g_h, r_h, atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(g_w, r_w, atol=1e-12, rtol=1e-10)


def test_float32_compiled_operators_agree_with_the_torch_ops():
    # The compiled sigmoid is a polynomial (a few ulp): the two float32 paths agree to
    # float32 precision, forward and every gradient.
    m = _model(SimpleNamespace(kind="lstm", options={}), "additive", "init").float()
    source, source_mask, target_in, target_mask = _batch(True)
    results = []
    for compiled in (True, False):
        with use_native(compiled):
            out = m(source, source_mask, target_in, target_mask)
        grads = torch.autograd.grad(out.logits.pow(2).sum(), list(m.parameters()))
        results.append((out.logits, out.attention, grads))
    (la, wa, ga), (lb, wb, gb) = results
    torch.testing.assert_close(la, lb, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(wa, wb, atol=1e-5, rtol=1e-4)
    for a, b in zip(ga, gb, strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-3)


@pytest.mark.parametrize("kind", ["additive", "dot"])
def test_float32_weight_gradients_agree_with_float64_at_product_sizes(kind):
    # Large enough that every weight gradient (4H = 64 rows, T·B = 80) runs on the
    # library's own product where it has one (AVX-512 builds): float32 against the same
    # node in float64, to float32 precision.
    torch.manual_seed(0)
    shape = ModelSpec(cell="lstm", hidden=16, embedding=16, attention=kind, context="init")
    m64 = build_seq2seq(shape, V, V).double()
    m32 = build_seq2seq(shape, V, V).float()
    m32.load_state_dict(m64.state_dict())
    g = torch.Generator().manual_seed(2)
    source = torch.randint(4, V, (8, 7), generator=g)
    target_in = torch.randint(4, V, (8, 10), generator=g)
    masks = torch.ones(8, 7, dtype=torch.bool), torch.ones(8, 10, dtype=torch.bool)
    grads = []
    for m in (m32, m64):
        out = m(source, masks[0], target_in, masks[1])
        grads.append(torch.autograd.grad(out.logits.pow(2).sum(), list(m.parameters())))
    for (name, _), a, b in zip(m32.named_parameters(), *grads, strict=True):
        scale = b.abs().max().item()
        torch.testing.assert_close(a.double(), b, atol=1e-5 * scale, rtol=1e-4, msg=name)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_low_precision_node_is_its_float32_computation_rounded_once(dtype):
    """float16/bfloat16 weights on the CPU: the node runs in float32 and rounds its
    outputs and every gradient once to the weights' dtype."""
    m = _model(SimpleNamespace(kind="lstm", options={}), "additive", "init").to(dtype)
    source, source_mask, target_in, _ = _batch(True)
    with torch.no_grad():
        state = m.encode(source, source_mask)
        emb = m.target_embedding(target_in).transpose(0, 1)
    cell = m.decoder.cells()[0]
    E, D = emb.shape[-1], m.memory_size
    leaves = {
        "weight_hh": cell.weight_hh,
        "v": m.attention.v,
        "emb": emb,
        "memory": state.memory,
        "keys": state.keys,
    }
    results = []
    for up in (False, True):
        t = {
            k: (v.detach().float() if up else v.detach()).requires_grad_()
            for k, v in leaves.items()
        }
        w = cell.weights()
        w = w._replace(weight_hh=t["weight_hh"])
        attention = SimpleNamespace(
            kind="additive",
            query_proj=SimpleNamespace(
                weight=m.attention.query_proj.weight.detach(),
                bias=m.attention.query_proj.bias.detach(),
            ),
            v=t["v"],
        )
        if up:
            w = type(w)(*(None if p is None else p.detach().float() for p in w))._replace(
                weight_hh=t["weight_hh"]
            )
            attention.query_proj.weight = attention.query_proj.weight.float()
            attention.query_proj.bias = attention.query_proj.bias.float()
        out = attention_decoder(
            cell.kernel,
            t["emb"],
            w.weight_ih[:, :E],
            w.weight_ih[:, E : E + D],
            w,
            attention,
            t["keys"],
            t["memory"],
            source_mask,
            tuple(s[0, 0].detach().to(w.weight_hh.dtype) for s in state.hidden),
        )
        # incoming gradients that the low dtype holds exactly: the same for both
        ramps = [torch.linspace(-1, 1, o.numel()).view(o.shape).to(dtype) for o in out]
        loss = sum((o * r.to(o.dtype)).float().sum() for o, r in zip(out, ramps, strict=True))
        grads = torch.autograd.grad(loss, list(t.values()))
        results.append((out, grads))
    (low, g_low), (high, g_high) = results
    for a, b in zip(low, high, strict=True):
        assert a.dtype == dtype and torch.equal(a, b.to(dtype))
    for a, b in zip(g_low, g_high, strict=True):
        assert a.dtype == dtype and torch.equal(a, b.to(dtype))
