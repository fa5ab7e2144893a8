"""Windowed BPTT(τ) of a whole stack (``rnnkit.layers.windowed``) against autograd.

* a unidirectional stack (1–3 layers, every cell, holes and padding, a random initial
  state, output and final-state losses) equals autograd of the truncated graph of the
  whole stack: for each step t every layer recomputed over steps t−τ … t from the
  detached states before them, with the cells' plain step functions;
* the same with document starts inside the batch (rows reset to the zero state);
* a bidirectional stack equals autograd of the budget graph (a state with budget b is
  computed from the state one step back with budget b − 1, and from the detached state
  at budget 0), built from the plain steps with the reverse order made row by row;
* hand checks: how far the loss at one step reaches, and where the window is full BPTT.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from tests.conftest import CellSpec
from torch import Tensor, nn
from torch.autograd.function import BackwardCFunction

from rnnkit import LSTM
from rnnkit.bptt.mask_facts import move_mask
from rnnkit.data.batching import to_device
from rnnkit.models.language_model import LanguageModel

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))
from host_reads import step_reads

pytestmark = pytest.mark.usefixtures("single_thread", "time_loop")

DT = torch.float64
TOL = {"atol": 1e-10, "rtol": 0.0}
B, T, I, H = 4, 6, 3, 4


def make_case(spec, gen, layers, bidirectional=False):
    layer = spec.layer(I, H, layers, bidirectional)
    D = 2 if bidirectional else 1
    x = torch.randn(B, T, I, generator=gen, dtype=DT, requires_grad=True)
    s0 = tuple(
        torch.randn(layers, D, B, H, generator=gen, dtype=DT, requires_grad=True)
        for _ in range(spec.num_states)
    )
    g_out = torch.randn(B, T, D * H, generator=gen, dtype=DT)
    g_fin = tuple(torch.randn(layers, D, B, H, generator=gen, dtype=DT) for _ in s0)
    return layer, x, s0, g_out, g_fin


def loss_of(outputs, finals, g_out, g_fin) -> Tensor:
    loss = (outputs * g_out).sum()
    for f, g in zip(finals, g_fin, strict=True):
        loss = loss + (f * g).sum()
    return loss


def grads(loss, layer, x, s0) -> tuple[Tensor, ...]:
    return torch.autograd.grad(loss, [x, *s0, *layer.parameters()], allow_unused=True)


def windowed_grads(spec, layer, x, s0, g_out, g_fin, mask, window, resets=None):
    out = layer(x, mask=mask, state=spec.pack(s0), window=window, resets=resets)
    return out, grads(loss_of(out.outputs, spec.unpack(out.state), g_out, g_fin), layer, x, s0)


def assert_all_close(got, want) -> None:
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(
            torch.zeros_like(b) if a is None else a, torch.zeros_like(a) if b is None else b, **TOL
        )


# ---------------------------------------------------------- unidirectional: the truncated graph


def run_step(spec, cell, x1, state, mask1, step=None):
    """One step ``x1 (1, B, I)`` with the cell's plain step, or ``step(x, state)`` (held
    where ``mask1 (1, B)`` is False): ``(output (1, B, H), new state)``."""
    if step is None:
        return spec.run(cell, x1, state, mask1)
    new = tuple(
        torch.where(mask1[0][:, None], a, b) for a, b in zip(step(x1[0], state), state, strict=True)
    )
    return new[0][None], new


def clip_run(spec, layer, x, s0, mask, resets, frozen, lo, hi, step_at=None):
    """The stack over steps ``lo … hi`` (time-major, plain steps, or ``step_at(layer,
    t)``'s) from the states before ``lo``: the detached ``frozen`` ones, or the live
    initial state when ``frozen`` is None."""
    h = x[lo : hi + 1]
    finals = []
    for index, cell in enumerate(layer.cells()):
        state = tuple(s[index, 0] for s in s0) if frozen is None else frozen[index][lo]
        outs = []
        for t in range(lo, hi + 1):
            if resets is not None:  # a document starts: the zero state
                r = resets[t][:, None]
                state = tuple(torch.where(r, 0.0, s) for s in state)
            step = None if step_at is None else step_at(index, t)
            out, state = run_step(spec, cell, h[t - lo : t - lo + 1], state, mask[t : t + 1], step)
            outs.append(out)
        h = torch.cat(outs)
        finals.append(state)
    return h, finals


def truncated_graph_loss(spec, layer, x, s0, mask, tau, g_out, g_fin, resets=None, step_at=None):
    """Σ_t ⟨g_out_t, top output at t⟩ + ⟨g_fin, final states⟩ where the output at step t
    (0-based) is recomputed, in every layer, over steps ``t − τ … t`` from the DETACHED
    states before step t − τ (the live initial state when t < τ); the final states are a
    loss at the last step. ``step_at(layer, t)``: that step's function, if not the
    cell's plain step."""
    xt, mask_t = x.transpose(0, 1), mask.T
    resets_t = None if resets is None else resets.T
    with torch.no_grad():  # the incoming state of every step of every layer
        frozen = [[None] * T for _ in layer.cells()]
        h = xt
        for index, cell in enumerate(layer.cells()):
            state = tuple(s[index, 0].detach() for s in s0)
            outs = []
            for t in range(T):
                frozen[index][t] = state
                if resets_t is not None:
                    state = tuple(torch.where(resets_t[t][:, None], 0.0, s) for s in state)
                step = None if step_at is None else step_at(index, t)
                out, state = run_step(spec, cell, h[t : t + 1], state, mask_t[t : t + 1], step)
                outs.append(out)
            h = torch.cat(outs)
    loss = x.new_zeros(())
    for t in range(T):
        lo = t - tau
        frozen_before = None if lo < 0 else frozen
        out, finals = clip_run(
            spec, layer, xt, s0, mask_t, resets_t, frozen_before, max(lo, 0), t, step_at
        )
        loss = loss + (out[-1] * g_out[:, t]).sum()
        if t == T - 1:
            for k, g in enumerate(g_fin):
                loss = loss + sum((f[k] * g[i, 0]).sum() for i, f in enumerate(finals))
    return loss


@pytest.mark.parametrize(("layers", "tau"), [(2, 2), (3, 1), (3, 3)])
def test_unidirectional_stack_equals_the_truncated_graph(cell_spec, gen, holey_mask, layers, tau):
    layer, x, s0, g_out, g_fin = make_case(cell_spec, gen, layers)
    out, got = windowed_grads(cell_spec, layer, x, s0, g_out, g_fin, holey_mask, tau)
    want = grads(
        truncated_graph_loss(cell_spec, layer, x, s0, holey_mask, tau, g_out, g_fin),
        layer,
        x,
        s0,
    )
    assert_all_close(got, want)
    # the window changes gradients only, never values (up to the rounding of the compiled
    # loop's batching: the ordinary run skips finished rows)
    full = layer(x, mask=holey_mask, state=cell_spec.pack(s0))
    torch.testing.assert_close(out.outputs, full.outputs, rtol=0, atol=1e-14)
    full_grads = grads(
        loss_of(full.outputs, cell_spec.unpack(full.state), g_out, g_fin), layer, x, s0
    )
    assert not torch.allclose(got[0], full_grads[0])


@pytest.mark.parametrize("layers", [1, 2])
def test_resets_inside_the_batch_equal_the_truncated_graph(cell_spec, gen, holey_mask, layers):
    """One layer included: a layer's call with ``window=`` and ``resets=`` is the windowed
    stack's node (``run_recurrence`` takes resets without a window only)."""
    layer, x, s0, g_out, g_fin = make_case(cell_spec, gen, layers)
    resets = torch.zeros(B, T, dtype=torch.bool)
    resets[0, 3] = True  # a document starts inside the batch
    resets[1, 0] = resets[1, 2] = True  # a fresh start, and another inside the real steps
    resets[3, 4] = True  # at a hole: the state held there is the zero state
    out, got = windowed_grads(cell_spec, layer, x, s0, g_out, g_fin, holey_mask, 2, resets)
    ref = truncated_graph_loss(cell_spec, layer, x, s0, holey_mask, 2, g_out, g_fin, resets)
    assert_all_close(got, grads(ref, layer, x, s0))
    with torch.no_grad():  # the values are those of the run in pieces (no window)
        pieces = layer(x, mask=holey_mask, state=cell_spec.pack(s0), resets=resets)
    torch.testing.assert_close(out.outputs, pieces.outputs, **TOL)
    for a, b in zip(cell_spec.unpack(out.state), cell_spec.unpack(pieces.state), strict=True):
        torch.testing.assert_close(a, b, **TOL)


@pytest.mark.parametrize("tau", [1, 2])
def test_the_loss_at_one_step_reaches_every_layer_tau_steps_back(cell_spec, gen, tau):
    """Hand check on a 3-layer stack: a loss on the top output at (1-based) step t gives
    ∂/∂x_s ≠ 0 exactly for t − τ ≤ s ≤ t, and reaches the initial states exactly when
    t ≤ τ — in every layer, not τ steps per layer."""
    layer, x, s0, _, _ = make_case(cell_spec, gen, 3)
    t = 5
    out = layer(x, state=cell_spec.pack(s0), window=tau).outputs
    d_x, *d_s0 = torch.autograd.grad(out[:, t - 1].sum(), [x, *s0])
    reached = [s + 1 for s in range(T) if bool(d_x[:, s].abs().sum() > 0)]
    assert reached == list(range(t - tau, t + 1))
    assert all(torch.count_nonzero(d) == 0 for d in d_s0)
    for t, reaches in ((tau, True), (tau + 1, False)):
        out = layer(x, state=cell_spec.pack(s0), window=tau).outputs
        d_h0 = torch.autograd.grad(out[:, t - 1].sum(), s0[0])[0]
        assert [bool(d_h0[i].abs().sum() > 0) for i in range(3)] == [reaches] * 3


# ---------------------------------------------------------------- bidirectional: the budget graph


def reverse_index(mask: Tensor) -> Tensor:
    """``(T, B)``: the step a reverse direction reads at each position, row by row."""
    idx = torch.empty(T, B, dtype=torch.long)
    for b in range(B):
        real = [t for t in range(T) if bool(mask[b, t])]
        extent = real[-1] + 1 if real else 0
        idx[:, b] = torch.tensor([extent - 1 - t if t < extent else t for t in range(T)])
    return idx


def take(h: Tensor, idx: Tensor) -> Tensor:
    """``h (T, B, ·)`` with row b's steps taken in the order ``idx[:, b]``."""
    return torch.stack([h[idx[:, b], b] for b in range(h.shape[1])], dim=1)


def budget_graph_loss(spec, layer, x, s0, mask, tau, g_out, g_fin):
    """The loss on outputs and final states computed with a budget of τ steps: the state
    after step k (reading order) with budget b is one plain step from the state after
    step k − 1 with budget b − 1 (the live initial state at k = 0) on the inputs with
    budget b; with budget 0 the state before is the DETACHED one of the ordinary run."""
    L, D = layer.num_layers, layer.num_directions
    cells = layer.cells()
    idx = reverse_index(mask)
    xt, mask_t = x.transpose(0, 1), mask.T
    readings = [mask_t, take(mask_t, idx)]
    with torch.no_grad():  # the ordinary run: the incoming states in reading order
        frozen = []
        h = xt
        for index in range(L):
            outs = []
            for d in range(D):
                cell = cells[index * D + d]
                inp = take(h, idx) if d else h
                state = tuple(s[index, d].detach() for s in s0)
                before, o = [], []
                for t in range(T):
                    before.append(state)
                    out, state = spec.run(cell, inp[t : t + 1], state, readings[d][t : t + 1])
                    o.append(out)
                frozen.append(before)
                o = torch.cat(o)
                outs.append(take(o, idx) if d else o)  # the index is an involution
            h = torch.cat(outs, dim=-1)
    lowest = max(0, tau - L * (T - 1))  # a lower budget is never reached
    previous = None
    for budget in range(lowest, tau + 1):
        current = []
        h = xt
        for index in range(L):
            outs = []
            for d in range(D):
                u = index * D + d
                cell = cells[u]
                inp = take(h, idx) if d else h
                new = []
                for t in range(T):
                    if budget == 0 or (t > 0 and previous is None):
                        prev = frozen[u][t]
                    elif t == 0:
                        prev = tuple(s[index, d] for s in s0)
                    else:
                        prev = previous[u][t - 1]
                    _, state = spec.run(cell, inp[t : t + 1], prev, readings[d][t : t + 1])
                    new.append(state)
                current.append(new)
                o = torch.stack([s[0] for s in new])
                outs.append(take(o, idx) if d else o)
            h = torch.cat(outs, dim=-1)
        previous = current
    loss = (h.transpose(0, 1) * g_out).sum()
    for u, states in enumerate(previous):
        for f, g in zip(states[T - 1], g_fin, strict=True):
            loss = loss + (f * g[u // D, u % D]).sum()
    return loss


@pytest.mark.parametrize(("layers", "tau"), [(1, 2), (2, 2), (2, 7)])
def test_bidirectional_stack_equals_the_budget_graph(cell_spec, gen, holey_mask, layers, tau):
    layer, x, s0, g_out, g_fin = make_case(cell_spec, gen, layers, bidirectional=True)
    _, got = windowed_grads(cell_spec, layer, x, s0, g_out, g_fin, holey_mask, tau)
    ref = budget_graph_loss(cell_spec, layer, x, s0, holey_mask, tau, g_out, g_fin)
    assert_all_close(got, grads(ref, layer, x, s0))


def test_the_two_oracles_agree_on_a_unidirectional_stack(cell_spec, gen, holey_mask):
    """On a unidirectional stack the budget graph is the truncated graph of the stack
    (a check of the oracles, and of what the window means there)."""
    layer, x, s0, g_out, g_fin = make_case(cell_spec, gen, 2)
    a = grads(
        truncated_graph_loss(cell_spec, layer, x, s0, holey_mask, 2, g_out, g_fin), layer, x, s0
    )
    b = grads(budget_graph_loss(cell_spec, layer, x, s0, holey_mask, 2, g_out, g_fin), layer, x, s0)
    assert_all_close(a, b)


# ------------------------------------------------------------------------ where it is full BPTT


def full_grads(spec, layer, x, s0, g_out, g_fin, mask):
    out = layer(x, mask=mask, state=spec.pack(s0))
    return grads(loss_of(out.outputs, spec.unpack(out.state), g_out, g_fin), layer, x, s0)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_a_window_as_long_as_the_longest_path_is_full_bptt(
    cell_spec, gen, holey_mask, bidirectional
):
    """A path to an initial state crosses at most T steps (T Jacobian factors); in a
    bidirectional stack it can turn at every layer, so at most L·(T − 1) + 1 (T − 1 in
    each layer above): that window is full BPTT, one step less is not."""
    layer, x, s0, g_out, g_fin = make_case(cell_spec, gen, 2, bidirectional)
    longest = 2 * (T - 1) + 1 if bidirectional else T
    want = full_grads(cell_spec, layer, x, s0, g_out, g_fin, holey_mask)
    for tau in (longest, longest + 4):
        _, got = windowed_grads(cell_spec, layer, x, s0, g_out, g_fin, holey_mask, tau)
        assert_all_close(got, want)
    _, short = windowed_grads(cell_spec, layer, x, s0, g_out, g_fin, holey_mask, longest - 1)
    gap = max(float((a - b).abs().max()) for a, b in zip(short, want, strict=True))
    if not (bidirectional and cell_spec.name == "rnn_relu"):  # its longest paths are dead here
        assert gap > 1e-12  # the logistic's 9-factor path: ~1e-7


def test_dropout_between_layers_is_the_same_draw_and_scales_the_gradient(gen):
    """In training, the windowed stack draws the dropout of the per-layer path (same
    values for the same seed), and a window as long as the sequence is full BPTT of it."""
    from tests.conftest import ALL_SPECS

    spec = ALL_SPECS[4]  # GRU
    layer, x, s0, g_out, g_fin = make_case(spec, gen, 3)
    layer.dropout = 0.4
    layer.drop.p = 0.4
    torch.manual_seed(7)
    full = layer(x, state=spec.pack(s0))
    want = grads(loss_of(full.outputs, spec.unpack(full.state), g_out, g_fin), layer, x, s0)
    torch.manual_seed(7)
    out, got = windowed_grads(spec, layer, x, s0, g_out, g_fin, None, T)
    torch.testing.assert_close(out.outputs, full.outputs, **TOL)
    assert_all_close(got, want)


@pytest.mark.parametrize("spec_index", [3, 4], ids=["lstm", "gru"])
def test_dropout_with_resets_is_the_draw_of_the_pieces(gen, holey_mask, spec_index):
    """With document starts inside the batch, the paths without a window draw the
    dropout between layers piece by piece (between the start columns); the windowed
    stack draws the same masks: the same seed gives the same outputs with any window,
    and a window as long as the sequence is the full BPTT of those pieces."""
    from tests.conftest import ALL_SPECS

    spec = ALL_SPECS[spec_index]
    layer, x, s0, g_out, g_fin = make_case(spec, gen, 3)
    layer.dropout = layer.drop.p = 0.4
    resets = torch.zeros(B, T, dtype=torch.bool)
    resets[0, 3] = resets[2, 1] = resets[1, 4] = True
    torch.manual_seed(7)
    pieces = layer(x, mask=holey_mask, state=spec.pack(s0), resets=resets)
    want = grads(loss_of(pieces.outputs, spec.unpack(pieces.state), g_out, g_fin), layer, x, s0)
    torch.manual_seed(7)
    out, got = windowed_grads(spec, layer, x, s0, g_out, g_fin, holey_mask, T, resets)
    torch.testing.assert_close(out.outputs, pieces.outputs, **TOL)
    assert_all_close(got, want)
    torch.manual_seed(7)
    short = layer(x, mask=holey_mask, state=spec.pack(s0), window=2, resets=resets)
    torch.testing.assert_close(short.outputs, pieces.outputs, **TOL)


class _Dropped(torch.nn.Module):
    """``W ↦ W ⊙ M``: the oracle's recurrent weight, the one the window must read."""

    def __init__(self, mask: Tensor) -> None:
        super().__init__()
        self.mask = mask

    def forward(self, w: Tensor) -> Tensor:
        return w * self.mask


def regularized_case(spec, gen, holey_mask, layers, tau, options) -> None:
    """The regularizers acting on the recurrence (``options``: weight_drop,
    recurrent_dropout, zoneout; masks drawn once and passed): the windowed stack's
    gradients equal autograd of the truncated graph of a copy whose ``W_hh`` is
    parametrized as ``W_hh ⊙ M`` (its raw weight gets the gradient through the product)
    and whose steps are the regularized steps in plain operations
    (``RegularizedKernel.step_at``: the masked state, zoneout's mix)."""
    import copy

    from torch.nn.utils import parametrize

    from rnnkit.bptt.regularized import regularized

    layer, x, s0, g_out, g_fin = make_case(spec, gen, layers)
    for name, p in options.items():
        setattr(layer, name, p)
    torch.manual_seed(3)
    masks = layer.draw_masks(B, T, x)
    out = layer(x, mask=holey_mask, state=spec.pack(s0), window=tau, masks=masks)
    got = grads(loss_of(out.outputs, spec.unpack(out.state), g_out, g_fin), layer, x, s0)
    oracle = copy.deepcopy(layer)
    for name in options:
        setattr(oracle, name, 0.0)
    kernels = []
    for cell, m in zip(oracle.cells(), masks.cells, strict=True):
        if m.weight_hh is not None:
            parametrize.register_parametrization(cell, "weight_hh", _Dropped(m.weight_hh))
        kernels.append(regularized(cell.kernel, m.recurrent, m.keep) if m.in_loop else None)
    cells = list(oracle.cells())

    def step_at(index, t):
        kernel, cell = kernels[index], cells[index]
        if kernel is None:
            return None
        return lambda x_t, state: kernel.step_at(t, x_t, state, cell.weights())

    ref = truncated_graph_loss(spec, oracle, x, s0, holey_mask, tau, g_out, g_fin, step_at=step_at)
    params = dict(oracle.named_parameters())
    raw = [
        params[n.replace("weight_hh", "parametrizations.weight_hh.original")]
        if n.endswith("weight_hh") and "weight_drop" in options
        else params[n]
        for n, _ in layer.named_parameters()
    ]
    want = torch.autograd.grad(ref, [x, *s0, *raw], allow_unused=True)
    assert_all_close(got, want)
    plain = layer(x, mask=holey_mask, state=spec.pack(s0), masks=masks)  # full BPTT's values
    torch.testing.assert_close(out.outputs, plain.outputs, rtol=0, atol=1e-12)


@pytest.mark.parametrize(("layers", "tau"), [(1, 2), (2, 3)])
def test_weight_drop_in_a_window_equals_the_truncated_graph_of_the_dropped_weight(
    cell_spec, gen, holey_mask, layers, tau
):
    regularized_case(cell_spec, gen, holey_mask, layers, tau, {"weight_drop": 0.4})


@pytest.mark.parametrize(
    "options",
    [
        {"recurrent_dropout": 0.4},
        {"zoneout": 0.3},
        {"recurrent_dropout": 0.3, "zoneout": 0.2, "weight_drop": 0.2},
    ],
    ids=["recurrent_dropout", "zoneout", "all three"],
)
def test_regularizers_in_the_step_under_a_window_equal_the_truncated_graph(
    cell_spec, gen, holey_mask, options
):
    """Recurrent dropout's mask (one per row: tiled over the lag's batched steps) and
    zoneout's per-step keep factors in the windowed sweep, two layers, τ 2."""
    regularized_case(cell_spec, gen, holey_mask, 2, 2, options)


def test_one_autograd_node_for_the_whole_stack(cell_spec, gen):
    layer, x, s0, _, _ = make_case(cell_spec, gen, 3)
    out = layer(x, state=cell_spec.pack(s0), window=2).outputs
    seen, todo, custom = set(), [out.grad_fn], 0
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        custom += isinstance(node, BackwardCFunction)
        todo.extend(n for n, _ in node.next_functions)
    assert custom == 1
    with torch.no_grad():  # nothing to truncate: the ordinary forward, the same values
        plain = layer(x, state=cell_spec.pack(s0), window=2).outputs
    torch.testing.assert_close(plain, out.detach(), rtol=0, atol=1e-14)


# ------------------------------------------------------------------ layer-normalised cells


@dataclass(frozen=True)
class LayerNormSpec(CellSpec):
    """A layer-normalised cell: built with ``layer_norm=True``, gains and ``β_c`` moved off
    their initial values; the oracle's step is the cell's own (autograd through ν)."""

    def layer(self, I, H, num_layers=1, bidirectional=False, seed=0, dtype=DT, **extra):
        layer = super().layer(I, H, num_layers, bidirectional, seed, dtype, layer_norm=True)
        with torch.no_grad():
            for name, p in layer.named_parameters():
                if "gamma" in name or "beta" in name:
                    p.add_(0.3 * torch.randn(p.shape, dtype=p.dtype))
        return layer

    def step(self, cell, x, states):
        return self.unpack(cell(x, self.pack(states)))


LN_SPECS = [
    LayerNormSpec("ln_lstm", "lstm"),
    LayerNormSpec("ln_gru_keep", "gru", {"update": "keep", "reset": "after"}),
    LayerNormSpec("ln_gru_candidate", "gru", {"update": "candidate", "reset": "after"}),
]


@pytest.fixture(params=LN_SPECS, ids=lambda s: s.name)
def ln_spec(request) -> CellSpec:
    return request.param


@pytest.mark.parametrize(("layers", "tau"), [(1, 2), (3, 2)])
def test_a_layer_normalised_stack_equals_the_truncated_graph(ln_spec, gen, holey_mask, layers, tau):
    """The input part ``ν(x W_xᵀ) ⊙ γ_x`` of the layer above is passed down at the same
    lag: every weight, gain, input and initial state as autograd of the truncated graph."""
    layer, x, s0, g_out, g_fin = make_case(ln_spec, gen, layers)
    out, got = windowed_grads(ln_spec, layer, x, s0, g_out, g_fin, holey_mask, tau)
    ref = truncated_graph_loss(ln_spec, layer, x, s0, holey_mask, tau, g_out, g_fin)
    assert_all_close(got, grads(ref, layer, x, s0))
    full = layer(x, mask=holey_mask, state=ln_spec.pack(s0))
    torch.testing.assert_close(out.outputs, full.outputs, rtol=0, atol=1e-12)


def test_a_layer_normalised_stack_with_resets_and_dropout(ln_spec, gen, holey_mask):
    layer, x, s0, g_out, g_fin = make_case(ln_spec, gen, 2)
    resets = torch.zeros(B, T, dtype=torch.bool)
    resets[0, 3] = resets[2, 1] = True
    _, got = windowed_grads(ln_spec, layer, x, s0, g_out, g_fin, holey_mask, 2, resets)
    ref = truncated_graph_loss(ln_spec, layer, x, s0, holey_mask, 2, g_out, g_fin, resets)
    assert_all_close(got, grads(ref, layer, x, s0))
    layer.dropout = layer.drop.p = 0.4  # a window as long as the sequence: full BPTT of it
    torch.manual_seed(7)
    full = layer(x, state=ln_spec.pack(s0))
    want = grads(loss_of(full.outputs, ln_spec.unpack(full.state), g_out, g_fin), layer, x, s0)
    torch.manual_seed(7)
    _, got = windowed_grads(ln_spec, layer, x, s0, g_out, g_fin, None, T)
    assert_all_close(got, want)


def test_weight_drop_in_a_window_of_a_layer_normalised_stack(ln_spec, gen, holey_mask):
    regularized_case(ln_spec, gen, holey_mask, 2, 2, {"weight_drop": 0.4})


@pytest.mark.parametrize("tau", [2, 2 * (T - 1) + 1])
def test_a_layer_normalised_bidirectional_stack_equals_the_budget_graph(
    ln_spec, gen, holey_mask, tau
):
    layer, x, s0, g_out, g_fin = make_case(ln_spec, gen, 2, bidirectional=True)
    _, got = windowed_grads(ln_spec, layer, x, s0, g_out, g_fin, holey_mask, tau)
    ref = budget_graph_loss(ln_spec, layer, x, s0, holey_mask, tau, g_out, g_fin)
    assert_all_close(got, grads(ref, layer, x, s0))


@pytest.mark.parametrize("layer_norm", [False, True])
def test_a_window_refuses_a_gradient_with_a_graph_or_batched_in_one_line(layer_norm):
    """The lag sweep has no graph of itself: create_graph=True and is_grads_batched=True
    are a ConfigError naming the window (they were a RuntimeError from inside torch)."""
    from rnnkit import LSTM
    from rnnkit.errors import ConfigError

    layer = LSTM(3, 4, 2, layer_norm=layer_norm).double()
    x = torch.randn(2, 5, 3, dtype=DT, requires_grad=True)
    message = r"^window=2 \(truncated BPTT\): its gradient cannot be differentiated again"
    with pytest.raises(ConfigError, match=message):
        torch.autograd.grad(layer(x, window=2).outputs.sum(), x, create_graph=True)
    out = layer(x, window=2).outputs
    batch = torch.ones(3, *out.shape, dtype=DT)
    with pytest.raises(ConfigError, match=message):
        torch.autograd.grad(out, x, batch, is_grads_batched=True)


# A windowed step reads the device once: "is every step real" from the mask's host copy.


HERE = torch.device("cpu")  # HostReads marks what is moved to a torch.device


def test_a_windowed_step_reads_the_device_once(monkeypatch) -> None:
    torch.manual_seed(0)
    lm = LanguageModel(nn.Embedding(7, 4), LSTM(4, 8), nn.Linear(8, 7))
    inputs = torch.tensor([[2, 4, 5, 6, 4], [2, 5, 0, 0, 0]])
    targets = torch.tensor([[4, 5, 6, 4, 3], [5, 3, 0, 0, 0]])
    mask = torch.tensor([[True] * 5, [True, True, False, False, False]])
    expected = lm.loss(inputs, targets, mask=mask, window=2)

    def run():
        x, y = to_device(inputs, HERE), to_device(targets, HERE)
        return lm.loss(x, y, mask=move_mask(mask, HERE), window=2)

    sites, (nats, tokens) = step_reads(lm, monkeypatch, run)
    assert _one_read(sites), sites
    assert tokens == expected.tokens and abs(nats - expected.nats) < 1e-5


def _one_read(sites) -> bool:
    """One read of the device in all: the step's own, in ``rnnkit.deferred``."""
    return sum(sites.values()) == 1 and all(s.startswith("deferred.py:") for s in sites)
