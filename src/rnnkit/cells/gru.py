"""The GRU cell with its two independent switches (docs/math.md, "GRU"). Gate order r, z, n.

    z_t = σ(W_z u_t + b_z)      (update gate)     r_t = σ(W_r u_t + b_r)   (reset gate)

reset="before" (textbook, Cho et al. 2014 v3, d2l):
    n_t = tanh(W_nx x_t + W_nh (r_t ⊙ h_{t-1}) + b_n)
reset="after" (cuDNN, PyTorch, Keras ``reset_after=True``), two candidate biases:
    n_t = tanh(W_nx x_t + b_n + r_t ⊙ (W_nh h_{t-1} + b_hn))
update="candidate" (z is the share given to the candidate; the textbook form):
    h_t = (1 − z_t) ⊙ h_{t-1} + z_t ⊙ n_t
update="keep" (z is the share kept of the old state; original GRU, PyTorch, d2l):
    h_t = z_t ⊙ h_{t-1} + (1 − z_t) ⊙ n_t

Since 1 − σ(s) = σ(−s), negating the z rows of the weights and bias turns one update
convention into the other exactly (``rnnkit.layers.interop.convert_gru_update``).

Backward of one step with ``d_h`` = ∂L/∂h_t ("keep"; "candidate" swaps z and 1 − z):

    d_n = d_h ⊙ (1 − z)   d_z = d_h ⊙ (h_{t-1} − n)   direct ∂L/∂h_{t-1} = d_h ⊙ z
    d_an = d_n ⊙ (1 − n²)
    after:  d_r = d_an ⊙ (W_nh h_{t-1} + b_hn);   recurrent n-gradient d_an ⊙ r
    before: d(r⊙h) = W_nhᵀ d_an;  d_r = d(r⊙h) ⊙ h_{t-1};  ∂L/∂h_{t-1} += d(r⊙h) ⊙ r
    d_ar = d_r ⊙ r(1 − r)   d_az = d_z ⊙ z(1 − z)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, overload

import torch
from torch import Tensor, nn

from rnnkit.cells.amp import cell_step_in_weights_dtype
from rnnkit.cells.base import CellBase, check_cell_input
from rnnkit.cells.kernel import Weights, input_product, scratch

__all__ = ["GRUCache", "GRUCell", "GRUKernel", "gru_step", "gru_step_backward"]

UPDATES = ("candidate", "keep")
RESETS = ("before", "after")


class GRUCache(NamedTuple):
    """What the backward of one GRU step needs besides ``h_{t-1}`` (the time loop keeps the
    same per step: ``rz``, ``n`` and ``rec`` of ``GRUKernel``)."""

    gates: Tensor  # (B, 3H) activated r, z, n
    rec: Tensor  # (B, H): W_nh h_{t-1} + b_hn (reset="after") or r ⊙ h_{t-1} ("before")


@overload
def gru_step(
    x: Tensor,
    h_prev: Tensor,
    w: Weights,
    update: str = ...,
    reset: str = ...,
    *,
    return_cache: Literal[False] = ...,
    mix: Tensor | None = ...,
) -> Tensor: ...
@overload
def gru_step(
    x: Tensor,
    h_prev: Tensor,
    w: Weights,
    update: str = ...,
    reset: str = ...,
    *,
    return_cache: Literal[True],
    mix: Tensor | None = ...,
) -> tuple[Tensor, GRUCache]: ...
def gru_step(
    x: Tensor,
    h_prev: Tensor,
    w: Weights,
    update: str = "candidate",
    reset: str = "before",
    *,
    return_cache: bool = False,
    mix: Tensor | None = None,
) -> Tensor | tuple[Tensor, GRUCache]:
    """One GRU step in plain differentiable ops (the autograd oracle).

    Args:
        x: ``(B, I)``.  h_prev: ``(B, H)``.
        return_cache: also return the ``GRUCache`` that ``gru_step_backward`` reads.
        mix: the state the update mixes, ``(B, H)``, where it is not the one the gates
            read (recurrent dropout masks only the recurrent products); None: ``h_prev``.
    Returns:
        ``h_t (B, H)``, or ``(h_t, cache)``.
    """
    H = h_prev.shape[1]
    xp = x @ w.weight_ih.T + w.bias  # (B, 3H)
    W_rz, W_n = w.weight_hh[: 2 * H], w.weight_hh[2 * H :]
    r, z = torch.sigmoid(xp[:, : 2 * H] + h_prev @ W_rz.T).chunk(2, dim=1)
    if reset == "before":
        rec = r * h_prev
        n = torch.tanh(xp[:, 2 * H :] + rec @ W_n.T)
    else:
        if w.bias_hn is None:
            raise ValueError('reset="after" needs the weights\' bias_hn (b_hn)')
        rec = h_prev @ W_n.T + w.bias_hn
        n = torch.tanh(xp[:, 2 * H :] + r * rec)
    kept = h_prev if mix is None else mix
    h = (1 - z) * kept + z * n if update == "candidate" else z * kept + (1 - z) * n
    if return_cache:
        return h, GRUCache(torch.cat([r, z, n], dim=1), rec)
    return h


def gru_step_backward(
    d_h: Tensor,
    h_prev: Tensor,
    cache: GRUCache,
    w: Weights,
    update: str = "candidate",
    reset: str = "before",
) -> tuple[Tensor, Tensor, Tensor]:
    """Readable backward of one step (the module docstring's equations).

    Args:
        d_h: ∂L/∂h_t ``(B, H)``.  h_prev: ``h_{t-1}``.  cache: from ``gru_step``.
    Returns:
        ``(d_gates (B, 3H), d_h_prev (B, H), d_hn (B, H))``: ``d_gates`` is ∂L/∂ of the
        input pre-activations ``W_x x_t + b`` of r, z, n (also ∂L/∂ of the recurrent ones
        ``W_rz h_{t-1}`` of r and z); ``d_hn`` is ∂L/∂ of the n block's recurrent product,
        ``W_nh h_{t-1} + b_hn`` (after) or ``W_nh (r ⊙ h_{t-1})`` (before). So
        ``∂L/∂W_nh = d_hnᵀ h_{t-1}`` (after) or ``d_hnᵀ (r ⊙ h_{t-1})`` (before) and
        ``∂L/∂b_hn = Σ d_hn``.
    """
    H = h_prev.shape[1]
    r, z, n = cache.gates.chunk(3, dim=1)
    W_rz, W_n = w.weight_hh[: 2 * H], w.weight_hh[2 * H :]
    if update == "candidate":  # h_t = (1 − z) ⊙ h_{t-1} + z ⊙ n
        d_z, d_n, d_h_prev = d_h * (n - h_prev), d_h * z, d_h * (1 - z)
    else:  # h_t = z ⊙ h_{t-1} + (1 − z) ⊙ n
        d_z, d_n, d_h_prev = d_h * (h_prev - n), d_h * (1 - z), d_h * z
    d_an = d_n * (1 - n * n)
    if reset == "after":  # n = tanh(a_n + r ⊙ rec), rec = W_nh h_{t-1} + b_hn
        d_r = d_an * cache.rec
        d_hn = d_an * r
        d_h_prev = d_h_prev + d_hn @ W_n
    else:  # n = tanh(a_n + W_nh rec), rec = r ⊙ h_{t-1}
        d_rec = d_an @ W_n
        d_r = d_rec * h_prev
        d_hn = d_an
        d_h_prev = d_h_prev + d_rec * r
    d_gates = torch.cat([d_r * r * (1 - r), d_z * z * (1 - z), d_an], dim=1)
    return d_gates, d_h_prev + d_gates[:, : 2 * H] @ W_rz, d_hn


class _Prepared(NamedTuple):
    weight_hh_t: Tensor  # (H, 2H): the r, z rows, transposed
    weight_hn_t: Tensor  # (H, H): the n rows, transposed
    bias_hn: Tensor | None  # (H,) "after" only


@dataclass(frozen=True)
class GRUKernel:
    """GRU step math for the time loop.

    The candidate ``n`` and the gates ``r, z`` live in separate contiguous buffers
    because ``tanh``/``sigmoid`` on strided slices cost ~4× here; ``torch.lerp`` does the
    convex combination of both update conventions in one op.
    Cache: ``rz (B, 2H)``, ``n (B, H)`` and ``rec (B, H)``: ``W_nh h_{t-1} + b_hn`` (after)
    or ``r ⊙ h_{t-1}`` (before). With ``reset="after"`` the sweep's ``d_hp`` holds only
    the n block ``d_an ⊙ r`` (the r, z blocks are ``d_xp``'s): both keep the memory of a
    training step at ``(2·3 + 3)·T·B·H`` numbers instead of ``(2·3 + 3 + 4)·T·B·H``.
    """

    update: str = "candidate"
    reset: str = "before"
    gates: int = 3
    num_states: int = 1

    def step(self, x: Tensor, states: tuple[Tensor, ...], w: Weights) -> tuple[Tensor, ...]:
        """One step in plain differentiable ops (the loop a traced graph holds)."""
        return (gru_step(x, states[0], w, self.update, self.reset),)

    def prepare(self, w: Weights) -> _Prepared:
        H = w.weight_hh.shape[1]
        bias_hn = w.bias_hn if self.reset == "after" else None
        return _Prepared(w.weight_hh[: 2 * H].T, w.weight_hh[2 * H :].T, bias_hn)

    def project_inputs(self, x: Tensor, w: Weights, T: int, B: int) -> tuple[Tensor, ...]:
        H = w.weight_hh.shape[1]
        # r,z and n projections in separate contiguous buffers: the gates are computed in
        # place in them and kept as the cache.
        xp_rz = torch.addmm(w.bias[: 2 * H], x, w.weight_ih[: 2 * H].T).view(T, B, 2 * H)
        xp_n = torch.addmm(w.bias[2 * H :], x, w.weight_ih[2 * H :].T).view(T, B, H)
        return (xp_rz, xp_n)

    def input_weights_t(self, weight: Tensor) -> tuple[Tensor, ...]:
        H = weight.shape[0] // 3
        return (weight[: 2 * H].T, weight[2 * H :].T)

    def alloc_cache(
        self, T: int, B: int, H: int, xps: tuple[Tensor, ...], save: bool
    ) -> tuple[Tensor, ...]:
        rec = scratch(T, B, H, xps[0], save)
        return (xps[0], xps[1], rec)

    def step_into(
        self,
        xp: tuple[Tensor, ...],
        prev: tuple[Tensor, ...],
        out: tuple[Tensor, ...],
        cache: tuple[Tensor, ...],
        prep: Any,  # what this kernel's prepare returns
    ) -> None:
        (h_prev,) = prev
        rz, n, rec = cache  # rz, n are the projection buffers, overwritten in place
        H = h_prev.shape[1]
        rz.addmm_(h_prev, prep.weight_hh_t).sigmoid_()
        if self.reset == "after":
            torch.addmm(prep.bias_hn, h_prev, prep.weight_hn_t, out=rec)  # W_nh h + b_hn
            n.addcmul_(rz[:, :H], rec)  # W_nx x + b_n + r ⊙ (W_nh h + b_hn)
        else:
            torch.mul(rz[:, :H], h_prev, out=rec)  # r ⊙ h_{t-1}
            n.addmm_(rec, prep.weight_hn_t)
        n.tanh_()
        z = rz[:, H:]
        if self.update == "keep":
            torch.lerp(n, h_prev, z, out=out[0])  # n + z (h_prev − n)
        else:
            torch.lerp(h_prev, n, z, out=out[0])  # h_prev + z (n − h_prev)

    def prepare_backward(self, w: Weights) -> Weights:
        return w

    def backward_cache(
        self, cache: tuple[Tensor, ...], states: tuple[Tensor, ...]
    ) -> tuple[Tensor, ...]:
        rz, n, rec = cache
        d_rz = rz * (1 - rz)  # σ' for r and z, all steps at once
        d_n = 1 - n * n  # tanh'
        return (rz, n, rec, d_rz, d_n)

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
        rz, n, rec, d_rz, d_n = cache
        H = h_prev.shape[1]
        r, z = rz[:, :H], rz[:, H:]
        d_ar, d_az, d_an = d_xp[:, :H], d_xp[:, H : 2 * H], d_xp[:, 2 * H :]
        d_hz = d_h * z
        if self.update == "keep":
            torch.sub(h_prev, n, out=d_az)
            torch.sub(d_h, d_hz, out=d_an)  # d_h (1 − z)
            d_h_prev = d_hz
        else:
            torch.sub(n, h_prev, out=d_az)
            torch.mul(d_h, z, out=d_an)
            d_h_prev = d_h - d_hz
        d_az.mul_(d_h)
        d_an.mul_(d_n)
        W = w.weight_hh
        if self.reset == "after":
            torch.mul(d_an, rec, out=d_ar)  # d_r = d_an ⊙ (W_nh h + b_hn)
            d_xp[:, : 2 * H].mul_(d_rz)
            torch.mul(d_an, r, out=d_hp)  # the recurrent n-gradient (B, H)
            return (d_h_prev.addmm_(d_xp[:, : 2 * H], W[: 2 * H]).addmm_(d_hp, W[2 * H :]),)
        d_rh = d_an @ W[2 * H :]  # ∂L/∂(r ⊙ h_{t-1})
        torch.mul(d_rh, h_prev, out=d_ar)
        d_xp[:, : 2 * H].mul_(d_rz)
        d_h_prev.addcmul_(d_rh, r)
        return (d_h_prev.addmm_(d_xp[:, : 2 * H], W[: 2 * H]),)

    def recurrent_grads(
        self,
        d_xp: Tensor,
        d_hp: Tensor,
        h_prev: Tensor,
        cache: tuple[Tensor, ...],
        mm: Callable[[Tensor, Tensor], Tensor] = torch.mm,
    ) -> tuple[Tensor, Tensor | None]:
        H = h_prev.shape[1]
        if self.reset == "after":  # d_hp is the n block; r, z are d_xp's
            d_w = torch.cat([mm(d_xp[:, : 2 * H].T, h_prev), mm(d_hp.T, h_prev)], dim=0)
            return d_w, d_hp.sum(0)
        rec = cache[2]
        d_w = torch.cat([mm(d_hp[:, : 2 * H].T, h_prev), mm(d_hp[:, 2 * H :].T, rec)], dim=0)
        return d_w, None

    # The compiled loop (rnnkit.bptt.native) fills the same buffers as step_into/step_backward.
    def native_reads_rows(self, x: Tensor, w: Weights) -> bool:
        return False  # its input products run before the loop, over rows of (T·B, I)

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
        """``reg``: recurrent dropout's mask and zoneout's keep factor of h
        (``rnnkit.bptt.regularized``), each a contiguous tensor or None; None: none."""
        kw = {} if reg is None else dict(zip(("rec_mask", "keep_h"), reg, strict=True))
        H = w.weight_hh.shape[1]
        # x W_ih^T; the bias is added in the loop (addmm would first copy it to every row)
        if projected:  # the two blocks as the contiguous buffers the loop writes into
            xp_rz, xp_n = x[:, : 2 * H].contiguous(), x[:, 2 * H :].contiguous()
        else:
            xp_rz = input_product(x, w.weight_ih[: 2 * H])  # (T·B or N, 2H)
            xp_n = input_product(x, w.weight_ih[2 * H :])  # (T·B or N, H)
        if offsets is None:
            xp_rz, xp_n = xp_rz.view(T, B, 2 * H), xp_n.view(T, B, H)
        after = self.reset == "after"
        # reset="after" cells always have bias_hn (Weights types it optional for all cells)
        bias_hn = w.bias_hn.contiguous() if after else None  # type: ignore[union-attr]
        hs, rec = lib.gru_forward(
            xp_rz, xp_n, w.weight_hh.contiguous(), w.bias.contiguous(), bias_hn, states0[0],
            mask, save,
            self.update == "keep", after, offsets, **kw,
        )  # fmt: skip
        return (hs,), (xp_rz, xp_n, rec), None

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
        kw = {} if reg is None else dict(zip(("rec_mask", "keep_h"), reg, strict=True))
        rz, n, rec = (c.contiguous() for c in record.cache)
        h_states = record.states[0].contiguous()
        d_out = None if d_out is None else d_out.contiguous()
        d_xp, d_hp, d_h0 = lib.gru_backward(
            rz, n, rec, h_states, w.weight_hh.contiguous(), mask, d_out, d_states[0],
            self.update == "keep", self.reset == "after", offsets, **kw,
        )  # fmt: skip
        return d_xp, d_hp, (d_h0,), None, None


class GRUCell(CellBase):
    """GRU cell with independent ``update`` and ``reset`` switches.

    Args:
        input_size: ``I``.  hidden_size: ``H``.
        update: ``"candidate"`` (z is the candidate's share) or ``"keep"`` (z is the old
            state's share: PyTorch, the original GRU).
        reset: ``"before"`` (r multiplies h before ``W_nh``) or ``"after"`` (r multiplies
            ``W_nh h + b_hn``: cuDNN/PyTorch; adds the parameter ``bias_hn (H,)``).
        init: ``"uniform"`` or ``"orthogonal"`` recurrent blocks.

    Parameters: ``weight_ih (3H, I)``, ``weight_hh (3H, H)``, ``bias (3H,)`` —
    ``3H(I + H + 1)``, plus ``H`` for ``reset="after"``.

    >>> sum(p.numel() for p in GRUCell(4, 2).parameters())
    42
    >>> sum(p.numel() for p in GRUCell(4, 2, reset="after").parameters())
    44
    """

    gates = 3

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        update: str = "candidate",
        reset: str = "before",
        init: str = "uniform",
    ) -> None:
        if update not in UPDATES:
            raise ValueError(f"update must be one of {UPDATES}, got {update!r}")
        if reset not in RESETS:
            raise ValueError(f"reset must be one of {RESETS}, got {reset!r}")
        super().__init__(input_size, hidden_size, init)
        self.update = update
        self.reset = reset
        self.bias_hn = nn.Parameter(torch.empty(hidden_size)) if reset == "after" else None
        self.reset_parameters()

    @property
    def kernel(self) -> GRUKernel:
        return GRUKernel(self.update, self.reset)

    def weights(self) -> Weights:
        return Weights(self.weight_ih, self.weight_hh, self.bias, self.bias_hn)

    @cell_step_in_weights_dtype
    def forward(self, x: Tensor, state: Tensor | None = None) -> Tensor:
        """One step: ``x (B, I)``, ``state (B, H)`` or None (zeros) → ``h_t (B, H)``."""
        h_prev = check_cell_input(self, x, state)
        return gru_step(x, h_prev, self.weights(), self.update, self.reset)

    def extra_repr(self) -> str:
        return (
            f"{self.input_size}, {self.hidden_size}, update={self.update!r}, reset={self.reset!r}"
        )
