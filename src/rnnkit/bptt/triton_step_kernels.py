"""The Triton kernels of :mod:`rnnkit.bptt.gpu_step_lib`: one LSTM step's gate math in
one launch, for loops that stay in Python (the attention decoder's).

The compiled library's one-step operators (``lstm_step``, ``lstm_step_backward`` of
``src/rnnkit/csrc/loop.cpp``) with their exact semantics, on ``(B, ·)`` buffers of one
step instead of whole-sequence ones. Imported on first use only (``import rnnkit`` never
imports triton); under ``TRITON_INTERPRET=1`` (read when this module is imported) they
run on the CPU in Triton's interpreter. The gate helpers come from
:mod:`rnnkit.bptt.triton_kernels`, imported, like this module, after the interpreter is
switched on.

Program ``p`` takes elements ``p·BLOCK …`` of the ``B·H`` units (element ``e`` is row
``b = e // H``, unit ``j = e mod H``); each reads and writes only its own unit of the
four gate blocks (order i, f, g, o), so a buffer may be read and overwritten in place.
"""

from __future__ import annotations

import triton
import triton.language as tl

from rnnkit.bptt.triton_kernels import _sigmoid, _tanh

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
