"""The layer-normalised LSTM and GRU (Ba et al. 2016; the forms of haste's
``LayerNormLSTM`` and ``LayerNormGRU``): the input and recurrent products each normalised
over their gate pre-activations, and the LSTM's cell state before its ``tanh``. LSTM gate
order i, f, g, o:

    ν(v) = (v − mean(v)) / √(var(v) + ε)              over the last dimension, ε = 1e-5
    a_t = ν(W_x x_t) ⊙ γ_x + ν(W_h h_{t-1}) ⊙ γ_h + b
    i, f, o = σ(a_i), σ(a_f), σ(a_o)     g = tanh(a_g)
    c_t = f ⊙ c_{t-1} + i ⊙ g
    h_t = o ⊙ tanh(ν(c_t) ⊙ γ_c + β_c)

The GRU (r, z, n; reset after the recurrent product, both update conventions):

    p_t = ν(W_x x_t) ⊙ γ_x + b             q_t = ν(W_h h_{t-1}) ⊙ γ_h + [0; 0; b_hn]
    r, z = σ(p_r + q_r), σ(p_z + q_z)      n = tanh(p_n + r ⊙ q_n)
    h_t = z ⊙ h_{t-1} + (1 − z) ⊙ n  ("keep";  "candidate": (1 − z) ⊙ h_{t-1} + z ⊙ n)

Backward of ν with ``n = ν(v)``, ``s = 1/√(var(v) + ε)``, for a gradient ``d`` of ``n``:
``∂L/∂v = s (d − mean(d) − n ⊙ mean(d ⊙ n))``. The input part ``ν(W_x x_t) ⊙ γ_x`` is
the same for every step: the layer computes it for all steps at once, with autograd
(``rnnkit.cells.normalization.normalized_input``: torch's fused layer norm of the input
product, that product the compiled loop's where the layer runs there), and hands it to
the time loop as its input (``LayerNormLSTMKernel.reads_projected``); the loop
runs the rest, with the hand-written backward of :meth:`LayerNormLSTMKernel.step_backward`.
On the CPU the compiled loop runs it (``rnnkit/csrc/layer_norm.h``: the same caches and
backward; the kernels' ``native_forward``/``native_backward``), on a GPU the Triton steps
(``rnnkit.bptt.gpu_steps_ln``), elsewhere the PyTorch loop. With recurrent dropout (the
LSTM's only) or zoneout (``rnnkit.bptt.regularized``) the compiled loop and the Triton
steps take their masks as inputs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from rnnkit.cells.amp import cell_step_in_weights_dtype
from rnnkit.cells.base import CellBase, check_cell_input
from rnnkit.cells.gru import UPDATES
from rnnkit.cells.kernel import Weights, scratch
from rnnkit.cells.normalization import normalize, normalize_backward, normalized_input
from rnnkit.types import LSTMState

__all__ = [
    "LayerNormGRUCell",
    "LayerNormGRUKernel",
    "LayerNormLSTMCell",
    "LayerNormLSTMKernel",
    "layer_norm_gru_step",
    "layer_norm_lstm_step",
]


def _rows(x: Tensor, T: int, B: int, offsets: Tensor | None) -> Tensor:
    """The input part as the compiled loop reads it: ``(T, B, G·H)``, or ``(N, G·H)``
    packed."""
    x = x.contiguous()
    return x if offsets is not None else x.view(T, B, x.shape[-1])


def _gains(w: Weights) -> Tensor:
    assert w.bias_hn is not None  # a layer-normalised cell's weights always carry the gains
    return w.bias_hn.contiguous()


def _regularizers(reg: tuple[Tensor | None, ...] | None, n: int) -> tuple[Tensor | None, ...]:
    """The compiled loop's regularizer inputs: recurrent dropout's mask, then zoneout's keep
    factor of each of the ``n`` states (``CompiledRegularized``), None where not given."""
    return tuple(reg) if reg is not None else (None,) * (1 + n)


def layer_norm_lstm_step(xp: Tensor, state: LSTMState, w: Weights) -> LSTMState:
    """One step in plain differentiable ops (the autograd oracle): ``xp (B, 4H)`` is the
    normalised input part ``ν(W_x x_t) ⊙ γ_x``; ``w.bias_hn`` holds ``[γ_h; γ_c; β_c]``
    (``4H + H + H``)."""
    H = state.h.shape[1]
    assert w.bias_hn is not None
    g_h, g_c, b_c = w.bias_hn[: 4 * H], w.bias_hn[4 * H : 5 * H], w.bias_hn[5 * H :]
    a = xp + normalize(state.h @ w.weight_hh.T)[0] * g_h + w.bias
    a_i, a_f, a_g, a_o = a.chunk(4, dim=1)
    i, f, g, o = torch.sigmoid(a_i), torch.sigmoid(a_f), torch.tanh(a_g), torch.sigmoid(a_o)
    c = f * state.c + i * g
    h = o * torch.tanh(normalize(c)[0] * g_c + b_c)
    return LSTMState(h, c)


class _Cache(NamedTuple):
    gates: Tensor  # (·, 4H) activated i, f, g, o (the input buffer, in place)
    n_q: Tensor  # (·, 4H) ν(W_h h_{t-1})
    inv_q: Tensor  # (·, 1)
    n_c: Tensor  # (·, H) ν(c_t)
    inv_c: Tensor  # (·, 1)
    tanh_c: Tensor  # (·, H) tanh(ν(c_t) γ_c + β_c)


@dataclass(frozen=True)
class LayerNormLSTMKernel:
    """The layer-normalised LSTM's step for the PyTorch time loop (module docstring).

    ``reads_projected``: the loop's input is the normalised input part itself (its
    gradient is the pre-activations'); the sweep's recurrent gradients ``d_hp`` are a
    buffer of their own, ``6H`` wide (:meth:`recurrent_grad_width`): ∂L/∂(W_h h_{t-1}),
    which differs from the pre-activations' through ν, then ``∂L/∂ĉ ⊙ ν(c)`` and
    ``∂L/∂ĉ`` (``ĉ = ν(c) γ_c + β_c``), zero at masked steps like the rest. ``bias_hn`` of
    the weights carries ``[γ_h; γ_c; β_c]``, whose gradient :meth:`recurrent_grads`
    returns; the step backward reads it (``backward_reads_bias_hn``).
    """

    gates: int = 4
    num_states: int = 2
    reads_projected: bool = True
    backward_reads_bias_hn: bool = True

    @staticmethod
    def recurrent_grad_width(H: int) -> int:
        return 6 * H

    def step(self, x: Tensor, states: tuple[Tensor, ...], w: Weights) -> tuple[Tensor, ...]:
        return tuple(layer_norm_lstm_step(x, LSTMState(*states), w))

    def prepare(self, w: Weights) -> Weights:
        return w

    def project_inputs(self, x: Tensor, w: Weights, T: int, B: int) -> tuple[Tensor, ...]:
        return ((x + w.bias).view(T, B, x.shape[1]),)  # the input part is given: + b

    def input_weights_t(self, weight: Tensor) -> tuple[Tensor, ...]:
        raise NotImplementedError("the layer-normalised LSTM reads its input part whole")

    def alloc_cache(
        self, T: int, B: int, H: int, xps: tuple[Tensor, ...], save: bool
    ) -> tuple[Tensor, ...]:
        like = xps[0]
        widths = (4 * H, 1, H, 1, H)
        return (xps[0], *(scratch(T, B, k, like, save) for k in widths))

    def step_into(
        self,
        xp: tuple[Tensor, ...],
        prev: tuple[Tensor, ...],
        out: tuple[Tensor, ...],
        cache: tuple[Tensor, ...],
        prep: Any,  # what this kernel's prepare returns
    ) -> None:
        gates, n_q, inv_q, n_c, inv_c, tanh_c = cache
        H = prev[0].shape[1]
        g_h, g_c, b_c = prep.bias_hn[: 4 * H], prep.bias_hn[4 * H : 5 * H], prep.bias_hn[5 * H :]
        n, inv = normalize(prev[0] @ prep.weight_hh.T)
        n_q.copy_(n)
        inv_q.copy_(inv)
        a = gates.addcmul_(n, g_h)  # the input part + b + ν(W_h h) γ_h, in place
        g = torch.tanh(a[:, 2 * H : 3 * H])
        a.sigmoid_()
        a[:, 2 * H : 3 * H] = g
        i, f, _, o = a.chunk(4, dim=1)
        torch.mul(f, prev[1], out=out[1])
        out[1].addcmul_(i, g)
        n, inv = normalize(out[1])
        n_c.copy_(n)
        inv_c.copy_(inv)
        torch.tanh(n * g_c + b_c, out=tanh_c)
        torch.mul(o, tanh_c, out=out[0])

    def prepare_backward(self, w: Weights) -> Weights:
        return w

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
        d_h, d_c = d_new
        gates, n_q, inv_q, n_c, inv_c, tanh_c = cache
        H = d_h.shape[1]
        g_h, g_c = w.bias_hn[: 4 * H], w.bias_hn[4 * H : 5 * H]
        i, f, g, o = gates.chunk(4, dim=1)
        d_q, d_cell = d_hp[:, : 4 * H], d_hp[:, 4 * H :]
        d_hat = d_h * o * (1 - tanh_c * tanh_c)  # ∂L/∂ĉ, ĉ = ν(c) γ_c + β_c
        torch.mul(d_hat, n_c, out=d_cell[:, :H])
        d_cell[:, H:].copy_(d_hat)
        d_ct = d_c + normalize_backward(d_hat * g_c, n_c, inv_c)
        d_i, d_f, d_g, d_o = d_xp.chunk(4, dim=1)
        torch.mul(d_ct, g * i * (1 - i), out=d_i)
        torch.mul(d_ct * prev[1], f * (1 - f), out=d_f)
        torch.mul(d_ct * i, 1 - g * g, out=d_g)
        torch.mul(d_h * tanh_c, o * (1 - o), out=d_o)
        d_q.copy_(normalize_backward(d_xp * g_h, n_q, inv_q))  # ∂L/∂(W_h h_{t-1})
        return (d_q @ w.weight_hh, d_ct * f)

    def recurrent_grads(
        self,
        d_xp: Tensor,
        d_hp: Tensor,
        h_prev: Tensor,
        cache: tuple[Tensor, ...],
        mm: Callable[[Tensor, Tensor], Tensor] = torch.mm,
    ) -> tuple[Tensor, Tensor | None]:
        n_q, H = cache[1], h_prev.shape[1]
        d_gains = torch.cat([(d_xp * n_q).sum(0), d_hp[:, 4 * H :].sum(0)])  # γ_h; γ_c, β_c
        return mm(d_hp[:, : 4 * H].T, h_prev), d_gains

    # The compiled loop (rnnkit/csrc/layer_norm.h) fills the same caches as step_into; its
    # backward sums the gradients of the gains and the bias itself (d_hp then only
    # ∂L/∂(W_h h_{t-1})).
    def native_reads_rows(self, x: Tensor, w: Weights) -> bool:
        return False  # the input part comes as rows of (T·B or N, 4H)

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
        """``x``: the input part (read, never written); ``reg``: recurrent dropout's mask and
        zoneout's keep factors of h and c (``rnnkit.bptt.regularized``), on unsorted and
        unpacked rows."""
        hs, cs, *cache = lib.ln_lstm_forward(
            _rows(x, T, B, offsets), w.weight_hh.contiguous(), w.bias.contiguous(),
            _gains(w), *states0, mask, save, offsets, *_regularizers(reg, 2),
        )  # fmt: skip
        return (hs, cs), tuple(cache), None

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
    ) -> tuple[Tensor, Tensor, tuple[Tensor, ...], Tensor | None, Tensor | None, Tensor]:
        """Also the gradients of the gains and the bias, summed by the loop: its ``d_hp`` is
        ∂L/∂(W_h h_{t-1}) alone (``Kernel.native_backward``); ``reg`` as the forward's."""
        d_xp, d_q, d_gains, d_bias, d_h0, d_c0 = lib.ln_lstm_backward(
            [c.contiguous() for c in record.cache], record.states[1].contiguous(),
            w.weight_hh.contiguous(), _gains(w), mask,
            None if d_out is None else d_out.contiguous(), *d_states, offsets,
            *_regularizers(reg, 2),
        )  # fmt: skip
        return d_xp, d_q, (d_h0, d_c0), None, d_bias, d_gains


class LayerNormLSTMCell(CellBase):
    """The layer-normalised LSTM cell (module docstring): gates i, f, g, o, ONE bias.

    Args:
        input_size: ``I``.  hidden_size: ``H``.
        init: ``"uniform"`` or ``"orthogonal"`` recurrent blocks.

    Parameters: ``weight_ih (4H, I)``, ``weight_hh (4H, H)``, ``bias (4H,)``, the gains
    ``gamma_ih (4H,)``, ``gamma_hh (4H,)``, ``gamma_c (H,)`` (all 1 at initialisation) and
    ``beta_c (H,)`` (0). The state is ``LSTMState(h, c)``.

    >>> cell = LayerNormLSTMCell(3, 5)
    >>> sum(p.numel() for p in cell.parameters())
    230
    >>> cell(torch.zeros(2, 3)).c.shape
    torch.Size([2, 5])
    """

    gates = 4
    is_lstm = True
    #: the parameters the loop's ``Weights.bias_hn`` carries, in order (:meth:`weights`)
    loop_gains = ("gamma_hh", "gamma_c", "beta_c")

    def __init__(self, input_size: int, hidden_size: int, init: str = "uniform") -> None:
        super().__init__(input_size, hidden_size, init)
        H = hidden_size
        self.gamma_ih = nn.Parameter(torch.empty(4 * H))
        self.gamma_hh = nn.Parameter(torch.empty(4 * H))
        self.gamma_c = nn.Parameter(torch.empty(H))
        self.beta_c = nn.Parameter(torch.empty(H))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        super().reset_parameters()
        with torch.no_grad():
            for gain in (self.gamma_ih, self.gamma_hh, self.gamma_c):
                gain.fill_(1.0)
            self.beta_c.zero_()

    @property
    def kernel(self) -> LayerNormLSTMKernel:
        return LayerNormLSTMKernel()

    def weights(self) -> Weights:
        """The loop's weights: ``weight_ih`` only as a size (the loop reads the input part
        :meth:`input_part` computes), ``bias_hn`` the gains ``[γ_h; γ_c; β_c]``."""
        gains = torch.cat([getattr(self, name) for name in self.loop_gains])
        return Weights(self.weight_ih.detach(), self.weight_hh, self.bias, gains)

    def input_part(self, x: Tensor, mm: Callable[..., Tensor] | None = None) -> Tensor:
        """``ν(x W_xᵀ) ⊙ γ_x`` for ``x (…, I)`` → ``(…, 4H)``: the loop's input
        (``mm``: :func:`normalized_input`)."""
        return normalized_input(x, self.weight_ih, self.gamma_ih, mm)

    @cell_step_in_weights_dtype
    def forward(self, x: Tensor, state: LSTMState | None = None) -> LSTMState:
        """One step: ``x (B, I)``, ``LSTMState`` or None (zeros) → ``LSTMState(h, c)``."""
        state = check_cell_input(self, x, state)
        return layer_norm_lstm_step(self.input_part(x), state, self.weights())


def layer_norm_gru_step(xp: Tensor, h_prev: Tensor, w: Weights, update: str) -> Tensor:
    """One step in plain differentiable ops (the autograd oracle): ``xp (B, 3H)`` is the
    input part ``ν(W_x x_t) ⊙ γ_x`` (without ``b``); ``w.bias_hn`` holds ``[γ_h; b_hn]``
    (``3H + H``)."""
    H = h_prev.shape[1]
    assert w.bias_hn is not None
    g_h, b_hn = w.bias_hn[: 3 * H], w.bias_hn[3 * H :]
    p = xp + w.bias
    q = normalize(h_prev @ w.weight_hh.T)[0] * g_h
    r, z = torch.sigmoid(p[:, : 2 * H] + q[:, : 2 * H]).chunk(2, dim=1)
    n = torch.tanh(p[:, 2 * H :] + r * (q[:, 2 * H :] + b_hn))
    return z * h_prev + (1 - z) * n if update == "keep" else (1 - z) * h_prev + z * n


@dataclass(frozen=True)
class LayerNormGRUKernel:
    """The layer-normalised GRU's step for the PyTorch time loop (module docstring).

    As :class:`LayerNormLSTMKernel`: the input part is the loop's input, ``bias_hn``
    carries ``[γ_h; b_hn]``, and the sweep's recurrent buffer ``d_hp`` is ``4H`` wide:
    ∂L/∂(W_h h_{t-1}), then ∂L/∂q_n (the gradient of ``b_hn``). Cache: the activated
    r, z and n (the input buffer, in place), ``q_n``, ``ν(W_h h_{t-1})`` and its scale.
    """

    update: str = "candidate"
    gates: int = 3
    num_states: int = 1
    reads_projected: bool = True
    backward_reads_bias_hn: bool = True

    @staticmethod
    def recurrent_grad_width(H: int) -> int:
        return 4 * H

    def step(self, x: Tensor, states: tuple[Tensor, ...], w: Weights) -> tuple[Tensor, ...]:
        return (layer_norm_gru_step(x, states[0], w, self.update),)

    def prepare(self, w: Weights) -> Weights:
        return w

    def project_inputs(self, x: Tensor, w: Weights, T: int, B: int) -> tuple[Tensor, ...]:
        return ((x + w.bias).view(T, B, x.shape[1]),)

    def input_weights_t(self, weight: Tensor) -> tuple[Tensor, ...]:
        raise NotImplementedError("the layer-normalised GRU reads its input part whole")

    def alloc_cache(
        self, T: int, B: int, H: int, xps: tuple[Tensor, ...], save: bool
    ) -> tuple[Tensor, ...]:
        like = xps[0]
        return (xps[0], *(scratch(T, B, k, like, save) for k in (H, 3 * H, 1)))

    def step_into(
        self,
        xp: tuple[Tensor, ...],
        prev: tuple[Tensor, ...],
        out: tuple[Tensor, ...],
        cache: tuple[Tensor, ...],
        prep: Any,  # what this kernel's prepare returns
    ) -> None:
        gates, q_n, n_q, inv_q = cache  # gates: p + b on entry, r, z, n on exit
        (h_prev,) = prev
        H = h_prev.shape[1]
        g_h, b_hn = prep.bias_hn[: 3 * H], prep.bias_hn[3 * H :]
        n, inv = normalize(h_prev @ prep.weight_hh.T)
        n_q.copy_(n)
        inv_q.copy_(inv)
        q = n * g_h
        rz = gates[:, : 2 * H].add_(q[:, : 2 * H]).sigmoid_()
        torch.add(q[:, 2 * H :], b_hn, out=q_n)
        cand = gates[:, 2 * H :].addcmul_(rz[:, :H], q_n).tanh_()
        z = rz[:, H:]
        if self.update == "keep":
            torch.lerp(cand, h_prev, z, out=out[0])
        else:
            torch.lerp(h_prev, cand, z, out=out[0])

    def prepare_backward(self, w: Weights) -> Weights:
        return w

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
        (d_h,) = d_new
        (h_prev,) = prev
        gates, q_n, n_q, inv_q = cache
        H = h_prev.shape[1]
        g_h = w.bias_hn[: 3 * H]
        r, z, n = gates[:, :H], gates[:, H : 2 * H], gates[:, 2 * H :]
        if self.update == "keep":
            d_z, d_n, direct = d_h * (h_prev - n), d_h * (1 - z), d_h * z
        else:
            d_z, d_n, direct = d_h * (n - h_prev), d_h * z, d_h * (1 - z)
        d_an = d_n * (1 - n * n)
        d_q, d_qn = d_hp[:, : 3 * H], d_hp[:, 3 * H :]
        torch.mul(d_an, r, out=d_qn)  # ∂L/∂q_n
        torch.mul(d_an * q_n, r * (1 - r), out=d_xp[:, :H])
        torch.mul(d_z, z * (1 - z), out=d_xp[:, H : 2 * H])
        d_xp[:, 2 * H :].copy_(d_an)
        q_grad = torch.cat([d_xp[:, : 2 * H], d_qn], dim=1)  # ∂L/∂q
        d_q.copy_(normalize_backward(q_grad * g_h, n_q, inv_q))  # ∂L/∂(W_h h_{t-1})
        return (direct + d_q @ w.weight_hh,)

    def recurrent_grads(
        self,
        d_xp: Tensor,
        d_hp: Tensor,
        h_prev: Tensor,
        cache: tuple[Tensor, ...],
        mm: Callable[[Tensor, Tensor], Tensor] = torch.mm,
    ) -> tuple[Tensor, Tensor | None]:
        n_q, H = cache[2], h_prev.shape[1]
        d_qn = d_hp[:, 3 * H :]
        q_grad = torch.cat([d_xp[:, : 2 * H], d_qn], dim=1)
        d_gains = torch.cat([(q_grad * n_q).sum(0), d_qn.sum(0)])  # γ_h; b_hn
        return mm(d_hp[:, : 3 * H].T, h_prev), d_gains

    # The compiled loop (rnnkit/csrc/layer_norm.h), as LayerNormLSTMKernel's.
    def native_reads_rows(self, x: Tensor, w: Weights) -> bool:
        return False  # the input part comes as rows of (T·B or N, 3H)

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
        """As :meth:`LayerNormLSTMKernel.native_forward`: zoneout only (no recurrent
        dropout: ``rnnkit.bptt.regularized.regularized`` refuses it for this cell)."""
        rec_mask, keep_h = _regularizers(reg, 1)
        assert rec_mask is None
        hs, *cache = lib.ln_gru_forward(
            _rows(x, T, B, offsets), w.weight_hh.contiguous(), w.bias.contiguous(),
            _gains(w), states0[0], mask, save, self.update == "keep", offsets, keep_h,
        )  # fmt: skip
        return (hs,), tuple(cache), None

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
    ) -> tuple[Tensor, Tensor, tuple[Tensor, ...], Tensor | None, Tensor | None, Tensor]:
        rec_mask, keep_h = _regularizers(reg, 1)
        assert rec_mask is None
        d_xp, d_q, d_gains, d_bias, d_h0 = lib.ln_gru_backward(
            [c.contiguous() for c in record.cache], record.states[0].contiguous(),
            w.weight_hh.contiguous(), _gains(w), mask,
            None if d_out is None else d_out.contiguous(), d_states[0],
            self.update == "keep", offsets, keep_h,
        )  # fmt: skip
        return d_xp, d_q, (d_h0,), None, d_bias, d_gains


class LayerNormGRUCell(CellBase):
    """The layer-normalised GRU cell (module docstring): gates r, z, n, the reset gate
    after the recurrent product.

    Args:
        input_size: ``I``.  hidden_size: ``H``.
        update: ``"candidate"`` or ``"keep"`` (as ``GRUCell``).
        init: ``"uniform"`` or ``"orthogonal"`` recurrent blocks.

    Parameters: ``weight_ih (3H, I)``, ``weight_hh (3H, H)``, ``bias (3H,)``,
    ``bias_hn (H,)`` and the gains ``gamma_ih (3H,)``, ``gamma_hh (3H,)`` (1 at
    initialisation). The state is one tensor ``(B, H)``.

    >>> cell = LayerNormGRUCell(3, 5)
    >>> sum(p.numel() for p in cell.parameters())
    170
    >>> cell(torch.zeros(2, 3)).shape
    torch.Size([2, 5])
    """

    gates = 3
    reset = "after"
    #: the parameters the loop's ``Weights.bias_hn`` carries, in order (:meth:`weights`)
    loop_gains = ("gamma_hh", "bias_hn")

    def __init__(
        self, input_size: int, hidden_size: int, update: str = "candidate", init: str = "uniform"
    ) -> None:
        if update not in UPDATES:
            raise ValueError(f"update must be one of {UPDATES}, got {update!r}")
        super().__init__(input_size, hidden_size, init)
        self.update = update
        H = hidden_size
        self.bias_hn = nn.Parameter(torch.empty(H))
        self.gamma_ih = nn.Parameter(torch.empty(3 * H))
        self.gamma_hh = nn.Parameter(torch.empty(3 * H))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        super().reset_parameters()
        with torch.no_grad():
            self.gamma_ih.fill_(1.0)
            self.gamma_hh.fill_(1.0)

    @property
    def kernel(self) -> LayerNormGRUKernel:
        return LayerNormGRUKernel(self.update)

    def weights(self) -> Weights:
        """As :meth:`LayerNormLSTMCell.weights`; ``bias_hn`` carries ``[γ_h; b_hn]``."""
        gains = torch.cat([getattr(self, name) for name in self.loop_gains])
        return Weights(self.weight_ih.detach(), self.weight_hh, self.bias, gains)

    def input_part(self, x: Tensor, mm: Callable[..., Tensor] | None = None) -> Tensor:
        """``ν(x W_xᵀ) ⊙ γ_x`` for ``x (…, I)`` → ``(…, 3H)``: the loop's input
        (``mm``: :func:`normalized_input`)."""
        return normalized_input(x, self.weight_ih, self.gamma_ih, mm)

    @cell_step_in_weights_dtype
    def forward(self, x: Tensor, state: Tensor | None = None) -> Tensor:
        """One step: ``x (B, I)``, ``state (B, H)`` or None (zeros) → ``h_t (B, H)``."""
        h_prev = check_cell_input(self, x, state)
        return layer_norm_gru_step(self.input_part(x), h_prev, self.weights(), self.update)

    def extra_repr(self) -> str:
        return f"{self.input_size}, {self.hidden_size}, update={self.update!r}"
