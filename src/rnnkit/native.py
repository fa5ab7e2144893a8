"""The compiled time loop: the same forward and explicit BPTT as ``recurrence.py``, in C++.

The pure-PyTorch loop of ``recurrence.py`` pays 3–5 µs of Python and dispatch per eager
op, a dozen ops per step; at small sizes that is most of the time. This module compiles
(once, on first use, into a per-user cache) one C++ loop per cell kind that does, per
step, ONE matrix product (float32: W_hh packed once per call and a register-blocked AVX2
kernel; float64: the BLAS torch links) and ONE fused pass of the gate math over
contiguous rows — forward, and the hand-written backward of ``cells/*.py``. Input
projections and every weight gradient stay single large matrix products in
``recurrence.py``; this module only replaces the two loops over time and fills the same
buffers (``ForwardRecord`` and ``Sweep``), so either loop's forward pairs with either
loop's backward.

Sequences are independent, so each thread runs the whole loop over its own block of rows
(no synchronisation per step). Rows that have finished stop costing: at step t only rows
``0 .. act_t − 1`` are computed, ``act_t − 1`` being the last row with a real step at or
after t (``run_recurrence`` sorts rows by their last real step, like packed sequences, and
may pack the step buffers to those rows: ``recurrence.Packing``); a hole inside that range
still holds the state by selection, as in the PyTorch loop.

Availability: CPU tensors, float32 and float64, when a C++ compiler is present (``$CXX``,
else ``c++``; the cache is ``$RNNKIT_CACHE``, else ``~/.cache/rnnkit``). If the build or
the load fails, one warning line is logged and ``recurrence.py`` uses its PyTorch loop,
which stays the oracle (``RNNKIT_NATIVE=0`` or ``use_native(False)`` selects it
explicitly); a failed build is remembered in the cache and not retried by later processes.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import Tensor

from rnnkit import messages

__all__ = ["available", "build", "library", "supports", "use_native"]

_state: dict[str, object] = {"loaded": None, "failed": False}
_lock = threading.Lock()  # one load per process: a namespace registers only once
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

// The recurrent product of every step, C (m x n) = A (m x k) · B + beta C, with B fixed for
// the whole call. float32: B is packed once per call into 16-column panels and multiplied
// by a register-blocked AVX2/FMA kernel (6 x 16 tile): the products of one step are thin
// (m = the rows of one thread's block, 4 .. 64), where this runs at ~105 GFLOP/s a core
// here against 55-90 for the BLAS. K is summed in blocks of 256 (accuracy like the BLAS).
// float64 (the exact oracle path) and CPUs without AVX2 call the BLAS.
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define RNNKIT_PACKED_GEMM 1
constexpr int NR = 16;
constexpr int64_t KC = 256;

template <int MR>
inline void kern(int64_t K, const float* __restrict A, int64_t lda, const float* __restrict Bp,
                 float* C, int64_t ldc, int nv, bool add) {
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00,
         c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
  const float* a0 = A;
  const float* a1 = A + lda;
  const float* a2 = A + 2 * lda;
  const float* a3 = A + 3 * lda;
  const float* a4 = A + 4 * lda;
  const float* a5 = A + 5 * lda;
  for (int64_t k = 0; k < K; ++k) {
    const __m256 b0 = _mm256_loadu_ps(Bp + k * NR), b1 = _mm256_loadu_ps(Bp + k * NR + 8);
    __m256 a = _mm256_broadcast_ss(a0 + k);
    c00 = _mm256_fmadd_ps(a, b0, c00);
    c01 = _mm256_fmadd_ps(a, b1, c01);
    if constexpr (MR > 1) {
      a = _mm256_broadcast_ss(a1 + k);
      c10 = _mm256_fmadd_ps(a, b0, c10);
      c11 = _mm256_fmadd_ps(a, b1, c11);
    }
    if constexpr (MR > 2) {
      a = _mm256_broadcast_ss(a2 + k);
      c20 = _mm256_fmadd_ps(a, b0, c20);
      c21 = _mm256_fmadd_ps(a, b1, c21);
    }
    if constexpr (MR > 3) {
      a = _mm256_broadcast_ss(a3 + k);
      c30 = _mm256_fmadd_ps(a, b0, c30);
      c31 = _mm256_fmadd_ps(a, b1, c31);
    }
    if constexpr (MR > 4) {
      a = _mm256_broadcast_ss(a4 + k);
      c40 = _mm256_fmadd_ps(a, b0, c40);
      c41 = _mm256_fmadd_ps(a, b1, c41);
    }
    if constexpr (MR > 5) {
      a = _mm256_broadcast_ss(a5 + k);
      c50 = _mm256_fmadd_ps(a, b0, c50);
      c51 = _mm256_fmadd_ps(a, b1, c51);
    }
  }
  const __m256 acc[12] = {c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51};
  alignas(32) float tmp[NR];
  for (int r = 0; r < MR; ++r) {
    float* cr = C + r * ldc;
    if (nv == NR) {
      __m256 x0 = acc[2 * r], x1 = acc[2 * r + 1];
      if (add) {
        x0 = _mm256_add_ps(x0, _mm256_loadu_ps(cr));
        x1 = _mm256_add_ps(x1, _mm256_loadu_ps(cr + 8));
      }
      _mm256_storeu_ps(cr, x0);
      _mm256_storeu_ps(cr + 8, x1);
    } else {
      _mm256_store_ps(tmp, acc[2 * r]);
      _mm256_store_ps(tmp + 8, acc[2 * r + 1]);
      for (int c = 0; c < nv; ++c) cr[c] = add ? cr[c] + tmp[c] : tmp[c];
    }
  }
}

// Rows in tiles of 6, except that a tail of 1-3 rows borrows from the last full tile
// (8 = 4 + 4, 9 = 5 + 4): a tile under 4 rows has too few independent FMA chains to hide
// the FMA latency, so it would cost nearly as much as a full one.
void kern_rows(int64_t m, int64_t K, const float* A, int64_t lda, const float* Bp, float* C,
               int64_t ldc, int nv, bool add) {
  int64_t r = 0;
  auto tile = [&](int64_t rows) {
    const float* a = A + r * lda;
    float* c = C + r * ldc;
    switch (rows) {
      case 1: kern<1>(K, a, lda, Bp, c, ldc, nv, add); break;
      case 2: kern<2>(K, a, lda, Bp, c, ldc, nv, add); break;
      case 3: kern<3>(K, a, lda, Bp, c, ldc, nv, add); break;
      case 4: kern<4>(K, a, lda, Bp, c, ldc, nv, add); break;
      case 5: kern<5>(K, a, lda, Bp, c, ldc, nv, add); break;
      default: kern<6>(K, a, lda, Bp, c, ldc, nv, add); break;
    }
    r += rows;
  };
  while (m - r > 9) tile(6);
  const int64_t left = m - r;  // 0 .. 9
  if (left > 6) tile((left + 1) / 2);  // 7 = 4 + 3, 8 = 4 + 4, 9 = 5 + 4
  if (m > r) tile(m - r);
}
#endif

// B of the per-step product: rows [row0, row0 + rows) of W (G·H x H, row-major), used as
// B = W_sub^T (k = H, n = rows) when transposed, else B = W_sub (k = rows, n = H).
constexpr int64_t PACK_MIN_ROWS = 64;  // see StepMatrix

template <typename T>
struct StepMatrix {
  const T* w = nullptr;
  int64_t k = 0, n = 0, ldw = 0;
  bool transposed = false;
  Tensor packed;  // float32: 16-column panels
  const float* panels = nullptr;

  // work: rows the products will see in all (the steps' computed rows). Packing reads and
  // writes all of W once, the cost of several rows' products: a call with only a few rows
  // (generation: one token, batch 1) is faster on the BLAS without it (207 -> ~30 us/step
  // for LSTM 256 at batch 1).
  StepMatrix(const Tensor& W, int64_t row0, int64_t rows, bool transpose, int64_t work) {
    const int64_t H = W.size(1);
    w = W.data_ptr<T>() + row0 * H;
    ldw = H;
    transposed = transpose;
    k = transpose ? H : rows;
    n = transpose ? rows : H;
#ifdef RNNKIT_PACKED_GEMM
    if constexpr (std::is_same_v<T, float>) {
      if (work < PACK_MIN_ROWS) return;
      const int64_t np = (n + NR - 1) / NR;
      packed = at::zeros({np * k * NR}, W.options());
      float* d = packed.data_ptr<float>();
      for (int64_t p = 0; p < np; ++p) {
        float* dp = d + p * k * NR;
        const int64_t cols = std::min<int64_t>(NR, n - p * NR);
        if (transpose) {  // B[kk][j] = W_sub[j][kk]
          for (int64_t c = 0; c < cols; ++c) {
            const float* src = w + (p * NR + c) * ldw;
            for (int64_t kk = 0; kk < k; ++kk) dp[kk * NR + c] = src[kk];
          }
        } else {  // B[kk][j] = W_sub[kk][j]
          for (int64_t kk = 0; kk < k; ++kk)
            std::memcpy(dp + kk * NR, w + kk * ldw + p * NR, cols * sizeof(float));
        }
      }
      panels = d;
    }
#endif
  }

  // C (m x n, ldc) = A (m x k, lda) · B + beta C, beta 0 or 1.
  void mm(int64_t m, const T* A, int64_t lda, T beta, T* C, int64_t ldc) const {
    if (m <= 0) return;
#ifdef RNNKIT_PACKED_GEMM
    if constexpr (std::is_same_v<T, float>) {
      if (panels == nullptr) {
        gemm_rm<T>(false, transposed, m, n, k, A, lda, w, ldw, beta, C, ldc);
        return;
      }
      const int64_t np = (n + NR - 1) / NR;
      for (int64_t p = 0; p < np; ++p) {
        const int nv = (int)std::min<int64_t>(NR, n - p * NR);
        for (int64_t kb = 0; kb < k; kb += KC) {
          const bool add = kb > 0 || beta != 0.f;
          kern_rows(m, std::min(KC, k - kb), A + kb, lda, panels + (p * k + kb) * NR,
                       C + p * NR, ldc, nv, add);
        }
        if (k == 0 && beta == 0.f)
          for (int64_t r = 0; r < m; ++r) std::memset(C + r * ldc + p * NR, 0, nv * sizeof(float));
      }
      return;
    }
#endif
    gemm_rm<T>(false, transposed, m, n, k, A, lda, w, ldw, beta, C, ldc);
  }
};

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

// The steps of one call: how many leading rows each step computes and where its rows
// start in the step buffers (xp, gates, caches, d_xp). Padded buffers are (T, B, width):
// step t starts at row t·B. Packed buffers (like PackedSequence) hold only the rows each
// step computes: step t starts at off[t], so products over all steps skip finished rows.
struct Steps {
  std::vector<int64_t> act;  // rows 0 .. act[t] − 1 are computed at step t
  std::vector<int64_t> off;  // packed row offsets (T + 1), empty when padded
  int64_t B = 0;
  int64_t row(int64_t t) const { return off.empty() ? t * B : off[t]; }
  bool packed() const { return !off.empty(); }
  int64_t rows() const { return off.empty() ? (int64_t)act.size() * B : off.back(); }
};

// Padded: step t computes rows up to the last one with a real step at or after t.
// Packed: the offsets say how many (the caller derived them from the same rule).
Steps make_steps(const std::optional<Tensor>& mask, const std::optional<Tensor>& offsets,
                 int64_t T, int64_t B) {
  Steps S;
  S.B = B;
  S.act.assign(T, B);
  if (offsets.has_value()) {
    TORCH_CHECK(offsets->scalar_type() == at::kLong && offsets->dim() == 1 &&
                    offsets->size(0) == T + 1 && offsets->is_contiguous(),
                "offsets must be (T + 1,) int64");
    const int64_t* o = offsets->data_ptr<int64_t>();
    S.off.assign(o, o + T + 1);
    for (int64_t t = 0; t < T; ++t) {
      S.act[t] = o[t + 1] - o[t];
      TORCH_CHECK(S.act[t] >= 0 && S.act[t] <= B, "offsets must grow by 0 .. B per step");
    }
    return S;
  }
  if (!mask.has_value()) return S;
  const bool* M = mask->data_ptr<bool>();
  std::vector<int64_t> last(B, -1);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < B; ++b)
      if (M[t * B + b]) last[b] = t;
  int64_t top = B;
  for (int64_t t = 0; t < T; ++t) {
    while (top > 0 && last[top - 1] < t) --top;
    S.act[t] = top;
  }
  return S;
}

void check(const Tensor& t, const char* name, int64_t dim) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be on the CPU");
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
  TORCH_CHECK(t.dim() == dim, name, " must have ", dim, " dimensions");
}

// Rows of the block [r0, r1) that step t computes (the rest are finished: held).
inline int64_t block_active(int64_t active, int64_t r0, int64_t r1) {
  return std::clamp<int64_t>(active - r0, 0, r1 - r0);
}

template <typename T>
void copy_rows(T* dst, const T* src, int64_t from, int64_t to, int64_t width) {
  if (from < to)
    std::memcpy(dst + from * width, src + from * width, (to - from) * width * sizeof(T));
}

template <typename T>
void zero_rows(T* dst, int64_t from, int64_t to, int64_t width) {
  if (from < to) std::memset(dst + from * width, 0, (to - from) * width * sizeof(T));
}

// Sequences are independent: split the batch into contiguous row blocks, one per thread,
// each running the WHOLE time loop — no synchronisation per step. Blocks are balanced by
// the number of steps their rows are active (rows come sorted by last real step).
int64_t g_min_block_rows = 4;  // below this a thread's products get too thin

void set_min_block_rows(int64_t rows) { g_min_block_rows = std::max<int64_t>(rows, 1); }

template <typename F>
void over_blocks(int64_t B, const Steps& S, const F& run) {
  const int64_t kMinRows = g_min_block_rows;
  const int64_t P = std::min<int64_t>(at::get_num_threads(), B / kMinRows);
  if (P <= 1 || at::in_parallel_region()) {
    run(0, B);
    return;
  }
  std::vector<int64_t> work(B + 1, 0);  // work[b] = steps at which row b is computed
  for (int64_t a : S.act) work[0] += 1, work[a] -= 1;
  int64_t total = 0;
  for (int64_t b = 0; b < B; ++b) {
    if (b > 0) work[b] += work[b - 1];
    total += work[b];
  }
  std::vector<int64_t> bounds{0};
  int64_t cum = 0;
  for (int64_t b = 0; b < B && (int64_t)bounds.size() < P; ++b) {
    cum += work[b];
    const int64_t rows_left = B - (b + 1), blocks_left = P - (int64_t)bounds.size();
    if (b + 1 - bounds.back() >= kMinRows && rows_left >= blocks_left * kMinRows &&
        cum * P >= total * (int64_t)bounds.size())
      bounds.push_back(b + 1);
  }
  bounds.push_back(B);
  const int64_t nblocks = (int64_t)bounds.size() - 1;
  at::parallel_for(0, nblocks, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) run(bounds[p], bounds[p + 1]);
  });
}

template <typename T>
void add_into(T* __restrict a, const T* __restrict b, int64_t n) {
  for (int64_t j = 0; j < n; ++j) a[j] += b[j];
}

// Each fused pass over one row is its own function with __restrict parameters: that is
// what lets GCC vectorise it (inside the lambdas, with derived pointers, it gives up).

// ---------------------------------------------------------------- simple cell
// x: x_t W_ih^T, s: h_{t-1} W_hh^T, b: the bias
// ACT: 0 tanh, 1 relu, 2 the logistic sigmoid (phi' = h (1 - h)).
template <typename T, int ACT>
void rnn_fwd_row(const T* __restrict x, const T* __restrict s, const T* __restrict b,
                 T* __restrict h, int64_t H) {
  for (int64_t j = 0; j < H; ++j) {
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

template <typename T, int ACT>
void rnn_forward_impl(T* xp, const StepMatrix<T>& W, const T* bias, T* sc, T* hs, const bool* M,
                      const Steps& S, int64_t Tn, int64_t B, int64_t H, int64_t r0, int64_t r1) {
  sc += r0 * H;
  for (int64_t t = 0; t < Tn; ++t) {
    const int64_t bt = block_active(S.act[t], r0, r1);
    T* a = xp + (S.row(t) + r0) * H;
    const T* hp = hs + (t * B + r0) * H;
    T* hn = hs + ((t + 1) * B + r0) * H;
    const bool* m = M ? M + t * B + r0 : nullptr;
    W.mm(bt, hp, H, T(0), sc, H);  // h W^T
    for (int64_t b = 0; b < bt; ++b) {
      if (m && !m[b])
        std::memcpy(hn + b * H, hp + b * H, H * sizeof(T));
      else
        rnn_fwd_row<T, ACT>(a + b * H, sc + b * H, bias, hn + b * H, H);
    }
    copy_rows(hn, hp, bt, r1 - r0, H);
  }
}

template <typename T, int ACT>
void rnn_backward_impl(const T* hs, const StepMatrix<T>& W, const bool* M, const Steps& S,
                       const T* dout, T* dxp, T* dh, int64_t Tn, int64_t B, int64_t H,
                       int64_t r0, int64_t r1) {
  dh += r0 * H;
  for (int64_t t = Tn - 1; t >= 0; --t) {
    const int64_t bt = block_active(S.act[t], r0, r1);
    const T* h = hs + ((t + 1) * B + r0) * H;
    T* da = dxp + (S.row(t) + r0) * H;
    const bool* m = M ? M + t * B + r0 : nullptr;
    if (dout) add_into(dh, dout + (t * B + r0) * H, (r1 - r0) * H);
    for (int64_t b = 0; b < bt; ++b) {
      if (m && !m[b])
        std::memset(da + b * H, 0, H * sizeof(T));
      else
        rnn_bwd_row<T, ACT>(h + b * H, dh + b * H, da + b * H, H);
    }
    if (!S.packed()) zero_rows(da, bt, r1 - r0, H);
    W.mm(bt, da, H, T(1), dh, H);  // d_h_prev += d_a W
  }
}

// ---------------------------------------------------------------- LSTM (i, f, g, o)
// gi..go: the input projections x_t W_ih^T on entry, the activated gates on exit (when
// SAVE); si..so: the recurrent part h_{t-1} W_hh^T of this step; bi..bo: the bias.
template <typename T, bool SAVE>
void lstm_fwd_row(T* __restrict gi, T* __restrict gf, T* __restrict gg, T* __restrict go,
                  const T* __restrict si, const T* __restrict sf, const T* __restrict sg,
                  const T* __restrict so, const T* __restrict bi, const T* __restrict bf,
                  const T* __restrict bg, const T* __restrict bo, const T* __restrict cp,
                  T* __restrict cn, T* __restrict hn, T* __restrict tc, int64_t H) {
  for (int64_t j = 0; j < H; ++j) {
    const T i = sigm(gi[j] + bi[j] + si[j]), f = sigm(gf[j] + bf[j] + sf[j]);
    const T g = tanh_(gg[j] + bg[j] + sg[j]), o = sigm(go[j] + bo[j] + so[j]);
    const T c = f * cp[j] + i * g;
    const T tcj = tanh_(c);
    cn[j] = c;
    hn[j] = o * tcj;
    if constexpr (SAVE) {
      gi[j] = i;
      gf[j] = f;
      gg[j] = g;
      go[j] = o;
      tc[j] = tcj;
    }
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
void lstm_forward_impl(T* xp, const StepMatrix<T>& W, const T* bias, T* rec, T* hs, T* cs,
                       T* tc, bool save,
                       const bool* M, const Steps& S, int64_t Tn, int64_t B, int64_t H,
                       int64_t r0, int64_t r1) {
  const int64_t G = 4 * H;
  rec += r0 * G;
  for (int64_t t = 0; t < Tn; ++t) {
    const int64_t bt = block_active(S.act[t], r0, r1);
    T* g = xp + (S.row(t) + r0) * G;
    const T* hp = hs + (t * B + r0) * H;
    // without save, c ping-pongs between two rows (only the final one is returned)
    const T* cp = cs + ((save ? t : t % 2) * B + r0) * H;
    T* cn = cs + ((save ? t + 1 : (t + 1) % 2) * B + r0) * H;
    T* hn = hs + ((t + 1) * B + r0) * H;
    T* tct = tc + ((save ? S.row(t) : 0) + r0) * H;
    const bool* m = M ? M + t * B + r0 : nullptr;
    // The recurrent part into a small hot buffer: the projections are read once, below.
    W.mm(bt, hp, H, T(0), rec, G);  // h_{t-1} W_hh^T
    for (int64_t b = 0; b < bt; ++b) {
      T* gb = g + b * G;
      const T* sb = rec + b * G;
      auto row = save ? lstm_fwd_row<T, true> : lstm_fwd_row<T, false>;
      row(gb, gb + H, gb + 2 * H, gb + 3 * H, sb, sb + H, sb + 2 * H, sb + 3 * H, bias,
          bias + H, bias + 2 * H, bias + 3 * H, cp + b * H, cn + b * H, hn + b * H, tct + b * H,
          H);
      if (m && !m[b]) {  // a hole: hold the state
        std::memcpy(hn + b * H, hp + b * H, H * sizeof(T));
        std::memcpy(cn + b * H, cp + b * H, H * sizeof(T));
      }
    }
    copy_rows(hn, hp, bt, r1 - r0, H);
    copy_rows(cn, cp, bt, r1 - r0, H);
    if (save && !S.packed()) zero_rows(tct, bt, r1 - r0, H);
  }
}

template <typename T>
void lstm_backward_impl(const T* gates, const T* tc, const T* cs, const StepMatrix<T>& W,
                        const bool* M, const Steps& S, const T* dout, T* dxp, T* dh, T* dc,
                        int64_t Tn, int64_t B, int64_t H, int64_t r0, int64_t r1) {
  const int64_t G = 4 * H;
  dh += r0 * H;
  dc += r0 * H;
  for (int64_t t = Tn - 1; t >= 0; --t) {
    const int64_t bt = block_active(S.act[t], r0, r1);
    const T* g = gates + (S.row(t) + r0) * G;
    const T* tct = tc + (S.row(t) + r0) * H;
    const T* cp = cs + (t * B + r0) * H;
    T* dg = dxp + (S.row(t) + r0) * G;
    const bool* m = M ? M + t * B + r0 : nullptr;
    if (dout) add_into(dh, dout + (t * B + r0) * H, (r1 - r0) * H);
    for (int64_t b = 0; b < bt; ++b) {
      T* d = dg + b * G;
      if (m && !m[b]) {  // a hole: no gate gradient, d_h and d_c pass through
        std::memset(d, 0, G * sizeof(T));
        continue;
      }
      const T* gb = g + b * G;
      lstm_bwd_row<T>(gb, gb + H, gb + 2 * H, gb + 3 * H, tct + b * H, cp + b * H, dh + b * H,
                      dc + b * H, d, d + H, d + 2 * H, d + 3 * H, H);
    }
    if (!S.packed()) zero_rows(dg, bt, r1 - r0, G);
    W.mm(bt, dg, G, T(1), dh, H);  // d_h_prev += d_gates W_hh
  }
}

// ---------------------------------------------------------------- GRU (r, z, n)
template <typename T, bool KEEP>
inline T mix(T z, T hp, T n) {
  return KEEP ? n + z * (hp - n) : hp + z * (n - hp);  // h_t from z, h_{t-1} and n
}

// r_, z_, n_: the input projections on entry, r, z, n on exit; b: the bias (r, z, n)
template <typename T, bool KEEP>
void gru_after_fwd_row(T* __restrict r_, T* __restrict z_, T* __restrict n_,
                       const T* __restrict rec_r, const T* __restrict rec_z,
                       const T* __restrict rec_n, T* __restrict rn_out,
                       const T* __restrict b, const T* __restrict bhn,
                       const T* __restrict hp, T* __restrict hn, int64_t H) {
  for (int64_t j = 0; j < H; ++j) {
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
  for (int64_t j = 0; j < H; ++j) {
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
  for (int64_t j = 0; j < H; ++j) {
    const T n = tanh_(n_[j] + bn[j] + s[j]);
    n_[j] = n;
    hn[j] = mix<T, KEEP>(z_[j], hp[j], n);
  }
}

template <typename T, bool KEEP>
void gru_forward_impl(T* rz, T* xn, T* rec, const StepMatrix<T>& W1, const StepMatrix<T>& W2,
                      const T* bias, const T* bhn, T* sc, T* hs, bool save,
                      const bool* M, const Steps& S, int64_t Tn, int64_t B,
                      int64_t H, bool after, int64_t r0, int64_t r1) {
  const int64_t RW = H;  // width of the rec cache: W_nh h + b_hn (after) or r ⊙ h (before)
  T* sc_rz = sc + r0 * 2 * H;  // scratch: h W_rz^T (B, 2H), then (r ⊙ h) W_nh^T (B, H)
  T* sc_n = sc + B * 2 * H + r0 * H;
  T* sc_all = sc + r0 * 3 * H;  // after: W_hh h (B, 3H)
  for (int64_t t = 0; t < Tn; ++t) {
    const int64_t bt = block_active(S.act[t], r0, r1);
    T* rzt = rz + (S.row(t) + r0) * 2 * H;
    T* nt = xn + (S.row(t) + r0) * H;
    T* rt = rec + ((save ? S.row(t) : 0) + r0) * RW;
    const T* hp = hs + (t * B + r0) * H;
    T* hn = hs + ((t + 1) * B + r0) * H;
    const bool* m = M ? M + t * B + r0 : nullptr;
    if (after) {
      W1.mm(bt, hp, H, T(0), sc_all, 3 * H);  // W_hh h
      for (int64_t b = 0; b < bt; ++b) {
        T* rzb = rzt + b * 2 * H;
        const T* sb = sc_all + b * 3 * H;
        gru_after_fwd_row<T, KEEP>(rzb, rzb + H, nt + b * H, sb, sb + H, sb + 2 * H, rt + b * H,
                                   bias, bhn, hp + b * H, hn + b * H, H);
        if (m && !m[b]) std::memcpy(hn + b * H, hp + b * H, H * sizeof(T));
      }
    } else {
      W1.mm(bt, hp, H, T(0), sc_rz, 2 * H);  // W_rz h
      for (int64_t b = 0; b < bt; ++b) {
        T* rzb = rzt + b * 2 * H;
        gru_before_fwd_row_a<T>(rzb, rzb + H, sc_rz + b * 2 * H, bias, hp + b * H, rt + b * H, H);
      }
      W2.mm(bt, rt, H, T(0), sc_n, H);  // W_nh (r⊙h)
      for (int64_t b = 0; b < bt; ++b) {
        gru_before_fwd_row_b<T, KEEP>(nt + b * H, sc_n + b * H, bias + 2 * H,
                                      rzt + b * 2 * H + H, hp + b * H, hn + b * H, H);
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
void gru_after_bwd_row(const T* __restrict r_, const T* __restrict rec_n,
                       const T* __restrict dan, T* __restrict dar, T* __restrict hn, int64_t H) {
  for (int64_t j = 0; j < H; ++j) {
    const T r = r_[j];
    dar[j] = dan[j] * rec_n[j] * (r * (T(1) - r));
    hn[j] = dan[j] * r;  // the recurrent n-gradient (d_hp holds only this block)
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
void gru_backward_impl(const T* rz, const T* xn, const T* rec, const T* hs,
                       const StepMatrix<T>& W1, const StepMatrix<T>& W2,
                       const bool* M, const Steps& S, const T* dout, T* dxp,
                       T* dhp, T* drh, T* dh, int64_t Tn, int64_t B, int64_t H, bool after,
                       int64_t r0, int64_t r1) {
  const int64_t G = 3 * H;
  dh += r0 * H;
  drh += r0 * H;
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
    for (int64_t b = 0; b < bt; ++b) {
      T* dxb = dx + b * G;
      if (m && !m[b]) {  // a hole: no gate gradient, d_h passes through
        std::memset(dxb, 0, G * sizeof(T));
        if (after) std::memset(dr + b * H, 0, H * sizeof(T));
        continue;
      }
      const T* rzb = rzt + b * 2 * H;
      gru_bwd_row_common<T, KEEP>(rzb + H, nt + b * H, hp + b * H, dh + b * H, dxb + H,
                                  dxb + 2 * H, H);
      if (after) gru_after_bwd_row<T>(rzb, rt + b * H, dxb + 2 * H, dxb, dr + b * H, H);
    }
    if (!S.packed()) zero_rows(dx, bt, r1 - r0, G);
    if (after) {
      if (!S.packed()) zero_rows(dr, bt, r1 - r0, H);
      W1.mm(bt, dx, G, T(1), dh, H);  // += d_rz W_rz
      W2.mm(bt, dr, H, T(1), dh, H);  // += (d_an ⊙ r) W_nh
      continue;
    }
    // reset before: d(r⊙h) = d_an W_nh, then d_r and the path through r⊙h
    W2.mm(bt, dx + 2 * H, G, T(0), drh, H);
    for (int64_t b = 0; b < bt; ++b) {
      if (m && !m[b]) continue;
      gru_before_bwd_row<T>(rzt + b * 2 * H, hp + b * H, drh + b * H, dx + b * G, dh + b * H, H);
    }
    W1.mm(bt, dx, G, T(1), dh, H);  // += d_rz W_rz
  }
}

// ---------------------------------------------------------------- entry points
// Step buffers (xp, caches) are (T, B, width), or (N, width) packed when offsets are given;
// states are always (T + 1, B, H) and d_out (T, B, H).
int64_t steps_of(const Tensor& buf, const std::optional<Tensor>& offsets) {
  return offsets.has_value() ? offsets->size(0) - 1 : buf.size(0);
}

void check_buf(const Tensor& t, const char* name, const Steps& S, int64_t width) {
  TORCH_CHECK(t.device().is_cpu() && t.is_contiguous(), name, " must be contiguous on the CPU");
  TORCH_CHECK(t.numel() == S.rows() * width, name, " has ", t.numel(), " elements, expected ",
              S.rows() * width);
}

Tensor step_buffer(const Steps& S, int64_t width, const Tensor& like) {
  if (S.packed()) return at::empty({S.rows(), width}, like.options());
  return at::empty({(int64_t)S.act.size(), S.B, width}, like.options());
}

Tensor scratch(const Steps& S, int64_t width, const Tensor& like) {
  return at::empty({1, S.B, width}, like.options());  // one step, reused (no save)
}

const bool* mask_of(const std::optional<Tensor>& mask, int64_t T, int64_t B) {
  if (!mask.has_value()) return nullptr;
  check(*mask, "mask", 2);
  TORCH_CHECK(mask->scalar_type() == at::kBool && mask->size(0) == T && mask->size(1) == B,
              "mask must be (T, B) bool");
  return mask->data_ptr<bool>();
}

template <typename T>
const T* opt_ptr(const std::optional<Tensor>& t) {
  return t.has_value() ? t->data_ptr<T>() : nullptr;
}

std::vector<Tensor> rnn_forward(Tensor xp, Tensor w_hh, Tensor bias, Tensor h0,
                                std::optional<Tensor> mask, int64_t act,
                                std::optional<Tensor> offsets) {
  TORCH_CHECK(act >= 0 && act <= 2, "act must be 0 (tanh), 1 (relu) or 2 (sigmoid)");
  check(w_hh, "w_hh", 2);
  const int64_t Tn = steps_of(xp, offsets), B = h0.size(0), H = h0.size(1);
  const bool* M = mask_of(mask, Tn, B);
  const Steps S = make_steps(mask, offsets, Tn, B);
  check_buf(xp, "xp", S, H);
  check(bias, "bias", 1);
  Tensor hs = at::empty({Tn + 1, B, H}, xp.options());
  Tensor sc = at::empty({B, H}, xp.options());
  hs[0].copy_(h0);
  AT_DISPATCH_FLOATING_TYPES(xp.scalar_type(), "rnn_forward", [&] {
    auto f = act == 1   ? rnn_forward_impl<scalar_t, 1>
             : act == 2 ? rnn_forward_impl<scalar_t, 2>
                        : rnn_forward_impl<scalar_t, 0>;
    const StepMatrix<scalar_t> W(w_hh, 0, H, true, S.rows());
    over_blocks(B, S, [&](int64_t r0, int64_t r1) {
      f(xp.data_ptr<scalar_t>(), W, bias.data_ptr<scalar_t>(), sc.data_ptr<scalar_t>(),
        hs.data_ptr<scalar_t>(), M, S, Tn,
        B, H, r0, r1);
    });
  });
  return {hs};
}

std::vector<Tensor> rnn_backward(Tensor hs, Tensor w_hh, std::optional<Tensor> mask,
                                 std::optional<Tensor> d_out, Tensor d_h, int64_t act,
                                 std::optional<Tensor> offsets) {
  TORCH_CHECK(act >= 0 && act <= 2, "act must be 0 (tanh), 1 (relu) or 2 (sigmoid)");
  check(hs, "hs", 3);
  check(w_hh, "w_hh", 2);
  check(d_h, "d_h", 2);
  const int64_t Tn = hs.size(0) - 1, B = hs.size(1), H = hs.size(2);
  const bool* M = mask_of(mask, Tn, B);
  const Steps S = make_steps(mask, offsets, Tn, B);
  Tensor dxp = step_buffer(S, H, hs);
  AT_DISPATCH_FLOATING_TYPES(hs.scalar_type(), "rnn_backward", [&] {
    auto f = act == 1   ? rnn_backward_impl<scalar_t, 1>
             : act == 2 ? rnn_backward_impl<scalar_t, 2>
                        : rnn_backward_impl<scalar_t, 0>;
    const StepMatrix<scalar_t> W(w_hh, 0, H, false, S.rows());
    over_blocks(B, S, [&](int64_t r0, int64_t r1) {
      f(hs.data_ptr<scalar_t>(), W, M, S, opt_ptr<scalar_t>(d_out),
        dxp.data_ptr<scalar_t>(), d_h.data_ptr<scalar_t>(), Tn, B, H, r0, r1);
    });
  });
  return {dxp, d_h};
}

std::vector<Tensor> lstm_forward(Tensor xp, Tensor w_hh, Tensor bias, Tensor h0, Tensor c0,
                                 std::optional<Tensor> mask, bool save,
                                 std::optional<Tensor> offsets) {
  check(w_hh, "w_hh", 2);
  const int64_t Tn = steps_of(xp, offsets), B = h0.size(0), H = h0.size(1);
  TORCH_CHECK(w_hh.size(0) == 4 * H && w_hh.size(1) == H, "w_hh must be (4H, H)");
  const bool* M = mask_of(mask, Tn, B);
  const Steps S = make_steps(mask, offsets, Tn, B);
  check_buf(xp, "xp", S, 4 * H);
  check(bias, "bias", 1);
  Tensor hs = at::empty({Tn + 1, B, H}, xp.options());
  Tensor cs = at::empty({save ? Tn + 1 : 2, B, H}, xp.options());
  Tensor tc = save ? step_buffer(S, H, xp) : scratch(S, H, xp);
  Tensor rec = at::empty({B, 4 * H}, xp.options());
  hs[0].copy_(h0);
  cs[0].copy_(c0);
  AT_DISPATCH_FLOATING_TYPES(xp.scalar_type(), "lstm_forward", [&] {
    const StepMatrix<scalar_t> W(w_hh, 0, 4 * H, true, S.rows());
    over_blocks(B, S, [&](int64_t r0, int64_t r1) {
      lstm_forward_impl<scalar_t>(xp.data_ptr<scalar_t>(), W, bias.data_ptr<scalar_t>(),
                                  rec.data_ptr<scalar_t>(),
                                  hs.data_ptr<scalar_t>(), cs.data_ptr<scalar_t>(),
                                  tc.data_ptr<scalar_t>(), save, M, S, Tn, B, H, r0, r1);
    });
  });
  if (!save) {  // nothing is kept for backward: only the final c is meaningful
    cs = cs[Tn % 2].expand({Tn + 1, B, H});
    if (!S.packed()) tc = tc.expand({Tn, B, H});
  }
  return {hs, cs, tc};
}

std::vector<Tensor> lstm_backward(Tensor gates, Tensor tc, Tensor cs, Tensor w_hh,
                                  std::optional<Tensor> mask, std::optional<Tensor> d_out,
                                  Tensor d_h, Tensor d_c, std::optional<Tensor> offsets) {
  check(cs, "cs", 3);
  check(w_hh, "w_hh", 2);
  check(d_h, "d_h", 2);
  check(d_c, "d_c", 2);
  const int64_t Tn = cs.size(0) - 1, B = cs.size(1), H = cs.size(2);
  const bool* M = mask_of(mask, Tn, B);
  const Steps S = make_steps(mask, offsets, Tn, B);
  check_buf(gates, "gates", S, 4 * H);
  check_buf(tc, "tanh_c", S, H);
  Tensor dxp = step_buffer(S, 4 * H, gates);
  AT_DISPATCH_FLOATING_TYPES(gates.scalar_type(), "lstm_backward", [&] {
    const StepMatrix<scalar_t> W(w_hh, 0, 4 * H, false, S.rows());
    over_blocks(B, S, [&](int64_t r0, int64_t r1) {
      lstm_backward_impl<scalar_t>(gates.data_ptr<scalar_t>(), tc.data_ptr<scalar_t>(),
                                   cs.data_ptr<scalar_t>(), W, M, S,
                                   opt_ptr<scalar_t>(d_out), dxp.data_ptr<scalar_t>(),
                                   d_h.data_ptr<scalar_t>(), d_c.data_ptr<scalar_t>(), Tn, B, H,
                                   r0, r1);
    });
  });
  return {dxp, d_h, d_c};
}

std::vector<Tensor> gru_forward(Tensor rz, Tensor xn, Tensor w_hh, Tensor bias,
                                std::optional<Tensor> b_hn,
                                Tensor h0, std::optional<Tensor> mask, bool save, bool keep,
                                bool after, std::optional<Tensor> offsets) {
  check(w_hh, "w_hh", 2);
  const int64_t Tn = steps_of(xn, offsets), B = h0.size(0), H = h0.size(1);
  TORCH_CHECK(!after || b_hn.has_value(), "reset='after' needs bias_hn");
  const bool* M = mask_of(mask, Tn, B);
  const Steps S = make_steps(mask, offsets, Tn, B);
  check_buf(rz, "xp_rz", S, 2 * H);
  check_buf(xn, "xp_n", S, H);
  Tensor hs = at::empty({Tn + 1, B, H}, xn.options());
  const int64_t RW = H;  // W_nh h + b_hn (after) or r ⊙ h (before)
  Tensor rec = save ? step_buffer(S, RW, xn) : scratch(S, RW, xn);
  Tensor sc = at::empty({B * 3 * H}, xn.options());
  check(bias, "bias", 1);
  hs[0].copy_(h0);
  AT_DISPATCH_FLOATING_TYPES(xn.scalar_type(), "gru_forward", [&] {
    auto f = keep ? gru_forward_impl<scalar_t, true> : gru_forward_impl<scalar_t, false>;
    // after: W_hh h in one product; before: W_rz h, then W_nh (r ⊙ h)
    const StepMatrix<scalar_t> W1(w_hh, 0, after ? 3 * H : 2 * H, true, S.rows());
    const StepMatrix<scalar_t> W2(w_hh, 2 * H, after ? 0 : H, true, S.rows());
    over_blocks(B, S, [&](int64_t r0, int64_t r1) {
      f(rz.data_ptr<scalar_t>(), xn.data_ptr<scalar_t>(), rec.data_ptr<scalar_t>(), W1, W2,
        bias.data_ptr<scalar_t>(), after ? b_hn->data_ptr<scalar_t>() : nullptr,
        sc.data_ptr<scalar_t>(),
        hs.data_ptr<scalar_t>(), save, M, S, Tn, B, H, after, r0, r1);
    });
  });
  if (!save && !S.packed()) rec = rec.expand({Tn, B, RW});
  return {hs, rec};
}

std::vector<Tensor> gru_backward(Tensor rz, Tensor xn, Tensor rec, Tensor hs, Tensor w_hh,
                                 std::optional<Tensor> mask, std::optional<Tensor> d_out,
                                 Tensor d_h, bool keep, bool after,
                                 std::optional<Tensor> offsets) {
  check(hs, "hs", 3);
  check(w_hh, "w_hh", 2);
  check(d_h, "d_h", 2);
  const int64_t Tn = hs.size(0) - 1, B = hs.size(1), H = hs.size(2);
  const bool* M = mask_of(mask, Tn, B);
  const Steps S = make_steps(mask, offsets, Tn, B);
  check_buf(rz, "rz", S, 2 * H);
  check_buf(xn, "n", S, H);
  check_buf(rec, "rec", S, H);
  Tensor dxp = step_buffer(S, 3 * H, xn);
  Tensor dhp = after ? step_buffer(S, H, xn) : dxp;
  Tensor drh = at::empty({B, H}, xn.options());  // d(r ⊙ h) scratch (reset before)
  AT_DISPATCH_FLOATING_TYPES(xn.scalar_type(), "gru_backward", [&] {
    auto f = keep ? gru_backward_impl<scalar_t, true> : gru_backward_impl<scalar_t, false>;
    const StepMatrix<scalar_t> W1(w_hh, 0, 2 * H, false, S.rows());  // r, z rows
    const StepMatrix<scalar_t> W2(w_hh, 2 * H, H, false, S.rows());  // n rows
    over_blocks(B, S, [&](int64_t r0, int64_t r1) {
      f(rz.data_ptr<scalar_t>(), xn.data_ptr<scalar_t>(), rec.data_ptr<scalar_t>(),
        hs.data_ptr<scalar_t>(), W1, W2, M, S, opt_ptr<scalar_t>(d_out),
        dxp.data_ptr<scalar_t>(), dhp.data_ptr<scalar_t>(), drh.data_ptr<scalar_t>(),
        d_h.data_ptr<scalar_t>(), Tn, B, H, after, r0, r1);
    });
  });
  return {dxp, dhp, d_h};
}

}  // namespace

TORCH_LIBRARY(rnnkit_native, m) {
  m.def("set_min_block_rows(int rows) -> ()", &set_min_block_rows);
  m.def("rnn_forward(Tensor xp, Tensor w_hh, Tensor bias, Tensor h0, Tensor? mask, int act, "
        "Tensor? offsets=None) -> Tensor[]",
        &rnn_forward);
  m.def("rnn_backward(Tensor hs, Tensor w_hh, Tensor? mask, Tensor? d_out, Tensor(a!) d_h, "
        "int act, Tensor? offsets=None) -> Tensor[]",
        &rnn_backward);
  m.def("lstm_forward(Tensor(a!) xp, Tensor w_hh, Tensor bias, Tensor h0, Tensor c0, Tensor? mask, "
        "bool save, Tensor? offsets=None) -> Tensor[]",
        &lstm_forward);
  m.def("lstm_backward(Tensor gates, Tensor tanh_c, Tensor cs, Tensor w_hh, Tensor? mask, "
        "Tensor? d_out, Tensor(a!) d_h, Tensor(b!) d_c, Tensor? offsets=None) -> Tensor[]",
        &lstm_backward);
  m.def("gru_forward(Tensor(a!) xp_rz, Tensor(b!) xp_n, Tensor w_hh, Tensor bias, "
        "Tensor? bias_hn, "
        "Tensor h0, Tensor? mask, bool save, bool keep, bool after, Tensor? offsets=None) "
        "-> Tensor[]",
        &gru_forward);
  m.def("gru_backward(Tensor rz, Tensor n, Tensor rec, Tensor hs, Tensor w_hh, Tensor? mask, "
        "Tensor? d_out, Tensor(a!) d_h, bool keep, bool after, Tensor? offsets=None) "
        "-> Tensor[]",
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


def _paths() -> tuple[Path, Path]:
    """The library this source, these flags and this torch build into, and the marker a
    failed build with this compiler leaves."""
    key = "\0".join([_SOURCE, *_flags(), torch.__version__, sys.platform])
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    cache = _cache_dir()
    # A failed build is not retried by later processes with the same compiler (a missing
    # compiler would otherwise cost every process a failed run); another $CXX tries again.
    cxx_tag = hashlib.sha256(os.environ.get("CXX", "c++").encode()).hexdigest()[:8]
    return cache / f"rnnkit_native_{digest}.so", cache / f"rnnkit_native_{digest}_{cxx_tag}.failed"


def _load() -> bool:
    target, failed = _paths()
    cache = target.parent
    cache.mkdir(parents=True, exist_ok=True)
    if not target.exists():
        with open(target.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one process builds, the others wait
            if failed.exists():
                raise RuntimeError(f"{failed.read_text().strip()} (delete {failed} to retry)")
            if not target.exists():
                try:
                    cxx = os.environ.get("CXX", "c++")
                    if shutil.which(cxx) is None:
                        raise RuntimeError(f"no C++ compiler: {cxx} not found")
                    # The first use must not look hung: say what the wait is, and where.
                    messages.info(f"building the compiled time loop (once, ~30 s) into {cache}…")
                    _build(target)
                except Exception as exc:
                    failed.write_text(str(exc))
                    raise
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.ops.load_library(str(target))
    return True


def build() -> Path:
    """Build (or find) the compiled loop now, retrying a build that failed before; return
    the library's path. Raises RuntimeError saying why it cannot be built.

    ``rnnkit build-native`` (and ``python -m rnnkit.native``) call it, e.g. right after
    installing, so that the first training does not wait for the compiler.
    """
    target, failed = _paths()
    failed.unlink(missing_ok=True)  # asked for explicitly: try again
    if _state["loaded"] is None:
        with _lock:
            _load()
            _state["loaded"], _state["failed"] = torch.ops.rnnkit_native, False
    return target


def library() -> object | None:
    """``torch.ops.rnnkit_native`` (built on first use), or None where unavailable."""
    if not _enabled or _state["failed"]:
        return None
    if _state["loaded"] is None:
        with _lock:
            if _state["loaded"] is None and not _state["failed"]:
                try:
                    _load()
                    _state["loaded"] = torch.ops.rnnkit_native
                except Exception as exc:  # any build or load failure: the PyTorch loop
                    _state["failed"] = True
                    messages.warning(
                        f"compiled time loop unavailable ({exc}); using the PyTorch loop"
                    )
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
