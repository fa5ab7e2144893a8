"""rnnkit's own layers under the ``torch.func`` transforms and forward-mode AD: the
recurrence runs as plain differentiable steps there, so ``grad``, per-example gradients
(``vmap(grad)``), ``jvp``/``jacfwd`` and ``forward_ad`` give what eager autograd of the
explicit BPTT gives (float64, to rounding); a BPTT window is refused in one line.
Recurrent dropout and zoneout take the same plain steps: under the transforms, in a
compiled or exported graph, and in a gradient that is differentiated again."""

from __future__ import annotations

import pytest
import torch
from torch.autograd import forward_ad
from torch.func import functional_call, grad, jacfwd, jacrev, jvp, vmap

from rnnkit import GRU, LSTM, RNN
from rnnkit.bptt.tracing import TracingError, tracing, transforming
from rnnkit.models.builders import build_language_model
from rnnkit.models.spec import ModelSpec

# torch's forward-mode AD scripts its decompositions on first use (torch's own warning)
pytestmark = pytest.mark.filterwarnings(
    "ignore:`torch.jit.script` is deprecated:DeprecationWarning"
)

D = torch.float64
B, T, I, H = 3, 5, 2, 4
TOL = {"rtol": 0, "atol": 1e-12}

LAYERS = {
    "lstm-2-bi": lambda **kw: LSTM(I, H, num_layers=2, bidirectional=True, **kw),
    "gru-keep-after": lambda **kw: GRU(I, H, update="keep", reset="after", **kw),
    "gru-cand-before": lambda **kw: GRU(I, H, **kw),
    "rnn-relu": lambda **kw: RNN(I, H, nonlinearity="relu", **kw),
    "rnn-sigmoid": lambda **kw: RNN(I, H, nonlinearity="sigmoid", **kw),
    "lstm-layer-norm": lambda **kw: LSTM(I, H, layer_norm=True, **kw),
}
REGULARIZED = {
    "lstm": lambda: LSTM(I, H, recurrent_dropout=0.3, zoneout=0.2),
    "gru-keep-after": lambda: GRU(I, H, update="keep", reset="after", recurrent_dropout=0.3),
    "gru-cand-before-2-bi": lambda: GRU(
        I, H, num_layers=2, bidirectional=True, recurrent_dropout=0.3, zoneout=0.2
    ),
    "rnn": lambda: RNN(I, H, zoneout=0.4),
    "lstm-layer-norm": lambda: LSTM(I, H, layer_norm=True, zoneout=0.3),
}


def _data(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``x (B, T, I)`` with NaN padding and its mask (one full row, one of length 1)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, I, generator=g, dtype=D)
    mask = torch.arange(T)[None, :] < torch.tensor([T, 1, 3])[:, None]
    return x.masked_fill(~mask[..., None], float("nan")), mask


def _params(layer: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach() for k, v in layer.named_parameters()}


def _eager_grads(layer, loss, params, *args):
    """The oracle: eager autograd through the explicit BPTT."""
    q = {k: v.clone().requires_grad_() for k, v in params.items()}
    return dict(zip(q, torch.autograd.grad(loss(q, *args), list(q.values())), strict=True))


def test_transforming_is_true_under_each_transform_and_forward_ad_only():
    x = torch.zeros(2)
    seen: list[bool] = []

    def probe(t: torch.Tensor) -> torch.Tensor:
        seen.append(transforming() and tracing())
        return t.sum()

    grad(probe)(x)
    vmap(probe)(x[:, None])
    jvp(probe, (x,), (x,))
    with forward_ad.dual_level():
        seen.append(transforming())
    assert seen == [True, True, True, True]
    assert not transforming() and not tracing()


@pytest.mark.parametrize("kind", list(LAYERS))
def test_grad_and_jacobians_equal_the_explicit_bptt(kind):
    # before: "an autograd.Function with functorch transforms ... must override the
    # setup_context staticmethod"
    torch.manual_seed(0)
    layer = LAYERS[kind]().to(D)
    x, mask = _data()
    params = _params(layer)

    def loss(p, x):
        out = functional_call(layer, p, (x,), {"mask": mask}).outputs
        return out.masked_fill(~mask[..., None], 0).pow(2).sum()

    got, want = grad(loss)(params, x), _eager_grads(layer, loss, params, x)
    for k in params:
        torch.testing.assert_close(got[k], want[k], **TOL)
    clean = x.nan_to_num(0.0)  # forward mode reads the padding's tangent: keep it finite
    torch.testing.assert_close(
        jacfwd(loss, argnums=1)(params, clean), jacrev(loss, argnums=1)(params, clean), **TOL
    )


@pytest.mark.parametrize("kind", ["lstm-2-bi", "gru-cand-before"])
def test_per_example_gradients_equal_one_backward_per_example(kind):
    torch.manual_seed(1)
    layer = LAYERS[kind]().to(D)
    x, mask = _data(1)
    params = _params(layer)

    def loss(p, x, m):
        out = functional_call(layer, p, (x[None],), {"mask": m[None]}).outputs
        return out.masked_fill(~m[None, :, None], 0).sum()

    per_example = vmap(grad(loss), in_dims=(None, 0, 0))(params, x, mask)
    for b in range(B):
        want = _eager_grads(layer, loss, params, x[b], mask[b])
        for k in params:
            torch.testing.assert_close(per_example[k][b], want[k], **TOL)


def test_forward_mode_ad_gives_the_jacobian_vector_product():
    torch.manual_seed(2)
    layer = LSTM(I, H).to(D)
    x, _ = _data(2)
    x = x.nan_to_num(0.0)
    v = torch.randn_like(x)
    with forward_ad.dual_level():
        out = layer(forward_ad.make_dual(x, v)).outputs
        tangent = forward_ad.unpack_dual(out).tangent
    _, want = torch.autograd.functional.jvp(lambda x: layer(x).outputs, (x,), (v,))
    torch.testing.assert_close(tangent, want, **TOL)


def test_a_window_is_refused_under_a_transform_in_one_line():
    layer = LSTM(I, H).to(D)
    x, _ = _data()
    x = x.nan_to_num(0.0)
    with pytest.raises(TracingError, match=r"window=2 .*torch\.func transform") as err:
        grad(lambda x: layer(x, window=2).outputs.sum())(x)
    assert "\n" not in str(err.value)


def test_a_language_models_per_example_gradients():
    torch.manual_seed(3)
    V = 11
    model = build_language_model(ModelSpec(cell="gru", hidden=6, embedding=5, layers=2), V)
    model = model.to(D).eval()
    ids, targets = torch.randint(0, V, (B, T)), torch.randint(0, V, (B, T))
    params = _params(model)

    def loss(p, i, t):
        logits = functional_call(model, p, (i[None],)).logits
        return torch.nn.functional.cross_entropy(logits.reshape(-1, V), t)

    per_example = vmap(grad(loss), in_dims=(None, 0, 0))(params, ids, targets)
    for b in range(B):
        want = _eager_grads(model, loss, params, ids[b], targets[b])
        for k in params:
            torch.testing.assert_close(per_example[k][b], want[k], **TOL)


def _regularized(kind: str, training: bool):
    torch.manual_seed(4)
    layer = REGULARIZED[kind]().to(D).train(training)
    x, mask = _data(4)
    # the masks drawn once, given to every run: the runs compute one function
    masks = layer.draw_masks(B, T, x.transpose(0, 1)) if training else None
    kw = {"mask": mask} if masks is None else {"mask": mask, "masks": masks}
    return layer, x, mask, kw


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("kind", list(REGULARIZED))
def test_recurrent_dropout_and_zoneout_under_grad_equal_the_explicit_bptt(kind, training):
    layer, x, mask, kw = _regularized(kind, training)
    params = _params(layer)

    def loss(p, x):
        out = functional_call(layer, p, (x,), kw).outputs
        return out.masked_fill(~mask[..., None], 0).pow(2).sum()

    got, want = grad(loss)(params, x), _eager_grads(layer, loss, params, x)
    for k in params:
        torch.testing.assert_close(got[k], want[k], **TOL)


@pytest.mark.parametrize("kind", ["lstm", "gru-keep-after"])
def test_a_gradient_penalty_through_recurrent_dropout_and_zoneout(kind):
    # before: "CompiledRegularized has no differentiable step: its gradient cannot be
    # differentiated again"
    layer, x, mask, kw = _regularized(kind, True)
    params = _params(layer)

    def loss(p):
        out = functional_call(layer, p, (x,), kw).outputs
        return out.masked_fill(~mask[..., None], 0).pow(2).sum()

    def penalty(p):
        return sum(g.pow(2).sum() for g in grad(loss)(p).values())

    want = grad(penalty)(params)  # the plain steps, differentiated twice by torch.func
    q = {k: v.clone().requires_grad_() for k, v in params.items()}
    first = torch.autograd.grad(loss(q), list(q.values()), create_graph=True)
    got = torch.autograd.grad(sum(g.pow(2).sum() for g in first), list(q.values()))
    for k, g in zip(q, got, strict=True):
        torch.testing.assert_close(g, want[k], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", ["lstm", "gru-cand-before-2-bi"])
def test_recurrent_dropout_and_zoneout_compile_and_export(kind):
    # before: "recurrent_dropout and zoneout run the PyTorch loop with per-step masks,
    # which torch.compile/export cannot trace"
    layer, x, mask, kw = _regularized(kind, True)
    want = layer(x, **kw).outputs
    want_grads = torch.autograd.grad(want.nan_to_num().sum(), list(layer.parameters()))
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    got = compiled(x, **kw).outputs
    got_grads = torch.autograd.grad(got.nan_to_num().sum(), list(layer.parameters()))
    torch.testing.assert_close(got, want, **TOL, equal_nan=True)
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, **TOL)
    layer.eval()  # zoneout's expectation, the dropouts off: what a served model runs
    program = torch.export.export(layer, (x,), {"mask": mask})
    torch.testing.assert_close(
        program.module()(x, mask=mask).outputs, layer(x, mask=mask).outputs, **TOL
    )
