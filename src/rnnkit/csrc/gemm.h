// The recurrent matrix product of every step: the BLAS torch links, and for float32 a
// packed, register-blocked AVX2/FMA or AVX-512 kernel (StepMatrix).
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__AVX2__) && defined(__FMA__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

// The Fortran BLAS entry points of the BLAS that torch links.
extern "C" {
void sgemm_(const char*, const char*, const int*, const int*, const int*, const float*,
            const float*, const int*, const float*, const int*, const float*, float*, const int*);
void dgemm_(const char*, const char*, const int*, const int*, const int*, const double*,
            const double*, const int*, const double*, const int*, const double*, double*,
            const int*);
}

namespace {

using at::Tensor;

inline void blas_gemm(char ta, char tb, int m, int n, int k, float alpha, const float* a, int lda,
                      const float* b, int ldb, float beta, float* c, int ldc) {
  sgemm_(&ta, &tb, &m, &n, &k, &alpha, a, &lda, b, &ldb, &beta, c, &ldc);
}
inline void blas_gemm(char ta, char tb, int m, int n, int k, double alpha, const double* a, int lda,
                      const double* b, int ldb, double beta, double* c, int ldc) {
  dgemm_(&ta, &tb, &m, &n, &k, &alpha, a, &lda, b, &ldb, &beta, c, &ldc);
}

// Row-major C (m x n, ldc) = op(A) op(B) + beta C. BLAS is column-major, so compute
// C^T = op(B)^T op(A)^T: a row-major matrix is its own transpose read column-major.
template <typename T>
void gemm_rm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* A, int64_t lda, const T* B,
             int64_t ldb, T beta, T* C, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  blas_gemm(tb ? 'T' : 'N', ta ? 'T' : 'N', (int)n, (int)m, (int)k, T(1), B, (int)ldb, A, (int)lda,
            beta, C, (int)ldc);
}

// The recurrent product of every step, C (m x n) = A (m x k) · B + beta C, with B fixed for
// the whole call. float32: B is packed once per call into NR-column panels and multiplied
// by a register-blocked FMA kernel: the products of one step are thin (m = the rows of one
// thread's block, 4 .. 64), where the BLAS runs well below its large-matrix rate. AVX2:
// 6 x 16 tiles (well above the BLAS's rate on these thin products: benchmarks/HISTORY.md).
// AVX-512: 8 x 32 tiles, twice the work per instruction — where the BLAS torch links
// takes its AVX2 path (MKL on AMD processors), the only way to the machine's rate. K is
// summed in blocks of 256 (accuracy like the BLAS). float64 (the exact oracle path) and
// CPUs without AVX2 call the BLAS.
#if defined(__AVX512F__)
#define RNNKIT_PACKED_GEMM 1
#define RNNKIT_GEMM_AVX512 1
constexpr int NR = 32;
constexpr int64_t KC = 256;

// C (MR x nv) (+)= A (MR x K) · Bp (K x NR panel). AT: A is stored transposed (element
// (r, k) at A[k·lda + r]: the weight gradients' d_gates, rows of the step buffer).
template <int MR, bool AT = false>
inline void kern(int64_t K, const float* __restrict A, int64_t lda, const float* __restrict Bp,
                 float* C, int64_t ldc, int nv, bool add) {
  __m512 acc[2 * MR];
#pragma GCC unroll 16
  for (int i = 0; i < 2 * MR; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    const __m512 b0 = _mm512_loadu_ps(Bp + k * NR), b1 = _mm512_loadu_ps(Bp + k * NR + 16);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m512 a = _mm512_set1_ps(AT ? A[k * lda + r] : A[r * lda + k]);
      acc[2 * r] = _mm512_fmadd_ps(a, b0, acc[2 * r]);
      acc[2 * r + 1] = _mm512_fmadd_ps(a, b1, acc[2 * r + 1]);
    }
  }
  // columns nv .. NR of a last, partial panel are not stored
  const __mmask16 m0 = nv >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << nv) - 1);
  const __mmask16 m1 = nv >= 32  ? __mmask16(0xFFFF)
                       : nv > 16 ? __mmask16((1u << (nv - 16)) - 1)
                                 : 0;
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    float* cr = C + r * ldc;
    __m512 x0 = acc[2 * r], x1 = acc[2 * r + 1];
    if (add) {
      x0 = _mm512_add_ps(x0, _mm512_maskz_loadu_ps(m0, cr));
      x1 = _mm512_add_ps(x1, _mm512_maskz_loadu_ps(m1, cr + 16));
    }
    _mm512_mask_storeu_ps(cr, m0, x0);
    _mm512_mask_storeu_ps(cr + 16, m1, x1);
  }
}

// Rows in tiles of 8; a tail of 9-11 rows is split in two (9 = 5 + 4): a tile under 4 rows
// has too few independent FMA chains (2 a row) to hide the FMA latency. The rows of the
// tile that starts at row r of m:
inline int64_t tile_rows(int64_t m, int64_t r) {
  const int64_t left = m - r;
  return left > 11 ? 8 : left > 8 ? (left + 1) / 2 : left;  // 9 = 5 + 4, 11 = 6 + 5
}

template <bool AT = false>
void kern_tile(int64_t rows, int64_t K, const float* a, int64_t lda, const float* Bp, float* c,
               int64_t ldc, int nv, bool add) {
  switch (rows) {
    case 1: kern<1, AT>(K, a, lda, Bp, c, ldc, nv, add); break;
    case 2: kern<2, AT>(K, a, lda, Bp, c, ldc, nv, add); break;
    case 3: kern<3, AT>(K, a, lda, Bp, c, ldc, nv, add); break;
    case 4: kern<4, AT>(K, a, lda, Bp, c, ldc, nv, add); break;
    case 5: kern<5, AT>(K, a, lda, Bp, c, ldc, nv, add); break;
    case 6: kern<6, AT>(K, a, lda, Bp, c, ldc, nv, add); break;
    case 7: kern<7, AT>(K, a, lda, Bp, c, ldc, nv, add); break;
    default: kern<8, AT>(K, a, lda, Bp, c, ldc, nv, add); break;
  }
}

// AT: A stored transposed (a tile's first row starts r floats in, not r rows down).
template <bool AT = false>
void kern_rows(int64_t m, int64_t K, const float* A, int64_t lda, const float* Bp, float* C,
               int64_t ldc, int nv, bool add) {
  for (int64_t r = 0, rows; r < m; r += rows) {
    rows = tile_rows(m, r);
    kern_tile<AT>(rows, K, AT ? A + r : A + r * lda, lda, Bp, C + r * ldc, ldc, nv, add);
  }
}
#elif defined(__AVX2__) && defined(__FMA__)
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
  const int64_t left = m - r;          // 0 .. 9
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
  // group > 0: row kk of B lies at w + (kk / group)·ldg + (kk % group)·ldw (see below)
  int64_t group = 0, ldg = 0;
  bool transposed = false;
  Tensor packed;  // float32: NR-column panels
  const float* panels = nullptr;

  // work: rows the products will see in all (the steps' computed rows). Packing reads and
  // writes all of W once, the cost of several rows' products: a call with only a few rows
  // (generation: one token, batch 1) is faster on the BLAS without it (benchmarks/HISTORY.md,
  // "End to end: the char-LM training", generation at batch 1).
  StepMatrix(const Tensor& W, int64_t row0, int64_t rows, bool transpose, int64_t work) {
    const int64_t H = W.size(1);
    w = W.data_ptr<T>() + row0 * H;
    ldw = H;
    transposed = transpose;
    k = transpose ? H : rows;
    n = transpose ? rows : H;
    if (work >= PACK_MIN_ROWS) pack(W.options());
  }

  // B (k x n) made of the rows t·groups + b of a (T, groups, n) tensor with any strides
  // but contiguous rows: row kk at base + (kk / groups)·ld_t + (kk % groups)·ld_b — a
  // batch-first input read in place. float32 with the packed kernel only: always packed.
  StepMatrix(const T* base, int64_t rows, int64_t cols, int64_t groups, int64_t ld_t, int64_t ld_b)
      : w(base), k(rows), n(cols), ldw(ld_b), group(groups), ldg(ld_t) {
    pack(at::TensorOptions().dtype(c10::CppTypeToScalarType<T>::value));
  }

  const T* row_of_b(int64_t kk) const {
    return group > 0 ? w + (kk / group) * ldg + (kk % group) * ldw : w + kk * ldw;
  }

  void pack([[maybe_unused]] const at::TensorOptions& options) {
#ifdef RNNKIT_PACKED_GEMM
    if constexpr (std::is_same_v<T, float>) {
      const int64_t np = (n + NR - 1) / NR;
      packed = at::empty({np * k * NR}, options);
      float* d = packed.data_ptr<float>();
      // only a last, partial panel has columns no row of W fills: zero them (whatever
      // they held would be multiplied, and a denormal there would slow the FMAs)
      if (n % NR != 0) std::memset(d + (np - 1) * k * NR, 0, k * NR * sizeof(float));
      for (int64_t p = 0; p < np; ++p) {
        float* dp = d + p * k * NR;
        const int64_t cols = std::min<int64_t>(NR, n - p * NR);
        if (transposed) {  // B[kk][j] = W_sub[j][kk]
          for (int64_t c = 0; c < cols; ++c) {
            const float* src = w + (p * NR + c) * ldw;
            for (int64_t kk = 0; kk < k; ++kk) dp[kk * NR + c] = src[kk];
          }
        } else {  // B[kk][j] = W_sub[kk][j]
          for (int64_t kk = 0; kk < k; ++kk)
            std::memcpy(dp + kk * NR, row_of_b(kk) + p * NR, cols * sizeof(float));
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
      // K blocks outermost: a block of A's rows stays in cache across the panels
      const int64_t np = (n + NR - 1) / NR;
      for (int64_t kb = 0; kb < k; kb += KC) {
        const bool add = kb > 0 || beta != 0.f;
        for (int64_t p = 0; p < np; ++p)
          kern_rows(m, std::min(KC, k - kb), A + kb, lda, panels + (p * k + kb) * NR, C + p * NR,
                    ldc, (int)std::min<int64_t>(NR, n - p * NR), add);
      }
      if (k == 0 && beta == 0.f)
        for (int64_t r = 0; r < m; ++r) std::memset(C + r * ldc, 0, n * sizeof(float));
      return;
    }
#endif
    gemm_rm<T>(false, transposed, m, n, k, A, lda, w, ldw, beta, C, ldc);
  }

  // C (m x n, ldc) = A · B where A is stored transposed: element (r, kk) at A[kk·lda + r]
  // (the weight gradients read d_gates, rows of G·H, as G·H x N); k ≥ 1. AVX-512 only: the AVX2
  // build leaves these large products to the BLAS (matmul asks for them the way round
  // it runs faster), whose AVX2 kernel is no slower than this one.
  void mm_at(int64_t m, const T* A, int64_t lda, T* C, int64_t ldc) const {
    if (m <= 0) return;
#ifdef RNNKIT_GEMM_AVX512
    if constexpr (std::is_same_v<T, float>) {
      if (panels != nullptr) {
        const int64_t np = (n + NR - 1) / NR;
        for (int64_t kb = 0; kb < k; kb += KC)
          for (int64_t p = 0; p < np; ++p)
            kern_rows<true>(m, std::min(KC, k - kb), A + kb * lda, lda, panels + (p * k + kb) * NR,
                            C + p * NR, ldc, (int)std::min<int64_t>(NR, n - p * NR), kb > 0);
        return;
      }
    }
#endif
    gemm_rm<T>(true, transposed, m, n, k, A, lda, w, ldw, T(0), C, ldc);
  }
};

}  // namespace
