// The layer-normalised LSTM and GRU (rnnkit/cells/layer_norm.py, equations there): the
// forward and backward loops over time of one thread's row block, and their entry points.
// The input part ν(W_x x_t) ⊙ γ_x comes in whole (the layer computes it for all steps);
// per step the loop runs the recurrent product, its normalisation over the G·H entries,
// the gates and, for the LSTM, the normalisation of c_t. The caches are those of the
// PyTorch loop's kernels (LayerNormLSTMKernel, LayerNormGRUKernel), so that either loop's
// forward pairs with either loop's backward, and the gains' gradients are theirs.
// Recurrent dropout (the LSTM's only) and zoneout as in lstm.h (steps.h, Regularizers): the
// product reads h_{t-1} ⊙ m, zoneout mixes after the step; the caches stay the cell's step's
// (its backward reads no h̃_t, c̃_t), so that RegularizedKernel's layout pairs as well.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

#include "activations.h"
#include "buffers.h"
#include "gemm.h"
#include "gru.h"
#include "steps.h"

namespace {

// Row sums in LN_K partial sums: vectorised without reassociating the compiler's own way
// (LN_K / 8 independent vector chains for float32, so that the adds' latency does not
// bind), and nearer the exact sum than one running total.
constexpr int64_t LN_K = 32;

template <typename T>
T ln_fold(const T (&acc)[LN_K], T tail) {
  for (int64_t k = 0; k < LN_K; ++k) tail += acc[k];
  return tail;
}

template <typename T>
T ln_sum(const T* __restrict v, int64_t w) {
  T acc[LN_K] = {};
  int64_t j = 0;
  for (; j + LN_K <= w; j += LN_K)
    for (int64_t k = 0; k < LN_K; ++k) acc[k] += v[j + k];
  T s = 0;
  for (; j < w; ++j) s += v[j];
  return ln_fold(acc, s);
}

// n = v − mean, in the same pass as Σ n²: the centred sum of squares (two passes over v in
// all with ln_sum, the variance as exact as torch's two-pass one).
template <typename T>
T ln_center(const T* __restrict v, T* __restrict n, T mean, int64_t w) {
  T acc[LN_K] = {};
  int64_t j = 0;
  for (; j + LN_K <= w; j += LN_K)
    for (int64_t k = 0; k < LN_K; ++k) {
      const T d = v[j + k] - mean;
      n[j + k] = d;
      acc[k] += d * d;
    }
  T s = 0;
  for (; j < w; ++j) {
    n[j] = v[j] - mean;
    s += n[j] * n[j];
  }
  return ln_fold(acc, s);
}

// n = v − mean(v) over the w entries of a row (ε = 1e-5, the variance over w); returns the
// scale 1/√(var(v) + ε), by which the caller multiplies n (ν(v) = n · scale) in its next
// pass over the row.
template <typename T>
T ln_centered(const T* __restrict v, T* __restrict n, int64_t w) {
  const T mean = ln_sum(v, w) / T(w);
  return T(1) / std::sqrt(ln_center(v, n, mean, w) / T(w) + T(1e-5));
}

// The means the backward of ν reads, of u and u ⊙ n, in one pass.
template <typename T>
void ln_means(const T* __restrict u, const T* __restrict n, int64_t w, T& mu, T& mun) {
  T a[LN_K] = {}, b[LN_K] = {};
  int64_t j = 0;
  for (; j + LN_K <= w; j += LN_K)
    for (int64_t k = 0; k < LN_K; ++k) {
      a[k] += u[j + k];
      b[k] += u[j + k] * n[j + k];
    }
  T s = 0, sn = 0;
  for (; j < w; ++j) {
    s += u[j];
    sn += u[j] * n[j];
  }
  mu = ln_fold(a, s) / T(w);
  mun = ln_fold(b, sn) / T(w);
}

// n = ν(v) over the w entries of a row; returns the scale 1/√(var(v) + ε).
template <typename T>
T ln_normalize(const T* __restrict v, T* __restrict n, int64_t w) {
  const T inv = ln_centered(v, n, w);
  for (int64_t j = 0; j < w; ++j) n[j] *= inv;
  return inv;
}

// The backward of ν: u holds d ⊙ γ (the gradient of ν(v)) on entry, ∂L/∂v on exit:
// s (u − mean(u) − n ⊙ mean(u ⊙ n)).
template <typename T>
void ln_normalize_backward(T* __restrict u, const T* __restrict n, T inv, int64_t w) {
  T mu, mun;
  ln_means(u, n, w, mu, mun);
  for (int64_t j = 0; j < w; ++j) u[j] = inv * (u[j] - mu - n[j] * mun);
}

// The gains' entries: the LSTM's [γ_h; γ_c; β_c], the GRU's [γ_h; b_hn].
constexpr int64_t ln_gains_width(int64_t G, int64_t H) { return G * H + (G == 4 ? 2 : 1) * H; }

// The caches of one call, each a step buffer (or one step's scratch without save). LSTM:
// the activated gates (4H), ν(q) (4H), its scale (1), ν(c) (H), its scale (1), tanh(ĉ)
// (H), ĉ = ν(c) γ_c + β_c. GRU: the activated r, z, n (3H), q_n (H), ν(q) (3H), its scale.
template <typename T>
struct LnCache {
  T* buf[6] = {};
  int64_t width[6] = {};
  int count = 0;
  T* row(int k, int64_t row) const { return buf[k] + row * width[k]; }
};

// One row of the LSTM's step. xp: the input part (4H); q: h_{t-1} W_hh^T (4H); gains:
// [γ_h (4H); γ_c (H); β_c (H)]; writes the gates, ν(q), ν(c), the scales, tanh(ĉ), c, h.
template <typename T>
void ln_lstm_fwd_row(const T* __restrict xp, const T* __restrict q, const T* __restrict bias,
                     const T* __restrict gains, const T* __restrict cp, T* __restrict a,
                     T* __restrict nq, T* __restrict invq, T* __restrict nc, T* __restrict invc,
                     T* __restrict tc, T* __restrict cn, T* __restrict hn, int64_t H) {
  const int64_t G = 4 * H;
  const T *gc = gains + G, *bc = gains + G + H;
  const T sq = invq[0] = ln_centered(q, nq, G);
  for (int64_t j = 0; j < G; ++j) {  // ν(q) in the pass that reads it
    const T n = nq[j] * sq;
    nq[j] = n;
    a[j] = (xp[j] + bias[j]) + n * gains[j];
  }
  for (int64_t j = 0; j < H; ++j) {
    const T i = sigm(a[j]), f = sigm(a[H + j]), g = tanh_(a[2 * H + j]);
    a[j] = i;
    a[H + j] = f;
    a[2 * H + j] = g;
    a[3 * H + j] = sigm(a[3 * H + j]);
    cn[j] = f * cp[j] + i * g;
  }
  const T sc = invc[0] = ln_centered(cn, nc, H);
  for (int64_t j = 0; j < H; ++j) {
    const T n = nc[j] * sc;
    nc[j] = n;
    tc[j] = tanh_(n * gc[j] + bc[j]);
    hn[j] = a[3 * H + j] * tc[j];
  }
}

// The backward of one row of the LSTM's step: dh, dc the gradients of h_t, c_t on entry;
// dc becomes that of c_{t-1}, dh is zeroed (d_q W_hh is added by the caller). dxp: the
// pre-activations' gradient (4H); dq: ∂L/∂q (4H); dg += the gains' gradient, [γ_h (4H):
// ∂L/∂a ⊙ ν(q); γ_c (H): ∂L/∂ĉ ⊙ ν(c); β_c (H): ∂L/∂ĉ]; db += ∂L/∂a (the bias's
// gradient); u: H values of scratch.
template <typename T>
void ln_lstm_bwd_row(const T* __restrict a, const T* __restrict nq, T invq, const T* __restrict nc,
                     T invc, const T* __restrict tc, const T* __restrict cp,
                     const T* __restrict gains, T* __restrict dh, T* __restrict dc,
                     T* __restrict dxp, T* __restrict dq, T* __restrict dg, T* __restrict db,
                     T* __restrict u, int64_t H) {
  const int64_t G = 4 * H;
  const T* gc = gains + G;
  for (int64_t j = 0; j < H; ++j) {
    const T o = a[3 * H + j];
    const T dhat = dh[j] * o * (T(1) - tc[j] * tc[j]);  // ∂L/∂ĉ
    dg[G + j] += dhat * nc[j];
    dg[G + H + j] += dhat;
    u[j] = dhat * gc[j];
    dxp[3 * H + j] = dh[j] * tc[j] * (o * (T(1) - o));
    dh[j] = T(0);
  }
  T mu, mun;
  ln_means(u, nc, H, mu, mun);
  for (int64_t j = 0; j < H; ++j) {  // ν's backward for ĉ in the pass that reads it
    const T i = a[j], f = a[H + j], g = a[2 * H + j];
    const T dct = dc[j] + invc * (u[j] - mu - nc[j] * mun);
    dxp[j] = dct * g * (i * (T(1) - i));
    dxp[H + j] = dct * cp[j] * (f * (T(1) - f));
    dxp[2 * H + j] = dct * i * (T(1) - g * g);
    dc[j] = dct * f;
  }
  // dq = ∂L/∂a ⊙ γ_h and the means of ν's backward in one pass, then ν's backward
  T sa[LN_K] = {}, sb[LN_K] = {};
  int64_t j = 0;
  for (; j + LN_K <= G; j += LN_K)
    for (int64_t k = 0; k < LN_K; ++k) {
      const T d = dxp[j + k], n = nq[j + k], v = d * gains[j + k];
      dg[j + k] += d * n;
      db[j + k] += d;
      dq[j + k] = v;
      sa[k] += v;
      sb[k] += v * n;
    }
  T s = 0, sn = 0;
  for (; j < G; ++j) {
    const T v = dxp[j] * gains[j];
    dg[j] += dxp[j] * nq[j];
    db[j] += dxp[j];
    dq[j] = v;
    s += v;
    sn += v * nq[j];
  }
  const T mq = ln_fold(sa, s) / T(G), mqn = ln_fold(sb, sn) / T(G);
  for (j = 0; j < G; ++j) dq[j] = invq * (dq[j] - mq - nq[j] * mqn);
}

// One row of the GRU's step (reset after the product). xp: the input part (3H); q:
// h_{t-1} W_hh^T (3H); gains: [γ_h (3H); b_hn (H)]. Writes r, z, n, q_n, ν(q), its scale, h.
template <typename T, bool KEEP>
void ln_gru_fwd_row(const T* __restrict xp, const T* __restrict q, const T* __restrict bias,
                    const T* __restrict gains, const T* __restrict hp, T* __restrict a,
                    T* __restrict qn, T* __restrict nq, T* __restrict invq, T* __restrict hn,
                    int64_t H) {
  const T* bhn = gains + 3 * H;
  invq[0] = ln_normalize(q, nq, 3 * H);
  for (int64_t j = 0; j < 2 * H; ++j) a[j] = sigm((xp[j] + bias[j]) + nq[j] * gains[j]);
  for (int64_t j = 0; j < H; ++j) {
    const int64_t k = 2 * H + j;
    qn[j] = nq[k] * gains[k] + bhn[j];
    const T n = tanh_((xp[k] + bias[k]) + a[j] * qn[j]);
    a[k] = n;
    hn[j] = mix<T, KEEP>(a[H + j], hp[j], n);
  }
}

// The backward of one row of the GRU's step: dh the gradient of h_t on entry, its direct
// part (through the update) on exit (d_q W_hh is added by the caller). dxp: the
// pre-activations' gradient (3H); dq: ∂L/∂q (3H); dg += the gains' gradient, [γ_h (3H):
// ∂L/∂(ν(q) γ_h) ⊙ ν(q); b_hn (H): ∂L/∂q_n]; db += ∂L/∂p (the bias's gradient).
template <typename T, bool KEEP>
void ln_gru_bwd_row(const T* __restrict a, const T* __restrict qn, const T* __restrict nq, T invq,
                    const T* __restrict hp, const T* __restrict gains, T* __restrict dh,
                    T* __restrict dxp, T* __restrict dq, T* __restrict dg, T* __restrict db,
                    int64_t H) {
  for (int64_t j = 0; j < H; ++j) {
    const T r = a[j], z = a[H + j], n = a[2 * H + j], d = dh[j];
    const T dz = KEEP ? d * (hp[j] - n) : d * (n - hp[j]);
    const T dn = KEEP ? d * (T(1) - z) : d * z;
    const T dan = dn * (T(1) - n * n);
    dq[2 * H + j] = dan * r;  // ∂L/∂q_n, for now
    dxp[j] = dan * qn[j] * (r * (T(1) - r));
    dxp[H + j] = dz * (z * (T(1) - z));
    dxp[2 * H + j] = dan;
    dh[j] = KEEP ? d * z : d * (T(1) - z);
  }
  for (int64_t j = 0; j < 3 * H; ++j) db[j] += dxp[j];
  for (int64_t j = 0; j < 2 * H; ++j) {
    dg[j] += dxp[j] * nq[j];
    dq[j] = dxp[j] * gains[j];
  }
  for (int64_t j = 2 * H; j < 3 * H; ++j) {
    dg[j] += dq[j] * nq[j];
    dg[H + j] += dq[j];
    dq[j] *= gains[j];
  }
  ln_normalize_backward(dq, nq, invq, 3 * H);
}

// The forward loop of one row block. xp: the input part (step buffer of G·H, read only);
// hs (T + 1, B, H) and, for the LSTM, cs (T + 1, B, H) with the initial states in row 0;
// rec: B·G·H scratch. A hole (M false) holds the state; finished rows are held. rg: the
// regularizers, on unpacked rows (no recurrent mask for the GRU).
template <typename T, int G, bool KEEP>
void ln_forward_impl(const T* xp, const StepMatrix<T>& W, const T* bias, const T* gains, T* rec,
                     T* hs, T* cs, const LnCache<T>& C, bool save, const bool* M, const Steps& S,
                     int64_t Tn, int64_t B, int64_t H, int64_t r0, int64_t r1,
                     const Regularizers<T>& rg) {
  const int64_t GH = G * H;
  rec += r0 * GH;
  std::vector<T> hm(rg.m ? (r1 - r0) * H : 0);  // h_{t-1} ⊙ m, the product's operand
  for (int64_t t = 0; t < Tn; ++t) {
    const int64_t bt = block_active(S.act[t], r0, r1);
    const int64_t row = (save ? S.row(t) : 0) + r0;  // this block's first cache row
    const T* x = xp + (S.row(t) + r0) * GH;
    const T* hp = hs + (t * B + r0) * H;
    T* hn = hs + ((t + 1) * B + r0) * H;
    const T* cp = G == 4 ? cs + (t * B + r0) * H : nullptr;
    T* cn = G == 4 ? cs + ((t + 1) * B + r0) * H : nullptr;
    const bool* m = M ? M + t * B + r0 : nullptr;
    const T* hq = hp;
    if (rg.m) {
      for (int64_t k = 0; k < bt * H; ++k) hm[k] = hp[k] * rg.m[r0 * H + k];
      hq = hm.data();
    }
    W.mm(bt, hq, H, T(0), rec, GH);  // h_{t-1} W_hh^T (of h_{t-1} ⊙ m)
    for (int64_t b = 0; b < bt; ++b) {
      if constexpr (G == 4)
        ln_lstm_fwd_row<T>(x + b * GH, rec + b * GH, bias, gains, cp + b * H, C.row(0, row + b),
                           C.row(1, row + b), C.row(2, row + b), C.row(3, row + b),
                           C.row(4, row + b), C.row(5, row + b), cn + b * H, hn + b * H, H);
      else
        ln_gru_fwd_row<T, KEEP>(x + b * GH, rec + b * GH, bias, gains, hp + b * H,
                                C.row(0, row + b), C.row(1, row + b), C.row(2, row + b),
                                C.row(3, row + b), hn + b * H, H);
      const int64_t kb = (t * B + r0 + b) * H;  // this row's keep factors
      if (rg.kh) zone_row(hn + b * H, hp + b * H, rg.kh + kb, H);
      if (G == 4 && rg.kc) zone_row(cn + b * H, cp + b * H, rg.kc + kb, H);
      if (m && !m[b]) {  // a hole: hold the state
        std::memcpy(hn + b * H, hp + b * H, H * sizeof(T));
        if (G == 4) std::memcpy(cn + b * H, cp + b * H, H * sizeof(T));
      }
    }
    copy_rows(hn, hp, bt, r1 - r0, H);
    if (G == 4) copy_rows(cn, cp, bt, r1 - r0, H);
    if (save && !S.packed())  // finished rows' caches: defined (zeros)
      for (int k = 0; k < C.count; ++k) zero_rows(C.row(k, row), bt, r1 - r0, C.width[k]);
  }
}

// The backward loop of one row block: d_h (and d_c) (B, H) the final states' gradients on
// entry, the initial states' on exit; d_out (T, B, H) contiguous or null. dxp, dhp: step
// buffers of G·H, the pre-activations' gradient and ∂L/∂q (q = h_{t-1} W_hh^T), zero at
// holes and finished rows. dg: this block's sum over its rows of the gains' gradient (NG
// entries: ln_gains_width), then of the bias's (G·H), summed while the rows are in cache (a
// pass over the step buffers afterwards would read them again). rg: as the forward's.
template <typename T, int G, bool KEEP>
void ln_backward_impl(const LnCache<T>& C, const T* hs, const T* cs, const StepMatrix<T>& W,
                      const T* gains, const bool* M, const Steps& S, const T* dout, T* dxp, T* dhp,
                      T* dg, T* dh, T* dc, int64_t Tn, int64_t B, int64_t H, int64_t r0, int64_t r1,
                      const Regularizers<T>& rg) {
  const int64_t GH = G * H, RW = GH, NG = ln_gains_width(G, H);
  dh += r0 * H;
  if (G == 4) dc += r0 * H;
  std::vector<T> u(H);
  // zoneout: the part of ∂L/∂h_t that reaches h_{t-1} directly, d_h ⊙ d (added after the
  // product); which rows ran the cell's step (not holes, not finished)
  std::vector<T> direct(rg.kh ? (r1 - r0) * H : 0), dcd(rg.kc ? H : 0);
  std::vector<char> ran(rg.any() ? r1 - r0 : 0);
  for (int64_t t = Tn - 1; t >= 0; --t) {
    const int64_t bt = block_active(S.act[t], r0, r1);
    const int64_t row = S.row(t) + r0;
    T* dx = dxp + row * GH;
    T* dr = dhp + row * RW;
    const bool* m = M ? M + t * B + r0 : nullptr;
    if (dout) add_into(dh, dout + (t * B + r0) * H, (r1 - r0) * H);
    for (int64_t b = 0; b < bt; ++b) {
      if (rg.any()) ran[b] = 0;
      if (m && !m[b]) {  // a hole: no gradient of its pre-activations, d_h (d_c) pass
        std::memset(dx + b * GH, 0, GH * sizeof(T));
        std::memset(dr + b * RW, 0, RW * sizeof(T));
        continue;
      }
      const int64_t k = row + b, kb = (t * B + r0 + b) * H;
      // d_h̃ = d_h (1 − d); d_h d reaches h_{t-1} directly (c the same)
      if (rg.kh) zone_split(dh + b * H, rg.kh + kb, direct.data() + b * H, H);
      if (G == 4 && rg.kc) zone_split(dc + b * H, rg.kc + kb, dcd.data(), H);
      if constexpr (G == 4)
        ln_lstm_bwd_row<T>(C.row(0, k), C.row(1, k), C.row(2, k)[0], C.row(3, k), C.row(4, k)[0],
                           C.row(5, k), cs + (t * B + r0 + b) * H, gains, dh + b * H, dc + b * H,
                           dx + b * GH, dr + b * RW, dg, dg + NG, u.data(), H);
      else
        ln_gru_bwd_row<T, KEEP>(C.row(0, k), C.row(1, k), C.row(2, k), C.row(3, k)[0],
                                hs + (t * B + r0 + b) * H, gains, dh + b * H, dx + b * GH,
                                dr + b * RW, dg, dg + NG, H);
      if (G == 4 && rg.kc) add_into(dc + b * H, dcd.data(), H);
      if (rg.any()) ran[b] = 1;
    }
    if (!S.packed()) {
      zero_rows(dx, bt, r1 - r0, GH);
      zero_rows(dr, bt, r1 - r0, RW);
    }
    W.mm(bt, dr, RW, T(1), dh, H);  // d_h_prev += ∂L/∂q W_hh
    if (rg.m || rg.kh)
      for (int64_t b = 0; b < bt; ++b) {
        if (!ran[b]) continue;
        T* dhb = dh + b * H;
        if (rg.m)  // the product read h_{t-1} ⊙ m (the LSTM's: dh held only ∂L/∂q W_hh)
          for (int64_t j = 0; j < H; ++j) dhb[j] *= rg.m[(r0 + b) * H + j];
        if (rg.kh) add_into(dhb, direct.data() + b * H, H);
      }
  }
}

// The caches' widths: the LSTM's (G = 4) and the GRU's (G = 3).
std::vector<int64_t> ln_cache_widths(int64_t G, int64_t H) {
  if (G == 4) return {4 * H, 4 * H, 1, H, 1, H};
  return {3 * H, H, 3 * H, 1};
}

// Checks shared by the entry points: W_hh (G·H, H) and the gains (G·H + 2H for the LSTM,
// G·H + H for the GRU), contiguous in the dtype of like.
void ln_check_weights(const Tensor& w_hh, const Tensor& gains, int64_t G, int64_t H,
                      const Tensor& like) {
  check(w_hh, "w_hh", 2);
  check(gains, "gains", 1);
  const int64_t ng = ln_gains_width(G, H);
  TORCH_CHECK(w_hh.size(0) == G * H && w_hh.size(1) == H && gains.size(0) == ng, "w_hh must be (",
              G * H, ", ", H, ") and gains (", ng, "), got ", w_hh.sizes(), " and ", gains.sizes());
  for (const Tensor* t : {&w_hh, &gains})
    TORCH_CHECK(t->scalar_type() == like.scalar_type(), "the weights must have the input's dtype");
}

template <typename T>
LnCache<T> ln_cache_of(const std::vector<Tensor>& caches, const std::vector<int64_t>& widths) {
  LnCache<T> C;
  C.count = (int)widths.size();
  for (int k = 0; k < C.count; ++k) {
    C.buf[k] = caches[k].data_ptr<T>();
    C.width[k] = widths[k];
  }
  return C;
}

// xp: the input part (T, B, G·H), or (N, G·H) packed with offsets; read only. states0:
// h0 (and c0) (B, H). Returns the states (T + 1, B, H), then the caches (ln_cache_widths):
// without save, one step's scratch (expanded over T where unpacked).
// rec_mask (the LSTM's only), keep_h, keep_c: the regularizers (steps.h), or none.
std::vector<Tensor> ln_forward(const Tensor& xp, const Tensor& w_hh, const Tensor& bias,
                               const Tensor& gains, const std::vector<Tensor>& states0,
                               const std::optional<Tensor>& mask, bool save, bool keep,
                               const std::optional<Tensor>& offsets, int64_t G,
                               const std::optional<Tensor>& rec_mask,
                               const std::optional<Tensor>& keep_h,
                               const std::optional<Tensor>& keep_c) {
  const int64_t Tn = steps_of(xp, offsets), B = states0[0].size(0), H = states0[0].size(1);
  ln_check_weights(w_hh, gains, G, H, xp);
  check(bias, "bias", 1);
  TORCH_CHECK(bias.size(0) == G * H && bias.scalar_type() == xp.scalar_type(),
              "bias must be (G·H) of the input's dtype");
  const bool* M = mask_of(mask, Tn, B);
  const Steps S = make_steps(mask, offsets, Tn, B);
  check_buf(xp, "xp", S, G * H);
  std::vector<Tensor> out;
  for (const Tensor& s0 : states0) {
    TORCH_CHECK(s0.dim() == 2 && s0.size(0) == B && s0.size(1) == H, "states must be (B, H)");
    Tensor s = at::empty({Tn + 1, B, H}, xp.options());
    s[0].copy_(s0);
    out.push_back(s);
  }
  const std::vector<int64_t> widths = ln_cache_widths(G, H);
  std::vector<Tensor> caches;
  for (int64_t w : widths) caches.push_back(save ? step_buffer(S, w, xp) : scratch(S, w, xp));
  Tensor rec = at::empty({B, G * H}, xp.options());
  AT_DISPATCH_FLOATING_TYPES(xp.scalar_type(), "ln_forward", [&] {
    const LnCache<scalar_t> C = ln_cache_of<scalar_t>(caches, widths);
    const StepMatrix<scalar_t> W(w_hh, 0, G * H, true, S.rows());
    auto f = G == 4 ? ln_forward_impl<scalar_t, 4, false>
             : keep ? ln_forward_impl<scalar_t, 3, true>
                    : ln_forward_impl<scalar_t, 3, false>;
    scalar_t* cs = G == 4 ? out[1].data_ptr<scalar_t>() : nullptr;
    const auto rg = regularizers_of<scalar_t>(rec_mask, keep_h, keep_c, S, Tn, B, H, xp);
    over_blocks(B, S, [&](int64_t r0, int64_t r1) {
      f(xp.data_ptr<scalar_t>(), W, bias.data_ptr<scalar_t>(), gains.data_ptr<scalar_t>(),
        rec.data_ptr<scalar_t>(), out[0].data_ptr<scalar_t>(), cs, C, save, M, S, Tn, B, H, r0, r1,
        rg);
    });
  });
  for (size_t k = 0; k < caches.size(); ++k) {
    if (!save && !S.packed()) caches[k] = caches[k].expand({Tn, B, widths[k]});
    out.push_back(caches[k]);
  }
  return out;
}

// cache: the forward's caches; states: cs (the LSTM) or hs (the GRU), (T + 1, B, H). d_h
// (and d_c) (B, H): the final states' gradients, the initial states' on return. Returns
// d_xp (the pre-activations' gradient), d_q (∂L/∂q), the gains' gradient (the LSTM's
// [γ_h; γ_c; β_c], the GRU's [γ_h; b_hn]), the bias's, then d_h (and d_c).
std::vector<Tensor> ln_backward(at::TensorList cache, const Tensor& states, const Tensor& w_hh,
                                const Tensor& gains, const std::optional<Tensor>& mask,
                                const std::optional<Tensor>& d_out, const Tensor& d_h,
                                const std::optional<Tensor>& d_c, bool keep,
                                const std::optional<Tensor>& offsets, int64_t G,
                                const std::optional<Tensor>& rec_mask,
                                const std::optional<Tensor>& keep_h,
                                const std::optional<Tensor>& keep_c) {
  check(states, G == 4 ? "cs" : "hs", 3);
  const int64_t Tn = states.size(0) - 1, B = states.size(1), H = states.size(2);
  ln_check_weights(w_hh, gains, G, H, states);
  check_d_out(d_out, Tn, B, H);
  const bool* M = mask_of(mask, Tn, B);
  const Steps S = make_steps(mask, offsets, Tn, B);
  const std::vector<int64_t> widths = ln_cache_widths(G, H);
  TORCH_CHECK(cache.size() == widths.size(), "cache must hold ", widths.size(), " tensors");
  std::vector<Tensor> caches(cache.begin(), cache.end());
  for (size_t k = 0; k < widths.size(); ++k) {
    check_buf(caches[k], "every cache tensor", S, widths[k]);
    TORCH_CHECK(caches[k].scalar_type() == states.scalar_type(), "the caches' dtype differs");
  }
  for (const Tensor* t : {&d_h, d_c ? &*d_c : &d_h}) {
    check(*t, "d_h and d_c", 2);
    TORCH_CHECK(t->size(0) == B && t->size(1) == H && t->scalar_type() == states.scalar_type(),
                "d_h and d_c must be (B, H) of the states' dtype");
  }
  TORCH_CHECK(d_c.has_value() == (G == 4), "d_c: the LSTM's only");
  Tensor dxp = step_buffer(S, G * H, states), dhp = step_buffer(S, G * H, states);
  // each thread block sums its rows' gradients of the gains and the bias into the row of
  // its first batch row
  const int64_t ng = gains.size(0);
  Tensor dg = at::zeros({B, ng + G * H}, states.options());
  AT_DISPATCH_FLOATING_TYPES(states.scalar_type(), "ln_backward", [&] {
    const LnCache<scalar_t> C = ln_cache_of<scalar_t>(caches, widths);
    const StepMatrix<scalar_t> W(w_hh, 0, G * H, false, S.rows());
    auto f = G == 4 ? ln_backward_impl<scalar_t, 4, false>
             : keep ? ln_backward_impl<scalar_t, 3, true>
                    : ln_backward_impl<scalar_t, 3, false>;
    const scalar_t* s = states.data_ptr<scalar_t>();
    scalar_t* dc = G == 4 ? d_c->data_ptr<scalar_t>() : nullptr;
    const auto rg = regularizers_of<scalar_t>(rec_mask, keep_h, keep_c, S, Tn, B, H, states);
    over_blocks(B, S, [&](int64_t r0, int64_t r1) {
      f(C, G == 4 ? nullptr : s, G == 4 ? s : nullptr, W, gains.data_ptr<scalar_t>(), M, S,
        opt_ptr<scalar_t>(d_out), dxp.data_ptr<scalar_t>(), dhp.data_ptr<scalar_t>(),
        dg.data_ptr<scalar_t>() + r0 * (ng + G * H), d_h.data_ptr<scalar_t>(), dc, Tn, B, H, r0, r1,
        rg);
    });
  });
  const Tensor sums = dg.sum(0);
  std::vector<Tensor> out{dxp, dhp, sums.slice(0, 0, ng), sums.slice(0, ng), d_h};
  if (d_c) out.push_back(*d_c);
  return out;
}

// The operators (registered in loop.cpp). The GRU takes zoneout only: recurrent dropout
// has no layer-normalised GRU form (rnnkit/bptt/regularized.py).
std::vector<Tensor> ln_lstm_forward(Tensor xp, Tensor w_hh, Tensor bias, Tensor gains, Tensor h0,
                                    Tensor c0, std::optional<Tensor> mask, bool save,
                                    std::optional<Tensor> offsets, std::optional<Tensor> rec_mask,
                                    std::optional<Tensor> keep_h, std::optional<Tensor> keep_c) {
  return ln_forward(xp, w_hh, bias, gains, {h0, c0}, mask, save, false, offsets, 4, rec_mask,
                    keep_h, keep_c);
}

std::vector<Tensor> ln_gru_forward(Tensor xp, Tensor w_hh, Tensor bias, Tensor gains, Tensor h0,
                                   std::optional<Tensor> mask, bool save, bool keep,
                                   std::optional<Tensor> offsets, std::optional<Tensor> keep_h) {
  return ln_forward(xp, w_hh, bias, gains, {h0}, mask, save, keep, offsets, 3, std::nullopt, keep_h,
                    std::nullopt);
}

std::vector<Tensor> ln_lstm_backward(at::TensorList cache, Tensor cs, Tensor w_hh, Tensor gains,
                                     std::optional<Tensor> mask, std::optional<Tensor> d_out,
                                     Tensor d_h, Tensor d_c, std::optional<Tensor> offsets,
                                     std::optional<Tensor> rec_mask, std::optional<Tensor> keep_h,
                                     std::optional<Tensor> keep_c) {
  return ln_backward(cache, cs, w_hh, gains, mask, d_out, d_h, d_c, false, offsets, 4, rec_mask,
                     keep_h, keep_c);
}

std::vector<Tensor> ln_gru_backward(at::TensorList cache, Tensor hs, Tensor w_hh, Tensor gains,
                                    std::optional<Tensor> mask, std::optional<Tensor> d_out,
                                    Tensor d_h, bool keep, std::optional<Tensor> offsets,
                                    std::optional<Tensor> keep_h) {
  return ln_backward(cache, hs, w_hh, gains, mask, d_out, d_h, std::nullopt, keep, offsets, 3,
                     std::nullopt, keep_h, std::nullopt);
}

}  // namespace
