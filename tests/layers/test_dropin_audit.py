"""Programs ported from ``torch.nn`` to ``rnnkit.nn`` beyond the plain forward/backward:
second derivatives (gradient penalties, Hessians), ``torch.func`` transforms, outputs
changed in place, torch's exception types. Each compares with ``torch.nn`` holding the
same state dict, in float64."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.func import functional_call
from torch.nn.utils.rnn import (
    PackedSequence,
    pack_padded_sequence,
    pack_sequence,
    pad_packed_sequence,
)

from rnnkit import nn as knn
from rnnkit.bptt.tracing import TracingError

DTYPE = torch.float64
MODES = ["RNN", "LSTM", "GRU"]


def _pair(mode: str, **kw):
    torch.manual_seed(0)
    reference = getattr(torch.nn, mode)(3, 4, dtype=DTYPE, **kw)
    mine = getattr(knn, mode)(3, 4, dtype=DTYPE, **kw)
    mine.load_state_dict(reference.state_dict())
    return reference, mine


def _x(T: int = 4, B: int = 2, seed: int = 1) -> torch.Tensor:
    return torch.randn(T, B, 3, dtype=DTYPE, generator=torch.Generator().manual_seed(seed))


def _assert_same(mine, reference) -> None:
    assert len(mine) == len(reference)
    for a, b in zip(mine, reference, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


def _penalty_grads(module, x, hx, packed: bool):
    """A WGAN-GP-like step: the input gradient with a graph, its norm added to the loss."""
    x = x.clone().requires_grad_()
    hx = tuple(h.clone().requires_grad_() for h in hx)
    lengths = [4, 2, 3]
    if packed:  # three sequences of different lengths, not sorted
        inp = pack_sequence([x[:n, b] for b, n in enumerate(lengths)], enforce_sorted=False)
    else:
        inp = x
    out, state = module(inp, hx if len(hx) == 2 else hx[0])
    if packed:
        out = pad_packed_sequence(out)[0]
    states = state if isinstance(state, tuple) else (state,)
    loss = out.pow(2).sum() + sum(s.sin().sum() for s in states)
    (d_x,) = torch.autograd.grad(loss, x, create_graph=True)
    total = loss + d_x.pow(2).sum()
    leaves = [x, *hx, *module.parameters()]
    return torch.autograd.grad(total, leaves)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_a_gradient_penalty_differentiates_the_gradient_as_torch(mode, packed):
    # before: "trying to differentiate twice a function marked with @once_differentiable"
    kw = {"num_layers": 2, "bidirectional": True} if packed else {}
    reference, mine = _pair(mode, **kw)
    D, L = (2, 2) if packed else (1, 1)
    g = torch.Generator().manual_seed(2)
    n = 2 if mode == "LSTM" else 1
    hx = tuple(torch.randn(L * D, 3, 4, dtype=DTYPE, generator=g) for _ in range(n))
    x = _x(B=3)
    _assert_same(_penalty_grads(mine, x, hx, packed), _penalty_grads(reference, x, hx, packed))


@pytest.mark.parametrize("mode", MODES)
def test_a_hessian_is_torchs_not_zeros(mode):
    # before: the explicit BPTT's gradient was a constant of the graph, so
    # torch.autograd.functional.hessian returned zeros without a word
    reference, mine = _pair(mode)
    x = _x(T=3)

    def hessian(module):
        def loss(w):
            out, _ = functional_call(module, {"weight_hh_l0": w}, (x,))
            return out.pow(2).sum()

        w0 = module.weight_hh_l0.detach().clone()
        return torch.autograd.functional.hessian(loss, w0)

    expected = hessian(reference)
    assert expected.abs().sum() > 0
    torch.testing.assert_close(hessian(mine), expected, rtol=1e-9, atol=1e-10)


# torch's forward-mode AD loads its decompositions with torch.jit.script on first use
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
@pytest.mark.parametrize("mode", MODES)
def test_torch_func_grad_jacrev_and_jacfwd_give_torchs_results(mode):
    # before: "an autograd.Function ... must override the setup_context staticmethod"
    reference, mine = _pair(mode)
    x = _x(T=3)

    def transforms(module):
        params = {k: v.detach() for k, v in module.named_parameters()}

        def loss(p):
            return functional_call(module, p, (x,))[0].pow(2).sum()

        grads = torch.func.grad(loss)(params)

        def outputs(inp):
            return module(inp)[0]

        jac_rev = torch.func.jacrev(outputs)(x)
        jac_fwd = torch.func.jacfwd(outputs)(x)
        return [*(grads[k] for k in sorted(grads)), jac_rev, jac_fwd]

    _assert_same(transforms(mine), transforms(reference))


@pytest.mark.parametrize("mode", MODES)
def test_a_vectorized_jacobian_is_torchs(mode):
    # before: "Batching rule not implemented for rnnkit_native::lstm_backward"
    reference, mine = _pair(mode)
    x = _x(T=3)

    def jacobian(module):
        return torch.autograd.functional.jacobian(lambda inp: module(inp)[0], x, vectorize=True)

    torch.testing.assert_close(jacobian(mine), jacobian(reference), rtol=1e-9, atol=1e-10)


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
@pytest.mark.parametrize("mode", MODES)
def test_forward_mode_ad_gives_torchs_tangents(mode):
    # before: "You must implement the jvp function ... to use it with forward mode AD"
    from torch.autograd import forward_ad

    reference, mine = _pair(mode, num_layers=2, bidirectional=True)
    x = _x()
    direction = torch.randn_like(x)

    def tangents(module):
        with forward_ad.dual_level():
            out, state = module(forward_ad.make_dual(x, direction))
            states = state if isinstance(state, tuple) else (state,)
            return [forward_ad.unpack_dual(t).tangent for t in (out, *states)]

    _assert_same(tangents(mine), tangents(reference))


@pytest.mark.parametrize("mode", MODES)
def test_vmap_runs_where_torch_has_no_batching_rule(mode):
    # torch: "Batching rule not implemented for aten::lstm.input"; before, the drop-in
    # ran torch's layer under vmap and failed the same way
    reference, mine = _pair(mode, num_layers=2, bidirectional=True)
    xs = torch.randn(3, 5, 2, 3, dtype=DTYPE)  # a batch of (T, B, I) inputs
    with pytest.raises(RuntimeError, match="Batching rule not implemented"):
        torch.func.vmap(lambda x: reference(x)[0])(xs)
    got = torch.func.vmap(lambda x: mine(x)[0])(xs)
    _assert_same(list(got), [reference(x)[0] for x in xs])

    def loss(p, x):  # per-example gradients: vmap over grad, as DP-SGD computes them
        return functional_call(mine, p, (x,))[0].pow(2).sum()

    params = {k: v.detach() for k, v in mine.named_parameters()}
    per_example = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0))(params, xs)
    for i, x in enumerate(xs):
        reference.zero_grad()
        reference(x)[0].pow(2).sum().backward()
        want = [p.grad for p in reference.parameters()]
        _assert_same([per_example[k][i] for k in params], want)


@pytest.mark.parametrize("mode", MODES)
def test_a_packed_sequence_under_vmap_and_grad_equals_torchs_layer_in_a_loop(mode):
    # torch has no batching rule for its packed operator under vmap, and under grad it
    # reads the data's memory: "Cannot access data pointer of Tensor that doesn't have
    # storage" (the drop-in ran it, and torch's pad_packed_sequence, and failed the same)
    reference, mine = _pair(mode, num_layers=2, bidirectional=True)
    g = torch.Generator().manual_seed(3)
    xs = torch.randn(3, 4, 3, 3, dtype=DTYPE, generator=g)  # 3 examples of (T, B, I)
    lengths = [2, 4, 3]  # not sorted: the packs carry sorted and unsorted indices
    packs = [pack_padded_sequence(x, lengths, enforce_sorted=False) for x in xs]
    like = packs[0]
    data = torch.stack([p.data for p in packs])

    def packed(d):
        return PackedSequence(d, like.batch_sizes, like.sorted_indices, like.unsorted_indices)

    def outputs(module, d):
        out, state = module(packed(d))
        return out.data, *(state if isinstance(state, tuple) else (state,))

    with pytest.raises(RuntimeError, match="Batching rule not implemented"):
        torch.func.vmap(lambda d: outputs(reference, d))(data)
    got = torch.func.vmap(lambda d: outputs(mine, d))(data)
    for i, p in enumerate(packs):
        _assert_same([g[i] for g in got], outputs(reference, p.data))

    def loss(module, params, d):
        out, state = functional_call(module, params, (packed(d),))
        states = state if isinstance(state, tuple) else (state,)
        return out.data.pow(2).sum() + sum(s.sin().sum() for s in states)

    def torch_grads(d):
        reference.zero_grad()
        loss(reference, dict(reference.named_parameters()), d).backward()
        return [p.grad for p in reference.parameters()]

    params = {k: v.detach() for k, v in mine.named_parameters()}
    with pytest.raises(RuntimeError, match="Cannot access data pointer"):
        torch.func.grad(lambda p, d: loss(reference, p, d))(params, like.data)
    one = torch.func.grad(lambda p, d: loss(mine, p, d))(params, like.data)
    _assert_same([one[k] for k in params], torch_grads(like.data))
    per_example = torch.func.vmap(
        torch.func.grad(lambda p, d: loss(mine, p, d)), in_dims=(None, 0)
    )(params, data)
    for i, p in enumerate(packs):
        _assert_same([per_example[k][i] for k in params], torch_grads(p.data))


def test_a_model_ensemble_runs_under_vmap_with_stacked_states():
    # torch's "model ensembling" recipe: the states of several models stacked, one call
    torch.manual_seed(2)
    references = [torch.nn.LSTM(3, 4, dtype=DTYPE) for _ in range(3)]
    mine = []
    for r in references:
        m = knn.LSTM(3, 4, dtype=DTYPE)
        m.load_state_dict(r.state_dict())
        mine.append(m)
    params, buffers = torch.func.stack_module_state(mine)
    x = _x()

    def run(p, b, x):
        return functional_call(mine[0], (p, b), (x,))[0]

    got = torch.func.vmap(run, in_dims=(0, 0, None))(params, buffers, x)
    _assert_same(list(got), [r(x)[0] for r in references])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("layout", ["time-major", "unbatched"])
def test_the_output_can_be_changed_in_place_as_torchs(mode, layout):
    # before: "Output 0 of _Recurrence is a view and is being modified inplace"
    reference, mine = _pair(mode, num_layers=2)
    x = _x() if layout == "time-major" else _x()[:, 0]

    def step(module):
        out, _ = module(x)
        out += 1.5  # a residual added in place
        out.mul_(2.0)
        out.pow(2).sum().backward()
        return [out.detach(), *(p.grad for p in module.parameters())]

    _assert_same(step(mine), step(reference))


def _hx_of(mode: str, shape: tuple[int, ...], dtype: torch.dtype = DTYPE):
    h = torch.zeros(*shape, dtype=dtype)
    return (h, h) if mode in ("LSTM", "LSTMCell") else h


LAYER_ERRORS = {  # each call fails in torch; rnnkit raises the same exception type
    "input size": lambda m, mode: m(torch.zeros(5, 2, 7, dtype=DTYPE)),
    "packed input size": lambda m, mode: m(pack_sequence([torch.zeros(2, 7, dtype=DTYPE)])),
    "input dtype": lambda m, mode: m(torch.zeros(5, 2, 3, dtype=torch.float32)),
    "integer input": lambda m, mode: m(torch.zeros(5, 2, 3, dtype=torch.long)),
    "hx dtype": lambda m, mode: m(_x(), _hx_of(mode, (1, 2, 4), torch.float32)),
    "hx size": lambda m, mode: m(_x(), _hx_of(mode, (1, 3, 4))),
    "unbatched hx dims": lambda m, mode: m(_x()[:, 0], _hx_of(mode, (1, 1, 4))),
}
CELL_ERRORS = {
    "input size": lambda m, mode: m(torch.zeros(2, 7, dtype=DTYPE)),
    "hx batch": lambda m, mode: m(torch.zeros(2, 3, dtype=DTYPE), _hx_of(mode, (3, 4))),
    "hx hidden_size": lambda m, mode: m(torch.zeros(2, 3, dtype=DTYPE), _hx_of(mode, (2, 5))),
    "input dtype": lambda m, mode: m(torch.zeros(2, 3, dtype=torch.float32)),
    "hx dtype": lambda m, mode: m(
        torch.zeros(2, 3, dtype=DTYPE), _hx_of(mode, (2, 4), torch.float32)
    ),
}
ERROR_CASES = [(m, c) for m in MODES for c in LAYER_ERRORS] + [
    (m + "Cell", c) for m in MODES for c in CELL_ERRORS
]


@pytest.mark.parametrize("mode,case", ERROR_CASES)
def test_bad_input_raises_torchs_exception_type_naming_the_layer(mode, case):
    # before: a ValueError where torch raises RuntimeError (input size), a TypeError where
    # torch raises ValueError (dtype); the cells' a matrix product's shape message
    call = (CELL_ERRORS if mode.endswith("Cell") else LAYER_ERRORS)[case]
    reference, mine = _pair(mode)
    with pytest.raises(Exception) as theirs:
        call(reference, mode)
    with pytest.raises(Exception, match=f"rnnkit.nn.{mode}: ") as ours:
        call(mine, mode)
    assert type(ours.value) is type(theirs.value)


def test_threads_may_call_one_layer_at_once_as_torchs():
    # before: the calls shared one inner stack whose parameters each call swapped in and
    # out, so a thread could find the meta placeholders ("Tensor on device meta")
    import threading

    from rnnkit.layers.stacked import StackedRecurrent

    reference, mine = _pair("LSTM", num_layers=2)
    xs = {"a": _x(seed=1), "b": _x(seed=2)}
    with torch.no_grad():
        expected = {k: reference(x)[0] for k, x in xs.items()}
    b_inside, a_done = threading.Event(), threading.Event()
    results: dict[str, object] = {}
    held: list[str] = []

    def hold(module, args):
        """The interleaving that broke the shared stack: a inside its call until b is
        inside its own, then b inside until a has returned."""
        if isinstance(module, StackedRecurrent):
            held.append(threading.current_thread().name)
            if threading.current_thread().name == "a":
                b_inside.wait(10)
            elif threading.current_thread().name == "b":
                b_inside.set()
                a_done.wait(10)

    def serve() -> None:
        name = threading.current_thread().name
        try:
            # with gradients: a short call without them is torch's forward on the CPU,
            # and this is about rnnkit's own stack
            results[name] = mine(xs[name])[0].detach()
        except Exception as error:  # reported by the main thread
            results[name] = error
        finally:
            if name == "a":
                a_done.set()

    handle = torch.nn.modules.module.register_module_forward_pre_hook(hold)
    try:
        threads = [threading.Thread(target=serve, name=name) for name in ("a", "b")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    finally:
        handle.remove()
    assert sorted(held) == ["a", "b"]  # both calls went through rnnkit's stack
    for name in ("a", "b"):
        assert isinstance(results[name], torch.Tensor), f"thread {name}: {results[name]!r}"
        torch.testing.assert_close(results[name], expected[name], rtol=0, atol=1e-10)


@pytest.mark.parametrize("mode", MODES)
def test_options_changed_after_construction_count_as_in_torch(mode):
    # before: the inner stack kept the constructor's dropout and batch_first
    reference, mine = _pair(mode, num_layers=2, dropout=0.5)
    for module in (reference, mine):
        module.dropout = 0.0  # a common way to switch dropout off for one run
        module.batch_first = True
    x = _x().transpose(0, 1)
    _assert_same(mine(x)[0:1], reference(x)[0:1])


@pytest.mark.parametrize("mode", [*MODES, *(m + "Cell" for m in MODES)])
def test_torch_fx_records_the_layer_as_one_node_as_torchs(mode):
    # before: FX traced into forward ("input must be a Tensor or a PackedSequence")
    reference, mine = _pair(mode)
    cell = mode.endswith("Cell")
    x = torch.randn(2, 3, dtype=DTYPE) if cell else _x()
    h = torch.randn(2, 4, dtype=DTYPE) if cell else torch.randn(1, 2, 4, dtype=DTYPE)
    hx = (h, h.cos()) if mode.startswith("LSTM") else h

    class Model(torch.nn.Module):
        def __init__(self, rnn: torch.nn.Module) -> None:
            super().__init__()
            self.rnn = rnn

        def forward(self, x, hx):
            out = self.rnn(x, hx)
            return out[0].tanh()

    graphs = [torch.fx.symbolic_trace(Model(m)) for m in (reference, mine)]
    nodes = [[(n.op, str(n.target)) for n in g.graph.nodes] for g in graphs]
    assert nodes[1] == nodes[0]
    assert ("call_module", "rnn") in nodes[1]
    torch.testing.assert_close(graphs[1](x, hx), graphs[0](x, hx), rtol=1e-9, atol=1e-10)


def _scaled(base: type) -> type:
    """A user's subclass whose forward scales its input, then calls the layer's."""

    class Scaled(base):
        def forward(self, input, hx=None):
            return super().forward(input * 2.0, hx)

    return Scaled


class _Holder(torch.nn.Module):
    def __init__(self, rnn: torch.nn.Module) -> None:
        super().__init__()
        self.rnn = rnn

    def forward(self, x):
        return self.rnn(x)[0].tanh()


class _LeafTracer(torch.fx.Tracer):
    def is_leaf_module(self, m: torch.nn.Module, module_qualified_name: str) -> bool:
        return module_qualified_name == "rnn" or super().is_leaf_module(m, module_qualified_name)


def _hooked(mode: str, lib: Any, how: str) -> torch.nn.Module:
    """A layer or cell of ``lib`` whose call runs more than its forward (``how``)."""
    torch.manual_seed(0)
    if how == "subclass":
        return _scaled(getattr(lib, mode))(3, 4).double()
    module = getattr(lib, mode)(3, 4).double()
    if how == "pre-hook":
        module.register_forward_pre_hook(lambda m, args: (args[0] * 2.0, *args[1:]))
    elif how == "hook":
        pair = mode not in ("RNNCell", "GRUCell")  # (output, state) or (h, c); else h
        module.register_forward_hook(
            lambda m, args, out: (out[0].sin(), out[1]) if pair else out.sin()
        )
    else:  # a forward replaced on the instance
        own = module.forward
        module.forward = lambda input, hx=None: own(input * 2.0, hx)
    return module


@pytest.mark.parametrize("how", ["subclass", "pre-hook", "hook", "instance"])
@pytest.mark.parametrize("mode", [*MODES, *(m + "Cell" for m in MODES)])
def test_torch_fx_graph_of_a_layer_with_more_than_its_forward_computes_eagers_function(mode, how):
    """A subclass's forward calling the drop-in's, hooks, or a forward set on the
    instance: the trace records them, and the graph's node for the drop-in runs its own
    forward alone. Before: the node called the module, which ran them again at each call
    of the graph (the input scaled twice, off by ~0.3). torch traces into its layers'
    subclasses, and fails there (its forward branches on the data)."""
    x = torch.randn(2, 3, dtype=DTYPE) if mode.endswith("Cell") else _x()
    reference, mine = _hooked(mode, torch.nn, how), _hooked(mode, knn, how)
    mine.load_state_dict(reference.state_dict())
    graph = torch.fx.symbolic_trace(_Holder(mine))
    torch.testing.assert_close(graph(x), _Holder(mine)(x), rtol=0, atol=0)
    if how == "subclass":
        with pytest.raises(torch.fx.proxy.TraceError):
            torch.fx.symbolic_trace(_Holder(reference))
    else:  # torch's layer is a leaf there: its module's call runs them at each call
        torch.testing.assert_close(torch.fx.symbolic_trace(_Holder(reference))(x), graph(x))
    torch.testing.assert_close(graph(x), _Holder(reference)(x), rtol=1e-9, atol=1e-10)
    leaf = _Holder(mine)  # kept whole by a tracer: its call, as torch's
    torch.testing.assert_close(torch.fx.GraphModule(leaf, _LeafTracer().trace(leaf))(x), graph(x))


@pytest.mark.parametrize("mode", ["LSTM", "GRUCell"])
def test_torch_fx_cannot_trace_a_drop_in_by_itself_and_says_so_with_torchs_error(mode):
    with pytest.raises(torch.fx.proxy.TraceError):
        torch.fx.symbolic_trace(getattr(torch.nn, mode)(3, 4))
    with pytest.raises(torch.fx.proxy.TraceError, match=rf"rnnkit\.nn\.{mode} is recorded"):
        torch.fx.symbolic_trace(getattr(knn, mode)(3, 4))


class _Double(torch.nn.Module):
    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return weight * 2.0


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
@pytest.mark.parametrize("mode", [*MODES, *(m + "Cell" for m in MODES)])
def test_torchscript_refuses_what_torchs_class_would_compute_otherwise(mode):
    """A subclass with a forward of its own (torch's class compiled in its place dropped
    it without a word) and a parametrized weight (compiled as the weight last computed).
    A subclass without a forward of its own still scripts as torch's class over the same
    parameters."""
    with pytest.raises(TracingError, match=r"Scaled has a forward of its own over rnnkit\.nn\."):
        torch.jit.script(torch.nn.Sequential(_scaled(getattr(knn, mode))(3, 4)))
    doubled = getattr(knn, mode)(3, 4)
    weight = "weight_ih" if mode.endswith("Cell") else "weight_ih_l0"
    torch.nn.utils.parametrize.register_parametrization(doubled, weight, _Double())
    with pytest.raises(TracingError, match=rf"{weight} carries a parametrization"):
        torch.jit.script(torch.nn.Sequential(doubled))

    class Initialised(getattr(knn, mode)):
        def reset_parameters(self) -> None:
            for p in self.parameters():
                torch.nn.init.constant_(p, 0.5)

    plain = Initialised(3, 4).__prepare_scriptable__()
    assert type(plain) is getattr(torch.nn, mode)
    assert all(bool((p == 0.5).all()) for p in plain.parameters())


def _seq2seq_translation(nn) -> dict[str, list[float]]:
    """PyTorch's "translation with a sequence to sequence network and attention" tutorial
    in miniature, written against the namespace ``nn``: a GRU encoder, a GRU decoder with
    Bahdanau attention called one step at a time with its hidden state, teacher forcing,
    then greedy decoding (its log-probabilities)."""
    import torch.nn.functional as F

    torch.manual_seed(0)
    V, H, L, SOS = 7, 6, 4, 0

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = nn.Embedding(V, H)
            self.gru = nn.GRU(H, H, batch_first=True)
            self.dropout = nn.Dropout(0.1)

        def forward(self, tokens):
            return self.gru(self.dropout(self.embedding(tokens)))

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.Wa, self.Ua, self.Va = nn.Linear(H, H), nn.Linear(H, H), nn.Linear(H, 1)

        def forward(self, query, keys):
            scores = self.Va(torch.tanh(self.Wa(query) + self.Ua(keys))).squeeze(2).unsqueeze(1)
            return torch.bmm(F.softmax(scores, dim=-1), keys)

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = nn.Embedding(V, H)
            self.attention = Attention()
            self.gru = nn.GRU(2 * H, H, batch_first=True)
            self.out = nn.Linear(H, V)
            self.dropout = nn.Dropout(0.1)

        def forward(self, keys, hidden, target=None):
            step_input = torch.full((keys.size(0), 1), SOS, dtype=torch.long)
            outputs = []
            for i in range(L):
                embedded = self.dropout(self.embedding(step_input))
                context = self.attention(hidden.permute(1, 0, 2), keys)
                output, hidden = self.gru(torch.cat((embedded, context), dim=2), hidden)
                outputs.append(self.out(output))
                if target is not None:
                    step_input = target[:, i].unsqueeze(1)
                else:
                    step_input = outputs[-1].topk(1)[1].squeeze(-1).detach()
            return F.log_softmax(torch.cat(outputs, dim=1), dim=-1)

    encoder, decoder = Encoder().double(), Decoder().double()
    parameters = [*encoder.parameters(), *decoder.parameters()]
    optimizer = torch.optim.Adam(parameters, lr=0.05)
    source = torch.randint(1, V, (3, 5))
    target = torch.randint(1, V, (3, L))
    losses = []
    for _ in range(15):
        optimizer.zero_grad()
        keys, hidden = encoder(source)
        log_probs = decoder(keys, hidden, target)
        loss = F.nll_loss(log_probs.view(-1, V), target.view(-1))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    encoder.eval()
    decoder.eval()
    with torch.no_grad():
        keys, hidden = encoder(source)
        greedy = decoder(keys, hidden)
    return {"losses": losses, "greedy": greedy.flatten().tolist()}


@pytest.mark.usefixtures("single_thread")
def test_the_seq2seq_translation_tutorial_runs_the_same():
    theirs = _seq2seq_translation(torch.nn)
    ours = _seq2seq_translation(knn)
    assert ours["losses"] == pytest.approx(theirs["losses"], rel=1e-9)
    assert ours["greedy"] == pytest.approx(theirs["greedy"], rel=1e-9)


def test_a_projected_lstm_where_neither_torch_nor_rnnkit_can_run_it_is_one_error():
    """proj_size under vmap, or packed under a torch.func transform: torch's kernel has no
    rule there and rnnkit has no projected layer. It was a shape error from rnnkit's steps
    run without the projection; now one line that names the layer and what to do."""
    from rnnkit.bptt.tracing import TracingError

    reference, mine = _pair("LSTM", proj_size=2)
    x = torch.randn(4, 3, 3, dtype=DTYPE)  # (T, B, I)
    packed = pack_padded_sequence(x, [4, 2, 3], enforce_sorted=False)
    params = {k: v.detach() for k, v in mine.named_parameters()}

    def loss(p):
        return functional_call(mine, p, (packed,))[0].data.sum()

    with pytest.raises(
        TracingError,
        match=r"^rnnkit\.nn\.LSTM: a projected LSTM \(proj_size=2\) "
        r"cannot run under a torch\.func transform on a PackedSequence.*padded",
    ):
        torch.func.grad(loss)(params)
    with pytest.raises(TracingError, match=r"cannot run under vmap.*whole batch instead$"):
        torch.func.vmap(lambda xi: mine(xi[:, None])[0])(x)
    # the padded tensor under grad is torch's own computation, as torch's layer gives it
    padded = torch.func.grad(lambda p: functional_call(mine, p, (x,))[0].sum())(params)
    reference(x)[0].sum().backward()
    _assert_same([padded[k] for k in params], [p.grad for p in reference.parameters()])
