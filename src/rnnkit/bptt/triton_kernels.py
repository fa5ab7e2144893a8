"""The Triton kernels of :mod:`rnnkit.bptt.gpu_steps`: one step's gate math in one launch.

Imported by ``gpu_steps`` on first use only (``import rnnkit`` never imports triton).
Under ``TRITON_INTERPRET=1`` (read when this module is imported) they run on the CPU in
Triton's interpreter: how the tests hold them to the library's explicit BPTT.

Every kernel runs over the ``B·H`` elements of one step (the step index ``t`` a runtime
argument, not specialised, so one compilation serves every step) (program ``p`` takes elements
``p·BLOCK …``; element ``e`` is row ``b = e // H``, unit ``j = e mod H``). Buffers are
contiguous and time-major: ``xp (T, B, G·H)`` the input pre-activations (bias included),
overwritten in place by the activated gates (the backward's cache); ``hs``/``cs``
``(T + 1, B, H)`` the states (index 0 the initial one); ``hw (B, G'·H)`` this step's
recurrent product ``h_{t-1} W_hhᵀ`` of the state as it lay, before any reset.

* ``mask (T, B)`` int8: 0 at a padded step, where the state is held (``h_t = h_{t-1}``,
  ``c`` too) and the step's gradients are zero, its incoming gradient passing through.
* ``reset (T + 1, B)`` int8: 1 where the state entering step t is zero. The forward zeroes
  ``h_{t-1}``, ``c_{t-1}`` and the rows of ``hw`` (``0 · W = 0``); the backward of step t
  zeroes the gradient that step t + 1 passed back through a reset (row ``t + 1``; the last
  row is all 0).

Recurrent dropout and zoneout (:mod:`rnnkit.bptt.regularized`), each a constexpr switch:

* ``RMASK``: ``rm (B, H)`` the recurrent mask ``m``; ``hw`` is then ``(h_{t-1} ⊙ m) W_hhᵀ``,
  which the forward launch prepares by writing ``h_t ⊙ m`` into ``hm (B, H)`` for the next
  step's product. The backward's ``d_h`` is then the product's part
  ``∂L/∂(h_t ⊙ m)``, and ``direct`` the rest (read and rewritten by the launch):
  ``∂L/∂h_t = d_h ⊙ m + direct``. The GRU's update reads the unmasked ``h_{t-1}``.
* ``ZH``/``ZC``: zoneout's keep factors ``kh``/``kc (T, B, H)`` of h and c,
  ``h_t = h̃_t + d_t (h_{t-1} − h̃_t)``; where the backward needs the cell's own new state
  (the LSTM's ``c̃_t``, the simple cell's ``h̃_t``) the forward keeps it in ``cn (T, B, H)``.
  The keep factors are read as strided views: element ``(t, b, j)`` at
  ``t·kt + b·kb + j`` (``kt``, ``kb`` shared by ``kh`` and ``kc``), a stride 0 along an
  axis where the factor is constant — at evaluation the constant ``p`` is one stored row
  of ``H`` values, ``kt = kb = 0``, and no ``(T, B, H)`` tensor is written out.

Nonlinearities in exact forms (float64 to the last bits): ``σ(a) = 1 / (1 + e^{−a})``,
``tanh(a) = sign(a) (1 − e^{−2|a|}) / (1 + e^{−2|a|})``.
"""

from __future__ import annotations

import triton
import triton.language as tl

# Triton kernels take pointers and integers; annotations would change their signatures.


@triton.jit
def _sigmoid(a):
    return 1.0 / (1.0 + tl.exp(-a))


@triton.jit
def _tanh(a):
    e = tl.exp(-2.0 * tl.abs(a))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(a < 0, -t, t)


@triton.jit
def _flags(mask, reset, t, B, b, ok, HAS_MASK: tl.constexpr, HAS_RESET: tl.constexpr):
    """(real step, state entering the step zeroed) of each element's row."""
    real = b >= 0
    zero = b < 0
    if HAS_MASK:
        real = tl.load(mask + t * B + b, mask=ok, other=1) != 0
    if HAS_RESET:
        zero = tl.load(reset + t * B + b, mask=ok, other=0) != 0
    return real, zero


@triton.jit
def _carried(d_h, direct, rm, offs, ok, RMASK: tl.constexpr):
    """∂L/∂h_t as step t + 1 passed it back: ``d_h``, or ``d_h ⊙ m + direct`` (RMASK)."""
    d = tl.load(d_h + offs, mask=ok, other=0.0)
    if RMASK:
        d = d * tl.load(rm + offs, mask=ok, other=0.0) + tl.load(direct + offs, mask=ok, other=0.0)
    return d


@triton.jit
def _zone(new, prev, keep, at, ok, Z: tl.constexpr):
    """Zoneout's mix ``new + d (prev − new)`` (Z), else ``new``."""
    if Z:
        new += tl.load(keep + at, mask=ok, other=0.0) * (prev - new)
    return new


@triton.jit
def _split(d, keep, at, ok, Z: tl.constexpr):
    """Zoneout's backward of a state's gradient ``d``: ``(d (1 − d_t), d d_t)``, the
    cell's step's share and the previous state's (Z), else ``(d, 0)``."""
    kept = tl.full(d.shape, 0.0, d.dtype)
    if Z:
        k = tl.load(keep + at, mask=ok, other=0.0)
        kept = d * k
        d = d * (1.0 - k)
    return d, kept


@triton.jit
def _mix(n, hp, z, KEEP: tl.constexpr):
    """The GRU's new state: ``n + z (h_{t-1} − n)`` (KEEP) or ``h_{t-1} + z (n − h_{t-1})``."""
    return n + z * (hp - n) if KEEP else hp + z * (n - hp)


@triton.jit
def _store_state(hs, hm, rm, at, offs, ok, real, h, hp, RMASK: tl.constexpr):
    """``h_t`` (held at a padded step) into ``hs``, and ``h_t ⊙ m`` into ``hm`` (RMASK)."""
    h = tl.where(real, h, hp)
    tl.store(hs + at, h, mask=ok)
    if RMASK:
        tl.store(hm + offs, h * tl.load(rm + offs, mask=ok, other=0.0), mask=ok)


@triton.jit
def _incoming(d, reset, t, B, b, ok, d_out, at, HAS_RESET: tl.constexpr, HAS_DOUT: tl.constexpr):
    """The gradient of the state after step t: what step t + 1 passed back (zero through
    a reset at t + 1) plus that of the output t."""
    if HAS_RESET:
        d = tl.where(tl.load(reset + (t + 1) * B + b, mask=ok, other=0) != 0, 0.0, d)
    if HAS_DOUT:
        d += tl.load(d_out + at, mask=ok, other=0.0)
    return d


@triton.jit(do_not_specialize=["t"])
def lstm_forward(
    xp, hw, hs, cs, mask, reset, t, B, H, rm, hm, kh, kc, kt, kb, cn,
    HAS_MASK: tl.constexpr, HAS_RESET: tl.constexpr, RMASK: tl.constexpr,
    ZH: tl.constexpr, ZC: tl.constexpr, CN: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """``c_t = f c_{t-1} + i g``, ``h_t = o tanh(c_t)``; the gates i, f, g, o into ``xp[t]``
    (zoneout: ``h̃ = o tanh(c̃)`` of the cell's own ``c̃``, kept in ``cn[t]`` under ZC
    where a backward will read it, CN)."""
    t = t.to(tl.int64)  # offsets of T·B·G·H elements may pass 2³¹
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < B * H
    b = offs // H
    j = offs - b * H
    real, zero = _flags(mask, reset, t, B, b, ok, HAS_MASK, HAS_RESET)
    g_at = xp + (t * B + b) * 4 * H + j
    r_at = hw + b * 4 * H + j
    s_at = t * B * H + offs
    k_at = t * kt + b * kb + j
    hp = tl.where(zero, 0.0, tl.load(hs + s_at, mask=ok, other=0.0))
    cp = tl.where(zero, 0.0, tl.load(cs + s_at, mask=ok, other=0.0))
    ai = tl.load(g_at, mask=ok, other=0.0) + tl.where(zero, 0.0, tl.load(r_at, mask=ok, other=0.0))
    af = tl.load(g_at + H, mask=ok, other=0.0)
    af += tl.where(zero, 0.0, tl.load(r_at + H, mask=ok, other=0.0))
    ag = tl.load(g_at + 2 * H, mask=ok, other=0.0)
    ag += tl.where(zero, 0.0, tl.load(r_at + 2 * H, mask=ok, other=0.0))
    ao = tl.load(g_at + 3 * H, mask=ok, other=0.0)
    ao += tl.where(zero, 0.0, tl.load(r_at + 3 * H, mask=ok, other=0.0))
    i = _sigmoid(ai)
    f = _sigmoid(af)
    g = _tanh(ag)
    o = _sigmoid(ao)
    c = f * cp + i * g
    h = _zone(o * _tanh(c), hp, kh, k_at, ok, ZH)
    if ZC and CN:
        tl.store(cn + s_at, c, mask=ok)
    c = _zone(c, cp, kc, k_at, ok, ZC)
    tl.store(g_at, i, mask=ok)
    tl.store(g_at + H, f, mask=ok)
    tl.store(g_at + 2 * H, g, mask=ok)
    tl.store(g_at + 3 * H, o, mask=ok)
    _store_state(hs, hm, rm, s_at + B * H, offs, ok, real, h, hp, RMASK)
    tl.store(cs + s_at + B * H, tl.where(real, c, cp), mask=ok)


@triton.jit(do_not_specialize=["t"])
def lstm_backward(
    gates, cs, mask, reset, d_h, d_c, d_out, d_xp, direct, t, B, H, rm, kh, kc, kt, kb, cn,
    HAS_MASK: tl.constexpr, HAS_RESET: tl.constexpr, HAS_DOUT: tl.constexpr,
    RMASK: tl.constexpr, ZH: tl.constexpr, ZC: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """∂L/∂ of step t's four pre-activations into ``d_xp[t]``; ``d_c`` becomes ∂L/∂c_{t-1}
    (in place); ``direct`` the part of ∂L/∂h_{t-1} outside ``d_xp[t] W_hh`` (the
    gradient passed through a held step)."""
    t = t.to(tl.int64)  # offsets of T·B·G·H elements may pass 2³¹
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < B * H
    b = offs // H
    j = offs - b * H
    real, zero = _flags(mask, reset, t, B, b, ok, HAS_MASK, HAS_RESET)
    s_at = t * B * H + offs
    k_at = t * kt + b * kb + j
    dh = _incoming(_carried(d_h, direct, rm, offs, ok, RMASK), reset, t, B, b, ok, d_out,
                   s_at, HAS_RESET, HAS_DOUT)  # fmt: skip
    dc = _incoming(tl.load(d_c + offs, mask=ok, other=0.0), reset, t, B, b, ok, d_out,
                   offs, HAS_RESET, False)  # fmt: skip
    # zoneout: the cell's step gets (1 − d) of each gradient, h_{t-1} (c_{t-1}) the rest
    dh_cell, dh_keep = _split(dh, kh, k_at, ok, ZH)
    dc_cell, dc_keep = _split(dc, kc, k_at, ok, ZC)
    g_at = gates + (t * B + b) * 4 * H + j
    i = tl.load(g_at, mask=ok, other=0.0)
    f = tl.load(g_at + H, mask=ok, other=0.0)
    g = tl.load(g_at + 2 * H, mask=ok, other=0.0)
    o = tl.load(g_at + 3 * H, mask=ok, other=0.0)
    cp = tl.where(zero, 0.0, tl.load(cs + s_at, mask=ok, other=0.0))
    if ZC:
        tc = _tanh(tl.load(cn + s_at, mask=ok, other=0.0))
    else:
        tc = _tanh(tl.load(cs + s_at + B * H, mask=ok, other=0.0))
    dct = dc_cell + dh_cell * o * (1.0 - tc * tc)
    di = tl.where(real, dct * g * i * (1.0 - i), 0.0)
    df = tl.where(real, dct * cp * f * (1.0 - f), 0.0)
    dg = tl.where(real, dct * i * (1.0 - g * g), 0.0)
    do = tl.where(real, dh_cell * tc * o * (1.0 - o), 0.0)
    d_at = d_xp + (t * B + b) * 4 * H + j
    tl.store(d_at, di, mask=ok)
    tl.store(d_at + H, df, mask=ok)
    tl.store(d_at + 2 * H, dg, mask=ok)
    tl.store(d_at + 3 * H, do, mask=ok)
    tl.store(d_c + offs, tl.where(real, dct * f + dc_keep, dc), mask=ok)
    tl.store(direct + offs, tl.where(real, dh_keep, dh), mask=ok)


@triton.jit(do_not_specialize=["t"])
def rnn_forward(
    xp, hw, hs, mask, reset, t, B, H, rm, hm, kh, kt, kb, cn,
    ACT: tl.constexpr, HAS_MASK: tl.constexpr, HAS_RESET: tl.constexpr,
    RMASK: tl.constexpr, ZH: tl.constexpr, CN: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """``h_t = φ(a_t)``, ``a_t = xp[t] + h_{t-1} W_hhᵀ``; φ: 0 tanh, 1 relu, 2 sigmoid
    (zoneout: ``h̃_t = φ(a_t)`` kept in ``cn[t]`` where a backward will read it, CN)."""
    t = t.to(tl.int64)  # offsets of T·B·G·H elements may pass 2³¹
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < B * H
    b = offs // H
    real, zero = _flags(mask, reset, t, B, b, ok, HAS_MASK, HAS_RESET)
    s_at = t * B * H + offs
    j = offs - b * H
    k_at = t * kt + b * kb + j
    hp = tl.where(zero, 0.0, tl.load(hs + s_at, mask=ok, other=0.0))
    a = tl.load(xp + s_at, mask=ok, other=0.0)
    a += tl.where(zero, 0.0, tl.load(hw + offs, mask=ok, other=0.0))
    if ACT == 0:
        h = _tanh(a)
    elif ACT == 1:
        h = tl.where(a > 0, a, 0.0)
    else:
        h = _sigmoid(a)
    if ZH and CN:
        tl.store(cn + s_at, h, mask=ok)
    h = _zone(h, hp, kh, k_at, ok, ZH)
    _store_state(hs, hm, rm, s_at + B * H, offs, ok, real, h, hp, RMASK)


@triton.jit(do_not_specialize=["t"])
def rnn_backward(
    hs, mask, reset, d_h, d_out, d_xp, direct, t, B, H, rm, kh, kt, kb, cn,
    ACT: tl.constexpr, HAS_MASK: tl.constexpr, HAS_RESET: tl.constexpr,
    HAS_DOUT: tl.constexpr, RMASK: tl.constexpr, ZH: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """``d_a = φ'(a_t) ⊙ d_h`` into ``d_xp[t]`` (φ' from ``h_t``, ``h̃_t`` under ZH)."""
    t = t.to(tl.int64)  # offsets of T·B·G·H elements may pass 2³¹
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < B * H
    b = offs // H
    real, _zero = _flags(mask, reset, t, B, b, ok, HAS_MASK, HAS_RESET)
    s_at = t * B * H + offs
    j = offs - b * H
    k_at = t * kt + b * kb + j
    dh = _incoming(_carried(d_h, direct, rm, offs, ok, RMASK), reset, t, B, b, ok, d_out,
                   s_at, HAS_RESET, HAS_DOUT)  # fmt: skip
    d_cell, d_keep = _split(dh, kh, k_at, ok, ZH)
    if ZH:
        h = tl.load(cn + s_at, mask=ok, other=0.0)
    else:
        h = tl.load(hs + s_at + B * H, mask=ok, other=0.0)
    if ACT == 0:
        da = d_cell * (1.0 - h * h)
    elif ACT == 1:
        da = tl.where(h > 0, d_cell, 0.0)
    else:
        da = d_cell * h * (1.0 - h)
    tl.store(d_xp + s_at, tl.where(real, da, 0.0), mask=ok)
    tl.store(direct + offs, tl.where(real, d_keep, dh), mask=ok)


@triton.jit(do_not_specialize=["t", "tc"])
def gru_after_forward(
    xp, hw, bias_hn, hs, rec, mask, reset, t, tc, B, H, rm, hm, kh, kt, kb,
    KEEP: tl.constexpr, HAS_MASK: tl.constexpr, HAS_RESET: tl.constexpr,
    RMASK: tl.constexpr, ZH: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """``n = tanh(a_n + r ⊙ (W_nh h_{t-1} + b_hn))``; r, z, n into ``xp[t]``, the
    bracket into ``rec[tc]``."""
    t = t.to(tl.int64)  # offsets of T·B·G·H elements may pass 2³¹
    tc = tc.to(tl.int64)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < B * H
    b = offs // H
    j = offs - b * H
    real, zero = _flags(mask, reset, t, B, b, ok, HAS_MASK, HAS_RESET)
    g_at = xp + (t * B + b) * 3 * H + j
    r_at = hw + b * 3 * H + j
    s_at = t * B * H + offs
    k_at = t * kt + b * kb + j
    hp = tl.where(zero, 0.0, tl.load(hs + s_at, mask=ok, other=0.0))
    ar = tl.load(g_at, mask=ok, other=0.0) + tl.where(zero, 0.0, tl.load(r_at, mask=ok, other=0.0))
    az = tl.load(g_at + H, mask=ok, other=0.0)
    az += tl.where(zero, 0.0, tl.load(r_at + H, mask=ok, other=0.0))
    bracket = tl.where(zero, 0.0, tl.load(r_at + 2 * H, mask=ok, other=0.0))
    bracket += tl.load(bias_hn + j, mask=ok, other=0.0)
    r = _sigmoid(ar)
    z = _sigmoid(az)
    n = _tanh(tl.load(g_at + 2 * H, mask=ok, other=0.0) + r * bracket)
    h = _mix(n, hp, z, KEEP)
    h = _zone(h, hp, kh, k_at, ok, ZH)
    tl.store(g_at, r, mask=ok)
    tl.store(g_at + H, z, mask=ok)
    tl.store(g_at + 2 * H, n, mask=ok)
    tl.store(rec + tc * B * H + offs, bracket, mask=ok)
    _store_state(hs, hm, rm, s_at + B * H, offs, ok, real, h, hp, RMASK)


@triton.jit(do_not_specialize=["t", "tc"])
def gru_before_gates(
    xp, hw, hs, rec, reset, t, tc, B, H, rm,
    HAS_RESET: tl.constexpr, RMASK: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """reset="before", first half: r, z into ``xp[t]``, ``r ⊙ h_{t-1}`` into ``rec[tc]``
    (``hw (B, 2H)`` is ``h_{t-1} W_rzᵀ``; RMASK: ``h_{t-1} ⊙ m`` in both)."""
    t = t.to(tl.int64)  # offsets of T·B·G·H elements may pass 2³¹
    tc = tc.to(tl.int64)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < B * H
    b = offs // H
    j = offs - b * H
    _real, zero = _flags(reset, reset, t, B, b, ok, False, HAS_RESET)
    g_at = xp + (t * B + b) * 3 * H + j
    r_at = hw + b * 2 * H + j
    hp = tl.where(zero, 0.0, tl.load(hs + t * B * H + offs, mask=ok, other=0.0))
    if RMASK:
        hp *= tl.load(rm + offs, mask=ok, other=0.0)
    ar = tl.load(g_at, mask=ok, other=0.0) + tl.where(zero, 0.0, tl.load(r_at, mask=ok, other=0.0))
    az = tl.load(g_at + H, mask=ok, other=0.0)
    az += tl.where(zero, 0.0, tl.load(r_at + H, mask=ok, other=0.0))
    r = _sigmoid(ar)
    tl.store(g_at, r, mask=ok)
    tl.store(g_at + H, _sigmoid(az), mask=ok)
    tl.store(rec + tc * B * H + offs, r * hp, mask=ok)


@triton.jit(do_not_specialize=["t"])
def gru_before_state(
    xp, hn, hs, mask, reset, t, B, H, rm, hm, kh, kt, kb,
    KEEP: tl.constexpr, HAS_MASK: tl.constexpr, HAS_RESET: tl.constexpr,
    RMASK: tl.constexpr, ZH: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """reset="before", second half: ``n = tanh(a_n + hn)`` (``hn = (r ⊙ h_{t-1}) W_nhᵀ``)
    into ``xp[t]``, and the new state."""
    t = t.to(tl.int64)  # offsets of T·B·G·H elements may pass 2³¹
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < B * H
    b = offs // H
    j = offs - b * H
    real, zero = _flags(mask, reset, t, B, b, ok, HAS_MASK, HAS_RESET)
    g_at = xp + (t * B + b) * 3 * H + j
    s_at = t * B * H + offs
    k_at = t * kt + b * kb + j
    hp = tl.where(zero, 0.0, tl.load(hs + s_at, mask=ok, other=0.0))
    z = tl.load(g_at + H, mask=ok, other=0.0)
    n = _tanh(tl.load(g_at + 2 * H, mask=ok, other=0.0) + tl.load(hn + offs, mask=ok, other=0.0))
    h = _mix(n, hp, z, KEEP)
    h = _zone(h, hp, kh, k_at, ok, ZH)
    tl.store(g_at + 2 * H, n, mask=ok)
    _store_state(hs, hm, rm, s_at + B * H, offs, ok, real, h, hp, RMASK)


@triton.jit(do_not_specialize=["t"])
def gru_update_backward(
    gates, rec, hs, mask, reset, d_h, d_out, d_xp, d_rec, direct, t, B, H, rm, kh, kt, kb,
    KEEP: tl.constexpr, AFTER: tl.constexpr, HAS_MASK: tl.constexpr,
    HAS_RESET: tl.constexpr, HAS_DOUT: tl.constexpr, RMASK: tl.constexpr,
    ZH: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """The z and n pre-activation gradients into ``d_xp[t]``, the update's direct part of
    ∂L/∂h_{t-1} into ``direct``. ``AFTER`` (reset="after"): the whole step, also
    ``d_r = d_an ⊙ rec ⊙ σ'`` into ``d_xp[t]`` and the recurrent gradients
    ``[d_ar, d_az, d_an ⊙ r]`` into ``d_rec[t]`` (the n block is ∂L/∂(W_nh h_{t-1} + b_hn));
    reset="before" finishes in ``gru_before_backward``."""
    t = t.to(tl.int64)  # offsets of T·B·G·H elements may pass 2³¹
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < B * H
    b = offs // H
    j = offs - b * H
    real, zero = _flags(mask, reset, t, B, b, ok, HAS_MASK, HAS_RESET)
    s_at = t * B * H + offs
    k_at = t * kt + b * kb + j
    d_in = _incoming(_carried(d_h, direct, rm, offs, ok, RMASK), reset, t, B, b, ok, d_out,
                     s_at, HAS_RESET, HAS_DOUT)  # fmt: skip
    dh, d_keep = _split(d_in, kh, k_at, ok, ZH)  # the update reads the unmasked h_{t-1}
    hp = tl.where(zero, 0.0, tl.load(hs + s_at, mask=ok, other=0.0))
    g_at = gates + (t * B + b) * 3 * H + j
    z = tl.load(g_at + H, mask=ok, other=0.0)
    n = tl.load(g_at + 2 * H, mask=ok, other=0.0)
    if KEEP:  # h = z h_{t-1} + (1 − z) n
        dz = dh * (hp - n)
        dn = dh * (1.0 - z)
        keep = dh * z
    else:  # h = (1 − z) h_{t-1} + z n
        dz = dh * (n - hp)
        dn = dh * z
        keep = dh * (1.0 - z)
    daz = tl.where(real, dz * z * (1.0 - z), 0.0)
    dan = tl.where(real, dn * (1.0 - n * n), 0.0)
    d_at = d_xp + (t * B + b) * 3 * H + j
    tl.store(d_at + H, daz, mask=ok)
    tl.store(d_at + 2 * H, dan, mask=ok)
    tl.store(direct + offs, tl.where(real, keep + d_keep, d_in), mask=ok)
    if AFTER:  # masked rows have d_an = 0: all zero
        r = tl.load(g_at, mask=ok, other=0.0)
        dar = dan * tl.load(rec + s_at, mask=ok, other=0.0) * r * (1.0 - r)
        q_at = d_rec + (t * B + b) * 3 * H + j
        tl.store(d_at, dar, mask=ok)
        tl.store(q_at, dar, mask=ok)
        tl.store(q_at + H, daz, mask=ok)
        tl.store(q_at + 2 * H, dan * r, mask=ok)


@triton.jit(do_not_specialize=["t"])
def gru_before_backward(
    gates, hs, reset, d_rh, d_xp, direct, t, B, H, rm, d_hm,
    HAS_RESET: tl.constexpr, RMASK: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """reset="before", after ``gru_update_backward`` and ``d_rh = d_an W_nh``
    (∂L/∂(r ⊙ h_{t-1})): ``d_ar = d_rh ⊙ h_{t-1} ⊙ σ'`` into ``d_xp[t]``, and
    ``direct += d_rh ⊙ r``. Masked rows have ``d_an = 0``, so ``d_rh = 0``. RMASK: the
    products read ``h_{t-1} ⊙ m``: ``d_ar`` from it, and ``d_rh ⊙ r`` into ``d_hm`` (the
    product's part of the gradient) instead."""
    t = t.to(tl.int64)  # offsets of T·B·G·H elements may pass 2³¹
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < B * H
    b = offs // H
    j = offs - b * H
    _real, zero = _flags(reset, reset, t, B, b, ok, False, HAS_RESET)
    hp = tl.where(zero, 0.0, tl.load(hs + t * B * H + offs, mask=ok, other=0.0))
    if RMASK:
        hp *= tl.load(rm + offs, mask=ok, other=0.0)
    r = tl.load(gates + (t * B + b) * 3 * H + j, mask=ok, other=0.0)
    drh = tl.load(d_rh + offs, mask=ok, other=0.0)
    tl.store(d_xp + (t * B + b) * 3 * H + j, drh * hp * r * (1.0 - r), mask=ok)
    if RMASK:
        tl.store(d_hm + offs, drh * r, mask=ok)
    else:
        tl.store(direct + offs, tl.load(direct + offs, mask=ok, other=0.0) + drh * r, mask=ok)


@triton.jit
def probe(out):
    """``out[0] = 1``: that a kernel builds and runs on ``out``'s device at all."""
    tl.store(out, 1.0)
