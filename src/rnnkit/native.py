"""The compiled time loop: the same forward and explicit BPTT as ``recurrence.py``, in C++.

The pure-PyTorch loop of ``recurrence.py`` pays 3–5 µs of Python and dispatch per eager
op, a dozen ops per step; at small sizes that is most of the time. This module compiles
(once, on first use, into a per-user cache) one C++ loop per cell kind that does, per
step, ONE matrix product through the BLAS torch links (``sgemm_``/``dgemm_``) and ONE
fused pass of the gate math over contiguous rows — forward, and the hand-written backward
of ``cells/*.py``. Inputs projections and every weight gradient stay single large matrix
products in ``recurrence.py``; this module only replaces the two loops over time, and
fills exactly the same buffers (``ForwardRecord`` and ``Sweep``), so either loop's
forward pairs with either loop's backward.

Rows that have finished stop costing: at step t only rows ``0 .. active_t − 1`` are
computed, where ``active_t − 1`` is the last row with a real step at or after t (the
caller sorts rows by their last real step, like packed sequences); a hole inside that
range still holds the state by selection, as in the PyTorch loop.

Availability: CPU tensors, float32 and float64, when a C++ compiler is present. If the
build fails, one warning line is logged and ``recurrence.py`` uses its PyTorch loop, which
stays the oracle (``RNNKIT_NATIVE=0`` or ``use_native(False)`` selects it explicitly).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import platform
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import Tensor

__all__ = ["available", "library", "supports", "use_native"]

_log = logging.getLogger("rnnkit")
_state: dict[str, object] = {"loaded": None, "failed": False}
_enabled = os.environ.get("RNNKIT_NATIVE", "1").strip().lower() not in ("0", "false", "no", "off")

_SOURCE = r"""
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

extern "C" {
void sgemm_(const char*, const char*, const int*, const int*, const int*, const float*,
            const float*, const int*, const float*, const int*, const float*, float*,
            const int*);
void dgemm_(const char*, const char*, const int*, const int*, const int*, const double*,
            const double*, const int*, const double*, const int*, const double*, double*,
            const int*);
}

namespace {

using at::Tensor;

inline void blas_gemm(char ta, char tb, int m, int n, int k, float alpha, const float* a,
                      int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  sgemm_(&ta, &tb, &m, &n, &k, &alpha, a, &lda, b, &ldb, &beta, c, &ldc);
}
inline void blas_gemm(char ta, char tb, int m, int n, int k, double alpha, const double* a,
                      int lda, const double* b, int ldb, double beta, double* c, int ldc) {
  dgemm_(&ta, &tb, &m, &n, &k, &alpha, a, &lda, b, &ldb, &beta, c, &ldc);
}

// Row-major C (m x n, ldc) = op(A) op(B) + beta C. BLAS is column-major, so compute
// C^T = op(B)^T op(A)^T: a row-major matrix is its own transpose read column-major.
template <typename T>
void gemm_rm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* A, int64_t lda,
             const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  blas_gemm(tb ? 'T' : 'N', ta ? 'T' : 'N', (int)n, (int)m, (int)k, T(1), B, (int)ldb, A,
            (int)lda, beta, C, (int)ldc);
}

// float32 exp/sigmoid/tanh: branch-free (Cephes polynomials, ~1-2 ulp) so that GCC
// vectorises the gate loops; NaN propagates. float64 uses the C library (exact oracle).
inline float exp_f(float x) {
  x = x > 88.0f ? 88.0f : x;
  x = x < -87.0f ? -87.0f : x;
  float fx = std::floor(x * 1.44269504088896341f + 0.5f);
  x = x - fx * 0.693359375f;
  x = x - fx * -2.12194440e-4f;
  float z = x * x;
  float y = 1.9875691500e-4f;
  y = y * x + 1.3981999507e-3f;
  y = y * x + 8.3334519073e-3f;
  y = y * x + 4.1665795894e-2f;
  y = y * x + 1.6666665459e-1f;
  y = y * x + 5.0000001201e-1f;
  y = y * z + x + 1.0f;
  int32_t e = (static_cast<int32_t>(fx) + 127) << 23;
  return y * std::bit_cast<float>(e);
}
inline float sigm(float x) { return 1.0f / (1.0f + exp_f(-x)); }
inline float tanh_(float x) {
  float ax = std::fabs(x);
  float big = 1.0f - 2.0f / (exp_f(2.0f * ax) + 1.0f);
  float z = x * x;
  float p = ((((-5.70498872745e-3f * z + 2.06390887954e-2f) * z - 5.37397155531e-2f) * z +
              1.33314422036e-1f) * z - 3.33332819422e-1f) * z * ax + ax;
  return std::copysign(ax < 0.625f ? p : big, x);
}
inline double sigm(double x) { return 1.0 / (1.0 + std::exp(-x)); }
inline double tanh_(double x) { return std::tanh(x); }

// Rows processed at step t: 1 + the last row with a real step at or after t.
std::vector<int64_t> active_rows(const std::optional<Tensor>& mask, int64_t T, int64_t B) {
  std::vector<int64_t> active(T, B);
  if (!mask.has_value()) return active;
  const bool* M = mask->data_ptr<bool>();
  std::vector<int64_t> last(B, -1);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < B; ++b)
      if (M[t * B + b]) last[b] = t;
  int64_t top = B;
  for (int64_t t = 0; t < T; ++t) {
    while (top > 0 && last[top - 1] < t) --top;
    active[t] = top;
  }
  return active;
}

void check(const Tensor& t, const char* name, int64_t dim) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be on the CPU");
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
  TORCH_CHECK(t.dim() == dim, name, " must have ", dim, " dimensions");
}

const bool* mask_ptr(const std::optional<Tensor>& mask, int64_t T, int64_t B) {
  if (!mask.has_value()) return nullptr;
  check(*mask, "mask", 2);
  TORCH_CHECK(mask->scalar_type() == at::kBool && mask->size(0) == T && mask->size(1) == B,
              "mask must be (T, B) bool");
  return mask->data_ptr<bool>();
}

int64_t grain_rows(int64_t width) {
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(width, 1));
}

template <typename F>
void rows(int64_t n, int64_t width, const F& f) {
  if (n > 0) at::parallel_for(0, n, grain_rows(width), f);
}

template <typename T>
void add_into(T* __restrict a, const T* __restrict b, int64_t n) {
  for (int64_t j = 0; j < n; ++j) a[j] += b[j];
}

// Each fused pass over one row is its own function with __restrict parameters: that is
// what lets GCC vectorise it (inside the lambdas, with derived pointers, it gives up).

// ---------------------------------------------------------------- simple cell
template <typename T, bool RELU>
void rnn_fwd_row(const T* __restrict a, T* __restrict h, int64_t H) {
  for (int64_t j = 0; j < H; ++j) h[j] = RELU ? (a[j] < T(0) ? T(0) : a[j]) : tanh_(a[j]);
}

template <typename T, bool RELU>
void rnn_bwd_row(const T* __restrict h, T* __restrict dh, T* __restrict da, int64_t H) {
  for (int64_t j = 0; j < H; ++j) {
    da[j] = RELU ? (h[j] > T(0) ? dh[j] : T(0)) : dh[j] * (T(1) - h[j] * h[j]);
    dh[j] = T(0);  // replaced by d_a W below
  }
}

template <typename T, bool RELU>
void rnn_forward_impl(T* xp, const T* w, T* hs, const bool* M, const std::vector<int64_t>& act,
                      int64_t Tn, int64_t B, int64_t H) {
  for (int64_t t = 0; t < Tn; ++t) {
    const int64_t bt = act[t];
    T* a = xp + t * B * H;
    const T* hp = hs + t * B * H;
    T* hn = hs + (t + 1) * B * H;
    const bool* m = M ? M + t * B : nullptr;
    gemm_rm<T>(false, true, bt, H, H, hp, H, w, H, T(1), a, H);  // a += h W^T
    rows(bt, H, [&](int64_t r0, int64_t r1) {
      for (int64_t b = r0; b < r1; ++b) {
        if (m && !m[b])
          std::memcpy(hn + b * H, hp + b * H, H * sizeof(T));
        else
          rnn_fwd_row<T, RELU>(a + b * H, hn + b * H, H);
      }
    });
    if (bt < B) std::memcpy(hn + bt * H, hp + bt * H, (B - bt) * H * sizeof(T));
  }
}

template <typename T, bool RELU>
void rnn_backward_impl(const T* hs, const T* w, const bool* M, const std::vector<int64_t>& act,
                       const T* dout, T* dxp, T* dh, int64_t Tn, int64_t B, int64_t H) {
  for (int64_t t = Tn - 1; t >= 0; --t) {
    const int64_t bt = act[t];
    const T* h = hs + (t + 1) * B * H;
    T* da = dxp + t * B * H;
    const bool* m = M ? M + t * B : nullptr;
    if (dout) add_into(dh, dout + t * B * H, B * H);
    rows(bt, H, [&](int64_t r0, int64_t r1) {
      for (int64_t b = r0; b < r1; ++b) {
        if (m && !m[b])
          std::memset(da + b * H, 0, H * sizeof(T));
        else
          rnn_bwd_row<T, RELU>(h + b * H, dh + b * H, da + b * H, H);
      }
    });
    if (bt < B) std::memset(da + bt * H, 0, (B - bt) * H * sizeof(T));
    gemm_rm<T>(false, false, bt, H, H, da, H, w, H, T(1), dh, H);  // d_h_prev += d_a W
  }
}

// ---------------------------------------------------------------- LSTM (i, f, g, o)
template <typename T>
void lstm_fwd_row(T* __restrict gi, T* __restrict gf, T* __restrict gg, T* __restrict go,
                  const T* __restrict cp, T* __restrict cn, T* __restrict hn,
                  T* __restrict tc, int64_t H) {
  for (int64_t j = 0; j < H; ++j) {
    const T i = sigm(gi[j]), f = sigm(gf[j]), g = tanh_(gg[j]), o = sigm(go[j]);
    gi[j] = i;
    gf[j] = f;
    gg[j] = g;
    go[j] = o;
    const T c = f * cp[j] + i * g;
    const T tcj = tanh_(c);
    cn[j] = c;
    tc[j] = tcj;
    hn[j] = o * tcj;
  }
}

template <typename T>
void lstm_bwd_row(const T* __restrict gi, const T* __restrict gf, const T* __restrict gg,
                  const T* __restrict go, const T* __restrict tc, const T* __restrict cp,
                  T* __restrict dh, T* __restrict dc, T* __restrict di, T* __restrict df,
                  T* __restrict dg, T* __restrict dout, int64_t H) {
  for (int64_t j = 0; j < H; ++j) {
    const T i = gi[j], f = gf[j], g = gg[j], o = go[j], tcj = tc[j], dhj = dh[j];
    const T dct = dc[j] + dhj * o * (T(1) - tcj * tcj);
    di[j] = dct * g * (i * (T(1) - i));
    df[j] = dct * cp[j] * (f * (T(1) - f));
    dg[j] = dct * i * (T(1) - g * g);
    dout[j] = dhj * tcj * (o * (T(1) - o));
    dc[j] = dct * f;
    dh[j] = T(0);  // replaced by d_gates W_hh below
  }
}

template <typename T>
void lstm_forward_impl(T* xp, const T* w, T* hs, T* cs, T* tc, bool save, const bool* M,
                       const std::vector<int64_t>& act, int64_t Tn, int64_t B, int64_t H) {
  const int64_t G = 4 * H;
  for (int64_t t = 0; t < Tn; ++t) {
    const int64_t bt = act[t];
    T* g = xp + t * B * G;
    const T* hp = hs + t * B * H;
    const T* cp = cs + t * B * H;
    T* hn = hs + (t + 1) * B * H;
    T* cn = cs + (t + 1) * B * H;
    T* tct = save ? tc + t * B * H : tc;
    const bool* m = M ? M + t * B : nullptr;
    gemm_rm<T>(false, true, bt, G, H, hp, H, w, H, T(1), g, G);  // gates += h W_hh^T
    rows(bt, G, [&](int64_t r0, int64_t r1) {
      for (int64_t b = r0; b < r1; ++b) {
        T* gb = g + b * G;
        lstm_fwd_row<T>(gb, gb + H, gb + 2 * H, gb + 3 * H, cp + b * H, cn + b * H, hn + b * H,
                        tct + b * H, H);
        if (m && !m[b]) {  // a hole: hold the state
          std::memcpy(hn + b * H, hp + b * H, H * sizeof(T));
          std::memcpy(cn + b * H, cp + b * H, H * sizeof(T));
        }
      }
    });
    if (bt < B) {
      std::memcpy(hn + bt * H, hp + bt * H, (B - bt) * H * sizeof(T));
      std::memcpy(cn + bt * H, cp + bt * H, (B - bt) * H * sizeof(T));
      if (save) std::memset(tct + bt * H, 0, (B - bt) * H * sizeof(T));
    }
  }
}

template <typename T>
void lstm_backward_impl(const T* gates, const T* tc, const T* cs, const T* w, const bool* M,
                        const std::vector<int64_t>& act, const T* dout, T* dxp, T* dh, T* dc,
                        int64_t Tn, int64_t B, int64_t H) {
  const int64_t G = 4 * H;
  for (int64_t t = Tn - 1; t >= 0; --t) {
    const int64_t bt = act[t];
    const T* g = gates + t * B * G;
    const T* tct = tc + t * B * H;
    const T* cp = cs + t * B * H;
    T* dg = dxp + t * B * G;
    const bool* m = M ? M + t * B : nullptr;
    if (dout) add_into(dh, dout + t * B * H, B * H);
    rows(bt, G, [&](int64_t r0, int64_t r1) {
      for (int64_t b = r0; b < r1; ++b) {
        T* d = dg + b * G;
        if (m && !m[b]) {  // a hole: no gate gradient, d_h and d_c pass through
          std::memset(d, 0, G * sizeof(T));
          continue;
        }
        const T* gb = g + b * G;
        lstm_bwd_row<T>(gb, gb + H, gb + 2 * H, gb + 3 * H, tct + b * H, cp + b * H, dh + b * H,
                        dc + b * H, d, d + H, d + 2 * H, d + 3 * H, H);
      }
    });
    if (bt < B) std::memset(dg + bt * G, 0, (B - bt) * G * sizeof(T));
    gemm_rm<T>(false, false, bt, H, G, dg, G, w, H, T(1), dh, H);  // d_h_prev += d_gates W_hh
  }
}

// ---------------------------------------------------------------- GRU (r, z, n)
template <typename T, bool KEEP>
inline T mix(T z, T hp, T n) {
  return KEEP ? n + z * (hp - n) : hp + z * (n - hp);  // h_t from z, h_{t-1} and n
}

template <typename T, bool KEEP>
void gru_after_fwd_row(T* __restrict r_, T* __restrict z_, T* __restrict n_,
                       const T* __restrict rec_r, const T* __restrict rec_z,
                       T* __restrict rec_n, const T* __restrict bhn, const T* __restrict hp,
                       T* __restrict hn, int64_t H) {
  for (int64_t j = 0; j < H; ++j) {
    const T rn = rec_n[j] + bhn[j];
    rec_n[j] = rn;
    const T r = sigm(r_[j] + rec_r[j]);
    const T z = sigm(z_[j] + rec_z[j]);
    const T n = tanh_(n_[j] + r * rn);
    r_[j] = r;
    z_[j] = z;
    n_[j] = n;
    hn[j] = mix<T, KEEP>(z, hp[j], n);
  }
}

template <typename T>
void gru_before_fwd_row_a(T* __restrict r_, T* __restrict z_, const T* __restrict hp,
                          T* __restrict rh, int64_t H) {
  for (int64_t j = 0; j < H; ++j) {
    const T r = sigm(r_[j]);
    r_[j] = r;
    z_[j] = sigm(z_[j]);
    rh[j] = r * hp[j];  // r ⊙ h_{t-1}
  }
}

template <typename T, bool KEEP>
void gru_before_fwd_row_b(T* __restrict n_, const T* __restrict z_, const T* __restrict hp,
                          T* __restrict hn, int64_t H) {
  for (int64_t j = 0; j < H; ++j) {
    const T n = tanh_(n_[j]);
    n_[j] = n;
    hn[j] = mix<T, KEEP>(z_[j], hp[j], n);
  }
}

template <typename T, bool KEEP>
void gru_forward_impl(T* rz, T* xn, T* rec, const T* w, const T* bhn, T* hs, bool save,
                      const bool* M, const std::vector<int64_t>& act, int64_t Tn, int64_t B,
                      int64_t H, bool after) {
  const int64_t RW = after ? 3 * H : H;  // width of the rec cache
  for (int64_t t = 0; t < Tn; ++t) {
    const int64_t bt = act[t];
    T* rzt = rz + t * B * 2 * H;
    T* nt = xn + t * B * H;
    T* rt = save ? rec + t * B * RW : rec;
    const T* hp = hs + t * B * H;
    T* hn = hs + (t + 1) * B * H;
    const bool* m = M ? M + t * B : nullptr;
    if (after) {
      gemm_rm<T>(false, true, bt, 3 * H, H, hp, H, w, H, T(0), rt, 3 * H);  // W_hh h
      rows(bt, 3 * H, [&](int64_t r0, int64_t r1) {
        for (int64_t b = r0; b < r1; ++b) {
          T* rzb = rzt + b * 2 * H;
          T* rb = rt + b * 3 * H;
          gru_after_fwd_row<T, KEEP>(rzb, rzb + H, nt + b * H, rb, rb + H, rb + 2 * H, bhn,
                                     hp + b * H, hn + b * H, H);
          if (m && !m[b]) std::memcpy(hn + b * H, hp + b * H, H * sizeof(T));
        }
      });
    } else {
      gemm_rm<T>(false, true, bt, 2 * H, H, hp, H, w, H, T(1), rzt, 2 * H);  // + W_rz h
      rows(bt, 2 * H, [&](int64_t r0, int64_t r1) {
        for (int64_t b = r0; b < r1; ++b) {
          T* rzb = rzt + b * 2 * H;
          gru_before_fwd_row_a<T>(rzb, rzb + H, hp + b * H, rt + b * H, H);
        }
      });
      gemm_rm<T>(false, true, bt, H, H, rt, H, w + 2 * H * H, H, T(1), nt, H);  // + W_nh (r⊙h)
      rows(bt, H, [&](int64_t r0, int64_t r1) {
        for (int64_t b = r0; b < r1; ++b) {
          gru_before_fwd_row_b<T, KEEP>(nt + b * H, rzt + b * 2 * H + H, hp + b * H, hn + b * H,
                                        H);
          if (m && !m[b]) std::memcpy(hn + b * H, hp + b * H, H * sizeof(T));
        }
      });
    }
    if (bt < B) {
      std::memcpy(hn + bt * H, hp + bt * H, (B - bt) * H * sizeof(T));
      if (save) std::memset(rt + bt * RW, 0, (B - bt) * RW * sizeof(T));
    }
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
void gru_after_bwd_row(const T* __restrict r_, const T* __restrict rec_n,
                       const T* __restrict daz, const T* __restrict dan, T* __restrict dar,
                       T* __restrict hr, T* __restrict hz, T* __restrict hn, int64_t H) {
  for (int64_t j = 0; j < H; ++j) {
    const T r = r_[j];
    const T d = dan[j] * rec_n[j] * (r * (T(1) - r));
    dar[j] = d;
    hr[j] = d;
    hz[j] = daz[j];
    hn[j] = dan[j] * r;
  }
}

template <typename T>
void gru_before_bwd_row(const T* __restrict r_, const T* __restrict hp,
                        const T* __restrict drh, T* __restrict dar, T* __restrict dh,
                        int64_t H) {
  for (int64_t j = 0; j < H; ++j) {
    const T r = r_[j];
    dar[j] = drh[j] * hp[j] * (r * (T(1) - r));
    dh[j] += drh[j] * r;
  }
}

template <typename T, bool KEEP>
void gru_backward_impl(const T* rz, const T* xn, const T* rec, const T* hs, const T* w,
                       const bool* M, const std::vector<int64_t>& act, const T* dout, T* dxp,
                       T* dhp, T* drh, T* dh, int64_t Tn, int64_t B, int64_t H, bool after) {
  const int64_t G = 3 * H;
  const int64_t RW = after ? 3 * H : H;
  for (int64_t t = Tn - 1; t >= 0; --t) {
    const int64_t bt = act[t];
    const T* rzt = rz + t * B * 2 * H;
    const T* nt = xn + t * B * H;
    const T* rt = rec + t * B * RW;
    const T* hp = hs + t * B * H;
    T* dx = dxp + t * B * G;
    T* dr = after ? dhp + t * B * G : dx;
    const bool* m = M ? M + t * B : nullptr;
    if (dout) add_into(dh, dout + t * B * H, B * H);
    rows(bt, G, [&](int64_t r0, int64_t r1) {
      for (int64_t b = r0; b < r1; ++b) {
        T* dxb = dx + b * G;
        if (m && !m[b]) {  // a hole: no gate gradient, d_h passes through
          std::memset(dxb, 0, G * sizeof(T));
          if (after) std::memset(dr + b * G, 0, G * sizeof(T));
          continue;
        }
        const T* rzb = rzt + b * 2 * H;
        gru_bwd_row_common<T, KEEP>(rzb + H, nt + b * H, hp + b * H, dh + b * H, dxb + H,
                                    dxb + 2 * H, H);
        if (after) {
          T* drb = dr + b * G;
          gru_after_bwd_row<T>(rzb, rt + b * 3 * H + 2 * H, dxb + H, dxb + 2 * H, dxb, drb,
                               drb + H, drb + 2 * H, H);
        }
      }
    });
    if (bt < B) {
      std::memset(dx + bt * G, 0, (B - bt) * G * sizeof(T));
      if (after) std::memset(dr + bt * G, 0, (B - bt) * G * sizeof(T));
    }
    if (after) {
      gemm_rm<T>(false, false, bt, H, G, dr, G, w, H, T(1), dh, H);  // += d_hp W_hh
      continue;
    }
    // reset before: d(r⊙h) = d_an W_nh, then d_r and the path through r⊙h
    gemm_rm<T>(false, false, bt, H, H, dx + 2 * H, G, w + 2 * H * H, H, T(0), drh, H);
    rows(bt, H, [&](int64_t r0, int64_t r1) {
      for (int64_t b = r0; b < r1; ++b) {
        if (m && !m[b]) continue;
        gru_before_bwd_row<T>(rzt + b * 2 * H, hp + b * H, drh + b * H, dx + b * G, dh + b * H,
                              H);
      }
    });
    gemm_rm<T>(false, false, bt, H, 2 * H, dx, G, w, H, T(1), dh, H);  // += d_rz W_rz
  }
}

// ---------------------------------------------------------------- entry points
std::vector<Tensor> rnn_forward(Tensor xp, Tensor w_hh, Tensor h0, std::optional<Tensor> mask,
                                bool relu) {
  check(xp, "xp", 3);
  check(w_hh, "w_hh", 2);
  const int64_t Tn = xp.size(0), B = xp.size(1), H = xp.size(2);
  const bool* M = mask_ptr(mask, Tn, B);
  auto act = active_rows(mask, Tn, B);
  Tensor hs = at::empty({Tn + 1, B, H}, xp.options());
  hs[0].copy_(h0);
  AT_DISPATCH_FLOATING_TYPES(xp.scalar_type(), "rnn_forward", [&] {
    auto f = relu ? rnn_forward_impl<scalar_t, true> : rnn_forward_impl<scalar_t, false>;
    f(xp.data_ptr<scalar_t>(), w_hh.data_ptr<scalar_t>(), hs.data_ptr<scalar_t>(), M, act, Tn,
      B, H);
  });
  return {hs};
}

std::vector<Tensor> rnn_backward(Tensor hs, Tensor w_hh, std::optional<Tensor> mask,
                                 std::optional<Tensor> d_out, Tensor d_h, bool relu) {
  check(hs, "hs", 3);
  check(w_hh, "w_hh", 2);
  check(d_h, "d_h", 2);
  const int64_t Tn = hs.size(0) - 1, B = hs.size(1), H = hs.size(2);
  const bool* M = mask_ptr(mask, Tn, B);
  auto act = active_rows(mask, Tn, B);
  Tensor dxp = at::empty({Tn, B, H}, hs.options());
  AT_DISPATCH_FLOATING_TYPES(hs.scalar_type(), "rnn_backward", [&] {
    auto f = relu ? rnn_backward_impl<scalar_t, true> : rnn_backward_impl<scalar_t, false>;
    f(hs.data_ptr<scalar_t>(), w_hh.data_ptr<scalar_t>(), M, act,
      d_out ? d_out->data_ptr<scalar_t>() : nullptr, dxp.data_ptr<scalar_t>(),
      d_h.data_ptr<scalar_t>(), Tn, B, H);
  });
  return {dxp, d_h};
}

std::vector<Tensor> lstm_forward(Tensor xp, Tensor w_hh, Tensor h0, Tensor c0,
                                 std::optional<Tensor> mask, bool save) {
  check(xp, "xp", 3);
  check(w_hh, "w_hh", 2);
  const int64_t Tn = xp.size(0), B = xp.size(1), H = h0.size(1);
  TORCH_CHECK(xp.size(2) == 4 * H && w_hh.size(0) == 4 * H && w_hh.size(1) == H);
  const bool* M = mask_ptr(mask, Tn, B);
  auto act = active_rows(mask, Tn, B);
  Tensor hs = at::empty({Tn + 1, B, H}, xp.options());
  Tensor cs = at::empty({Tn + 1, B, H}, xp.options());
  Tensor tc = at::empty({save ? Tn : 1, B, H}, xp.options());
  hs[0].copy_(h0);
  cs[0].copy_(c0);
  AT_DISPATCH_FLOATING_TYPES(xp.scalar_type(), "lstm_forward", [&] {
    lstm_forward_impl<scalar_t>(xp.data_ptr<scalar_t>(), w_hh.data_ptr<scalar_t>(),
                                hs.data_ptr<scalar_t>(), cs.data_ptr<scalar_t>(),
                                tc.data_ptr<scalar_t>(), save, M, act, Tn, B, H);
  });
  if (!save) tc = tc.expand({Tn, B, H});
  return {hs, cs, tc};
}

std::vector<Tensor> lstm_backward(Tensor gates, Tensor tc, Tensor cs, Tensor w_hh,
                                  std::optional<Tensor> mask, std::optional<Tensor> d_out,
                                  Tensor d_h, Tensor d_c) {
  check(gates, "gates", 3);
  check(tc, "tanh_c", 3);
  check(cs, "cs", 3);
  check(w_hh, "w_hh", 2);
  check(d_h, "d_h", 2);
  check(d_c, "d_c", 2);
  const int64_t Tn = gates.size(0), B = gates.size(1), H = tc.size(2);
  const bool* M = mask_ptr(mask, Tn, B);
  auto act = active_rows(mask, Tn, B);
  Tensor dxp = at::empty({Tn, B, 4 * H}, gates.options());
  AT_DISPATCH_FLOATING_TYPES(gates.scalar_type(), "lstm_backward", [&] {
    lstm_backward_impl<scalar_t>(gates.data_ptr<scalar_t>(), tc.data_ptr<scalar_t>(),
                                 cs.data_ptr<scalar_t>(), w_hh.data_ptr<scalar_t>(), M, act,
                                 d_out ? d_out->data_ptr<scalar_t>() : nullptr,
                                 dxp.data_ptr<scalar_t>(), d_h.data_ptr<scalar_t>(),
                                 d_c.data_ptr<scalar_t>(), Tn, B, H);
  });
  return {dxp, d_h, d_c};
}

std::vector<Tensor> gru_forward(Tensor rz, Tensor xn, Tensor w_hh, std::optional<Tensor> b_hn,
                                Tensor h0, std::optional<Tensor> mask, bool save, bool keep,
                                bool after) {
  check(rz, "xp_rz", 3);
  check(xn, "xp_n", 3);
  check(w_hh, "w_hh", 2);
  const int64_t Tn = xn.size(0), B = xn.size(1), H = xn.size(2);
  TORCH_CHECK(!after || b_hn.has_value(), "reset='after' needs bias_hn");
  const bool* M = mask_ptr(mask, Tn, B);
  auto act = active_rows(mask, Tn, B);
  Tensor hs = at::empty({Tn + 1, B, H}, xn.options());
  const int64_t RW = after ? 3 * H : H;
  Tensor rec = at::empty({save ? Tn : 1, B, RW}, xn.options());
  hs[0].copy_(h0);
  AT_DISPATCH_FLOATING_TYPES(xn.scalar_type(), "gru_forward", [&] {
    auto f = keep ? gru_forward_impl<scalar_t, true> : gru_forward_impl<scalar_t, false>;
    f(rz.data_ptr<scalar_t>(), xn.data_ptr<scalar_t>(), rec.data_ptr<scalar_t>(),
      w_hh.data_ptr<scalar_t>(), after ? b_hn->data_ptr<scalar_t>() : nullptr,
      hs.data_ptr<scalar_t>(), save, M, act, Tn, B, H, after);
  });
  if (!save) rec = rec.expand({Tn, B, RW});
  return {hs, rec};
}

std::vector<Tensor> gru_backward(Tensor rz, Tensor xn, Tensor rec, Tensor hs, Tensor w_hh,
                                 std::optional<Tensor> mask, std::optional<Tensor> d_out,
                                 Tensor d_h, bool keep, bool after) {
  check(rz, "rz", 3);
  check(xn, "n", 3);
  check(rec, "rec", 3);
  check(hs, "hs", 3);
  check(w_hh, "w_hh", 2);
  check(d_h, "d_h", 2);
  const int64_t Tn = xn.size(0), B = xn.size(1), H = xn.size(2);
  const bool* M = mask_ptr(mask, Tn, B);
  auto act = active_rows(mask, Tn, B);
  Tensor dxp = at::empty({Tn, B, 3 * H}, xn.options());
  Tensor dhp = after ? at::empty({Tn, B, 3 * H}, xn.options()) : dxp;
  Tensor drh = at::empty({after ? 1 : B, H}, xn.options());
  AT_DISPATCH_FLOATING_TYPES(xn.scalar_type(), "gru_backward", [&] {
    auto f = keep ? gru_backward_impl<scalar_t, true> : gru_backward_impl<scalar_t, false>;
    f(rz.data_ptr<scalar_t>(), xn.data_ptr<scalar_t>(), rec.data_ptr<scalar_t>(),
      hs.data_ptr<scalar_t>(), w_hh.data_ptr<scalar_t>(), M, act,
      d_out ? d_out->data_ptr<scalar_t>() : nullptr, dxp.data_ptr<scalar_t>(),
      dhp.data_ptr<scalar_t>(), drh.data_ptr<scalar_t>(), d_h.data_ptr<scalar_t>(), Tn, B, H,
      after);
  });
  return {dxp, dhp, d_h};
}

}  // namespace

TORCH_LIBRARY(rnnkit_native, m) {
  m.def("rnn_forward(Tensor(a!) xp, Tensor w_hh, Tensor h0, Tensor? mask, bool relu) -> Tensor[]",
        &rnn_forward);
  m.def("rnn_backward(Tensor hs, Tensor w_hh, Tensor? mask, Tensor? d_out, Tensor(a!) d_h, "
        "bool relu) -> Tensor[]",
        &rnn_backward);
  m.def("lstm_forward(Tensor(a!) xp, Tensor w_hh, Tensor h0, Tensor c0, Tensor? mask, "
        "bool save) -> Tensor[]",
        &lstm_forward);
  m.def("lstm_backward(Tensor gates, Tensor tanh_c, Tensor cs, Tensor w_hh, Tensor? mask, "
        "Tensor? d_out, Tensor(a!) d_h, Tensor(b!) d_c) -> Tensor[]",
        &lstm_backward);
  m.def("gru_forward(Tensor(a!) xp_rz, Tensor(b!) xp_n, Tensor w_hh, Tensor? bias_hn, "
        "Tensor h0, Tensor? mask, bool save, bool keep, bool after) -> Tensor[]",
        &gru_forward);
  m.def("gru_backward(Tensor rz, Tensor n, Tensor rec, Tensor hs, Tensor w_hh, Tensor? mask, "
        "Tensor? d_out, Tensor(a!) d_h, bool keep, bool after) -> Tensor[]",
        &gru_backward);
}
"""


def _flags() -> list[str]:
    flags = ["-O3", "-std=c++20", "-fPIC", "-shared", "-fopenmp"]
    flags += ["-fno-math-errno", "-fno-trapping-math", "-w"]
    if platform.machine() in ("x86_64", "AMD64"):
        capability = torch.backends.cpu.get_cpu_capability()
        if capability in ("AVX2", "AVX512"):
            flags.append("-march=x86-64-v3")  # AVX2 + FMA: the gate loops vectorise
    return flags


def _build(target: Path) -> None:
    from torch.utils import cpp_extension

    torch_lib = Path(torch.__file__).resolve().parent / "lib"
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    cxx = os.environ.get("CXX", "c++")
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "rnnkit_native.cpp"
        src.write_text(_SOURCE)
        out = Path(tmp) / target.name
        cmd = [cxx, *_flags(), f"-D_GLIBCXX_USE_CXX11_ABI={abi}"]
        cmd += [f"-I{p}" for p in cpp_extension.include_paths()]
        cmd += [str(src), "-o", str(out), f"-L{torch_lib}", f"-Wl,-rpath,{torch_lib}"]
        cmd += ["-lc10", "-ltorch_cpu"]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise RuntimeError(" | ".join(tail) or f"{cxx} exited with {proc.returncode}")
        os.replace(out, target)  # atomic: a concurrent reader sees all or nothing


def _cache_dir() -> Path:
    """``$RNNKIT_CACHE``, else ``$XDG_CACHE_HOME/rnnkit``, else ``~/.cache/rnnkit``."""
    if os.environ.get("RNNKIT_CACHE"):
        return Path(os.environ["RNNKIT_CACHE"])
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "rnnkit"


def _load() -> bool:
    key = "\0".join([_SOURCE, *_flags(), torch.__version__, sys.platform])
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    cache = _cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / f"rnnkit_native_{digest}.so"
    if not target.exists():
        with open(cache / f"rnnkit_native_{digest}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one process builds, the others wait
            if not target.exists():
                _build(target)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.ops.load_library(str(target))
    return True


def library() -> object | None:
    """``torch.ops.rnnkit_native`` (built on first use), or None where unavailable."""
    if not _enabled or _state["failed"]:
        return None
    if _state["loaded"] is None:
        try:
            _load()
            _state["loaded"] = torch.ops.rnnkit_native
        except Exception as exc:  # any build or load failure means: use the PyTorch loop
            _state["failed"] = True
            _log.warning("rnnkit: compiled time loop unavailable (%s); using the PyTorch loop", exc)
            return None
    return _state["loaded"]


def supports(*tensors: Tensor | None) -> bool:
    """Whether the compiled loop handles these tensors (CPU, float32/float64)."""
    return all(
        t is None or (t.device.type == "cpu" and t.dtype in (torch.float32, torch.float64))
        for t in tensors
    )


def available() -> bool:
    """Whether the compiled loop is enabled and built (builds it if needed)."""
    return library() is not None


@contextlib.contextmanager
def use_native(enabled: bool) -> Iterator[None]:
    """Select the compiled loop (True) or the PyTorch loop (False) inside the block.

    >>> with use_native(False):
    ...     pass
    """
    global _enabled
    before = _enabled
    _enabled = bool(enabled)
    try:
        yield
    finally:
        _enabled = before
