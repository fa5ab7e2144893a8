"""Explicit BPTT against central finite differences, in float64 (SPEC §3).

``gradcheck`` builds a layer (``RNN``/``LSTM``/``GRU`` with the chosen options), a random
batch with holes and trailing padding (every sequence starts with a real step), a random
initial state, and the loss ``L = Σ R ⊙ outputs + Σ R_f ⊙ final state`` with random
``R``, ``R_f``. The layer's normal backward (the library's explicit BPTT) gives the
gradients of every parameter, the input and the initial state; central differences
``(L(θ + ε) − L(θ − ε)) / 2ε`` give them again, one scalar at a time.

With ``window=τ`` the explicit gradient is BPTT(τ), the gradient of a truncated graph, so
the reference is too: for each direction, from the top layer down, the truncated loss
``F = Σ_t ⟨∂L/∂h_t, h_t⟩`` where ``h_t`` is recomputed over steps ``t − τ … t`` from the
state before them held FIXED at its unperturbed value (the initial state stays variable,
so it is reached for ``t ≤ τ``); central
differences of ``F`` give that direction's truncated gradients, and its input gradient
becomes the output gradient of the layer below.

The error of one tensor is ``max|g − g_fd| / max(max|g_fd|, max|g|)`` (0 when both are
0); the check passes when every tensor's error is at most ``tol``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor

from rnnkit.diagnostics.contributions import detached_weights, run_direction
from rnnkit.layers.masking import flip_sequences
from rnnkit.layers.stacked import GRU, LSTM, RNN, Bidirectional, StackedRecurrent
from rnnkit.recurrence import forward_pass
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


def _cell_prefixes(layer: StackedRecurrent) -> dict[int, str]:
    """id(cell) → its dotted name inside ``layer``."""
    return {id(m): name for name, m in layer.named_modules() if m in layer.cells()}


def _truncated_reference(
    layer: StackedRecurrent,
    x: Tensor,
    mask: Tensor,
    states0: tuple[Tensor, ...],
    r_out: Tensor,
    r_fin: tuple[Tensor, ...],
    window: int,
    eps: float,
) -> dict[str, Tensor]:
    """Finite-difference gradients of the BPTT(τ) graph, direction by direction (top down)."""
    L, H = layer.num_layers, layer.hidden_size
    prefixes = _cell_prefixes(layer)
    inputs = [x]  # batch-first input of every layer
    for index in range(L):
        dirs = _directions(layer, index)
        outs = [
            run_direction(d, inputs[-1], mask=mask, state=_s0(states0, index, k)).outputs
            for k, d in enumerate(dirs)
        ]
        inputs.append(torch.cat(outs, dim=-1).transpose(0, 1))
    ref: dict[str, Tensor] = {"state." + str(k): torch.zeros_like(s) for k, s in enumerate(states0)}
    d_above = r_out  # ∂L/∂(outputs of the layer being processed), (B, T, D·H)
    for index in range(L - 1, -1, -1):
        d_input = torch.zeros_like(inputs[index])
        for k, direction in enumerate(_directions(layer, index)):
            fin = tuple(r[index, k] for r in r_fin)
            s0 = tuple(s[index, k] for s in states0)
            grads = _direction_reference(
                direction,
                inputs[index],
                mask,
                s0,
                d_above[..., k * H : (k + 1) * H],
                fin,
                window,
                eps,
            )
            prefix = prefixes[id(direction.cell)]
            for name, g in grads.items():
                if name == "input":
                    d_input += g
                elif name.startswith("state."):
                    ref[name][index, k] = g
                else:
                    ref[f"{prefix}.{name}"] = g
        d_above = d_input
    ref["input"] = d_above
    return ref


def _directions(layer: StackedRecurrent, index: int) -> list[Any]:
    module = layer.layers[index]
    return list(module.directions) if isinstance(module, Bidirectional) else [module]


def _s0(states0: tuple[Tensor, ...], index: int, k: int) -> Any:
    parts = tuple(s[index, k] for s in states0)
    return LSTMState(*parts) if len(parts) == 2 else parts[0]


def _direction_reference(
    direction: Any,
    x: Tensor,
    mask: Tensor,
    s0: tuple[Tensor, ...],
    d_out: Tensor,
    d_fin: tuple[Tensor, ...],
    window: int,
    eps: float,
) -> dict[str, Tensor]:
    """Central differences of one direction's truncated loss ``F`` (see the module doc)."""
    cell = direction.cell
    state = LSTMState(*s0) if cell.is_lstm else s0[0]
    frozen = run_direction(direction, x, mask=mask, state=state).record.states  # (T + 1, B, H)
    T, B = x.shape[1], x.shape[0]
    mask_t = mask.T
    d_r = d_out.transpose(0, 1)  # (T, B, H)
    if direction.reverse:
        d_r = flip_sequences(d_r, mask_t)[0]  # reading order
    x_var = x.clone(memory_format=torch.contiguous_format)
    s0_var = tuple(s.clone(memory_format=torch.contiguous_format) for s in s0)
    # Window of injection t: steps t − τ … t (τ + 1 of them, from the detached state
    # before step t − τ), as rows (t, b) of one batch. Where t − τ < 0 the window starts at
    # the live initial state.
    span = window + 1
    idx = torch.arange(T)[:, None] - window + torch.arange(span)[None, :]  # (T, τ + 1)
    inside = idx >= 0
    idx = idx.clamp(min=0)
    starts_at_zero = (torch.arange(T) - window < 0)[:, None]  # (T, 1)
    w = detached_weights(cell)

    def objective() -> Tensor:
        xt = x_var.transpose(0, 1)  # (T, B, I)
        mr = mask_t
        if direction.reverse:
            xt = flip_sequences(xt, mask_t)[0]
            mr = flip_sequences(mask_t, mask_t)[0]  # the mask in reading order
        xw = xt[idx.T].reshape(span, T * B, -1)  # (τ + 1, T, B, I) → (τ + 1, T·B, I)
        mw = (mr[idx.T] & inside.T[:, :, None]).reshape(span, T * B, 1)
        xw = torch.where(mw, xw, 0.0)
        start_index = (torch.arange(T) - window).clamp(min=0)
        starts = tuple(
            torch.where(starts_at_zero[:, :, None], s.expand(T, B, -1), f[start_index]).reshape(
                T * B, -1
            )
            for s, f in zip(s0_var, frozen, strict=True)
        )
        rec = forward_pass(cell.kernel, xw, w, starts, mw, save=False)
        ends = [s[-1].view(T, B, -1) for s in rec.states]  # the state at step t, row (t, b)
        total = (ends[0] * d_r).sum()
        for e, d in zip(ends, d_fin, strict=True):
            total = total + (e[T - 1] * d).sum()
        return total

    with torch.no_grad():
        grads = {name: _central(p.data, objective, eps) for name, p in cell.named_parameters()}
        grads["input"] = _central(x_var, objective, eps)
        for k, s in enumerate(s0_var):
            grads[f"state.{k}"] = _central(s, objective, eps)
    return grads


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
    window: int | None = None,
    seed: int = 0,
    tol: float = 1e-6,
    eps: float = 1e-6,
) -> GradcheckResult:
    """Check the explicit BPTT of one layer configuration against finite differences.

    Args:
        cell: ``"rnn"``, ``"lstm"`` or ``"gru"``; ``nonlinearity`` (rnn), ``update`` and
            ``reset`` (gru) as for the cells.
        hidden_size, input_size, batch_size, steps, num_layers, bidirectional: the layer
            and the batch.  window: None (full BPTT) or τ for BPTT(τ).
        seed: weights, data, mask and loss weights (the global RNG is left alone).
        tol: the largest relative error that passes.  eps: the finite-difference step.

    >>> result = gradcheck("gru", reset="after", steps=4)
    >>> result.passed, result.max_rel_error < 1e-8
    (True, True)
    """
    if cell not in CELLS:
        raise ValueError(f"cell must be one of {CELLS}, got {cell!r}")
    options: dict[str, Any] = {}
    if cell == "rnn":
        options["nonlinearity"] = nonlinearity
    elif cell == "gru":
        options.update(update=update, reset=reset)
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
        "seed": seed,
        "eps": eps,
    }
    gen = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        cls = {"rnn": RNN, "lstm": LSTM, "gru": GRU}[cell]
        layer = cls(input_size, hidden_size, num_layers, bidirectional, **options).double()
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

    def pack(states: tuple[Tensor, ...]) -> Any:
        return LSTMState(*states) if n_states == 2 else states[0]

    # The explicit BPTT: the layer's normal backward.
    x_leaf = x.clone().requires_grad_(True)
    s_leaf = tuple(s.clone().requires_grad_(True) for s in states0)
    out = layer(x_leaf, mask=mask, state=pack(s_leaf), window=window)
    _loss(out, r_out, r_fin).backward()
    explicit = {name: _grad(p) for name, p in layer.named_parameters()}
    explicit["input"] = _grad(x_leaf)
    for k, s in enumerate(s_leaf):
        explicit[f"state.{k}"] = _grad(s)

    if window is None:
        x_var, s_var = x.clone(), tuple(s.clone() for s in states0)

        def objective() -> Tensor:
            return _loss(layer(x_var, mask=mask, state=pack(s_var)), r_out, r_fin)

        with torch.no_grad():
            ref = {n: _central(p.data, objective, eps) for n, p in layer.named_parameters()}
            ref["input"] = _central(x_var, objective, eps)
            for k, s in enumerate(s_var):
                ref[f"state.{k}"] = _central(s, objective, eps)
    else:
        with torch.no_grad():
            ref = _truncated_reference(layer, x, mask, states0, r_out, r_fin, window, eps)
    names = {"state.0": "state.h" if n_states == 2 else "state", "state.1": "state.c"}
    errors = tuple(_rel(explicit[n], ref[n], names.get(n, n)) for n in explicit)
    return GradcheckResult(config, errors, tol)
