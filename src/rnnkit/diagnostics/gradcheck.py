"""Explicit BPTT against central finite differences, in float64.

``gradcheck`` builds a layer (``RNN``/``LSTM``/``GRU`` with the chosen options), a random
batch with holes and trailing padding (every sequence starts with a real step), a random
initial state, and the loss ``L = Σ R ⊙ outputs + Σ R_f ⊙ final state`` with random
``R``, ``R_f``. The layer's normal backward (the library's explicit BPTT) gives the
gradients of every parameter, the input and the initial state; central differences
``(L(θ + ε) − L(θ − ε)) / 2ε`` give them again, one scalar at a time.

With ``window=τ`` the explicit gradient is BPTT(τ) of the whole stack, the gradient of a
truncated graph, so the reference is too: the loss ``L`` evaluated on states recomputed
with a budget of steps. The state after step k of a direction with budget b is one step
from the state after step k − 1 with budget b − 1, on the input of step k with budget b
(the layer below's states at step k with the same budget); with budget 0 the state before
is held FIXED at its unperturbed value (the initial state stays variable while the budget
lasts). The outputs and final states of ``L`` are those with budget τ, so every path from
the loss to a parameter, input or initial state crosses at most τ steps, counted in every
layer and direction; central differences of that loss give the reference.

With the regularizers of the recurrence (``recurrent_dropout``, ``zoneout``,
``weight_drop``) the masks are drawn once from the seed, in training mode, and held fixed:
the explicit backward and every evaluation of the loss use the same masks, so the loss
is a smooth function of the parameters and the check compares the same function. With
``recompute=k`` the explicit backward is the segmented one. With ``resets=True`` (a
unidirectional stack) rows start documents at random steps: the state entering such a
step is zero in every layer, on both sides, and under a window in the budget graph too.

The error of one tensor is ``max|g − g_fd| / max(max|g_fd|, max|g|)`` (0 when both are
0); the check passes when every tensor's error is at most ``tol``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor

from rnnkit.bptt.forward import forward_pass
from rnnkit.cells.kernel import Kernel, Weights
from rnnkit.diagnostics.contributions import detached_weights
from rnnkit.layers.cell_stacks import GRU, LSTM, RNN
from rnnkit.layers.masking import flip_sequences
from rnnkit.layers.regularization import CellMasks, StackMasks, masked_loop
from rnnkit.layers.stacked import Bidirectional, StackedRecurrent
from rnnkit.types import LSTMState

__all__ = ["GradcheckResult", "GradientError", "gradcheck", "random_mask"]

CELLS = ("rnn", "lstm", "gru")


@dataclass(frozen=True)
class GradientError:
    """How far the explicit gradient of one tensor is from finite differences."""

    name: str
    numel: int
    max_abs_error: float  # max |g − g_fd|
    max_abs_grad: float  # max |g_fd|
    rel_error: float


@dataclass(frozen=True)
class GradcheckResult:
    """The outcome: one ``GradientError`` per parameter, the input and the state."""

    config: dict[str, Any]
    errors: tuple[GradientError, ...]
    tol: float

    @property
    def worst(self) -> GradientError:
        return max(self.errors, key=lambda e: e.rel_error)

    @property
    def max_rel_error(self) -> float:
        return self.worst.rel_error

    @property
    def passed(self) -> bool:
        return self.max_rel_error <= self.tol

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "config": self.config,
            "tol": self.tol,
            "passed": self.passed,
            "max_rel_error": _json_number(self.max_rel_error),
            "worst": self.worst.name,
            "errors": [{k: _json_number(v) for k, v in asdict(e).items()} for e in self.errors],
        }


def _json_number(v: Any) -> Any:
    """JSON has no NaN/inf: such numbers become None."""
    return None if isinstance(v, float) and not math.isfinite(v) else v


def random_mask(
    batch_size: int, steps: int, generator: torch.Generator, hole_rate: float = 0.25
) -> Tensor:
    """``(B, T)`` bool: row 0 full, the others of random length ≥ 1 with random holes.

    Every row starts with a real step.

    >>> m = random_mask(4, 6, torch.Generator().manual_seed(0))
    >>> bool(m[0].all()), bool(m[:, 0].all())
    (True, True)
    """
    lengths = torch.randint(1, steps + 1, (batch_size,), generator=generator)
    lengths[0] = steps
    t = torch.arange(steps)
    mask = t[None, :] < lengths[:, None]
    holes = torch.rand(batch_size, steps, generator=generator) < hole_rate
    holes[:, 0] = False
    holes[0] = False
    return mask & ~holes


def _state_tuple(state: Any) -> tuple[Tensor, ...]:
    return tuple(state) if isinstance(state, LSTMState) else (state,)


def _loss(out: Any, r_out: Tensor, r_fin: tuple[Tensor, ...]) -> Tensor:
    loss = (out.outputs * r_out).sum()
    for s, r in zip(_state_tuple(out.state), r_fin, strict=True):
        loss = loss + (s * r).sum()
    return loss


def _grad(t: Tensor) -> Tensor:
    """``t.grad`` (zeros if nothing reached ``t``)."""
    return torch.zeros_like(t) if t.grad is None else t.grad.detach().clone()


def _rel(g: Tensor, ref: Tensor, name: str) -> GradientError:
    err = float((g - ref).abs().max()) if g.numel() else 0.0
    scale = max(float(ref.abs().max()), float(g.abs().max())) if g.numel() else 0.0
    rel = err / scale if scale > 0 else (0.0 if err == 0 else float("inf"))
    if math.isnan(rel):  # a NaN gradient is as wrong as it gets (and sorts)
        rel = float("inf")
    return GradientError(name, g.numel(), err, float(ref.abs().max()) if g.numel() else 0.0, rel)


def _central(tensor: Tensor, objective: Any, eps: float) -> Tensor:
    """Central differences of ``objective()`` w.r.t. every entry of ``tensor`` (in place)."""
    flat = tensor.view(-1)
    grad = torch.empty_like(flat)
    for i in range(flat.numel()):
        keep = float(flat[i])
        flat[i] = keep + eps
        up = float(objective())
        flat[i] = keep - eps
        down = float(objective())
        flat[i] = keep
        grad[i] = (up - down) / (2 * eps)
    return grad.view_as(tensor)


def _unit_step(cell: Any, unit: CellMasks | None, rows: int = 1) -> tuple[Kernel, Weights]:
    """The kernel and detached weights a direction's loop runs with its regularizers'
    masks (``masked_loop``). ``rows``: the steps are run as ONE step of ``rows·B`` rows
    (the budget forward): the recurrent mask tiled, the keep factors of the steps laid
    out as those rows."""
    if unit is not None and rows > 1:
        recurrent = None if unit.recurrent is None else unit.recurrent.repeat(rows, 1)
        # each (T, B, H): step t's factors are rows t·B … t·B + B − 1
        keep = (
            None if unit.keep is None else tuple(k.reshape(1, -1, k.shape[-1]) for k in unit.keep)
        )
        unit = unit._replace(recurrent=recurrent, keep=keep)
    return masked_loop(cell.kernel, detached_weights(cell), unit)


def _reading_run(
    direction: Any,
    xt: Tensor,
    mask_t: Tensor,
    state0: tuple[Tensor, ...],
    unit: CellMasks | None,
    reset_t: Tensor | None = None,
) -> tuple[tuple[Tensor, ...], Tensor]:
    """One direction over ``xt (T, B, I)``: its states ``(T + 1, B, H)`` in reading order
    and its outputs ``(T, B, H)`` in the input's order (``reset_t (T, B)``: the state
    entering those steps zero; a forward direction)."""
    cell = direction.cell
    inp, run_mask = flip_sequences(xt, mask_t) if direction.reverse else (xt, mask_t)
    assert run_mask is not None
    inp = torch.where(run_mask[..., None], inp, 0.0)
    input_part = getattr(type(cell), "input_part", None)
    if input_part is not None:  # a layer-normalised cell's loop reads ν(x W_xᵀ)γ_x
        inp = input_part(cell, inp)
    kernel, w = _unit_step(cell, unit)
    # save=True: the record then holds every step's states (the compiled loop keeps the
    # LSTM's c of each step only for a backward)
    reset = None if reset_t is None else reset_t[..., None]
    record = forward_pass(kernel, inp, w, state0, run_mask[..., None], save=True, reset=reset)
    h = record.states[0][1:]
    return record.states, flip_sequences(h, mask_t)[0] if direction.reverse else h


def _truncated_reference(
    layer: StackedRecurrent,
    x: Tensor,
    mask: Tensor,
    states0: tuple[Tensor, ...],
    r_out: Tensor,
    r_fin: tuple[Tensor, ...],
    window: int,
    eps: float,
    masks: StackMasks | None = None,
    resets: Tensor | None = None,
) -> dict[str, Tensor]:
    """Finite-difference gradients of the BPTT(τ) graph of the whole stack (module doc);
    ``resets (B, T)``: document starts (a unidirectional stack)."""
    L = layer.num_layers
    dirs = [_directions(layer, index) for index in range(L)]
    units: list[CellMasks | None] = (
        [None] * sum(len(d) for d in dirs) if masks is None else list(masks.cells)
    )
    frozen: list[tuple[Tensor, ...]] = []  # unperturbed states (T + 1, B, H), reading order
    below = x.transpose(0, 1)
    mask_t = mask.T
    reset_t = None if resets is None else resets.T
    u = 0
    for index in range(L):
        outs = []
        for k, d in enumerate(dirs[index]):
            parts = tuple(s[index, k] for s in states0)
            states, out = _reading_run(d, below, mask_t, parts, units[u], reset_t)
            frozen.append(states)
            outs.append(out)
            u += 1
        below = torch.cat(outs, dim=-1)
    x_var = x.clone(memory_format=torch.contiguous_format)
    s_var = tuple(s.clone(memory_format=torch.contiguous_format) for s in states0)

    def objective() -> Tensor:
        out, finals = _budget_forward(dirs, x_var, mask, s_var, frozen, window, units, reset_t)
        total = (out * r_out).sum()
        u = 0
        for index in range(L):
            for k in range(len(dirs[index])):
                for f, r in zip(finals[u], r_fin, strict=True):
                    total = total + (f * r[index, k]).sum()
                u += 1
        return total

    with torch.no_grad():
        ref = {name: _central(p.data, objective, eps) for name, p in layer.named_parameters()}
        ref["input"] = _central(x_var, objective, eps)
        for k, s in enumerate(s_var):
            ref[f"state.{k}"] = _central(s, objective, eps)
    return ref


def _budget_forward(
    dirs: list[list[Any]],
    x: Tensor,
    mask: Tensor,
    states0: tuple[Tensor, ...],
    frozen: list[tuple[Tensor, ...]],
    window: int,
    units: list[CellMasks | None] | None = None,
    reset_t: Tensor | None = None,
) -> tuple[Tensor, list[tuple[Tensor, ...]]]:
    """The stack's outputs ``(B, T, D·H)`` and final states with budget τ (module doc).

    Budget level by level, every step of a level in ONE batch of ``T·B`` rows: level b
    reads level b − 1 one step back. A path crosses at most ``T − 1`` steps per layer, so
    levels below ``τ − L·(T − 1)`` are never reached and start from the fixed states."""
    T, B = x.shape[1], x.shape[0]
    mask_t = mask.T  # (T, B)
    order = flip_sequences(torch.arange(T).view(T, 1).expand(T, B), mask_t)[0]
    reading = flip_sequences(mask_t, mask_t)[1]
    assert reading is not None
    lowest = max(0, window - (T - 1) * len(dirs))
    xt = x.transpose(0, 1)  # (T, B, I)
    h = xt
    # what every level shares: each direction's kernel and weights (the same at every
    # budget), and the first layer's inputs (the stack's, the same at every budget)
    steps = [
        _unit_step(d.cell, None if units is None else units[u], rows=T)
        for u, d in enumerate(d for layer_dirs in dirs for d in layer_dirs)
    ]
    first: dict[int, Tensor] = {}
    previous: list[tuple[Tensor, ...]] = []
    for budget in range(lowest, window + 1):
        current: list[tuple[Tensor, ...]] = []
        h = xt
        u = 0
        for index, layer_dirs in enumerate(dirs):
            outs = []
            for k, direction in enumerate(layer_dirs):
                rev = direction.reverse
                m = reading if rev else mask_t
                inp = first.get(k) if index == 0 else None
                if inp is None:
                    inp = h.gather(0, order[..., None].expand_as(h)) if rev else h
                    inp = torch.where(m[..., None], inp, 0.0)
                    input_part = getattr(type(direction.cell), "input_part", None)
                    if input_part is not None:  # a layer-normalised loop reads ν(x W_xᵀ)γ_x
                        inp = input_part(direction.cell, inp)
                    inp = inp.reshape(1, T * B, -1)
                    if index == 0:
                        first[k] = inp
                prev = []
                for j, fixed in enumerate(frozen[u]):
                    # (T, B, H): the state before each step; with budget 0 the fixed one
                    before = fixed[:-1]
                    if budget >= 1:
                        later = previous[u][j][:-1] if previous else fixed[1:-1]
                        before = torch.cat([states0[j][index, k][None], later])
                    prev.append(before.reshape(T * B, -1))
                kernel, w = steps[u]
                rec = forward_pass(
                    kernel,
                    inp,
                    w,
                    tuple(prev),
                    m.reshape(1, T * B, 1),
                    save=False,
                    # a document start: the state entering the step is zero at any budget
                    reset=None if reset_t is None else reset_t.reshape(1, T * B, 1),
                )
                new = tuple(s[1].view(T, B, -1) for s in rec.states)
                current.append(new)
                outs.append(new[0].gather(0, order[..., None].expand_as(new[0])) if rev else new[0])
                u += 1
            h = torch.cat(outs, dim=-1)
        previous = current
    return h.transpose(0, 1), [tuple(s[T - 1] for s in unit) for unit in previous]


def _directions(layer: StackedRecurrent, index: int) -> list[Any]:
    module = layer.layers[index]
    return list(module.directions) if isinstance(module, Bidirectional) else [module]


def _s0(states0: tuple[Tensor, ...], index: int, k: int) -> Any:
    parts = tuple(s[index, k] for s in states0)
    return LSTMState(*parts) if len(parts) == 2 else parts[0]


def _pack(states: tuple[Tensor, ...]) -> Any:
    """A layer's state from its tensors: ``(h, c)`` of an LSTM, else ``h``."""
    return LSTMState(*states) if len(states) == 2 else states[0]


def _cell_options(
    cell: str, nonlinearity: str, update: str, reset: str, layer_norm: bool = False
) -> dict[str, Any]:
    """The options of ``cell``'s layer: ``nonlinearity`` (rnn), ``update``/``reset`` (gru),
    ``layer_norm`` (lstm, gru: only where given)."""
    normed = {"layer_norm": True} if layer_norm else {}
    if cell == "rnn":
        return {"nonlinearity": nonlinearity}
    if cell == "gru":
        return {"update": update, "reset": reset, **normed}
    return normed


def _full_reference(
    layer: StackedRecurrent,
    x: Tensor,
    mask: Tensor,
    states0: tuple[Tensor, ...],
    r_out: Tensor,
    r_fin: tuple[Tensor, ...],
    eps: float,
    masks: StackMasks | None = None,
    resets: Tensor | None = None,
) -> dict[str, Tensor]:
    """Central finite differences of the full-BPTT loss: every parameter, the input and
    each initial state (float64, under ``no_grad``), the regularizers' ``masks`` held."""
    x_var, s_var = x.clone(), tuple(s.clone() for s in states0)

    def objective() -> Tensor:
        out = layer(x_var, mask=mask, state=_pack(s_var), masks=masks, resets=resets)
        return _loss(out, r_out, r_fin)

    ref = {n: _central(p.data, objective, eps) for n, p in layer.named_parameters()}
    ref["input"] = _central(x_var, objective, eps)
    for k, s in enumerate(s_var):
        ref[f"state.{k}"] = _central(s, objective, eps)
    return ref


def gradcheck(
    cell: str = "rnn",
    *,
    hidden_size: int = 4,
    input_size: int = 3,
    batch_size: int = 3,
    steps: int = 5,
    num_layers: int = 1,
    bidirectional: bool = False,
    nonlinearity: str = "tanh",
    update: str = "candidate",
    reset: str = "before",
    layer_norm: bool = False,
    window: int | None = None,
    recurrent_dropout: float = 0.0,
    zoneout: float = 0.0,
    weight_drop: float = 0.0,
    recompute: int | None = None,
    resets: bool = False,
    seed: int = 0,
    tol: float = 1e-6,
    eps: float = 1e-6,
) -> GradcheckResult:
    """Check the explicit BPTT of one layer configuration against finite differences.

    Args:
        cell: ``"rnn"``, ``"lstm"`` or ``"gru"``; ``nonlinearity`` (rnn), ``update`` and
            ``reset`` (gru) as for the cells; ``layer_norm`` the layer-normalised LSTM or
            GRU (``reset="after"``).
        hidden_size, input_size, batch_size, steps, num_layers, bidirectional: the layer
            and the batch.  window: None (full BPTT) or τ for BPTT(τ).
        recurrent_dropout, zoneout, weight_drop: the regularizers of the recurrence, their
            masks drawn once from ``seed`` and held (module docstring).
        recompute: None, or the segment length of the recomputing backward (not with
            ``window``).
        resets: rows start documents at random steps (drawn from ``seed``; not with
            ``bidirectional``).
        seed: weights, data, mask and loss weights (the global RNG is left alone).
        tol: the largest relative error that passes.  eps: the finite-difference step.

    >>> result = gradcheck("gru", reset="after", steps=4)
    >>> result.passed, result.max_rel_error < 1e-8
    (True, True)
    """
    if cell not in CELLS:
        raise ValueError(f"cell must be one of {CELLS}, got {cell!r}")
    for name, count in (("batch_size", batch_size), ("steps", steps)):
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            # 0 was an error from inside torch's random_ or an IndexError
            raise ValueError(f"{name} must be a positive integer, got {count!r}")
    for name, amount in (("tol", tol), ("eps", eps)):
        if not 0 < amount < math.inf:  # eps=0 divided by zero; tol ≤ 0 never passes
            raise ValueError(f"{name} must be a finite number > 0, got {amount!r}")
    if layer_norm and cell == "rnn":
        raise ValueError("layer_norm takes cell 'lstm' or 'gru', got 'rnn'")
    if layer_norm and cell == "gru" and recurrent_dropout:
        raise ValueError("recurrent_dropout has no layer-normalised GRU form")
    if window is not None and recompute is not None:
        raise ValueError("window and recompute cannot be combined: choose one")
    if resets and bidirectional:
        raise ValueError("resets need a unidirectional stack (a document start is in time)")
    options = _cell_options(cell, nonlinearity, update, reset, layer_norm)
    drops = {"recurrent_dropout": recurrent_dropout, "zoneout": zoneout, "weight_drop": weight_drop}
    chosen = {k: v for k, v in drops.items() if v}  # in config only where given
    config = {
        "cell": cell,
        **options,
        "hidden_size": hidden_size,
        "input_size": input_size,
        "batch_size": batch_size,
        "steps": steps,
        "num_layers": num_layers,
        "bidirectional": bidirectional,
        "window": window,
        **chosen,
        **({} if recompute is None else {"recompute": recompute}),
        **({"resets": True} if resets else {}),
        "seed": seed,
        "eps": eps,
    }
    gen = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        cls = {"rnn": RNN, "lstm": LSTM, "gru": GRU}[cell]
        layer = cls(
            input_size,
            hidden_size,
            num_layers,
            bidirectional,
            recompute=recompute,
            **options,
            **chosen,
        ).double()
    dt = torch.float64
    B, T, D = batch_size, steps, 2 if bidirectional else 1
    mask = random_mask(B, T, gen)
    x = torch.randn(B, T, input_size, generator=gen, dtype=dt)  # padding holds data too
    n_states = 2 if cell == "lstm" else 1
    states0 = tuple(
        torch.randn(num_layers, D, B, hidden_size, generator=gen, dtype=dt) for _ in range(n_states)
    )
    r_out = torch.randn(B, T, D * hidden_size, generator=gen, dtype=dt)
    r_fin = tuple(torch.randn(s.shape, generator=gen, dtype=dt) for s in states0)
    starts = None
    if resets:  # after the other draws: a check without resets keeps its data
        starts = torch.rand(B, T, generator=gen) < 0.25
    masks = None
    if chosen:  # drawn once, in training, from the seed; then held
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed + 1)
            masks = layer.draw_masks(B, T, x)

    # The explicit BPTT: the layer's normal backward.
    x_leaf = x.clone().requires_grad_(True)
    s_leaf = tuple(s.clone().requires_grad_(True) for s in states0)
    out = layer(x_leaf, mask=mask, state=_pack(s_leaf), window=window, masks=masks, resets=starts)
    _loss(out, r_out, r_fin).backward()
    explicit = {name: _grad(p) for name, p in layer.named_parameters()}
    explicit["input"] = _grad(x_leaf)
    for k, s in enumerate(s_leaf):
        explicit[f"state.{k}"] = _grad(s)
    with torch.no_grad():  # the reference: finite differences of the same loss
        if window is None:
            ref = _full_reference(layer, x, mask, states0, r_out, r_fin, eps, masks, starts)
        else:
            ref = _truncated_reference(
                layer, x, mask, states0, r_out, r_fin, window, eps, masks, starts
            )
    names = {"state.0": "state.h" if n_states == 2 else "state", "state.1": "state.c"}
    errors = tuple(_rel(explicit[n], ref[n], names.get(n, n)) for n in explicit)
    return GradcheckResult(config, errors, tol)
