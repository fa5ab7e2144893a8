"""The Triton kernels of the layer-normalised LSTM and GRU steps
(:mod:`rnnkit.bptt.gpu_steps_ln`): one launch per step, forward and backward.

One program per batch row ``b``; each gate's ``H`` units are one block (``BLOCK`` the
next power of two of ``H``, the tail masked), so the row's ``G·H`` recurrent
pre-activations are ``G`` blocks whose ``tl.sum`` give ν's mean and variance. Buffers as
in :mod:`rnnkit.bptt.triton_kernels` (contiguous, time-major; ``mask``/``reset`` int8 with
the same meaning), and the caches of :mod:`rnnkit.cells.layer_norm`: ``nq (T, B, G·H)``
ν(W_h h_{t-1}), ``iq (T, B)`` its scale; the LSTM's ``nc (T, B, H)`` ν(c_t), ``ic (T, B)``,
``tc (T, B, H)`` tanh(ν(c_t) γ_c + β_c); the GRU's ``qn (T, B, H)`` the normalised
``q_n`` plus ``b_hn``. ``gains``: the weights' ``bias_hn`` (``[γ_h; γ_c; β_c]`` or
``[γ_h; b_hn]``). Backward of ν: ``∂L/∂v = s (d − mean(d) − n ⊙ mean(d ⊙ n))``.

Recurrent dropout (``RMASK``, the LSTM's only) and zoneout (``ZH``, ``ZC``) as in
:mod:`rnnkit.bptt.triton_kernels`: ``rm (B, H)``, ``hm (B, H)`` the next step's product
operand ``h_t ⊙ m`` that the forward launch writes, ``kh``/``kc`` the keep factors read
at ``t·kt + b·kb + j`` (a stride 0 where a factor does not vary); the backward's ``d_h``
is then ∂L/∂(h_t ⊙ m) and ``direct`` the rest. The caches stay the cell's step's (its
backward reads no ``h̃_t`` or ``c̃_t``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from rnnkit.bptt.triton_kernels import (
    _carried,
    _flags,
    _incoming,
    _sigmoid,
    _split,
    _store_state,
    _tanh,
    _zone,
)

EPS = tl.constexpr(1e-5)  # rnnkit.cells.normalization.EPS

# Triton kernels take pointers and integers; annotations would change their signatures.
# The sums are ``tl.reduce`` with this module's own ``_add`` rather than ``tl.sum``:
# Triton's interpreter runs only functions decorated while it was on (``tl.sum`` is
# decorated when triton is imported; the gate helpers come with ``triton_kernels``, which
# is imported, like this module, after the interpreter is switched on).


@triton.jit
def _add(a, b):
    return a + b


@triton.jit
def _sum(v):
    return tl.reduce(v, 0, _add)


@triton.jit
def _centred(v, ok):
    return tl.where(ok, v, 0.0)


@triton.jit(do_not_specialize=["t"])
def ln_lstm_forward(
    gates, hw, hs, cs, nq, iq, nc, ic, tc, gains, mask, reset, t, B, H, rm, hm, kh, kc, kt, kb,
    HAS_MASK: tl.constexpr, HAS_RESET: tl.constexpr, RMASK: tl.constexpr, ZH: tl.constexpr,
    ZC: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """Step t of row b: ``gates[t]`` holds ``ν(W_x x) γ_x + b`` on entry, the activated
    i, f, g, o on exit; ``h_t``, ``c_t`` into ``hs[t + 1]``, ``cs[t + 1]``."""
    t = t.to(tl.int64)
    b = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, BLOCK)
    ok = j < H
    real, zero = _flags(mask, reset, t, B, b + j * 0, ok, HAS_MASK, HAS_RESET)
    row = t * B + b
    r_at = hw + b * 4 * H + j
    qi = tl.where(zero, 0.0, tl.load(r_at, mask=ok, other=0.0))
    qf = tl.where(zero, 0.0, tl.load(r_at + H, mask=ok, other=0.0))
    qg = tl.where(zero, 0.0, tl.load(r_at + 2 * H, mask=ok, other=0.0))
    qo = tl.where(zero, 0.0, tl.load(r_at + 3 * H, mask=ok, other=0.0))
    mean = (_sum(qi) + _sum(qf) + _sum(qg) + _sum(qo)) / (4 * H)
    qi = _centred(qi - mean, ok)
    qf = _centred(qf - mean, ok)
    qg = _centred(qg - mean, ok)
    qo = _centred(qo - mean, ok)
    var = _sum(qi * qi) + _sum(qf * qf) + _sum(qg * qg) + _sum(qo * qo)
    inv = 1.0 / tl.sqrt(var / (4 * H) + EPS)
    n_at = nq + row * 4 * H + j
    tl.store(n_at, qi * inv, mask=ok)
    tl.store(n_at + H, qf * inv, mask=ok)
    tl.store(n_at + 2 * H, qg * inv, mask=ok)
    tl.store(n_at + 3 * H, qo * inv, mask=ok)
    tl.store(iq + row + j * 0, qi * 0.0 + inv, mask=j == 0)
    g_at = gates + row * 4 * H + j
    ai = tl.load(g_at, mask=ok, other=0.0) + qi * inv * tl.load(gains + j, mask=ok, other=0.0)
    af = tl.load(g_at + H, mask=ok, other=0.0)
    af += qf * inv * tl.load(gains + H + j, mask=ok, other=0.0)
    ag = tl.load(g_at + 2 * H, mask=ok, other=0.0)
    ag += qg * inv * tl.load(gains + 2 * H + j, mask=ok, other=0.0)
    ao = tl.load(g_at + 3 * H, mask=ok, other=0.0)
    ao += qo * inv * tl.load(gains + 3 * H + j, mask=ok, other=0.0)
    i = _sigmoid(ai)
    f = _sigmoid(af)
    g = _tanh(ag)
    o = _sigmoid(ao)
    tl.store(g_at, i, mask=ok)
    tl.store(g_at + H, f, mask=ok)
    tl.store(g_at + 2 * H, g, mask=ok)
    tl.store(g_at + 3 * H, o, mask=ok)
    s_at = t * B * H + b * H + j
    hp = tl.where(zero, 0.0, tl.load(hs + s_at, mask=ok, other=0.0))
    cp = tl.where(zero, 0.0, tl.load(cs + s_at, mask=ok, other=0.0))
    c = f * cp + i * g
    dcm = _centred(c - _sum(_centred(c, ok)) / H, ok)
    inv_c = 1.0 / tl.sqrt(_sum(dcm * dcm) / H + EPS)
    n_c = dcm * inv_c
    th = _tanh(n_c * tl.load(gains + 4 * H + j, mask=ok, other=0.0)
               + tl.load(gains + 5 * H + j, mask=ok, other=0.0))  # fmt: skip
    c_at = row * H + j
    tl.store(nc + c_at, n_c, mask=ok)
    tl.store(ic + row + j * 0, n_c * 0.0 + inv_c, mask=j == 0)
    tl.store(tc + c_at, th, mask=ok)
    h = _zone(o * th, hp, kh, t * kt + b * kb + j, ok, ZH)
    c = _zone(c, cp, kc, t * kt + b * kb + j, ok, ZC)
    _store_state(hs, hm, rm, s_at + B * H, b * H + j, ok, real, h, hp, RMASK)
    tl.store(cs + s_at + B * H, tl.where(real, c, cp), mask=ok)


@triton.jit(do_not_specialize=["t"])
def ln_lstm_backward(
    gates, cs, nq, iq, nc, ic, tc, gains, mask, reset, d_h, d_c, d_out, d_xp, d_q, d_hat,
    direct, t, B, H, rm, kh, kc, kt, kb,
    HAS_MASK: tl.constexpr, HAS_RESET: tl.constexpr, HAS_DOUT: tl.constexpr,
    RMASK: tl.constexpr, ZH: tl.constexpr, ZC: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """Step t of row b: the pre-activations' gradients into ``d_xp[t]``, ∂L/∂(W_h h_{t-1})
    into ``d_q[t]``, ∂L/∂ĉ into ``d_hat[t]`` (ĉ = ν(c) γ_c + β_c); ``d_c`` becomes
    ∂L/∂c_{t-1} (in place), ``direct`` the part of ∂L/∂h_{t-1} outside ``d_q[t] W_hh``."""
    t = t.to(tl.int64)
    b = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, BLOCK)
    ok = j < H
    bv = b + j * 0
    real, zero = _flags(mask, reset, t, B, bv, ok, HAS_MASK, HAS_RESET)
    row = t * B + b
    s_at = t * B * H + b * H + j
    o_at = b * H + j
    dh = _incoming(_carried(d_h, direct, rm, o_at, ok, RMASK), reset, t, B, bv, ok, d_out,
                   s_at, HAS_RESET, HAS_DOUT)  # fmt: skip
    dc = _incoming(tl.load(d_c + o_at, mask=ok, other=0.0), reset, t, B, bv, ok, d_out,
                   o_at, HAS_RESET, False)  # fmt: skip
    # zoneout: the cell's step gets (1 − d) of each gradient, h_{t-1} (c_{t-1}) the rest
    dh_cell, dh_keep = _split(dh, kh, t * kt + b * kb + j, ok, ZH)
    dc_cell, dc_keep = _split(dc, kc, t * kt + b * kb + j, ok, ZC)
    g_at = gates + row * 4 * H + j
    i = tl.load(g_at, mask=ok, other=0.0)
    f = tl.load(g_at + H, mask=ok, other=0.0)
    g = tl.load(g_at + 2 * H, mask=ok, other=0.0)
    o = tl.load(g_at + 3 * H, mask=ok, other=0.0)
    c_at = row * H + j
    th = tl.load(tc + c_at, mask=ok, other=0.0)
    n_c = tl.load(nc + c_at, mask=ok, other=0.0)
    inv_c = tl.load(ic + row + j * 0, mask=ok, other=0.0)
    cp = tl.where(zero, 0.0, tl.load(cs + s_at, mask=ok, other=0.0))
    dhat = tl.where(real, dh_cell * o * (1.0 - th * th), 0.0)
    tl.store(d_hat + c_at, dhat, mask=ok)
    u = dhat * tl.load(gains + 4 * H + j, mask=ok, other=0.0)
    dct = dc_cell + inv_c * (u - _sum(u) / H - n_c * (_sum(u * n_c) / H))
    di = tl.where(real, dct * g * i * (1.0 - i), 0.0)
    df = tl.where(real, dct * cp * f * (1.0 - f), 0.0)
    dg = tl.where(real, dct * i * (1.0 - g * g), 0.0)
    do = tl.where(real, dh_cell * th * o * (1.0 - o), 0.0)
    d_at = d_xp + row * 4 * H + j
    tl.store(d_at, di, mask=ok)
    tl.store(d_at + H, df, mask=ok)
    tl.store(d_at + 2 * H, dg, mask=ok)
    tl.store(d_at + 3 * H, do, mask=ok)
    n_at = nq + row * 4 * H + j
    ni = tl.load(n_at, mask=ok, other=0.0)
    nf = tl.load(n_at + H, mask=ok, other=0.0)
    ng = tl.load(n_at + 2 * H, mask=ok, other=0.0)
    no = tl.load(n_at + 3 * H, mask=ok, other=0.0)
    vi = di * tl.load(gains + j, mask=ok, other=0.0)
    vf = df * tl.load(gains + H + j, mask=ok, other=0.0)
    vg = dg * tl.load(gains + 2 * H + j, mask=ok, other=0.0)
    vo = do * tl.load(gains + 3 * H + j, mask=ok, other=0.0)
    mv = (_sum(vi) + _sum(vf) + _sum(vg) + _sum(vo)) / (4 * H)
    mvn = _sum(vi * ni) + _sum(vf * nf) + _sum(vg * ng) + _sum(vo * no)
    mvn = mvn / (4 * H)
    inv = tl.load(iq + row + j * 0, mask=ok, other=0.0)
    q_at = d_q + row * 4 * H + j
    tl.store(q_at, inv * (vi - mv - ni * mvn), mask=ok)
    tl.store(q_at + H, inv * (vf - mv - nf * mvn), mask=ok)
    tl.store(q_at + 2 * H, inv * (vg - mv - ng * mvn), mask=ok)
    tl.store(q_at + 3 * H, inv * (vo - mv - no * mvn), mask=ok)
    tl.store(d_c + o_at, tl.where(real, dct * f + dc_keep, dc), mask=ok)
    tl.store(direct + o_at, tl.where(real, dh_keep, dh), mask=ok)


@triton.jit(do_not_specialize=["t"])
def ln_gru_forward(
    gates, hw, hs, nq, iq, qn, gains, mask, reset, t, B, H, kh, kt, kb,
    HAS_MASK: tl.constexpr, HAS_RESET: tl.constexpr, KEEP: tl.constexpr, ZH: tl.constexpr,
    BLOCK: tl.constexpr,
):  # fmt: skip
    """Step t of row b: ``gates[t]`` holds ``ν(W_x x) γ_x + b`` on entry, the activated
    r, z, n on exit; ``h_t`` into ``hs[t + 1]``."""
    t = t.to(tl.int64)
    b = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, BLOCK)
    ok = j < H
    real, zero = _flags(mask, reset, t, B, b + j * 0, ok, HAS_MASK, HAS_RESET)
    row = t * B + b
    r_at = hw + b * 3 * H + j
    qr = tl.where(zero, 0.0, tl.load(r_at, mask=ok, other=0.0))
    qz = tl.where(zero, 0.0, tl.load(r_at + H, mask=ok, other=0.0))
    qq = tl.where(zero, 0.0, tl.load(r_at + 2 * H, mask=ok, other=0.0))
    mean = (_sum(qr) + _sum(qz) + _sum(qq)) / (3 * H)
    qr = _centred(qr - mean, ok)
    qz = _centred(qz - mean, ok)
    qq = _centred(qq - mean, ok)
    var = (_sum(qr * qr) + _sum(qz * qz) + _sum(qq * qq)) / (3 * H)
    inv = 1.0 / tl.sqrt(var + EPS)
    n_at = nq + row * 3 * H + j
    tl.store(n_at, qr * inv, mask=ok)
    tl.store(n_at + H, qz * inv, mask=ok)
    tl.store(n_at + 2 * H, qq * inv, mask=ok)
    tl.store(iq + row + j * 0, qr * 0.0 + inv, mask=j == 0)
    q_n = qq * inv * tl.load(gains + 2 * H + j, mask=ok, other=0.0)
    q_n += tl.load(gains + 3 * H + j, mask=ok, other=0.0)
    tl.store(qn + row * H + j, q_n, mask=ok)
    g_at = gates + row * 3 * H + j
    r = _sigmoid(
        tl.load(g_at, mask=ok, other=0.0) + qr * inv * tl.load(gains + j, mask=ok, other=0.0)
    )
    z = tl.load(g_at + H, mask=ok, other=0.0)
    z = _sigmoid(z + qz * inv * tl.load(gains + H + j, mask=ok, other=0.0))
    n = _tanh(tl.load(g_at + 2 * H, mask=ok, other=0.0) + r * q_n)
    tl.store(g_at, r, mask=ok)
    tl.store(g_at + H, z, mask=ok)
    tl.store(g_at + 2 * H, n, mask=ok)
    s_at = t * B * H + b * H + j
    hp = tl.where(zero, 0.0, tl.load(hs + s_at, mask=ok, other=0.0))
    zk = z if KEEP else 1.0 - z  # keep: h = z h_{t-1} + (1 − z) n; candidate: z ↔ 1 − z
    h = _zone(zk * hp + (1.0 - zk) * n, hp, kh, t * kt + b * kb + j, ok, ZH)
    tl.store(hs + s_at + B * H, tl.where(real, h, hp), mask=ok)


@triton.jit(do_not_specialize=["t"])
def ln_gru_backward(
    gates, hs, nq, iq, qn, gains, mask, reset, d_h, d_out, d_xp, d_q, d_qn, direct, t, B, H,
    kh, kt, kb,
    HAS_MASK: tl.constexpr, HAS_RESET: tl.constexpr, HAS_DOUT: tl.constexpr,
    KEEP: tl.constexpr, ZH: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """Step t of row b: ``d_xp[t]`` the gradients of p (r, z, n), ``d_qn[t]`` ∂L/∂q_n,
    ``d_q[t]`` ∂L/∂(W_h h_{t-1}); ``direct`` the part of ∂L/∂h_{t-1} outside
    ``d_q[t] W_hh``."""
    t = t.to(tl.int64)
    b = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, BLOCK)
    ok = j < H
    bv = b + j * 0
    real, zero = _flags(mask, reset, t, B, bv, ok, HAS_MASK, HAS_RESET)
    row = t * B + b
    s_at = t * B * H + b * H + j
    o_at = b * H + j
    dh = _incoming(tl.load(d_h + o_at, mask=ok, other=0.0), reset, t, B, bv, ok, d_out,
                   s_at, HAS_RESET, HAS_DOUT)  # fmt: skip
    g_at = gates + row * 3 * H + j
    r = tl.load(g_at, mask=ok, other=0.0)
    z = tl.load(g_at + H, mask=ok, other=0.0)
    n = tl.load(g_at + 2 * H, mask=ok, other=0.0)
    hp = tl.where(zero, 0.0, tl.load(hs + s_at, mask=ok, other=0.0))
    # zoneout (the kept share 0 without)
    dh_cell, dh_keep = _split(dh, kh, t * kt + b * kb + j, ok, ZH)
    if KEEP:
        dz, dn, keep = dh_cell * (hp - n), dh_cell * (1.0 - z), dh_cell * z + dh_keep
    else:
        dz, dn, keep = dh_cell * (n - hp), dh_cell * z, dh_cell * (1.0 - z) + dh_keep
    dan = tl.where(real, dn * (1.0 - n * n), 0.0)
    q_n = tl.load(qn + row * H + j, mask=ok, other=0.0)
    dqn = dan * r
    dar = dan * q_n * r * (1.0 - r)
    daz = tl.where(real, dz * z * (1.0 - z), 0.0)
    d_at = d_xp + row * 3 * H + j
    tl.store(d_at, dar, mask=ok)
    tl.store(d_at + H, daz, mask=ok)
    tl.store(d_at + 2 * H, dan, mask=ok)
    tl.store(d_qn + row * H + j, dqn, mask=ok)
    n_at = nq + row * 3 * H + j
    nr = tl.load(n_at, mask=ok, other=0.0)
    nz = tl.load(n_at + H, mask=ok, other=0.0)
    nn = tl.load(n_at + 2 * H, mask=ok, other=0.0)
    vr = dar * tl.load(gains + j, mask=ok, other=0.0)
    vz = daz * tl.load(gains + H + j, mask=ok, other=0.0)
    vn = dqn * tl.load(gains + 2 * H + j, mask=ok, other=0.0)
    mv = (_sum(vr) + _sum(vz) + _sum(vn)) / (3 * H)
    mvn = (_sum(vr * nr) + _sum(vz * nz) + _sum(vn * nn)) / (3 * H)
    inv = tl.load(iq + row + j * 0, mask=ok, other=0.0)
    q_at = d_q + row * 3 * H + j
    tl.store(q_at, inv * (vr - mv - nr * mvn), mask=ok)
    tl.store(q_at + H, inv * (vz - mv - nz * mvn), mask=ok)
    tl.store(q_at + 2 * H, inv * (vn - mv - nn * mvn), mask=ok)
    tl.store(direct + o_at, tl.where(real, keep, dh), mask=ok)
