"""Training monitors: gradient-norm history, clipping, gate saturation, state norms.

Everything here returns plain data; nothing prints, logs or warns (pytest turns warnings
into errors, and the caller decides where messages go). ``GradientMonitor`` is called once
per optimizer step — directly, or as the ``grad_hook(model, grad_norm, clipped)`` of
``rnnkit.training.loop.Trainer`` — and its history is JSON-serialisable for the report.

Gate saturation: the share of gate values within ``threshold`` (0.02) of 0 or
1. For a logistic gate ``s`` that is ``s < 0.02`` or ``s > 0.98``. Gates in tanh form —
the LSTM candidate ``g``, the GRU candidate ``n`` and the state of a tanh RNN, all in
``[−1, 1]`` — are mapped to ``(v + 1) / 2``, so they count when ``|v| > 1 − 2·0.02 =
0.96``. For a relu RNN ``"h"`` is the share of exact zeros (dead units); a sigmoid RNN's
``"h"`` is read as a logistic gate. Values are read
from the forward cache of ``rnnkit.bptt.forward.forward_pass`` (LSTM: activated i, f, g, o;
GRU: r, z and n) at real steps only.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, cast

import torch
from torch import Tensor, nn

from rnnkit.cells.base import CellBase
from rnnkit.deferred import read_values
from rnnkit.diagnostics.contributions import DirectionRun, layer_normalised, run_direction
from rnnkit.layers.recurrent import Recurrent
from rnnkit.layers.stacked import Bidirectional, StackedRecurrent
from rnnkit.types import State

__all__ = [
    "GradientEvent",
    "GradientMonitor",
    "LayerStats",
    "StepRecord",
    "gate_saturation",
    "layer_statistics",
]


# ---- gates and states ------------------------------------------------------------------
def _share(values: Tensor, valid: Tensor | None, hit: Tensor) -> float:
    """Share of ``hit`` over the real steps; ``values``/``hit`` ``(T, B, H)``."""
    if valid is None:
        return float(hit.to(torch.float64).mean()) if hit.numel() else 0.0
    w = valid.to(torch.float64).expand_as(values)
    total = float(w.sum())
    return float((hit.to(torch.float64) * w).sum()) / total if total else 0.0


def _saturation(run: DirectionRun, threshold: float) -> dict[str, float]:
    cell, record = run.cell, run.record
    H = cell.hidden_size
    valid = run.mask3  # (T, B, 1) in reading order, like the cache

    def logistic(v: Tensor) -> Tensor:
        return (v < threshold) | (v > 1 - threshold)

    def tanh_form(v: Tensor) -> Tensor:
        return v.abs() > 1 - 2 * threshold

    def expect(t: Tensor, width: int, what: str) -> Tensor:
        if t.shape[-1] != width:  # the kernel's cache layout changed: fail, never misreport
            raise RuntimeError(f"unexpected {type(cell).__name__} cache for {what}")
        return t

    parts: dict[str, tuple[Tensor, Callable[[Tensor], Tensor]]] = {}
    if cell.is_lstm:
        gates = expect(record.cache[0], 4 * H, "gates i, f, g, o")
        i, f, g, o = gates.chunk(4, dim=-1)
        parts = {"i": (i, logistic), "f": (f, logistic), "g": (g, tanh_form), "o": (o, logistic)}
    elif cell.gates == 3:
        if layer_normalised(cell):  # its first cache holds r, z and n
            r, z, n = expect(record.cache[0], 3 * H, "gates r, z, n").chunk(3, dim=-1)
        else:
            r, z = expect(record.cache[0], 2 * H, "gates r, z").chunk(2, dim=-1)
            n = expect(record.cache[1], H, "candidate n")
        parts = {"r": (r, logistic), "z": (z, logistic), "n": (n, tanh_form)}
    else:
        h = record.states[0][1:]
        phi = getattr(cell, "nonlinearity", "tanh")
        if phi == "relu":
            parts = {"h": (h, lambda v: v == 0)}
        else:
            parts = {"h": (h, logistic if phi == "sigmoid" else tanh_form)}
    return {name: _share(v, valid, hit(v)) for name, (v, hit) in parts.items()}


def gate_saturation(
    source: CellBase | Recurrent,
    x: Tensor,
    *,
    lengths: Tensor | None = None,
    mask: Tensor | None = None,
    state: State | None = None,
    threshold: float = 0.02,
    batch_first: bool = True,
) -> dict[str, float]:
    """Run one direction over a batch; the share of saturated values of each gate.

    Args:
        source: a cell or one direction of a layer.  x: ``(B, T, I)``.
        lengths / mask / state: as for layers.  threshold: distance to 0 or 1.

    Returns:
        ``{"i", "f", "g", "o"}`` (LSTM), ``{"r", "z", "n"}`` (GRU) or ``{"h"}`` (RNN) →
        share in ``[0, 1]`` over real steps and units (see the module docstring).

    >>> from rnnkit import LSTMCell
    >>> cell = LSTMCell(2, 3)
    >>> with torch.no_grad():
    ...     _ = cell.bias.fill_(10.0)  # every gate pushed to 1 (g to tanh(10))
    >>> gate_saturation(cell, torch.zeros(1, 4, 2))
    {'i': 1.0, 'f': 1.0, 'g': 1.0, 'o': 1.0}
    """
    run = run_direction(source, x, lengths=lengths, mask=mask, state=state, batch_first=batch_first)
    return _saturation(run, threshold)


@dataclass(frozen=True)
class LayerStats:
    """Activation statistics of one direction of one layer over one batch.

    Attributes:
        saturation: gate → share of saturated values (``gate_saturation``).
        state_norm: mean ``‖h_t‖₂`` over real steps.  cell_norm: the same for the LSTM
            memory ``c_t`` (None otherwise).  steps: number of real (sequence, step) pairs.
    """

    saturation: dict[str, float]
    state_norm: float
    cell_norm: float | None
    steps: int


def _stats(run: DirectionRun, threshold: float) -> LayerStats:
    states = [s[1:] for s in run.record.states]  # (T, B, H) in reading order
    valid = run.mask3
    count = states[0].shape[0] * states[0].shape[1] if valid is None else int(valid.sum())

    def mean_norm(s: Tensor) -> float:
        n = s.norm(dim=-1, keepdim=True)  # (T, B, 1)
        if valid is not None:
            n = n * valid
        return float(n.sum()) / count if count else 0.0

    c_norm = mean_norm(states[1]) if len(states) > 1 else None
    return LayerStats(_saturation(run, threshold), mean_norm(states[0]), c_norm, count)


def layer_statistics(
    module: StackedRecurrent | Recurrent | CellBase,
    x: Tensor,
    *,
    lengths: Tensor | None = None,
    mask: Tensor | None = None,
    threshold: float = 0.02,
) -> dict[str, LayerStats]:
    """Gate saturation and state norms of every layer and direction over a batch.

    Each layer reads the previous layer's outputs (no dropout: diagnostics see the model
    as at evaluation). Initial states are zeros. ``x`` is batch-first ``(B, T, I)`` unless
    ``module`` is a stack built with ``batch_first=False``.

    Returns:
        ``{"layer0": …, "layer1": …}``; bidirectional stacks have ``"layer0.forward"`` and
        ``"layer0.backward"``.

    >>> from rnnkit import GRU
    >>> stats = layer_statistics(GRU(3, 4, num_layers=2), torch.randn(2, 5, 3))
    >>> sorted(stats), sorted(stats["layer1"].saturation)
    (['layer0', 'layer1'], ['n', 'r', 'z'])
    """
    if isinstance(module, (CellBase, Recurrent)):
        run = run_direction(module, x, lengths=lengths, mask=mask)
        return {"layer0": _stats(run, threshold)}
    if not isinstance(module, StackedRecurrent):
        raise TypeError(f"expected a recurrent stack, layer or cell, got {type(module).__name__}")
    batch_first = module.batch_first
    out: dict[str, LayerStats] = {}
    h = x
    for index, layer in enumerate(module.layers):
        directions = layer.directions if isinstance(layer, Bidirectional) else [layer]
        names = ["forward", "backward"] if isinstance(layer, Bidirectional) else [""]
        outputs = []
        for direction, name in zip(directions, names, strict=True):
            run = run_direction(
                cast(Recurrent, direction), h, lengths=lengths, mask=mask, batch_first=batch_first
            )
            out[f"layer{index}" + (f".{name}" if name else "")] = _stats(run, threshold)
            outputs.append(run.outputs)  # (T, B, H), original order
        h = torch.cat(outputs, dim=-1)
        h = h.transpose(0, 1) if batch_first else h
    return out


# ---- gradient norms over training ------------------------------------------------------
def _finite(v: float | None) -> float | None:
    """JSON has no NaN/inf: non-finite values are stored as None (the signal says why)."""
    return v if v is not None and math.isfinite(v) else None


@dataclass
class StepRecord:
    """One optimizer step as the monitor saw it.

    Attributes:
        step: the step number.  grad_norm: global gradient norm BEFORE clipping (None if
            not finite).  group_norms: norm per parameter group, also before clipping.
        clipped: whether clipping fired (None when no threshold is known).
        signal: ``"vanishing"``, ``"exploding"``, ``"nonfinite"`` or None.
    """

    step: int
    grad_norm: float | None
    group_norms: dict[str, float | None]
    clipped: bool | None
    signal: str | None = None


@dataclass
class GradientEvent:
    """A change of signal: the norm fell or rose by ``factor`` within ``window`` steps."""

    step: int
    kind: str  # "vanishing" | "exploding" | "nonfinite"
    grad_norm: float | None
    reference_norm: float | None  # the window's max (vanishing) or min (exploding)
    message: str


@dataclass
class GradientMonitor:
    """Gradient-norm history, clipping and vanishing/exploding signals over training.

    Call ``record`` (or the monitor itself, as ``Trainer``'s ``grad_hook``) once per step
    after ``backward()`` and ``clip_grad_norm_``, passing the norm that
    ``clip_grad_norm_`` returned: where the monitor knows that clipping fired (its
    ``clip_norm`` below that norm, or ``clipped=True`` given) the group norms are rescaled
    to their pre-clip values (clipping scales all gradients by the same factor). Without
    either they are the gradients' as they are now: the monitor cannot tell a clipped
    step from a ``pre_clip_norm`` over more parameters than it was given.

    A signal fires when the global norm falls below the largest of the previous
    ``window`` norms divided by ``factor`` ("vanishing") or rises above the smallest times
    ``factor`` ("exploding"); an event is added when a signal starts.

    Args:
        clip_norm: the clipping threshold κ, or None (then ``clipped`` is what the caller
            says, or None).
        window: steps to look back.  factor: how much change is a signal (> 1).
        group_of: parameter name → group name (default: the name itself).

    >>> model = torch.nn.Linear(2, 1)
    >>> monitor = GradientMonitor(clip_norm=1.0, window=2, factor=10.0)
    >>> for scale in (1.0, 1.0, 1e-3):
    ...     model.zero_grad()
    ...     (scale * model(torch.ones(1, 2))).sum().backward()
    ...     norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    ...     rec = monitor.record(model, pre_clip_norm=norm)
    >>> [r.clipped for r in monitor.history], rec.signal, monitor.events[0].kind
    ([True, True, False], 'vanishing', 'vanishing')
    >>> round(monitor.history[0].group_norms["weight"], 4)  # pre-clip: ‖(1, 1)‖
    1.4142
    """

    clip_norm: float | None = None
    window: int = 20
    factor: float = 10.0
    group_of: Callable[[str], str] | None = None
    history: list[StepRecord] = field(default_factory=list)
    events: list[GradientEvent] = field(default_factory=list)
    layers: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 1:
            raise ValueError(f"window must be a positive integer, got {self.window!r}")
        if not self.factor > 1:
            raise ValueError(f"factor must be > 1, got {self.factor!r}")

    # -- recording ---------------------------------------------------------------------
    def _named(self, parameters: Any) -> list[tuple[str, Tensor]]:
        if isinstance(parameters, nn.Module):
            return list(parameters.named_parameters())
        items = list(parameters)
        if items and isinstance(items[0], Tensor):
            return [(f"param{i}", p) for i, p in enumerate(items)]
        return items

    def record(
        self,
        parameters: nn.Module | Iterable[Tensor] | Iterable[tuple[str, Tensor]],
        *,
        pre_clip_norm: float | Tensor | None = None,
        clipped: bool | None = None,
        step: int | None = None,
    ) -> StepRecord:
        """Record one step from the parameters' current ``.grad``; returns the record."""
        groups: dict[str, float] = {}
        keys: list[str] = []
        squares: list[Tensor] = []
        for name, p in self._named(parameters):
            if p.grad is None:
                continue
            keys.append(self.group_of(name) if self.group_of is not None else name)
            squares.append(p.grad.detach().double().pow(2).sum())
        # every sum (and a norm given as a tensor) read in one transfer per device: on a
        # GPU a read per parameter waited for the device once each, at every step
        given = [pre_clip_norm] if isinstance(pre_clip_norm, Tensor) else []
        values = read_values([*squares, *given])
        for key, v in zip(keys, values, strict=False):
            groups[key] = groups.get(key, 0.0) + v
        current = math.sqrt(sum(groups.values()))
        norm = values[-1] if given else current if pre_clip_norm is None else float(pre_clip_norm)
        if clipped is None and self.clip_norm is not None and math.isfinite(norm):
            clipped = norm > self.clip_norm
        scale = norm / current if clipped and current > 0 and math.isfinite(norm) else 1.0
        record = StepRecord(
            step=len(self.history) if step is None else int(step),
            grad_norm=_finite(norm),
            group_norms={k: _finite(math.sqrt(v) * scale) for k, v in groups.items()},
            clipped=None if clipped is None else bool(clipped),
        )
        record.signal = self._signal(record)
        self.history.append(record)
        return record

    def __call__(self, model: nn.Module, grad_norm: float, clipped: bool) -> None:
        """``Trainer``'s ``grad_hook``: called after clipping with the pre-clip norm."""
        self.record(model, pre_clip_norm=grad_norm, clipped=clipped)

    def _signal(self, record: StepRecord) -> str | None:
        norm = record.grad_norm
        previous = self.history[-1].signal if self.history else None
        kind, ref = None, None
        if norm is None:
            kind = "nonfinite"
        else:
            past = [r.grad_norm for r in self.history[-self.window :] if r.grad_norm is not None]
            if len(past) == self.window:
                if norm < max(past) / self.factor:
                    kind, ref = "vanishing", max(past)
                elif norm > min(past) * self.factor:
                    kind, ref = "exploding", min(past)
        if kind is not None and kind != previous:
            if kind == "nonfinite":
                message = f"step {record.step}: the gradient norm is not finite"
            else:
                change = "fell" if kind == "vanishing" else "rose"
                message = (
                    f"step {record.step}: gradient norm {change} to {norm:.3g} from {ref:.3g} "
                    f"within {self.window} steps (factor {self.factor:g}): {kind} gradients"
                )
            self.events.append(GradientEvent(record.step, kind, norm, ref, message))
        return kind

    def record_layers(self, stats: Mapping[str, LayerStats], step: int | None = None) -> None:
        """Keep one ``layer_statistics`` result (gate saturation, state norms) in history."""
        at = (self.history[-1].step if self.history else 0) if step is None else int(step)
        self.layers.append({"step": at, "layers": {k: asdict(v) for k, v in stats.items()}})

    # -- summaries ---------------------------------------------------------------------
    @property
    def clip_count(self) -> int:
        """Steps on which clipping fired."""
        return sum(1 for r in self.history if r.clipped)

    @property
    def clip_rate(self) -> float:
        """Share of recorded steps (with a known ``clipped``) on which clipping fired."""
        known = [r for r in self.history if r.clipped is not None]
        return sum(1 for r in known if r.clipped) / len(known) if known else 0.0

    def norms(self, group: str | None = None) -> list[float | None]:
        """The global norm history, or one group's."""
        if group is None:
            return [r.grad_norm for r in self.history]
        return [r.group_norms.get(group) for r in self.history]

    def to_dict(self) -> dict[str, Any]:
        """Everything, as JSON-ready data (``json.dumps`` works on it)."""
        return {
            "config": {"clip_norm": self.clip_norm, "window": self.window, "factor": self.factor},
            "summary": {
                "steps": len(self.history),
                "clipped": self.clip_count,
                "clip_rate": self.clip_rate,
                "events": len(self.events),
            },
            "history": [asdict(r) for r in self.history],
            "events": [asdict(e) for e in self.events],
            "layers": self.layers,
        }

    def to_json(self) -> str:
        """``to_dict`` as strict JSON text."""
        return json.dumps(self.to_dict(), allow_nan=False)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GradientMonitor:
        """Rebuild a monitor (history and events) from ``to_dict`` output."""
        config = data.get("config", {})
        return cls(
            clip_norm=config.get("clip_norm"),
            window=int(config.get("window", 20)),
            factor=float(config.get("factor", 10.0)),
            history=[StepRecord(**r) for r in data.get("history", [])],
            events=[GradientEvent(**e) for e in data.get("events", [])],
            layers=list(data.get("layers", [])),
        )
