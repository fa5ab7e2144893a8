// The GRU: the forward and backward loops over time of one thread's row block.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "activations.h"
#include "gemm.h"
#include "steps.h"

namespace {

template <typename T, bool KEEP>
inline T mix(T z, T hp, T n) {
  return KEEP ? n + z * (hp - n) : hp + z * (n - hp);  // h_t from z, h_{t-1} and n
}

#ifdef RNNKIT_ACT_AVX2
// float32 on AVX2: the first 8·⌊H/8⌋ units of a row with the scalar loops' operations
// (results equal to the bit), written out as in lstm.h; each returns the units done.
template <bool KEEP>
inline __m256 mix8(__m256 z, __m256 hp, __m256 n) {
  return KEEP ? _mm256_fmadd_ps(z, _mm256_sub_ps(hp, n), n)
              : _mm256_fmadd_ps(z, _mm256_sub_ps(n, hp), hp);
}

// Two loops, (r, z, n's pre-activation) then (n, h): in one, a unit's chain r → n → h
// outlasts what the core overlaps (see lstm_fwd_row8). n_ holds the pre-activation between.
template <bool KEEP>
int64_t gru_after_fwd_row8(float* __restrict r_, float* __restrict z_, float* __restrict n_,
                           const float* __restrict rec_r, const float* __restrict rec_z,
                           const float* __restrict rec_n, float* __restrict rn_out,
                           const float* __restrict b, const float* __restrict bhn,
                           const float* __restrict hp, float* __restrict hn, int64_t H) {
  const int64_t n = H / 8 * 8;
  for (int64_t j = 0; j < n; j += 8) {
    const __m256 rn = _mm256_add_ps(ld8(rec_n, j), ld8(bhn, j));
    const __m256 r = sigm8(sum8(r_, b, rec_r, j)), z = sigm8(sum8(z_, b + H, rec_z, j));
    _mm256_storeu_ps(rn_out + j, rn);
    _mm256_storeu_ps(r_ + j, r);
    _mm256_storeu_ps(z_ + j, z);
    __m256 rrn = _mm256_mul_ps(r, rn);
    // opaque to GCC, which would fuse the add below into an FMA: the scalar loop's build
    // rounds r ⊙ rn first
    __asm__("" : "+x"(rrn));
    _mm256_storeu_ps(n_ + j, _mm256_add_ps(_mm256_add_ps(ld8(n_, j), ld8(b + 2 * H, j)), rrn));
  }
  for (int64_t j = 0; j < n; j += 8) {
    const __m256 nv = tanh8(ld8(n_, j));
    _mm256_storeu_ps(n_ + j, nv);
    _mm256_storeu_ps(hn + j, mix8<KEEP>(ld8(z_, j), ld8(hp, j), nv));
  }
  return n;
}

inline int64_t gru_before_fwd_row_a8(float* __restrict r_, float* __restrict z_,
                                     const float* __restrict s, const float* __restrict b,
                                     const float* __restrict hp, float* __restrict rh, int64_t H) {
  const int64_t n = H / 8 * 8;
  for (int64_t j = 0; j < n; j += 8) {
    const __m256 r = sigm8(sum8(r_, b, s, j)), z = sigm8(sum8(z_, b + H, s + H, j));
    _mm256_storeu_ps(r_ + j, r);
    _mm256_storeu_ps(z_ + j, z);
    _mm256_storeu_ps(rh + j, _mm256_mul_ps(r, ld8(hp, j)));
  }
  return n;
}

template <bool KEEP>
int64_t gru_before_fwd_row_b8(float* __restrict n_, const float* __restrict s,
                              const float* __restrict bn, const float* __restrict z_,
                              const float* __restrict hp, float* __restrict hn, int64_t H) {
  const int64_t n = H / 8 * 8;
  for (int64_t j = 0; j < n; j += 8) {
    const __m256 nv = tanh8(sum8(n_, bn, s, j));
    _mm256_storeu_ps(n_ + j, nv);
    _mm256_storeu_ps(hn + j, mix8<KEEP>(ld8(z_, j), ld8(hp, j), nv));
  }
  return n;
}
#endif

// r_, z_, n_: the input projections on entry, r, z, n on exit; b: the bias (r, z, n)
template <typename T, bool KEEP>
void gru_after_fwd_row(T* __restrict r_, T* __restrict z_, T* __restrict n_,
                       const T* __restrict rec_r, const T* __restrict rec_z,
                       const T* __restrict rec_n, T* __restrict rn_out, const T* __restrict b,
                       const T* __restrict bhn, const T* __restrict hp, T* __restrict hn,
                       int64_t H) {
  int64_t j0 = 0;
#ifdef RNNKIT_ACT_AVX2
  if constexpr (std::is_same_v<T, float>)
    j0 = gru_after_fwd_row8<KEEP>(r_, z_, n_, rec_r, rec_z, rec_n, rn_out, b, bhn, hp, hn, H);
#endif
  for (int64_t j = j0; j < H; ++j) {
    const T rn = rec_n[j] + bhn[j];
    rn_out[j] = rn;  // W_nh h + b_hn: the only part of W_hh h the backward needs
    const T r = sigm(r_[j] + b[j] + rec_r[j]);
    const T z = sigm(z_[j] + b[H + j] + rec_z[j]);
    const T n = tanh_(n_[j] + b[2 * H + j] + r * rn);
    r_[j] = r;
    z_[j] = z;
    n_[j] = n;
    hn[j] = mix<T, KEEP>(z, hp[j], n);
  }
}

template <typename T>
void gru_before_fwd_row_a(T* __restrict r_, T* __restrict z_, const T* __restrict s,
                          const T* __restrict b, const T* __restrict hp, T* __restrict rh,
                          int64_t H) {
  int64_t j0 = 0;
#ifdef RNNKIT_ACT_AVX2
  if constexpr (std::is_same_v<T, float>) j0 = gru_before_fwd_row_a8(r_, z_, s, b, hp, rh, H);
#endif
  for (int64_t j = j0; j < H; ++j) {
    const T r = sigm(r_[j] + b[j] + s[j]);
    r_[j] = r;
    z_[j] = sigm(z_[j] + b[H + j] + s[H + j]);
    rh[j] = r * hp[j];  // r ⊙ h_{t-1}
  }
}

template <typename T, bool KEEP>
void gru_before_fwd_row_b(T* __restrict n_, const T* __restrict s, const T* __restrict bn,
                          const T* __restrict z_, const T* __restrict hp, T* __restrict hn,
                          int64_t H) {
  int64_t j0 = 0;
#ifdef RNNKIT_ACT_AVX2
  if constexpr (std::is_same_v<T, float>)
    j0 = gru_before_fwd_row_b8<KEEP>(n_, s, bn, z_, hp, hn, H);
#endif
  for (int64_t j = j0; j < H; ++j) {
    const T n = tanh_(n_[j] + bn[j] + s[j]);
    n_[j] = n;
    hn[j] = mix<T, KEEP>(z_[j], hp[j], n);
  }
}

template <typename T, bool KEEP>
void gru_forward_impl(T* rz, T* xn, T* rec, const StepMatrix<T>& W1, const StepMatrix<T>& W2,
                      const T* bias, const T* bhn, T* sc, T* hs, bool save, const bool* M,
                      const Steps& S, int64_t Tn, int64_t B, int64_t H, bool after, int64_t r0,
                      int64_t r1, const Regularizers<T>& rg = {}) {
  const int64_t RW = H;  // width of the rec cache: W_nh h + b_hn (after) or r ⊙ h (before)
  std::vector<T> hm(rg.m ? (r1 - r0) * H : 0);  // h_{t-1} ⊙ m: what the products read
  T* sc_rz = sc + r0 * 2 * H;  // scratch: h W_rz^T (B, 2H), then (r ⊙ h) W_nh^T (B, H)
  T* sc_n = sc + B * 2 * H + r0 * H;
  T* sc_all = sc + r0 * 3 * H;  // after: W_hh h (B, 3H)
  for (int64_t t = 0; t < Tn; ++t) {
    const int64_t bt = block_active(S.act[t], r0, r1);
    T* rzt = rz + (S.row(t) + r0) * 2 * H;
    T* nt = xn + (S.row(t) + r0) * H;
    T* rt = rec + ((save ? S.row(t) : 0) + r0) * RW;
    const T* hp = hs + (t * B + r0) * H;  // h_{t-1}: the update mixes it
    T* hn = hs + ((t + 1) * B + r0) * H;
    const bool* m = M ? M + t * B + r0 : nullptr;
    const T* hq = hp;  // what the products (and r ⊙ h) read
    if (rg.m) {
      for (int64_t k = 0; k < bt * H; ++k) hm[k] = hp[k] * rg.m[r0 * H + k];
      hq = hm.data();
    }
    if (after) {
      W1.mm(bt, hq, H, T(0), sc_all, 3 * H);  // W_hh h
      for (int64_t b = 0; b < bt; ++b) {
        T* rzb = rzt + b * 2 * H;
        const T* sb = sc_all + b * 3 * H;
        gru_after_fwd_row<T, KEEP>(rzb, rzb + H, nt + b * H, sb, sb + H, sb + 2 * H, rt + b * H,
                                   bias, bhn, hp + b * H, hn + b * H, H);
        if (rg.kh) zone_row(hn + b * H, hp + b * H, rg.kh + (t * B + r0 + b) * H, H);
        if (m && !m[b]) std::memcpy(hn + b * H, hp + b * H, H * sizeof(T));
      }
    } else {
      W1.mm(bt, hq, H, T(0), sc_rz, 2 * H);  // W_rz h
      for (int64_t b = 0; b < bt; ++b) {
        T* rzb = rzt + b * 2 * H;
        gru_before_fwd_row_a<T>(rzb, rzb + H, sc_rz + b * 2 * H, bias, hq + b * H, rt + b * H, H);
      }
      W2.mm(bt, rt, H, T(0), sc_n, H);  // W_nh (r⊙h)
      for (int64_t b = 0; b < bt; ++b) {
        gru_before_fwd_row_b<T, KEEP>(nt + b * H, sc_n + b * H, bias + 2 * H, rzt + b * 2 * H + H,
                                      hp + b * H, hn + b * H, H);
        if (rg.kh) zone_row(hn + b * H, hp + b * H, rg.kh + (t * B + r0 + b) * H, H);
        if (m && !m[b]) std::memcpy(hn + b * H, hp + b * H, H * sizeof(T));
      }
    }
    copy_rows(hn, hp, bt, r1 - r0, H);
    if (save && !S.packed()) zero_rows(rt, bt, r1 - r0, RW);
  }
}

// d_h holds ∂L/∂h_t on entry and the direct path to h_{t-1} on exit; writes d_az, d_an.
template <typename T, bool KEEP>
void gru_bwd_row_common(const T* __restrict z_, const T* __restrict n_, const T* __restrict hp,
                        T* __restrict dh, T* __restrict daz, T* __restrict dan, int64_t H) {
  for (int64_t j = 0; j < H; ++j) {
    const T z = z_[j], n = n_[j], d = dh[j];
    const T dz = (KEEP ? hp[j] - n : n - hp[j]) * d;
    const T dn = KEEP ? d * (T(1) - z) : d * z;
    dan[j] = dn * (T(1) - n * n);
    daz[j] = dz * (z * (T(1) - z));
    dh[j] = KEEP ? d * z : d - d * z;
  }
}

template <typename T>
void gru_after_bwd_row(const T* __restrict r_, const T* __restrict rec_n, const T* __restrict dan,
                       T* __restrict dar, T* __restrict hn, int64_t H) {
  for (int64_t j = 0; j < H; ++j) {
    const T r = r_[j];
    dar[j] = dan[j] * rec_n[j] * (r * (T(1) - r));
    hn[j] = dan[j] * r;  // the recurrent n-gradient (d_hp holds only this block)
  }
}

template <typename T>
void gru_before_bwd_row(const T* __restrict r_, const T* __restrict hp, const T* __restrict drh,
                        T* __restrict dar, T* __restrict dh, int64_t H) {
  for (int64_t j = 0; j < H; ++j) {
    const T r = r_[j];
    dar[j] = drh[j] * hp[j] * (r * (T(1) - r));
    dh[j] += drh[j] * r;
  }
}

template <typename T, bool KEEP>
void gru_backward_impl(const T* rz, const T* xn, const T* rec, const T* hs, const StepMatrix<T>& W1,
                       const StepMatrix<T>& W2, const bool* M, const Steps& S, const T* dout,
                       T* dxp, T* dhp, T* drh, T* dh, int64_t Tn, int64_t B, int64_t H, bool after,
                       int64_t r0, int64_t r1, const Regularizers<T>& rg = {}) {
  const int64_t G = 3 * H;
  dh += r0 * H;
  drh += r0 * H;
  // recurrent dropout: the products' gradient, of h_{t-1} ⊙ m, apart in dp, and h ⊙ m
  // itself; zoneout: d_h ⊙ d, which reaches h_{t-1} directly; the rows that ran the step
  std::vector<T> dp(rg.m ? (r1 - r0) * H : 0), hm(rg.m ? (r1 - r0) * H : 0);
  std::vector<T> direct(rg.kh ? (r1 - r0) * H : 0);
  std::vector<char> ran(rg.any() ? r1 - r0 : 0);
  for (int64_t t = Tn - 1; t >= 0; --t) {
    const int64_t bt = block_active(S.act[t], r0, r1);
    const T* rzt = rz + (S.row(t) + r0) * 2 * H;
    const T* nt = xn + (S.row(t) + r0) * H;
    const T* rt = rec + (S.row(t) + r0) * H;
    const T* hp = hs + (t * B + r0) * H;
    T* dx = dxp + (S.row(t) + r0) * G;
    T* dr = after ? dhp + (S.row(t) + r0) * H : dx;  // after: d_hp is (·, H)
    const bool* m = M ? M + t * B + r0 : nullptr;
    if (dout) add_into(dh, dout + (t * B + r0) * H, (r1 - r0) * H);
    const T* hq = hp;  // what the products read
    T* dq = dh;        // where their gradient goes
    if (rg.m) {
      for (int64_t k = 0; k < bt * H; ++k) hm[k] = hp[k] * rg.m[r0 * H + k];
      std::fill(dp.begin(), dp.begin() + bt * H, T(0));
      hq = hm.data();
      dq = dp.data();
    }
    for (int64_t b = 0; b < bt; ++b) {
      T* dxb = dx + b * G;
      if (rg.any()) ran[b] = 0;
      if (m && !m[b]) {  // a hole: no gate gradient, d_h passes through
        std::memset(dxb, 0, G * sizeof(T));
        if (after) std::memset(dr + b * H, 0, H * sizeof(T));
        continue;
      }
      if (rg.any()) ran[b] = 1;
      if (rg.kh) zone_split(dh + b * H, rg.kh + (t * B + r0 + b) * H, direct.data() + b * H, H);
      const T* rzb = rzt + b * 2 * H;
      gru_bwd_row_common<T, KEEP>(rzb + H, nt + b * H, hp + b * H, dh + b * H, dxb + H, dxb + 2 * H,
                                  H);
      if (after) gru_after_bwd_row<T>(rzb, rt + b * H, dxb + 2 * H, dxb, dr + b * H, H);
    }
    if (!S.packed()) zero_rows(dx, bt, r1 - r0, G);
    if (after) {
      if (!S.packed()) zero_rows(dr, bt, r1 - r0, H);
      W1.mm(bt, dx, G, T(1), dq, H);  // += d_rz W_rz
      W2.mm(bt, dr, H, T(1), dq, H);  // += (d_an ⊙ r) W_nh
    } else {
      // reset before: d(r⊙h) = d_an W_nh, then d_r and the path through r⊙h
      W2.mm(bt, dx + 2 * H, G, T(0), drh, H);
      for (int64_t b = 0; b < bt; ++b) {
        if (m && !m[b]) continue;
        gru_before_bwd_row<T>(rzt + b * 2 * H, hq + b * H, drh + b * H, dx + b * G, dq + b * H, H);
      }
      W1.mm(bt, dx, G, T(1), dq, H);  // += d_rz W_rz
    }
    if (rg.m || rg.kh)
      for (int64_t b = 0; b < bt; ++b) {
        if (!ran[b]) continue;
        if (rg.m) add_masked(dh + b * H, dp.data() + b * H, rg.m + (r0 + b) * H, H);
        if (rg.kh) add_into(dh + b * H, direct.data() + b * H, H);
      }
  }
}

}  // namespace
