"""Training monitors: gate saturation from the forward cache, state norms, gradient history."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

from rnnkit import GRU, LSTM, GRUCell, LSTMCell, RNNCell
from rnnkit.cells.layer_norm import LayerNormGRUCell, LayerNormLSTMCell
from rnnkit.diagnostics import (
    GradientMonitor,
    LayerStats,
    gate_saturation,
    layer_statistics,
)
from rnnkit.layers.recurrent import Recurrent

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))
from host_reads import HostReads

DT = torch.float64
MASK = torch.tensor([[1, 1, 1, 1, 1], [1, 0, 1, 1, 0], [1, 1, 0, 0, 0]]).bool()


def ln(v: Tensor) -> Tensor:
    """ν(v), the layer-normalised cells' normalisation (ε = 1e-5), in torch's operator."""
    return nn.functional.layer_norm(v, (v.shape[-1],), eps=1e-5)


def recomputed_gates(cell, x: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """Gate activations from the plain equations, by a masked Python loop; ``(N, H)``."""
    H = cell.hidden_size
    B, T, _ = x.shape
    h = torch.zeros(B, H, dtype=DT)
    c = torch.zeros(B, H, dtype=DT)
    found: dict[str, list[Tensor]] = {}
    for t in range(T):
        m = mask[:, t : t + 1]
        a_x = x[:, t] @ cell.weight_ih.T + cell.bias
        if isinstance(cell, LayerNormLSTMCell):
            a = ln(x[:, t] @ cell.weight_ih.T) * cell.gamma_ih + cell.bias
            a = a + ln(h @ cell.weight_hh.T) * cell.gamma_hh
            i, f, g, o = a.chunk(4, dim=1)
            i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
            c_new = f * c + i * g
            h_new = o * (ln(c_new) * cell.gamma_c + cell.beta_c).tanh()
            gates = {"i": i, "f": f, "g": g, "o": o}
            c = torch.where(m, c_new, c)
        elif isinstance(cell, LayerNormGRUCell):
            p = ln(x[:, t] @ cell.weight_ih.T) * cell.gamma_ih + cell.bias
            q = ln(h @ cell.weight_hh.T) * cell.gamma_hh
            r, z = (p[:, : 2 * H] + q[:, : 2 * H]).sigmoid().chunk(2, dim=1)
            n = (p[:, 2 * H :] + r * (q[:, 2 * H :] + cell.bias_hn)).tanh()
            h_new = (1 - z) * h + z * n if cell.update == "candidate" else z * h + (1 - z) * n
            gates = {"r": r, "z": z, "n": n}
        elif isinstance(cell, LSTMCell):
            a = a_x + h @ cell.weight_hh.T
            i, f, g, o = a.chunk(4, dim=1)
            i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
            c_new = f * c + i * g
            h_new = o * c_new.tanh()
            gates = {"i": i, "f": f, "g": g, "o": o}
            c = torch.where(m, c_new, c)
        elif isinstance(cell, GRUCell):
            W = cell.weight_hh
            r, z = (a_x[:, : 2 * H] + h @ W[: 2 * H].T).sigmoid().chunk(2, dim=1)
            if cell.reset == "after":
                n = (a_x[:, 2 * H :] + r * (h @ W[2 * H :].T + cell.bias_hn)).tanh()
            else:
                n = (a_x[:, 2 * H :] + (r * h) @ W[2 * H :].T).tanh()
            h_new = (1 - z) * h + z * n if cell.update == "candidate" else z * h + (1 - z) * n
            gates = {"r": r, "z": z, "n": n}
        else:
            a = a_x + h @ cell.weight_hh.T
            h_new = a.tanh() if cell.nonlinearity == "tanh" else a.relu()
            gates = {"h": h_new}
        for name, v in gates.items():
            found.setdefault(name, []).append(v[mask[:, t]])
        h = torch.where(m, h_new, h)
    return {name: torch.cat(vs) for name, vs in found.items()}


@pytest.mark.parametrize(
    "make",
    [
        lambda: LSTMCell(3, 5),
        lambda: GRUCell(3, 5),
        lambda: GRUCell(3, 5, update="keep", reset="after"),
        lambda: RNNCell(3, 5),
        lambda: RNNCell(3, 5, nonlinearity="relu"),
        lambda: LayerNormLSTMCell(3, 5),
        lambda: LayerNormGRUCell(3, 5, update="keep"),
    ],
    ids=["lstm", "gru_before", "gru_after", "rnn_tanh", "rnn_relu", "ln_lstm", "ln_gru"],
)
def test_saturation_reads_the_gates_from_the_cache(make) -> None:
    torch.manual_seed(0)
    cell = make().to(DT)
    with torch.no_grad():  # large weights: plenty of values near 0 and 1
        for p in cell.parameters():
            p.mul_(6.0)
    x = torch.randn(3, 5, 3, dtype=DT)
    got = gate_saturation(cell, x, mask=MASK)
    gates = recomputed_gates(cell, x, MASK)
    assert set(got) == set(gates)
    for name, v in gates.items():
        if name in ("g", "n") or (name == "h" and cell.gates == 1 and cell.nonlinearity == "tanh"):
            want = (v.abs() > 0.96).double().mean()
        elif name == "h":
            want = (v == 0).double().mean()  # relu: dead units
        else:
            want = ((v < 0.02) | (v > 0.98)).double().mean()
        assert got[name] == pytest.approx(float(want), abs=1e-12), name
    assert 0 < sum(got.values()) < len(got)  # a real mix, not all-or-nothing


def test_saturation_extremes_and_threshold() -> None:
    cell = LSTMCell(2, 3).to(DT)
    with torch.no_grad():
        cell.weight_ih.zero_()
        cell.weight_hh.zero_()
        cell.bias.zero_()
    x = torch.randn(2, 4, 2, dtype=DT)
    assert gate_saturation(cell, x) == {"i": 0.0, "f": 0.0, "g": 0.0, "o": 0.0}  # all 0.5 / 0
    assert gate_saturation(cell, x, threshold=0.51)["i"] == 1.0  # 0.5 is within 0.51 of 0
    with torch.no_grad():
        cell.bias.fill_(-20.0)
    assert gate_saturation(cell, x, lengths=torch.tensor([4, 1])) == {
        "i": 1.0,
        "f": 1.0,
        "g": 1.0,
        "o": 1.0,
    }


def test_layer_statistics_of_a_bidirectional_stack() -> None:
    torch.manual_seed(2)
    stack = LSTM(3, 4, num_layers=2, bidirectional=True).to(DT)
    x = torch.randn(3, 5, 3, dtype=DT)
    stats = layer_statistics(stack, x, mask=MASK)
    assert list(stats) == ["layer0.forward", "layer0.backward", "layer1.forward", "layer1.backward"]
    assert all(isinstance(s, LayerStats) and s.steps == int(MASK.sum()) for s in stats.values())
    # The top forward direction's mean ‖h_t‖ over real steps, from the layer's own outputs.
    out = stack(x, mask=MASK).outputs[..., :4]
    want = float(out.detach().norm(dim=-1)[MASK].mean())
    assert stats["layer1.forward"].state_norm == pytest.approx(want, rel=1e-12)
    assert stats["layer1.forward"].cell_norm is not None
    assert set(stats["layer0.backward"].saturation) == {"i", "f", "g", "o"}
    gru = layer_statistics(GRU(3, 4), x.float())
    assert list(gru) == ["layer0"] and gru["layer0"].cell_norm is None
    single = layer_statistics(Recurrent(GRUCell(3, 4), reverse=True), x.float())
    assert list(single) == ["layer0"]
    with pytest.raises(TypeError, match="recurrent"):
        layer_statistics(nn.Linear(3, 4), x)


def backward_with(model: nn.Module, scale: float) -> None:
    model.zero_grad()
    (scale * model(torch.ones(1, 2))).sum().backward()


def test_clipping_and_pre_clip_group_norms() -> None:
    model = nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 1))
    monitor = GradientMonitor(clip_norm=0.5, group_of=lambda name: name.split(".")[0])
    backward_with(model, 10.0)
    raw = {
        k: math.sqrt(
            sum(float(p.grad.pow(2).sum()) for n, p in model.named_parameters() if n[0] == k)
        )
        for k in ("0", "1")
    }
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    rec = monitor.record(model, pre_clip_norm=norm)
    assert rec.clipped is True and rec.grad_norm == pytest.approx(float(norm))
    # Undone: the pre-clip values (up to float32 rounding of the clipped gradients).
    assert rec.group_norms == pytest.approx(raw, rel=1e-6)
    backward_with(model, 1e-3)
    rec = monitor.record(model)  # before clipping: the monitor decides from its threshold
    assert rec.clipped is False
    assert monitor.clip_count == 1 and monitor.clip_rate == 0.5
    assert monitor.norms("0")[0] == pytest.approx(raw["0"])


def test_without_clip_norm_the_group_norms_are_rescaled_only_when_told() -> None:
    """No ``clip_norm``: the monitor cannot tell clipping from a ``pre_clip_norm`` of more
    parameters than it records (the encoder's groups beside the whole model's norm), so
    the group norms are the gradients' own unless ``clipped=True`` says it fired."""
    model = nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 1))
    backward_with(model, 10.0)
    raw = {
        k: math.sqrt(
            sum(float(p.grad.pow(2).sum()) for n, p in model.named_parameters() if n[0] == k)
        )
        for k in ("0", "1")
    }
    whole = torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)  # not clipped
    first = GradientMonitor().record(model[0], pre_clip_norm=whole)
    assert math.hypot(*first.group_norms.values()) == pytest.approx(raw["0"], rel=1e-6)
    monitor = GradientMonitor(group_of=lambda name: name.split(".")[0])
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    told = monitor.record(model, pre_clip_norm=norm, clipped=True)
    assert told.group_norms == pytest.approx(raw, rel=1e-6)
    untold = monitor.record(model, pre_clip_norm=norm)
    assert untold.clipped is None
    assert math.hypot(*untold.group_norms.values()) == pytest.approx(1.0, rel=1e-5)


def test_vanishing_exploding_and_nonfinite_events() -> None:
    monitor = GradientMonitor(window=3, factor=10.0)
    w = nn.Parameter(torch.zeros(2))
    signals = []
    for g in [1.0, 1.0, 1.0, 0.5, 0.05, 0.04, 0.04, 0.04, 0.04, 1.0, float("nan"), 1.0]:
        w.grad = torch.full((2,), g)
        signals.append(monitor.record([w]).signal)
    assert signals == [
        None,
        None,
        None,
        None,  # 0.5 is not 10× below max(1, 1, 1)
        "vanishing",  # 0.05 < max(1, 1, 0.5) / 10
        "vanishing",
        "vanishing",  # 0.04 < max(0.5, 0.05, 0.04) / 10
        None,  # the window no longer holds a large norm
        None,
        "exploding",  # 1 > min(0.04, 0.04, 0.04) · 10
        "nonfinite",
        None,  # only two finite norms in the window
    ]
    assert [(e.step, e.kind) for e in monitor.events] == [
        (4, "vanishing"),
        (9, "exploding"),
        (10, "nonfinite"),
    ]
    assert "within 3 steps" in monitor.events[0].message
    assert monitor.history[10].grad_norm is None and monitor.history[10].group_norms == {
        "param0": None
    }


def test_history_is_json_and_round_trips() -> None:
    model = nn.Linear(2, 1)
    monitor = GradientMonitor(clip_norm=1.0, window=2)
    for scale in (1.0, 5.0, float("nan")):
        backward_with(model, scale)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        monitor(model, float(norm), bool(norm > 1.0))  # as Trainer's grad_hook
    monitor.record_layers(layer_statistics(RNNCell(2, 3), torch.randn(1, 4, 2)))
    text = monitor.to_json()  # strict JSON: no NaN/inf anywhere
    data = json.loads(text)
    assert data["summary"] == {"steps": 3, "clipped": 2, "clip_rate": 2 / 3, "events": 1}
    assert (
        data["layers"][0]["step"] == 2
        and "h" in data["layers"][0]["layers"]["layer0"]["saturation"]
    )
    again = GradientMonitor.from_dict(data)
    assert again.to_dict() == data


def test_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="window"):
        GradientMonitor(window=0)
    with pytest.raises(ValueError, match="factor"):
        GradientMonitor(factor=1.0)


# GradientMonitor.record (a Trainer's grad_hook, every step) reads the gradients' figures
# in one transfer, not one per parameter (on a GPU each read waits).


def test_a_monitor_step_reads_the_device_once() -> None:
    torch.manual_seed(0)
    model = LSTM(3, 4, num_layers=2)  # 8 parameters
    model(torch.randn(5, 2, 3)).outputs.sum().backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
    expected = GradientMonitor(clip_norm=0.1).record(model, pre_clip_norm=float(norm))
    monitor = GradientMonitor(clip_norm=0.1)
    with HostReads(model) as reads:
        rec = monitor.record(model, pre_clip_norm=norm)
    assert reads.count == 1, dict(reads.sites)
    assert rec.grad_norm == expected.grad_norm and rec.clipped is True
    assert rec.group_norms == expected.group_norms
