"""The LSTM cell with forget gate, ONE bias per gate, gate order i, f, g, o.

    u_t = [x_t; h_{t-1}]
    i_t = σ(W_i u_t + b_i)    f_t = σ(W_f u_t + b_f)    o_t = σ(W_o u_t + b_o)
    g_t = tanh(W_c u_t + b_c)                                   (candidate)
    c_t = f_t ⊙ c_{t-1} + i_t ⊙ g_t
    h_t = o_t ⊙ tanh(c_t)

``weight_ih`` stacks the ``x`` columns of W_i, W_f, W_c, W_o (``4H × I``), ``weight_hh``
their ``h`` columns (``4H × H``). Backward of one step, ``d_h``/``d_c`` = ∂L/∂h_t, ∂L/∂c_t
coming from step t+1 and the output:

    d_c ← d_c + d_h ⊙ o_t ⊙ (1 − tanh²(c_t))
    d_o = d_h ⊙ tanh(c_t)   d_i = d_c ⊙ g_t   d_g = d_c ⊙ i_t   d_f = d_c ⊙ c_{t-1}
    pre-activation gradients: × σ' = s(1 − s) for i, f, o and × (1 − g²) for g
    ∂L/∂c_{t-1} = d_c ⊙ f_t      ∂L/∂h_{t-1} = weight_hhᵀ d_gates
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, overload

import torch
from torch import Tensor
from torch.utils.weak import WeakIdKeyDictionary

from rnnkit.cells.amp import cell_step_in_weights_dtype
from rnnkit.cells.base import CellBase, check_cell_input
from rnnkit.cells.kernel import Weights, input_product, scratch
from rnnkit.types import LSTMState

# The compiled loop takes the input product step by step (x_t W_ih^T beside h_{t-1} W_hh^T,
# and d_x_t = d_gates_t W_ih in the backward) where I + H is at most this and every thread
# gets a block of at least 4 rows: there, one step's two products beat the (T·B, 4H)
# product before the loop (its output stays in cache); wider layers are better served by
# the large product, and fewer rows leave a step's products too thin. The measurements:
# benchmarks/HISTORY.md, "How the time loop got here", step 9.
INPUT_IN_LOOP_MAX = 512
_MIN_ROWS_PER_THREAD = 4  # the loop's smallest thread block (steps.h, g_min_block_rows)


def input_in_loop(input_size: int, hidden_size: int, batch: int) -> bool:
    """Whether the compiled loop computes an LSTM layer's input product per step, for
    ``batch`` rows on torch's current number of threads."""
    if input_size <= 0 or input_size + hidden_size > INPUT_IN_LOOP_MAX:
        return False
    return batch >= _MIN_ROWS_PER_THREAD * torch.get_num_threads()


__all__ = [
    "LSTMCache",
    "LSTMCell",
    "LSTMKernel",
    "NativeLSTMStep",
    "fused_lstm_cell",
    "lstm_step",
    "lstm_step_backward",
]

# A zero hidden bias for each bias given to torch's fused cell (see fused_lstm_cell),
# kept while that bias lives: no allocation (no kernel on a GPU) per step
_zero_bias: WeakIdKeyDictionary = WeakIdKeyDictionary()


def _capturing(t: Tensor) -> bool:
    """Whether a CUDA graph is being captured on the current stream, for a CUDA ``t``."""
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def fused_lstm_cell(
    x: Tensor, state: tuple[Tensor, Tensor], w_ih: Tensor, w_hh: Tensor, bias: Tensor | None
) -> tuple[Tensor, Tensor]:
    """One LSTM step, one bias per gate, in torch's fused cell operator: ``x (B, I)``,
    ``state (h, c)`` each ``(B, H)`` → ``(h', c')``.

    torch's cell takes two biases (``b_ih``, ``b_hh``). On the CPU it adds what it is
    given; on a GPU its fused kernel (``_thnn_fused_lstm_cell``) refuses an input bias
    without a hidden one. So the bias goes in as ``b_ih`` beside a zero ``b_hh`` (the
    same values: ``+ 0`` is exact) on every device.
    """
    if bias is None:
        return torch.lstm_cell(x, state, w_ih, w_hh, None, None)
    if torch.compiler.is_compiling():  # a traced graph makes its own (no cache to trace)
        return torch.lstm_cell(x, state, w_ih, w_hh, bias, torch.zeros_like(bias))
    zero = _zero_bias.get(bias)
    if zero is None or (zero.shape, zero.dtype, zero.device) != (
        bias.shape,
        bias.dtype,
        bias.device,
    ):
        if _capturing(bias):
            # inside a CUDA graph's capture a new tensor's zeros are recorded, not written
            # (they exist once the graph replays): made for this call, not kept for eager
            # calls after the capture (as rnnkit.bptt.fused._gru_parameters does)
            return torch.lstm_cell(x, state, w_ih, w_hh, bias, torch.zeros_like(bias))
        # a normal tensor even under inference_mode: later calls may save it for backward
        with torch.inference_mode(False):
            zero = _zero_bias[bias] = torch.zeros_like(bias, requires_grad=False)
    return torch.lstm_cell(x, state, w_ih, w_hh, bias, zero)


class LSTMCache(NamedTuple):
    """What the backward of one LSTM step needs besides the states."""

    gates: Tensor  # (B, 4H) activated i, f, g, o
    tanh_c: Tensor  # (B, H)


@overload
def lstm_step(
    x: Tensor, state: LSTMState, w: Weights, *, return_cache: Literal[False] = ...
) -> LSTMState: ...
@overload
def lstm_step(
    x: Tensor, state: LSTMState, w: Weights, *, return_cache: Literal[True]
) -> tuple[LSTMState, LSTMCache]: ...
def lstm_step(
    x: Tensor, state: LSTMState, w: Weights, *, return_cache: bool = False
) -> LSTMState | tuple[LSTMState, LSTMCache]:
    """One step in plain differentiable ops (the autograd oracle).

    Args:
        x: ``(B, I)``.  state: ``LSTMState(h, c)``, each ``(B, H)``.
        return_cache: also return the ``LSTMCache`` that ``lstm_step_backward`` reads.
    Returns:
        ``LSTMState(h_t, c_t)``, or ``(state, cache)``.
    """
    a = x @ w.weight_ih.T + state.h @ w.weight_hh.T + w.bias  # (B, 4H)
    a_i, a_f, a_g, a_o = a.chunk(4, dim=1)
    i, f, g, o = torch.sigmoid(a_i), torch.sigmoid(a_f), torch.tanh(a_g), torch.sigmoid(a_o)
    c = f * state.c + i * g
    tanh_c = torch.tanh(c)
    new = LSTMState(o * tanh_c, c)
    if return_cache:
        return new, LSTMCache(torch.cat([i, f, g, o], dim=1), tanh_c)
    return new


def lstm_step_backward(
    d_h: Tensor, d_c: Tensor, c_prev: Tensor, cache: LSTMCache, w: Weights
) -> tuple[Tensor, Tensor, Tensor]:
    """Readable backward of one step (the module docstring's equations).

    Args:
        d_h, d_c: ∂L/∂h_t and ∂L/∂c_t ``(B, H)``.  c_prev: ``c_{t-1}``.
        cache: from ``lstm_step``.
    Returns:
        ``(d_gates (B, 4H), d_h_prev, d_c_prev)``: ``d_gates`` is ∂L/∂ of the gates'
        pre-activations ``W_x x_t + W_h h_{t-1} + b`` (order i, f, g, o).
    """
    i, f, g, o = cache.gates.chunk(4, dim=1)
    d_c = d_c + d_h * o * (1 - cache.tanh_c**2)
    d_i = d_c * g * i * (1 - i)
    d_f = d_c * c_prev * f * (1 - f)
    d_g = d_c * i * (1 - g * g)
    d_o = d_h * cache.tanh_c * o * (1 - o)
    d_gates = torch.cat([d_i, d_f, d_g, d_o], dim=1)
    return d_gates, d_gates @ w.weight_hh, d_c * f


class _Prepared(NamedTuple):
    weight_hh_t: Tensor  # (H, 4H), g rows scaled by 2
    minus_one: Tensor  # scalar −1 broadcast for g = 2 σ(2a) − 1


@dataclass(frozen=True)
class LSTMKernel:
    """LSTM step math for the time loop.

    Why the scaling: ``tanh`` on the strided g-slice of the gate block costs ~4× a
    ``sigmoid`` over the whole contiguous block here, so the g rows of both projections
    are pre-scaled by 2 and ``g = tanh(a) = 2σ(2a) − 1`` — one sigmoid, one fused add.
    """

    gates: int = 4
    num_states: int = 2

    def step(self, x: Tensor, states: tuple[Tensor, ...], w: Weights) -> tuple[Tensor, ...]:
        """One step in plain differentiable ops (the loop a traced graph holds)."""
        return tuple(lstm_step(x, LSTMState(*states), w))

    @staticmethod
    def _g_scale(H: int, like: Tensor) -> Tensor:
        scale = like.new_ones(4 * H)
        scale[2 * H : 3 * H] = 2
        return scale

    def prepare(self, w: Weights) -> _Prepared:
        H = w.weight_hh.shape[1]
        scale = self._g_scale(H, w.weight_hh)
        return _Prepared((w.weight_hh * scale[:, None]).T, w.weight_hh.new_full((), -1.0))

    def project_inputs(self, x: Tensor, w: Weights, T: int, B: int) -> tuple[Tensor, ...]:
        H = w.weight_hh.shape[1]
        scale = self._g_scale(H, w.weight_hh)
        xp = torch.addmm(w.bias * scale, x, (w.weight_ih * scale[:, None]).T)
        return (xp.view(T, B, 4 * H),)

    def input_weights_t(self, weight: Tensor) -> tuple[Tensor, ...]:
        scale = self._g_scale(weight.shape[0] // 4, weight)
        return ((weight * scale[:, None]).T,)

    def alloc_cache(
        self, T: int, B: int, H: int, xps: tuple[Tensor, ...], save: bool
    ) -> tuple[Tensor, ...]:
        # The gates are computed in place in the input projections and kept there.
        return (xps[0], scratch(T, B, H, xps[0], save))

    def step_into(
        self,
        xp: tuple[Tensor, ...],
        prev: tuple[Tensor, ...],
        out: tuple[Tensor, ...],
        cache: tuple[Tensor, ...],
        prep: Any,  # what this kernel's prepare returns
    ) -> None:
        h, c = out
        gates, tanh_c = cache  # gates is xp[0]: the projection buffer, overwritten
        H = h.shape[1]
        gates.addmm_(prev[0], prep.weight_hh_t)
        gates.sigmoid_()
        g = gates[:, 2 * H : 3 * H]
        torch.add(prep.minus_one, g, alpha=2, out=g)  # tanh(a) = 2σ(2a) − 1
        i, f, _, o = gates.chunk(4, dim=1)
        torch.mul(f, prev[1], out=c)
        c.addcmul_(i, g)
        torch.tanh(c, out=tanh_c)
        torch.mul(o, tanh_c, out=h)

    def prepare_backward(self, w: Weights) -> Tensor:
        return w.weight_hh

    def backward_cache(
        self, cache: tuple[Tensor, ...], states: tuple[Tensor, ...]
    ) -> tuple[Tensor, ...]:
        gates, tanh_c = cache
        H = tanh_c.shape[-1]
        deriv = gates * (1 - gates)  # σ' = s(1 − s) for i, f, o   (T, B, 4H)
        g = gates[..., 2 * H : 3 * H]
        torch.mul(g, g, out=deriv[..., 2 * H : 3 * H]).neg_().add_(1)  # tanh' = 1 − g²
        d_tanh_c = 1 - tanh_c * tanh_c
        return (gates, tanh_c, deriv, d_tanh_c)

    def step_backward(
        self,
        d_new: tuple[Tensor, ...],
        prev: tuple[Tensor, ...],
        new: tuple[Tensor, ...],
        cache: tuple[Tensor, ...],
        d_xp: Tensor,
        d_hp: Tensor,
        w: Any,  # what this kernel's prepare_backward returns
    ) -> tuple[Tensor, ...]:
        d_h, d_c = d_new
        gates, tanh_c, deriv, d_tanh_c = cache
        i, f, g, o = gates.chunk(4, dim=1)
        d_i, d_f, d_g, d_o = d_xp.chunk(4, dim=1)
        d_ct = d_h * o
        d_ct.mul_(d_tanh_c).add_(d_c)  # d_c + d_h ⊙ o ⊙ (1 − tanh²c)
        torch.mul(d_ct, g, out=d_i)
        torch.mul(d_ct, prev[1], out=d_f)
        torch.mul(d_ct, i, out=d_g)
        torch.mul(d_h, tanh_c, out=d_o)
        d_xp.mul_(deriv)  # to pre-activation gradients, all four blocks in one op
        return (d_xp @ w, d_ct.mul_(f))

    def recurrent_grads(
        self,
        d_xp: Tensor,
        d_hp: Tensor,
        h_prev: Tensor,
        cache: tuple[Tensor, ...],
        mm: Callable[[Tensor, Tensor], Tensor] = torch.mm,
    ) -> tuple[Tensor, Tensor | None]:
        return mm(d_hp.T, h_prev), None

    # The compiled loop (rnnkit.bptt.native) fills the same buffers as step_into/step_backward.
    def native_reads_rows(self, x: Tensor, w: Weights) -> bool:
        return input_in_loop(x.shape[-1], w.weight_hh.shape[1], x.shape[1])

    def native_forward(
        self,
        lib: Any,
        x: Tensor,
        w: Weights,
        T: int,
        B: int,
        states0: tuple[Tensor, ...],
        mask: Tensor | None,
        save: bool,
        offsets: Tensor | None = None,
        projected: bool = False,
        reg: tuple[Tensor | None, ...] | None = None,
    ) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...], Tensor | None]:
        """``reg``: recurrent dropout's mask and zoneout's keep factors of h and c
        (``rnnkit.bptt.regularized``), each a contiguous tensor or None; None: none."""
        kw = {} if reg is None else dict(zip(("rec_mask", "keep_h", "keep_c"), reg, strict=True))
        w_hh, bias = w.weight_hh.contiguous(), w.bias.contiguous()
        if not projected and input_in_loop(x.shape[-1], w_hh.shape[1], B):
            # each step's x_t W_ih^T in the loop: no (N, 4H) product before it. x (T, B, I)
            # is read where it lies; a batch-first one (rows of a step T·I apart) gets its
            # outputs written batch-first too: no transposing copy on either side.
            if x.dim() == 3:
                xs = x if x.stride(-1) == 1 else x.contiguous()
                batch_first = T > 1 and B > 1 and xs.stride(0) < xs.stride(1)
            else:
                xs = x.contiguous()
                xs = xs if offsets is not None else xs.view(T, B, xs.shape[-1])
                batch_first = False
            hs, cs, tanh_c, gates, out = lib.lstm_forward(
                xs, w_hh, bias, *states0, mask, save, offsets, w.weight_ih.contiguous(), False,
                batch_first, **kw,
            )  # fmt: skip
            return (hs, cs), (gates, tanh_c), (out.transpose(0, 1) if batch_first else None)
        # x W_ih^T; the bias is added in the loop (addmm would first copy it to every row)
        xp = x if projected else input_product(x, w.weight_ih)  # (T·B or N, 4H): the
        # activated gates, in place — except in the caller's projections (kept: the loop
        # writes the gates to a new buffer, cheaper than a copy of the projections first)
        if offsets is None:
            xp = xp.view(T, B, xp.shape[1])
        hs, cs, tanh_c, gates, _ = lib.lstm_forward(
            xp, w_hh, bias, *states0, mask, save, offsets, None, projected, **kw
        )
        return (hs, cs), ((gates if projected else xp), tanh_c), None

    def native_backward(
        self,
        lib: Any,
        record: Any,
        w: Weights,
        mask: Tensor | None,
        d_out: Tensor | None,
        d_states: tuple[Tensor, ...],
        offsets: Tensor | None = None,
        need_x: bool = False,
        reg: tuple[Tensor | None, ...] | None = None,
    ) -> tuple[Tensor, Tensor, tuple[Tensor, ...], Tensor | None, Tensor | None]:
        kw = {} if reg is None else dict(zip(("rec_mask", "keep_h", "keep_c"), reg, strict=True))
        gates, tanh_c = (c.contiguous() for c in record.cache)
        c_states = record.states[1].contiguous()
        # ∂L/∂x step by step where the forward would take its input product in the loop (a
        # projected input keeps no x: the caller's product has its own backward)
        B = c_states.shape[1]
        in_loop = need_x and record.x.numel() > 0
        in_loop = in_loop and input_in_loop(record.x.shape[-1], w.weight_hh.shape[1], B)
        w_ih = w.weight_ih.contiguous() if in_loop else None
        if d_out is not None and d_out.stride(-1) != 1:  # the loop reads rows in place
            d_out = d_out.contiguous()
        d_xp, d_h0, d_c0, d_x, d_bias = lib.lstm_backward(
            gates, tanh_c, c_states, w.weight_hh.contiguous(), mask, d_out, *d_states, offsets,
            w_ih, **kw,
        )  # fmt: skip
        return d_xp, d_xp, (d_h0, d_c0), (d_x if in_loop else None), d_bias


class _NativePrepared(NamedTuple):
    weight_hh_t: Tensor  # (H, 4H)
    bias: Tensor  # (4H,)


@dataclass(frozen=True)
class NativeLSTMStep:
    """:class:`LSTMKernel`'s step interface on the compiled loop's one-step operators, for
    loops that stay in Python (attention before the step): per step the two products in
    torch and the gate math in one call (``lstm_step`` / ``lstm_step_backward``) instead of
    some ten eager operations (on a GPU the same two operators in Triton, one launch each,
    :class:`rnnkit.bptt.gpu_step_lib.TritonStepLib`). The same buffers as
    :class:`LSTMKernel` (the activated gates in place of the input projections, ``tanh c``
    beside them); the projections carry no bias (the step adds it) and no scaling of the
    g rows (the step computes ``tanh``).
    """

    lib: Any  # torch.ops.rnnkit_native, or on a GPU rnnkit.bptt.gpu_step_lib.TritonStepLib
    gates: int = 4
    num_states: int = 2

    def prepare(self, w: Weights) -> _NativePrepared:
        return _NativePrepared(w.weight_hh.T, w.bias.contiguous())

    def project_inputs(self, x: Tensor, w: Weights, T: int, B: int) -> tuple[Tensor, ...]:
        return (input_product(x, w.weight_ih).view(T, B, w.weight_ih.shape[0]),)

    def input_weights_t(self, weight: Tensor) -> tuple[Tensor, ...]:
        return (weight.T,)

    def alloc_cache(
        self, T: int, B: int, H: int, xps: tuple[Tensor, ...], save: bool
    ) -> tuple[Tensor, ...]:
        return (xps[0], scratch(T, B, H, xps[0], save))

    def step_into(
        self,
        xp: tuple[Tensor, ...],
        prev: tuple[Tensor, ...],
        out: tuple[Tensor, ...],
        cache: tuple[Tensor, ...],
        prep: Any,  # what this kernel's prepare returns
    ) -> None:
        gates, tanh_c = cache  # gates is xp[0]: the projection buffer, overwritten
        rec = torch.mm(prev[0], prep.weight_hh_t)  # h_{t−1} W_hhᵀ
        self.lib.lstm_step(gates, rec, prep.bias, prev[1], out[0], out[1], tanh_c)

    def prepare_backward(self, w: Weights) -> Tensor:
        return w.weight_hh

    def backward_cache(
        self, cache: tuple[Tensor, ...], states: tuple[Tensor, ...]
    ) -> tuple[Tensor, ...]:
        return cache

    def step_backward(
        self,
        d_new: tuple[Tensor, ...],
        prev: tuple[Tensor, ...],
        new: tuple[Tensor, ...],
        cache: tuple[Tensor, ...],
        d_xp: Tensor,
        d_hp: Tensor,
        w: Any,  # what this kernel's prepare_backward returns
    ) -> tuple[Tensor, ...]:
        d_h, d_c = d_new  # updated in place: d_c becomes ∂L/∂c_{t−1}
        gates, tanh_c = cache
        self.lib.lstm_step_backward(gates, tanh_c, prev[1], d_h, d_c, d_xp)
        return (d_xp @ w, d_c)

    def recurrent_grads(
        self,
        d_xp: Tensor,
        d_hp: Tensor,
        h_prev: Tensor,
        cache: tuple[Tensor, ...],
        mm: Callable[[Tensor, Tensor], Tensor] = torch.mm,
    ) -> tuple[Tensor, Tensor | None]:
        return mm(d_hp.T, h_prev), None


class LSTMCell(CellBase):
    """LSTM cell with forget gate: ONE bias per gate, gates i, f, g, o.

    Args:
        input_size: ``I``.  hidden_size: ``H``.
        forget_bias: added to the forget gate's bias at initialisation (1.0 is the
            common advice to remember by default); the bias stays one trainable vector.
        init: ``"uniform"`` or ``"orthogonal"`` recurrent blocks.

    Parameters: ``weight_ih (4H, I)``, ``weight_hh (4H, H)``, ``bias (4H,)`` —
    ``4H(I + H + 1)``. The state is ``LSTMState(h, c)``.

    >>> cell = LSTMCell(3, 5)
    >>> sum(p.numel() for p in cell.parameters())
    180
    >>> cell(torch.zeros(2, 3)).c.shape
    torch.Size([2, 5])
    """

    gates = 4
    is_lstm = True

    def __init__(
        self, input_size: int, hidden_size: int, forget_bias: float = 0.0, init: str = "uniform"
    ) -> None:
        super().__init__(input_size, hidden_size, init)
        if (
            isinstance(forget_bias, bool)
            or not isinstance(forget_bias, numbers.Real)
            or not math.isfinite(forget_bias)
        ):  # NaN gave NaN outputs; a string failed in float() without naming the argument
            raise ValueError(f"forget_bias must be a finite number, got {forget_bias!r}")
        self.forget_bias: float = float(forget_bias)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        super().reset_parameters()
        H = self.hidden_size
        with torch.no_grad():
            self.bias[H : 2 * H] += self.forget_bias

    @property
    def kernel(self) -> LSTMKernel:
        return LSTMKernel()

    def weights(self) -> Weights:
        return Weights(self.weight_ih, self.weight_hh, self.bias, None)

    @cell_step_in_weights_dtype
    def forward(self, x: Tensor, state: LSTMState | None = None) -> LSTMState:
        """One step: ``x (B, I)``, ``LSTMState`` or None (zeros) → ``LSTMState(h, c)``."""
        state = check_cell_input(self, x, state)
        # The same step as ``lstm_step`` (the oracle, same gate order and bias), in torch's
        # one fused op: a per-step loop (decoders, generation) pays ~10 eager ops of
        # Python dispatch less per step. Tested equal to ``lstm_step`` in float64.
        h, c = fused_lstm_cell(x, (state.h, state.c), self.weight_ih, self.weight_hh, self.bias)
        return LSTMState(h, c)
