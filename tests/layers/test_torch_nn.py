"""``rnnkit.nn.RNN/LSTM/GRU`` against ``torch.nn`` with the same state dict (float64):
outputs, final states and every gradient; packed and unbatched input, ``hx``, the
constructor's positional order, initial weights from the same seed, errors."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import rnnkit
from rnnkit import nn as knn
from rnnkit.bptt.fused import use_fused

DTYPE = torch.float64
MODES = [("RNN", {}), ("RNN", {"nonlinearity": "relu"}), ("LSTM", {}), ("GRU", {})]
SHAPES = [  # (batch_first, bidirectional, num_layers)
    (False, False, 1),
    (True, True, 2),
    (False, True, 2),
]


def _pair(mode: str, seed: int = 0, **kw):
    torch.manual_seed(seed)
    reference = getattr(torch.nn, mode)(3, 5, dtype=DTYPE, **kw)
    mine = getattr(knn, mode)(3, 5, dtype=DTYPE, **kw)
    mine.load_state_dict(reference.state_dict())
    return reference, mine


def _hx(mode: str, L: int, D: int, B: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(L * D, B, 5, dtype=DTYPE, generator=g)
    if mode == "LSTM":
        return (h, torch.randn(L * D, B, 5, dtype=DTYPE, generator=g))
    return h


def _flat(state):
    return list(state) if isinstance(state, tuple) else [state]


def _grads(module, x, hx, out_state):
    out, state = out_state
    loss = out.pow(2).sum() + sum(s.sin().sum() for s in _flat(state))
    inputs = [x, *_flat(hx)]
    names = [n for n, _ in module.named_parameters()]
    grads = torch.autograd.grad(loss, [*inputs, *module.parameters()])
    return dict(zip(["x", "h0", "c0"][: len(inputs)] + names, grads, strict=False))


@pytest.mark.parametrize("mode,options", MODES, ids=lambda v: str(v))
@pytest.mark.parametrize("batch_first,bidirectional,num_layers", SHAPES)
def test_same_outputs_states_and_gradients(mode, options, batch_first, bidirectional, num_layers):
    kw = dict(batch_first=batch_first, bidirectional=bidirectional, num_layers=num_layers)
    reference, mine = _pair(mode, **options, **kw)
    B, T = 3, 6
    shape = (B, T, 3) if batch_first else (T, B, 3)
    x = torch.randn(*shape, dtype=DTYPE, requires_grad=True)
    hx = _hx(mode, num_layers, 2 if bidirectional else 1, B)
    for h in _flat(hx):
        h.requires_grad_(True)
    expected, got = reference(x, hx), mine(x, hx)
    torch.testing.assert_close(got[0], expected[0], rtol=0, atol=1e-10)
    for a, b in zip(_flat(got[1]), _flat(expected[1]), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
    g_ref, g_mine = _grads(reference, x, hx, expected), _grads(mine, x, hx, got)
    assert g_mine.keys() == g_ref.keys()
    for name in g_ref:
        torch.testing.assert_close(g_mine[name], g_ref[name], rtol=0, atol=1e-9, msg=name)
    # No hx: zeros, as in torch.
    torch.testing.assert_close(mine(x)[0], reference(x)[0], rtol=0, atol=1e-10)


@pytest.mark.parametrize("mode", ["RNN", "LSTM", "GRU"])
@pytest.mark.parametrize("batch_first", [False, True])
def test_packed_sequence_in_and_out(mode, batch_first):
    reference, mine = _pair(mode, batch_first=batch_first, bidirectional=True, num_layers=2)
    lengths = torch.tensor([4, 7, 2, 7])  # unsorted: enforce_sorted=False
    x = torch.randn(4, 7, 3, dtype=DTYPE)
    if not batch_first:
        x = x.transpose(0, 1)
    packed = pack_padded_sequence(x, lengths, batch_first=batch_first, enforce_sorted=False)
    hx = _hx(mode, 2, 2, 4)
    (p_ref, s_ref), (p_mine, s_mine) = reference(packed, hx), mine(packed, hx)
    assert isinstance(p_mine, torch.nn.utils.rnn.PackedSequence)
    assert torch.equal(p_mine.batch_sizes, p_ref.batch_sizes)
    assert torch.equal(p_mine.sorted_indices, p_ref.sorted_indices)
    assert torch.equal(p_mine.unsorted_indices, p_ref.unsorted_indices)
    torch.testing.assert_close(p_mine.data, p_ref.data, rtol=0, atol=1e-10)
    for a, b in zip(_flat(s_mine), _flat(s_ref), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
    _, out_lengths = pad_packed_sequence(p_mine, batch_first=batch_first)
    assert out_lengths.tolist() == lengths.tolist()


@pytest.mark.parametrize("mode", ["RNN", "LSTM", "GRU"])
def test_unbatched_input(mode):
    reference, mine = _pair(mode, bidirectional=True)
    x = torch.randn(6, 3, dtype=DTYPE)
    h = torch.randn(2, 5, dtype=DTYPE)
    hx = (h, h.cos()) if mode == "LSTM" else h
    (o_ref, s_ref), (o_mine, s_mine) = reference(x, hx), mine(x, hx)
    assert o_mine.shape == o_ref.shape == (6, 10)
    torch.testing.assert_close(o_mine, o_ref, rtol=0, atol=1e-10)
    for a, b in zip(_flat(s_mine), _flat(s_ref), strict=True):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


@pytest.mark.parametrize("mode", ["RNN", "LSTM", "GRU"])
def test_no_bias(mode):
    reference, mine = _pair(mode, bias=False, num_layers=2)
    assert list(mine.state_dict()) == list(reference.state_dict())
    assert not any("bias" in k for k in mine.state_dict())
    x = torch.randn(5, 2, 3, dtype=DTYPE)
    torch.testing.assert_close(mine(x)[0], reference(x)[0], rtol=0, atol=1e-10)


@pytest.mark.parametrize("mode", ["RNN", "LSTM", "GRU"])
def test_same_seed_same_initial_weights_and_state_dict_both_ways(mode):
    torch.manual_seed(3)
    reference = getattr(torch.nn, mode)(4, 6, num_layers=2, bidirectional=True)
    torch.manual_seed(3)
    mine = getattr(knn, mode)(4, 6, num_layers=2, bidirectional=True)
    assert list(mine.state_dict()) == list(reference.state_dict())
    for key, value in reference.state_dict().items():
        assert torch.equal(mine.state_dict()[key], value), key
    back = getattr(torch.nn, mode)(4, 6, num_layers=2, bidirectional=True)
    back.load_state_dict(mine.state_dict())  # and rnnkit's loads into torch
    assert [len(w) for w in mine.all_weights] == [len(w) for w in reference.all_weights]


def test_torch_positional_order_and_defaults():
    """``LSTM(8, 16, 2, True, True)`` is (num_layers, bias, batch_first), as in torch."""
    mine, reference = knn.LSTM(8, 16, 2, True, True), torch.nn.LSTM(8, 16, 2, True, True)
    for name in ("num_layers", "bias", "batch_first", "dropout", "bidirectional", "proj_size"):
        assert getattr(mine, name) == getattr(reference, name), name
    assert knn.GRU(2, 3).batch_first is False
    rnn = knn.RNN(3, 4, 1, "relu")
    assert rnn.nonlinearity == "relu" and repr(rnn) == repr(torch.nn.RNN(3, 4, 1, "relu"))
    assert repr(knn.LSTM(3, 4, batch_first=True)) == repr(torch.nn.LSTM(3, 4, batch_first=True))
    mine.flatten_parameters()  # torch code calls it


def test_eval_mode_dropout_is_identity_as_in_torch():
    reference, mine = _pair("GRU", num_layers=3, dropout=0.5)
    reference.eval()
    mine.eval()
    x = torch.randn(5, 2, 3, dtype=DTYPE)
    torch.testing.assert_close(mine(x)[0], reference(x)[0], rtol=0, atol=1e-10)


@pytest.mark.parametrize("mode", ["RNN", "LSTM", "GRU"])
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("steps", [6, 1])
def test_training_dropout_draws_torchs_masks(mode, packed, batch_first, steps):
    """Dropout between layers in training: torch's masks (the same draws from torch's
    generator), so outputs, states and gradients are torch's, and the generator is left
    where torch's layer leaves it. Before, a packed input drew a padded tensor's masks:
    other values and, after the call, other random numbers; and a packed input of one
    step (the single-step route) failed inside the dropout."""
    kw = dict(num_layers=3, dropout=0.5, bidirectional=True, batch_first=batch_first)
    reference, mine = _pair(mode, **kw)
    x = torch.randn(3, steps, 3, dtype=DTYPE)
    x = (x if batch_first else x.transpose(0, 1)).requires_grad_(True)
    lengths = torch.tensor([4, 6, 1]).clamp(max=steps)
    runs = []
    for module in (reference, mine):
        torch.manual_seed(11)
        inp = x
        if packed:
            inp = pack_padded_sequence(x, lengths, batch_first=batch_first, enforce_sorted=False)
        out, state = module(inp)
        out = out.data if packed else out
        loss = out.pow(2).sum() + sum(s.sin().sum() for s in _flat(state))
        grads = torch.autograd.grad(loss, [x, *module.parameters()])
        runs.append([out, *_flat(state), *grads, torch.rand(4, dtype=DTYPE)])
    for got, expected in zip(runs[1], runs[0], strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-9)


def test_errors_are_clear():
    with pytest.raises(ValueError, match="Unknown nonlinearity"):
        knn.RNN(3, 4, nonlinearity="sigmoid")
    lstm = knn.LSTM(3, 4, num_layers=2)
    x = torch.randn(5, 2, 3)
    with pytest.raises(TypeError, match=r"hx must be the pair \(h_0, c_0\)"):
        lstm(x, torch.zeros(2, 2, 4))
    with pytest.raises(RuntimeError, match=r"Expected hx\[0\] size \(2, 2, 4\)"):
        lstm(x, (torch.zeros(1, 2, 4), torch.zeros(1, 2, 4)))
    with pytest.raises(TypeError, match="hx must be one tensor"):
        knn.GRU(3, 4)(x, (torch.zeros(1, 2, 4),))
    with pytest.raises(ValueError, match="Expected input to be 2D or 3D"):
        knn.GRU(3, 4)(torch.zeros(5, 2, 3, 1))


def test_namespace():
    assert rnnkit.nn.LSTM is knn.LSTM
    assert sum(p.numel() for p in knn.LSTM(3, 5).parameters()) == sum(
        p.numel() for p in torch.nn.LSTM(3, 5).parameters()
    )


# -- the drop-ins are torch's classes ---------------------------------------------------------
@pytest.mark.parametrize("mode", ["RNN", "LSTM", "GRU"])
def test_instances_of_torchs_classes_with_torchs_small_api(mode):
    mine = getattr(knn, mode)(3, 5, num_layers=2)
    assert isinstance(mine, getattr(torch.nn, mode)) and isinstance(mine, torch.nn.RNNBase)
    assert [t.shape for t in mine._flat_weights] == [p.shape for p in mine.parameters()]
    x = torch.randn(4, 2, 3)
    h = torch.zeros(2, 2, 5)
    hx = (h, h) if mode == "LSTM" else h
    mine.check_forward_args(x, hx, None)  # torch's own checks pass
    assert mine.permute_hidden(hx, None) is hx


def test_projected_lstm_is_computed_as_torch_does():
    reference, mine = _pair("LSTM", num_layers=2, proj_size=2, bidirectional=True)
    x = torch.randn(6, 3, 3, dtype=DTYPE)
    (o1, (h1, c1)), (o2, (h2, c2)) = reference(x), mine(x)
    assert h2.shape == (4, 3, 2)
    for a, b in ((o1, o2), (h1, h2), (c1, c2)):
        torch.testing.assert_close(b, a, rtol=0, atol=0)


@pytest.mark.parametrize("mode", ["RNN", "LSTM", "GRU"])
def test_a_batch_of_size_zero_gives_torchs_empty_results(mode):
    reference, mine = _pair(mode, batch_first=True)
    x = torch.zeros(0, 4, 3, dtype=DTYPE)
    (o1, s1), (o2, s2) = reference(x), mine(x)
    assert o2.shape == o1.shape == (0, 4, 5)
    assert [t.shape for t in _flat(s2)] == [t.shape for t in _flat(s1)]


def test_dropout_one_runs_as_in_torch():
    mine = knn.GRU(3, 4, num_layers=2, dropout=1.0)
    out, h = mine(torch.randn(5, 2, 3))
    assert out.shape == (5, 2, 4) and h.shape == (2, 2, 4)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.ao's own notices
@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor:UserWarning")
def test_quantize_dynamic_quantizes_the_drop_in_as_torchs():
    """The PyTorch tutorial's recipe for a word language model, {nn.LSTM, nn.Linear},
    through rnnkit.nn's quantize_dynamic (torch's looks classes up by exact type)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential()
    model.add_module("rnn", knn.LSTM(8, 16, num_layers=2))
    quantized = knn.quantize_dynamic(model, {knn.LSTM, knn.Linear}, dtype=torch.qint8)
    assert isinstance(quantized.rnn, torch.ao.nn.quantized.dynamic.LSTM)
    assert isinstance(model.rnn, knn.LSTM)  # not in place, as torch's default
    x = torch.randn(5, 2, 8)
    torch.testing.assert_close(quantized.rnn(x)[0], model.rnn(x)[0], rtol=0, atol=0.05)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.ao's own notices
@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor:UserWarning")
def test_torchs_quantize_dynamic_quantizes_the_drop_in_once_registered(monkeypatch):
    """The tutorial's own line, torch's function, after the one opt-in call; before it,
    torch's function leaves the subclass alone (exact-class lookup), which is why the
    registration exists. Torch's table is replaced by a copy so the test leaks nothing."""
    from torch.ao.quantization import quantization_mappings as qm

    table = dict(qm.DEFAULT_DYNAMIC_QUANT_MODULE_MAPPINGS)
    monkeypatch.setattr(qm, "DEFAULT_DYNAMIC_QUANT_MODULE_MAPPINGS", table)
    torch.manual_seed(0)
    model = torch.nn.Sequential()
    model.add_module("rnn", knn.LSTM(8, 16, num_layers=2))
    model.add_module("cell", knn.GRUCell(8, 4))
    spec = {knn.LSTM, knn.GRUCell, knn.Linear}
    before = torch.ao.quantization.quantize_dynamic(model, spec, dtype=torch.qint8)
    assert type(before.rnn) is knn.LSTM
    knn.register_quantization()
    knn.register_quantization()  # again: the same table
    assert len(table) == len(qm.DEFAULT_DYNAMIC_QUANT_MODULE_MAPPINGS)
    quantized = torch.ao.quantization.quantize_dynamic(model, spec, dtype=torch.qint8)
    assert isinstance(quantized.rnn, torch.ao.nn.quantized.dynamic.LSTM)
    assert isinstance(quantized.cell, torch.ao.nn.quantized.dynamic.GRUCell)
    x = torch.randn(5, 2, 8)
    torch.testing.assert_close(quantized.rnn(x)[0], model.rnn(x)[0], rtol=0, atol=0.05)
    torch.testing.assert_close(quantized.cell(x[0]), model.cell(x[0]), rtol=0, atol=0.05)


def test_importing_rnnkit_nn_registers_nothing_with_torch_quantization():
    """The registration is opt-in: a fresh interpreter's table has no rnnkit class."""
    code = (
        "import rnnkit.nn, rnnkit\n"
        "from torch.ao.quantization import quantization_mappings as qm\n"
        "print(sum('rnnkit' in getattr(k, '__module__', '') "
        "for k in qm.DEFAULT_DYNAMIC_QUANT_MODULE_MAPPINGS))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "0"


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # TorchScript's own notice
@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")  # torch's LSTM's own checks
@pytest.mark.parametrize("mode", ["LSTM", "GRU"])
def test_torchscript_trace_and_script_compute_the_same_function(mode):
    reference, mine = _pair(mode, num_layers=2, bidirectional=True)
    x, x2 = torch.randn(4, 2, 3, dtype=DTYPE), torch.randn(4, 2, 3, dtype=DTYPE)
    traced = torch.jit.trace(mine, (x,))
    torch.testing.assert_close(traced(x2)[0], reference(x2)[0], rtol=0, atol=1e-12)
    # torch.jit.script compiles torch's own class over the same parameters
    plain = mine.__prepare_scriptable__()
    assert type(plain) is getattr(torch.nn, mode)
    assert plain.weight_ih_l0 is mine.weight_ih_l0
    torch.testing.assert_close(plain(x2)[0], reference(x2)[0], rtol=0, atol=0)
    try:
        scripted_torch = torch.jit.script(reference)
        scripted_torch(x)
    except (AttributeError, RuntimeError) as exc:  # torch 2.13 no longer scripts its RNNs
        pytest.skip(f"torch.jit.script of torch.nn.{mode} itself fails here: {exc}")
    scripted = torch.jit.script(mine)
    torch.testing.assert_close(scripted(x)[0], reference(x)[0], rtol=0, atol=1e-12)


class _Model(torch.nn.Module):
    """A user's model holding a drop-in (module level: pickles name their class)."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(10, 3)
        self.rnn = knn.LSTM(3, 5, num_layers=2)
        self.head = torch.nn.Linear(5, 10)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(self.embedding(ids))[0])


def test_a_pickled_whole_model_loads_with_weights_only_and_the_public_classes(tmp_path):
    torch.manual_seed(0)
    model = _Model()
    torch.save(model, tmp_path / "model.pt")
    allowed = [_Model, torch.nn.Embedding, torch.nn.Linear, knn.LSTM]
    with torch.serialization.safe_globals(allowed):
        loaded = torch.load(tmp_path / "model.pt", weights_only=True)
    ids = torch.randint(0, 10, (4, 2))
    torch.testing.assert_close(loaded(ids), model(ids), rtol=0, atol=0)
    assert type(loaded.rnn) is knn.LSTM and knn.LSTM.__module__ == "rnnkit.nn"
    refused = pytest.raises(Exception, match=r"rnnkit\.nn\.LSTM")  # only what is allowed
    with refused, torch.serialization.safe_globals(allowed[:3]):
        torch.load(tmp_path / "model.pt", weights_only=True)


class _DropConnect(torch.nn.Module):
    """A weight parametrization that draws a dropout mask at each evaluation (the
    DropConnect of AWD-LSTM's weight drop), counting its evaluations."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return torch.nn.functional.dropout(weight, 0.5, self.training)


@pytest.mark.parametrize("mode", ["RNN", "LSTM", "GRU"])
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_parametrized_weights_are_evaluated_as_torch_evaluates_them(mode, packed):
    """A parametrization runs as often per call as in torch's forward (which evaluates
    the weights twice: once to see whether they changed, once to use them), and its
    last value is the one used: the same dropout masks, the same generator afterwards,
    and spectral_norm's power iteration as far along. Before, the drop-in read each
    weight once more for every check (input, hx) and once for the computation."""
    from torch.nn.utils import parametrize
    from torch.nn.utils.parametrizations import spectral_norm

    reference, mine = _pair(mode, num_layers=2, bidirectional=True)
    runs = []
    for module in (reference, mine):
        parametrize.register_parametrization(module, "weight_hh_l0", _DropConnect())
        parametrize.register_parametrization(module, "weight_ih_l0", _DropConnect())
        torch.manual_seed(5)
        spectral_norm(module, "weight_hh_l1_reverse")
        x = torch.randn(4, 3, 3, dtype=DTYPE, generator=torch.Generator().manual_seed(3))
        inp = pack_padded_sequence(x, [4, 2, 3], enforce_sorted=False) if packed else x
        outputs = [module(inp, _hx(mode, 2, 2, 3))[0] for _ in range(3)]
        if packed:
            outputs = [pad_packed_sequence(out)[0] for out in outputs]
        sum(out.sum() for out in outputs).backward()
        calls = [module.parametrizations[n][0].calls for n in ("weight_hh_l0", "weight_ih_l0")]
        runs.append((outputs, calls, module.state_dict(), torch.rand(2), module))
    (outputs, calls, state, after, reference), (o_mine, c_mine, s_mine, a_mine, mine) = runs
    assert c_mine == calls
    assert torch.equal(a_mine, after)  # the generator is where torch's layer leaves it
    for a, b in zip(o_mine, outputs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)
    for key in state:  # spectral_norm's vectors u, v among them
        torch.testing.assert_close(s_mine[key], state[key], rtol=1e-9, atol=1e-12, msg=key)
    for (name, a), (_, b) in zip(
        mine.named_parameters(), reference.named_parameters(), strict=True
    ):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-9, atol=1e-12, msg=name)


@pytest.mark.parametrize("mode", ["RNN", "LSTM", "GRU"])
def test_a_layer_with_a_parametrized_weight_deep_copies_as_torchs(mode):
    """``copy.deepcopy`` (``AveragedModel``, a kept best model) of a layer with
    ``weight_norm`` on ``weight_hh_l0``: torch's parametrized class copies the module's
    ``__dict__`` as it is, which failed on the drop-in's per-thread room ("cannot
    pickle '_Stacks' object")."""
    import copy

    from torch.nn.utils.parametrizations import weight_norm

    reference, mine = _pair(mode, num_layers=2)
    x = torch.randn(4, 2, 3, dtype=DTYPE)
    for module in (reference, mine):
        weight_norm(module, "weight_hh_l0")
    copies = [copy.deepcopy(module) for module in (reference, mine)]
    for module in (*copies, mine):
        with torch.no_grad():
            module.parametrizations.weight_hh_l0.original0.mul_(1.5)  # the copies' own
    torch.testing.assert_close(copies[1](x)[0], copies[0](x)[0], rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(mine(x)[0], copies[1](x)[0], rtol=1e-9, atol=1e-12)
    assert type(copies[1]).__mro__[1] is knn.__dict__[mode]  # torch's parametrized class


@pytest.mark.parametrize("mode", ["RNN", "LSTM", "GRU"])
def test_a_single_step_on_the_cpu_is_torchs_cell_operators_and_bad_input_names_the_layer(
    mode, monkeypatch
):
    # A decoder calling its layer step by step: rnnkit's loop cost several times torch's
    # step there, and torch's own LSTM forward (oneDNN) more still (benchmarks/README.md),
    # so one step is torch's fused cell operators, one per layer and direction; longer
    # calls, or the loop path forced, run rnnkit's route (one per layer).
    from rnnkit.bptt import recurrence
    from rnnkit.bptt.fused import use_fused
    from rnnkit.layers import torch_nn

    routes, steps = [], []
    real = recurrence.route
    monkeypatch.setattr(recurrence, "route", lambda *a, **k: routes.append(1) or real(*a, **k))
    for key, op in list(torch_nn._CELL_OPS.items()):
        counted = lambda *a, op=op, **k: steps.append(1) or op(*a, **k)  # noqa: E731
        monkeypatch.setitem(torch_nn._CELL_OPS, key, counted)
    torch.manual_seed(0)
    theirs = getattr(torch.nn, mode)(3, 4, num_layers=2, batch_first=True)
    mine = getattr(knn, mode)(3, 4, num_layers=2, batch_first=True)
    mine.load_state_dict(theirs.state_dict())
    x = torch.randn(2, 1, 3)
    got, want = mine(x), theirs(x)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)  # oneDNN's rounding or not
    assert routes == [] and len(steps) == 2
    with use_fused("loop"):
        looped = mine(x)
    assert len(routes) == 2
    torch.testing.assert_close(looped, want, rtol=1e-5, atol=1e-6)
    mine(torch.randn(2, 3, 3))
    assert len(routes) == 4 and len(steps) == 2
    with pytest.raises(RuntimeError, match=f"rnnkit.nn.{mode}: input.size"):
        mine(torch.zeros(2, 1, 7))
    with pytest.raises(RuntimeError, match=f"rnnkit.nn.{mode}: Expected hx"):
        mine(x, (torch.zeros(4, 2, 4),) * 2 if mode == "LSTM" else torch.zeros(4, 2, 4))


@pytest.mark.parametrize("mode", ["RNN_RELU", "LSTM", "GRU"])
@pytest.mark.parametrize(
    "options, shape",
    [
        ({"batch_first": True}, (3, 1, 5)),
        ({"bidirectional": True, "dropout": 0.5}, (1, 3, 5)),  # time-major, dropout drawn
        ({"bias": False, "bidirectional": True}, (1, 5)),  # unbatched
    ],
    ids=["batch-first", "bidirectional-dropout", "unbatched-no-bias"],
)
def test_a_single_step_equals_torchs_layer_in_float64_gradients_too(mode, options, shape):
    # torch's float64 layer (no oneDNN) is the oracle: outputs, final states and every
    # gradient (the input's, the initial state's, the weights'), with the same dropout
    # masks drawn from the same seed
    torch.manual_seed(0)
    extra = {"nonlinearity": "relu"} if mode == "RNN_RELU" else {}
    kind = "RNN" if mode.startswith("RNN") else mode
    theirs = getattr(torch.nn, kind)(5, 4, num_layers=3, **options, **extra).double()
    mine = getattr(knn, kind)(5, 4, num_layers=3, **options, **extra).double()
    mine.load_state_dict(theirs.state_dict())
    D = 2 if options.get("bidirectional") else 1
    batched = len(shape) == 3
    hx_shape = (3 * D, shape[0] if options.get("batch_first") else shape[1], 4)
    hx_shape = hx_shape if batched else (3 * D, 4)
    x0 = torch.randn(*shape, dtype=torch.float64)
    hx0 = [torch.randn(*hx_shape, dtype=torch.float64) for _ in range(2 if kind == "LSTM" else 1)]

    def run(module):
        module.zero_grad()
        x = x0.clone().requires_grad_()
        hx = [h.clone().requires_grad_() for h in hx0]
        torch.manual_seed(7)
        out, final = module(x, tuple(hx) if kind == "LSTM" else hx[0])
        finals = list(final) if kind == "LSTM" else [final]
        loss = sum((t * (i + 1.5)).sin().sum() for i, t in enumerate([out, *finals]))
        loss.backward()
        grads = [x.grad, *(h.grad for h in hx), *(p.grad for p in module.parameters())]
        return [out.detach(), *(f.detach() for f in finals), *grads]

    for want, got in zip(run(theirs), run(mine), strict=True):
        torch.testing.assert_close(got, want, rtol=0.0, atol=1e-12)


@pytest.mark.parametrize("mode", ["RNN", "LSTM", "GRU"])
def test_a_single_step_under_vmap_is_torchs_layer_example_by_example(mode):
    # under vmap torch's recurrent operators have no batching rule: a one-step call is
    # not handed to torch's forward there, rnnkit's steps run
    torch.manual_seed(0)
    theirs = getattr(torch.nn, mode)(3, 4, batch_first=True)
    mine = getattr(knn, mode)(3, 4, batch_first=True)
    mine.load_state_dict(theirs.state_dict())
    x = torch.randn(5, 2, 1, 3)
    got = torch.func.vmap(lambda xi: mine(xi)[0])(x)
    want = torch.stack([theirs(xi)[0] for xi in x])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["RNN", "LSTM", "GRU"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize(
    "options",
    [{"batch_first": True}, {"num_layers": 2, "bidirectional": True}, {"bias": False}],
    ids=["batch-first", "two-layers-bidirectional", "no-bias"],
)
def test_a_single_steps_quick_path_is_the_checked_paths_bits(mode, dtype, options, monkeypatch):
    # the common single step reads the weights from _parameters and skips the checks;
    # the checked path (a subclass takes it: its weights could be properties) refreshes
    # torch's _flat_weights and checks everything: the same operators on the same
    # tensors, so the same bits, gradients included, with and without an initial state
    from rnnkit.layers import torch_nn

    checked = []
    real = torch_nn._DropIn._weights
    monkeypatch.setattr(torch_nn._DropIn, "_weights", lambda s: checked.append(1) or real(s))

    class Sub(getattr(knn, mode)):
        pass

    torch.manual_seed(0)
    mine = getattr(knn, mode)(3, 5, dtype=dtype, **options)
    sub = Sub(3, 5, dtype=dtype, **options)
    sub.load_state_dict(mine.state_dict())
    L, D = options.get("num_layers", 1), 2 if options.get("bidirectional") else 1
    g = torch.Generator().manual_seed(1)
    x0 = torch.randn(
        *((2, 1) if options.get("batch_first") else (1, 2)), 3, dtype=dtype, generator=g
    )
    h0 = [torch.randn(L * D, 2, 5, dtype=dtype, generator=g) for _ in range(1 + (mode == "LSTM"))]
    for given in (True, False):
        results = []
        for module in (mine, sub):
            x = x0.clone().requires_grad_()
            hs = [h.clone().requires_grad_() for h in h0] if given else []
            hx = (tuple(hs) if mode == "LSTM" else hs[0]) if given else None
            out, final = module(x, hx)
            finals = _flat(final)
            loss = sum((t * (i + 1.5)).sin().sum() for i, t in enumerate([out, *finals]))
            grads = torch.autograd.grad(loss, [x, *hs, *module.parameters()])
            results.append([out.detach(), *(f.detach() for f in finals), *grads])
        for a, b in zip(*results, strict=True):
            assert a.dtype == b.dtype == dtype and torch.equal(a, b)
    assert len(checked) == 2  # the subclass's calls only


SINGLE_STEP_ERRORS = {  # each call of one time step fails in torch; rnnkit names the layer
    "input size": lambda m, h: m(torch.zeros(2, 1, 7, dtype=DTYPE)),
    "input dtype": lambda m, h: m(torch.zeros(2, 1, 3, dtype=torch.float32)),
    "hx size": lambda m, h: m(torch.zeros(2, 1, 3, dtype=DTYPE), h(1, 3, 5)),
    "hx dtype": lambda m, h: m(torch.zeros(2, 1, 3, dtype=DTYPE), h(1, 2, 5, dtype=torch.float32)),
}


@pytest.mark.parametrize("mode", ["RNN", "LSTM", "GRU"])
@pytest.mark.parametrize("case", list(SINGLE_STEP_ERRORS))
def test_a_single_step_with_bad_input_raises_torchs_exception_type_naming_the_layer(mode, case):
    def h(*shape, dtype=DTYPE):
        t = torch.zeros(*shape, dtype=dtype)
        return (t, t) if mode == "LSTM" else t

    reference, mine = _pair(mode, batch_first=True)
    with pytest.raises(Exception) as theirs:
        SINGLE_STEP_ERRORS[case](reference, h)
    with pytest.raises(Exception, match=f"rnnkit.nn.{mode}: ") as ours:
        SINGLE_STEP_ERRORS[case](mine, h)
    assert type(ours.value) is type(theirs.value)
    state = h(1, 2, 5)
    with pytest.raises(TypeError, match=f"rnnkit.nn.{mode}: hx must be"):
        mine(torch.zeros(2, 1, 3, dtype=DTYPE), state[0] if mode == "LSTM" else (state,))


@pytest.mark.parametrize("mode", ["RNN", "LSTM", "GRU"])
def test_a_single_step_reads_a_weight_kept_outside_parameters_as_torch_does(mode):
    # a weight-dropping wrapper (or torch.nn.utils.weight_norm's hook) moves a weight out
    # of _parameters and sets it as a plain attribute: one step computes with it, as
    # torch's layer does
    reference, mine = _pair(mode, batch_first=True)
    for module in (reference, mine):
        raw = module._parameters.pop("weight_hh_l0")
        module.weight_hh_l0 = raw.detach() * 0.5
    x = torch.randn(2, 1, 3, dtype=DTYPE)
    h = _hx(mode, 1, 1, 2)
    for a, b in zip(_flat(reference(x, h)[1]), _flat(mine(x, h)[1]), strict=True):
        torch.testing.assert_close(b, a, rtol=0.0, atol=1e-12)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # TorchScript's own notice
@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")  # torch's LSTM's own checks
@pytest.mark.parametrize("mode", ["LSTM", "GRU"])
def test_a_traced_or_compiled_single_step_is_torchs_forward_as_before(mode):
    # the quick single step stands aside while a graph is traced: torch.jit.trace and
    # torch.compile record torch's own layer (one aten.lstm/gru node), as for torch.nn
    theirs, mine = _pair(mode, batch_first=True)
    x = torch.randn(2, 1, 3, dtype=DTYPE)

    def kinds(graph):
        return sorted({n.kind() for n in graph.nodes() if n.kind().startswith("aten::")})

    traced = [torch.jit.trace(m, (x,), check_trace=False) for m in (theirs, mine)]
    assert kinds(traced[1].graph) == kinds(traced[0].graph)
    assert f"aten::{mode.lower()}" in kinds(traced[1].graph)

    graphs = []

    def backend(gm, example_inputs):
        graphs.append([str(n.target) for n in gm.graph.nodes if n.op == "call_function"])
        return gm.forward

    torch._dynamo.reset()
    got = torch.compile(mine, backend=backend)(x)
    # dynamo leaves torch's layer whole (it runs eagerly between the graphs, as torch.nn's
    # does): no cell operator of the quick step in a graph
    assert not any("cell" in target for graph in graphs for target in graph)
    torch.testing.assert_close(got, theirs(x), rtol=0.0, atol=1e-12)


# torch's forward failing for the device's reasons (out of memory, a CUDA error) is not
# computed again by rnnkit: "fused" hands the call to torch's forward on the CPU, as
# "auto" does on a GPU.


def _oom(*args, **kwargs):
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


# ---- 01: torch's forward failing for the device's reasons is not swallowed ----------


@pytest.mark.parametrize("name", ["LSTM", "GRU", "RNN"])
def test_device_failure_in_torchs_forward_is_not_computed_again(monkeypatch, name):
    # "fused" hands the call to torch's forward on the CPU, as "auto" does on a GPU
    monkeypatch.setattr(getattr(torch.nn, name), "forward", _oom)
    layer = getattr(knn, name)(3, 4, num_layers=2)
    with use_fused("fused"), pytest.raises(torch.OutOfMemoryError):
        layer(torch.randn(5, 2, 3))


def test_a_bad_input_still_gets_rnnkits_message():
    layer = knn.LSTM(3, 4)
    with use_fused("fused"), pytest.raises(RuntimeError, match=r"rnnkit\.nn\.LSTM: input\.size"):
        layer(torch.randn(5, 2, 7))


# A state or input on another device: torch's RuntimeError, naming the layer.


@pytest.mark.parametrize("path", ["auto", "fused"])
@pytest.mark.parametrize("name", ["LSTM", "GRU"])
def test_devices_that_differ_are_torchs_runtime_error_naming_the_layer(path, name):
    # "meta" stands for the other device (cuda:0 vs cpu on a GPU machine)
    layer = getattr(knn, name)(3, 4)
    x = torch.randn(5, 2, 3)
    h = torch.zeros(1, 2, 4, device="meta")
    hx = (h, torch.zeros(1, 2, 4)) if name == "LSTM" else h
    what = r"hx\[0\]" if name == "LSTM" else "hx"
    with use_fused(path), pytest.raises(RuntimeError, match=rf"rnnkit\.nn\.{name}: .*{what}"):
        layer(x, hx)
    on_meta = getattr(knn, name)(3, 4).to("meta")
    with (
        use_fused(path),
        pytest.raises(
            RuntimeError, match=rf"rnnkit\.nn\.{name}: Input and parameter tensors are not"
        ),
    ):
        on_meta(x)


def test_a_short_call_without_gradients_is_torchs_kernel_on_the_cpu(monkeypatch):
    # rnnkit's fixed cost per call is larger than torch's; a call of few steps that asks
    # no gradient runs torch's kernel (the same function), the rest rnnkit's loop
    from rnnkit.layers.torch_nn import SHORT_STEPS

    calls = []
    for torch_class in (torch.nn.LSTM, torch.nn.GRU, torch.nn.RNN):

        def counted(self, *args, real=torch_class.forward, **kwargs):
            calls.append(1)
            return real(self, *args, **kwargs)

        monkeypatch.setattr(torch_class, "forward", counted)
    torch.manual_seed(0)
    ref = torch.nn.LSTM(3, 5, num_layers=2, batch_first=True)
    ours = knn.LSTM(3, 5, num_layers=2, batch_first=True)
    ours.load_state_dict(ref.state_dict())
    short, long = torch.randn(2, SHORT_STEPS, 3), torch.randn(2, SHORT_STEPS + 1, 3)
    h0 = (torch.randn(2, 2, 5), torch.randn(2, 2, 5))

    def handed(run) -> bool:
        calls.clear()
        run()
        return bool(calls)

    with torch.no_grad():
        assert handed(lambda: ours(short))
        out, (h, c) = ours(short, h0)
        want, (wh, wc) = ref(short, h0)
        assert torch.equal(out, want) and torch.equal(h, wh) and torch.equal(c, wc)
        assert not handed(lambda: ours(long))
        with use_fused("loop"):  # a forced path is that path
            assert not handed(lambda: ours(short))
        for mode in ("GRU", "RNN"):  # one tensor as the state
            theirs = getattr(torch.nn, mode)(3, 5, num_layers=2, batch_first=True)
            mine = getattr(knn, mode)(3, 5, num_layers=2, batch_first=True)
            mine.load_state_dict(theirs.state_dict())
            calls.clear()
            out, h = mine(short, h0[0])
            want, wh = theirs(short, h0[0])
            assert calls and torch.equal(out, want) and torch.equal(h, wh)
            assert not handed(lambda mine=mine: mine(long))
    assert not handed(lambda: ours(short))  # training: rnnkit's backward
    ours.requires_grad_(False)
    assert handed(lambda: ours(short))  # a frozen layer in grad mode: inference
    assert not handed(lambda: ours(short, (h0[0].requires_grad_(), h0[1])))
    # a malformed state is rnnkit's to name, as in training (torch's forward would fail
    # on it with an IndexError or an AttributeError of its own)
    h = torch.zeros(2, 2, 5)
    with torch.no_grad():
        for bad, words in (((h,), "hx must be the pair"), ((h, None), r"hx\[1\] must be")):
            with pytest.raises(TypeError, match=f"rnnkit.nn.LSTM: {words}"):
                ours(short, bad)


@pytest.mark.parametrize("mode", ["RNN", "LSTM", "GRU"])
@pytest.mark.parametrize("grad", [True, False])
@pytest.mark.parametrize("packed", [False, True])
def test_the_final_state_is_detached_in_place_between_segments_as_torchs_is(mode, grad, packed):
    # truncated BPTT as older programs write it: h_n.detach_() before the next segment
    reference, mine = _pair(mode, num_layers=2)
    x = torch.randn(20, 3, 3, dtype=DTYPE)
    if packed:
        x = pack_padded_sequence(x, torch.tensor([20, 7, 1]))
    for layer in (reference, mine):
        with torch.set_grad_enabled(grad):
            _, state = layer(x)
        for h in state if mode == "LSTM" else (state,):
            assert not h._is_view()
            h.detach_()
            assert not h.requires_grad
