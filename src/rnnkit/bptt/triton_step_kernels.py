"""The Triton kernels of :mod:`rnnkit.bptt.gpu_step_lib`: one step's gate math of an LSTM
or a GRU in one launch (a GRU with ``reset="before"``: two), for loops that stay in Python
(the attention decoder's), on ``(B, ·)`` buffers of one step instead of whole-sequence
ones.

The LSTM's are the compiled library's one-step operators (``lstm_step``,
``lstm_step_backward`` of ``src/rnnkit/csrc/loop.cpp``) with their exact semantics; the
GRU's fill the buffers of :class:`rnnkit.cells.gru.GRUKernel`'s step (``rz``, ``n``,
``rec``; ``d_xp`` in the order r, z, n). Imported on first use only (``import rnnkit`` never
imports triton); under ``TRITON_INTERPRET=1`` (read when this module is imported) they
run on the CPU in Triton's interpreter. The gate helpers (σ, tanh, the GRU's mix) come from
:mod:`rnnkit.bptt.triton_kernels`, imported, like this module, after the interpreter is
switched on.

Program ``p`` takes elements ``p·BLOCK …`` of the ``B·H`` units (element ``e`` is row
``b = e // H``, unit ``j = e mod H``); each reads and writes only its own unit of the
gate blocks (the LSTM's order i, f, g, o; the GRU's r, z, n), so a buffer may be read and
overwritten in place.
"""

from __future__ import annotations

import triton
import triton.language as tl

from rnnkit.bptt.triton_kernels import _mix, _sigmoid, _tanh

# Triton kernels take pointers and integers; annotations would change their signatures.


@triton.jit
def lstm_step(xp, rec, bias, c_prev, h, c, tanh_c, B, H, BLOCK: tl.constexpr):
    """``a = (xp + bias) + rec`` (``(B, 4H)``: the input product, the bias ``(4H,)``, the
    recurrent product ``h_{t-1} W_hhᵀ``); ``i, f, o = σ(a)``, ``g = tanh(a)`` into ``xp``;
    ``c = f c_prev + i g``, ``tanh_c = tanh(c)``, ``h = o tanh_c`` (each ``(B, H)``)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < B * H
    b = (offs // H).to(tl.int64)
    j = offs - b * H
    g_at = xp + b * 4 * H + j
    r_at = rec + b * 4 * H + j
    # the compiled step's order: (input product + bias) + recurrent product
    ai = tl.load(g_at, mask=ok, other=0.0) + tl.load(bias + j, mask=ok, other=0.0)
    af = tl.load(g_at + H, mask=ok, other=0.0) + tl.load(bias + H + j, mask=ok, other=0.0)
    ag = tl.load(g_at + 2 * H, mask=ok, other=0.0) + tl.load(bias + 2 * H + j, mask=ok, other=0.0)
    ao = tl.load(g_at + 3 * H, mask=ok, other=0.0) + tl.load(bias + 3 * H + j, mask=ok, other=0.0)
    i = _sigmoid(ai + tl.load(r_at, mask=ok, other=0.0))
    f = _sigmoid(af + tl.load(r_at + H, mask=ok, other=0.0))
    g = _tanh(ag + tl.load(r_at + 2 * H, mask=ok, other=0.0))
    o = _sigmoid(ao + tl.load(r_at + 3 * H, mask=ok, other=0.0))
    cn = f * tl.load(c_prev + offs, mask=ok, other=0.0) + i * g
    tc = _tanh(cn)
    tl.store(g_at, i, mask=ok)
    tl.store(g_at + H, f, mask=ok)
    tl.store(g_at + 2 * H, g, mask=ok)
    tl.store(g_at + 3 * H, o, mask=ok)
    tl.store(c + offs, cn, mask=ok)
    tl.store(tanh_c + offs, tc, mask=ok)
    tl.store(h + offs, o * tc, mask=ok)


@triton.jit
def lstm_step_backward(
    gates, tanh_c, c_prev, d_h, d_c, d_gates, d_out, B, H,
    HAS_DOUT: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """From ``lstm_step``'s activated ``gates`` and ``tanh_c``, ``c_prev`` and the
    gradients ``d_h`` (plus ``d_out`` under HAS_DOUT), ``d_c`` of ``h_t``, ``c_t``: the
    pre-activations' gradient into ``d_gates``; ``d_c`` becomes ∂L/∂c_{t-1}, ``d_h`` zero
    (its recurrent part, ``d_gates W_hh``, is the caller's product)::

        d_ct = d_c + d_h o (1 − tanh_c²)
        d_i = d_ct g i(1 − i)   d_f = d_ct c_prev f(1 − f)   d_g = d_ct i (1 − g²)
        d_o = d_h tanh_c o(1 − o)                            d_c ← d_ct f
    """
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < B * H
    b = (offs // H).to(tl.int64)
    j = offs - b * H
    g_at = gates + b * 4 * H + j
    i = tl.load(g_at, mask=ok, other=0.0)
    f = tl.load(g_at + H, mask=ok, other=0.0)
    g = tl.load(g_at + 2 * H, mask=ok, other=0.0)
    o = tl.load(g_at + 3 * H, mask=ok, other=0.0)
    tc = tl.load(tanh_c + offs, mask=ok, other=0.0)
    dh = tl.load(d_h + offs, mask=ok, other=0.0)
    if HAS_DOUT:
        dh += tl.load(d_out + offs, mask=ok, other=0.0)
    dct = tl.load(d_c + offs, mask=ok, other=0.0) + dh * o * (1.0 - tc * tc)
    d_at = d_gates + b * 4 * H + j
    tl.store(d_at, dct * g * (i * (1.0 - i)), mask=ok)
    cp = tl.load(c_prev + offs, mask=ok, other=0.0)
    tl.store(d_at + H, dct * cp * (f * (1.0 - f)), mask=ok)
    tl.store(d_at + 2 * H, dct * i * (1.0 - g * g), mask=ok)
    tl.store(d_at + 3 * H, dh * tc * (o * (1.0 - o)), mask=ok)
    tl.store(d_c + offs, dct * f, mask=ok)
    tl.store(d_h + offs, tl.full(dh.shape, 0.0, dh.dtype), mask=ok)


@triton.jit
def gru_after_step(rz, n, rec3, bias_hn, h_prev, h, rec, B, H, KEEP: tl.constexpr,
                   BLOCK: tl.constexpr):  # fmt: skip
    """A GRU step with ``reset="after"``: ``rz (B, 2H)`` and ``n (B, H)`` the input
    pre-activations (bias included), ``rec3 (B, 3H)`` the recurrent product
    ``h_{t-1} W_hhᵀ``; ``r, z = σ(rz + rec3[:2H])`` into ``rz``,
    ``rec = rec3[2H:] + b_hn``, ``n = tanh(n + r ⊙ rec)`` into ``n``, the new state into
    ``h``."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < B * H
    b = (offs // H).to(tl.int64)
    j = offs - b * H
    g_at = rz + b * 2 * H + j
    r_at = rec3 + b * 3 * H + j
    r = _sigmoid(tl.load(g_at, mask=ok, other=0.0) + tl.load(r_at, mask=ok, other=0.0))
    z = _sigmoid(tl.load(g_at + H, mask=ok, other=0.0) + tl.load(r_at + H, mask=ok, other=0.0))
    q = tl.load(r_at + 2 * H, mask=ok, other=0.0) + tl.load(bias_hn + j, mask=ok, other=0.0)
    c = _tanh(tl.load(n + offs, mask=ok, other=0.0) + r * q)
    hp = tl.load(h_prev + offs, mask=ok, other=0.0)
    tl.store(g_at, r, mask=ok)
    tl.store(g_at + H, z, mask=ok)
    tl.store(rec + offs, q, mask=ok)
    tl.store(n + offs, c, mask=ok)
    tl.store(h + offs, _mix(c, hp, z, KEEP), mask=ok)


@triton.jit
def gru_before_gates(rz, rec2, h_prev, rec, B, H, BLOCK: tl.constexpr):
    """The gates of a GRU step with ``reset="before"``: ``r, z = σ(rz + rec2)`` into
    ``rz (B, 2H)`` (``rec2`` the product ``h_{t-1} W_rzᵀ``), ``rec = r ⊙ h_{t-1}`` (the
    operand of the candidate's product)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < B * H
    b = (offs // H).to(tl.int64)
    j = offs - b * H
    g_at = rz + b * 2 * H + j
    r_at = rec2 + b * 2 * H + j
    r = _sigmoid(tl.load(g_at, mask=ok, other=0.0) + tl.load(r_at, mask=ok, other=0.0))
    z = _sigmoid(tl.load(g_at + H, mask=ok, other=0.0) + tl.load(r_at + H, mask=ok, other=0.0))
    tl.store(g_at, r, mask=ok)
    tl.store(g_at + H, z, mask=ok)
    tl.store(rec + offs, r * tl.load(h_prev + offs, mask=ok, other=0.0), mask=ok)


@triton.jit
def gru_before_state(rz, n, h_prev, h, B, H, KEEP: tl.constexpr, BLOCK: tl.constexpr):
    """The state of a GRU step with ``reset="before"``: ``n`` holds the candidate's whole
    pre-activation; ``n = tanh(n)`` in place, the new state into ``h``."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < B * H
    b = (offs // H).to(tl.int64)
    j = offs - b * H
    z = tl.load(rz + b * 2 * H + H + j, mask=ok, other=0.0)
    c = _tanh(tl.load(n + offs, mask=ok, other=0.0))
    tl.store(n + offs, c, mask=ok)
    tl.store(h + offs, _mix(c, tl.load(h_prev + offs, mask=ok, other=0.0), z, KEEP), mask=ok)


@triton.jit
def gru_step_backward(
    rz, n, rec, h_prev, d_h, d_xp, d_hp, d_prev, B, H,
    KEEP: tl.constexpr, AFTER: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """The backward of a GRU step's update and candidate (the cache ``rz``, ``n``, ``rec``
    of the forward; ``d_h`` ∂L/∂h_t): ``d_xp (B, 3H)`` receives ∂L/∂ of the z
    pre-activation and of the candidate's (``d_an``); ``reset="after"`` (AFTER) the r
    block ``d_an ⊙ rec ⊙ r(1 − r)`` too and ``d_hp = d_an ⊙ r``; ``d_prev`` the direct
    part of ∂L/∂h_{t-1} (``d_h z``, or ``d_h (1 − z)``)::

        KEEP:  d_az = d_h (h_{t-1} − n) z(1 − z)   d_an = (d_h − d_h z)(1 − n²)
        else:  d_az = d_h (n − h_{t-1}) z(1 − z)   d_an = d_h z (1 − n²)
    """
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < B * H
    b = (offs // H).to(tl.int64)
    j = offs - b * H
    z = tl.load(rz + b * 2 * H + H + j, mask=ok, other=0.0)
    c = tl.load(n + offs, mask=ok, other=0.0)
    hp = tl.load(h_prev + offs, mask=ok, other=0.0)
    dh = tl.load(d_h + offs, mask=ok, other=0.0)
    d_hz = dh * z
    if KEEP:
        d_az = (hp - c) * dh
        d_an = (dh - d_hz) * (1.0 - c * c)
        dp = d_hz
    else:
        d_az = (c - hp) * dh
        d_an = d_hz * (1.0 - c * c)
        dp = dh - d_hz
    d_at = d_xp + b * 3 * H + j
    tl.store(d_at + H, d_az * (z * (1.0 - z)), mask=ok)
    tl.store(d_at + 2 * H, d_an, mask=ok)
    if AFTER:
        r = tl.load(rz + b * 2 * H + j, mask=ok, other=0.0)
        d_ar = d_an * tl.load(rec + offs, mask=ok, other=0.0)
        tl.store(d_at, d_ar * (r * (1.0 - r)), mask=ok)
        tl.store(d_hp + offs, d_an * r, mask=ok)
    tl.store(d_prev + offs, dp, mask=ok)


@triton.jit
def gru_before_backward(rz, h_prev, d_rh, d_xp, d_prev, B, H, BLOCK: tl.constexpr):
    """The reset gate's part of a ``reset="before"`` step's backward, ``d_rh`` =
    ∂L/∂(r ⊙ h_{t-1}): ``d_ar = d_rh h_{t-1} r(1 − r)`` into ``d_xp``'s r block,
    ``d_prev += d_rh r``."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < B * H
    b = (offs // H).to(tl.int64)
    j = offs - b * H
    r = tl.load(rz + b * 2 * H + j, mask=ok, other=0.0)
    drh = tl.load(d_rh + offs, mask=ok, other=0.0)
    d_ar = drh * tl.load(h_prev + offs, mask=ok, other=0.0)
    tl.store(d_xp + b * 3 * H + j, d_ar * (r * (1.0 - r)), mask=ok)
    tl.store(d_prev + offs, tl.load(d_prev + offs, mask=ok, other=0.0) + drh * r, mask=ok)
