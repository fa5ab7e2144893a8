// The simple (Elman) cell: the forward and backward loops over time of one thread's row block.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "activations.h"
#include "gemm.h"
#include "steps.h"

namespace {

// x: x_t W_ih^T, s: h_{t-1} W_hh^T, b: the bias
// ACT: 0 tanh, 1 relu, 2 the logistic sigmoid (phi' = h (1 - h)).
template <typename T, int ACT>
void rnn_fwd_row(const T* __restrict x, const T* __restrict s, const T* __restrict b,
                 T* __restrict h, int64_t H) {
  int64_t j0 = 0;
#ifdef RNNKIT_ACT_AVX2
  // float32 tanh and sigmoid: written out as in lstm.h (min/max clamps), equal to the bit
  if constexpr (std::is_same_v<T, float> && ACT != 1) {
    for (j0 = 0; j0 + 8 <= H; j0 += 8) {
      const __m256 a = sum8(x, b, s, j0);
      _mm256_storeu_ps(h + j0, ACT == 2 ? sigm8(a) : tanh8(a));
    }
  }
#endif
  for (int64_t j = j0; j < H; ++j) {
    const T a = x[j] + b[j] + s[j];
    h[j] = ACT == 1 ? (a < T(0) ? T(0) : a) : ACT == 2 ? sigm(a) : tanh_(a);
  }
}

template <typename T, int ACT>
void rnn_bwd_row(const T* __restrict h, T* __restrict dh, T* __restrict da, int64_t H) {
  for (int64_t j = 0; j < H; ++j) {
    da[j] = ACT == 1   ? (h[j] > T(0) ? dh[j] : T(0))
            : ACT == 2 ? dh[j] * (h[j] * (T(1) - h[j]))
                       : dh[j] * (T(1) - h[j] * h[j]);
    dh[j] = T(0);  // replaced by d_a W below
  }
}

// With zoneout (rg.kh), cand (T, B, H) receives the cell's own h̃_t, whose φ' the backward
// reads (h_t mixes in h_{t-1}).
template <typename T, int ACT>
void rnn_forward_impl(T* xp, const StepMatrix<T>& W, const T* bias, T* sc, T* hs, const bool* M,
                      const Steps& S, int64_t Tn, int64_t B, int64_t H, int64_t r0, int64_t r1,
                      const Regularizers<T>& rg = {}, T* cand = nullptr) {
  sc += r0 * H;
  std::vector<T> hm(rg.m ? (r1 - r0) * H : 0);  // h_{t-1} ⊙ m: what the product reads
  for (int64_t t = 0; t < Tn; ++t) {
    const int64_t bt = block_active(S.act[t], r0, r1);
    T* a = xp + (S.row(t) + r0) * H;
    const T* hp = hs + (t * B + r0) * H;
    T* hn = hs + ((t + 1) * B + r0) * H;
    const bool* m = M ? M + t * B + r0 : nullptr;
    const T* hq = hp;
    if (rg.m) {
      for (int64_t k = 0; k < bt * H; ++k) hm[k] = hp[k] * rg.m[r0 * H + k];
      hq = hm.data();
    }
    W.mm(bt, hq, H, T(0), sc, H);  // h W^T
    for (int64_t b = 0; b < bt; ++b) {
      if (m && !m[b]) {
        std::memcpy(hn + b * H, hp + b * H, H * sizeof(T));
        continue;
      }
      rnn_fwd_row<T, ACT>(a + b * H, sc + b * H, bias, hn + b * H, H);
      if (rg.kh) {
        const int64_t kb = (t * B + r0 + b) * H;
        std::memcpy(cand + kb, hn + b * H, H * sizeof(T));
        zone_row(hn + b * H, hp + b * H, rg.kh + kb, H);
      }
    }
    copy_rows(hn, hp, bt, r1 - r0, H);
  }
}

// cand: the forward's h̃_t where zoneout mixed them (rg.kh), else null.
template <typename T, int ACT>
void rnn_backward_impl(const T* hs, const StepMatrix<T>& W, const bool* M, const Steps& S,
                       const T* dout, T* dxp, T* dh, int64_t Tn, int64_t B, int64_t H, int64_t r0,
                       int64_t r1, const Regularizers<T>& rg = {}, const T* cand = nullptr) {
  dh += r0 * H;
  std::vector<T> direct(rg.kh ? (r1 - r0) * H : 0);  // d_h ⊙ d: straight to h_{t-1}
  std::vector<char> ran(rg.any() ? r1 - r0 : 0);
  for (int64_t t = Tn - 1; t >= 0; --t) {
    const int64_t bt = block_active(S.act[t], r0, r1);
    const T* h = rg.kh ? cand + (t * B + r0) * H : hs + ((t + 1) * B + r0) * H;
    T* da = dxp + (S.row(t) + r0) * H;
    const bool* m = M ? M + t * B + r0 : nullptr;
    if (dout) add_into(dh, dout + (t * B + r0) * H, (r1 - r0) * H);
    for (int64_t b = 0; b < bt; ++b) {
      if (rg.any()) ran[b] = !(m && !m[b]);
      if (m && !m[b]) {
        std::memset(da + b * H, 0, H * sizeof(T));
        continue;
      }
      if (rg.kh) zone_split(dh + b * H, rg.kh + (t * B + r0 + b) * H, direct.data() + b * H, H);
      rnn_bwd_row<T, ACT>(h + b * H, dh + b * H, da + b * H, H);
    }
    if (!S.packed()) zero_rows(da, bt, r1 - r0, H);
    W.mm(bt, da, H, T(1), dh, H);  // d_h_prev += d_a W
    if (rg.m || rg.kh)
      for (int64_t b = 0; b < bt; ++b) {
        if (!ran[b]) continue;
        T* dhb = dh + b * H;
        if (rg.m)  // the product read h_{t-1} ⊙ m (d_h held only its gradient here)
          for (int64_t j = 0; j < H; ++j) dhb[j] *= rg.m[(r0 + b) * H + j];
        if (rg.kh) add_into(dhb, direct.data() + b * H, H);
      }
  }
}

}  // namespace
