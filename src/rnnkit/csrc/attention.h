// Additive attention's scores in one pass over the keys, forward and backward.
//
// With the factor 2 of tanh a = 2σ(2a) − 1 folded into the inputs (k = 2 W_m m_j,
// q = 2 (W_q h + b_q)), the score of source position j is, up to a constant per row that
// the softmax ignores,
//
//     σ_j = σ(k_j + q) (A values)        s_j = vᵀ σ_j
//
// In torch that is an add, a sigmoid and a matrix-vector product, three passes over a
// (B, S, A) tensor, and torch's float32 sigmoid is the slowest of them; here it is one
// pass per source position with the gate loops' sigmoid (activations.h). The backward
// takes the gradient of the scores, d_s (B, S), and the kept σ:
//
//     Σ_j d_s_j σ_j                                (the gradient of v, summed later)
//     d_q = w ⊙ Σ_j d_s_j σ_j (1 − σ_j)            (w: v with the factors of the chain)
//     acc_j += d_s_j σ_j (1 − σ_j)                 (the keys' gradient, over all steps)
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "activations.h"

namespace {

// σ of one source position into sig, then vᵀσ: two loops, each of which GCC vectorises
// (the sigmoid inside the reduction it does not).
template <typename T>
void sigmoid_row(const T* __restrict k, T ks, const T* __restrict q, T* __restrict sig, int64_t A) {
  for (int64_t a = 0; a < A; ++a) sig[a] = sigm(ks * k[a] + q[a]);
}

template <typename T>
T dot_row(const T* __restrict v, const T* __restrict sig, int64_t A) {
  T s = T(0);
#pragma omp simd reduction(+ : s)  // the sum in any order
  for (int64_t a = 0; a < A; ++a) s += v[a] * sig[a];
  return s;
}

// keys (B, S, A), query (B, Q, A), v (A) → scores (B, Q, S) of σ(ks · k + q); σ into
// sig (B, Q, S, A) if not null (ks: the keys' scale, so that callers need not scale them). Q
// queries per row: one per decoder step (1 while decoding or inside a step loop). padding
// (B, S), if not null: −∞ where true (the masked fill a decoding step needs, in the same pass).
template <typename T>
void sigmoid_scores_impl(const T* keys, T ks, const T* query, const T* v, T* scores, T* sig,
                         const bool* padding, int64_t B, int64_t Q, int64_t S, int64_t A) {
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, Q * S * A));
  at::parallel_for(0, B, grain, [&](int64_t b0, int64_t b1) {
    std::vector<T> row(sig == nullptr ? A : 0);  // σ of one position when sig is not kept
    for (int64_t b = b0; b < b1; ++b) {
      for (int64_t t = 0; t < Q; ++t) {
        const T* q = query + (b * Q + t) * A;
        for (int64_t j = 0; j < S; ++j) {
          const int64_t r = (b * Q + t) * S + j;
          const bool pad = padding != nullptr && padding[b * S + j];
          if (pad && sig == nullptr) {
            scores[r] = -std::numeric_limits<T>::infinity();
            continue;
          }
          T* out = sig != nullptr ? sig + r * A : row.data();
          sigmoid_row(keys + (b * S + j) * A, ks, q, out, A);
          scores[r] = pad ? -std::numeric_limits<T>::infinity() : dot_row(v, out, A);
        }
      }
    }
  });
}

template <typename T>
void sigmoid_backward_row(T ds, const T* __restrict sig, T* __restrict s_sig, T* __restrict s_dsig,
                          T* __restrict acc, int64_t A) {
  for (int64_t a = 0; a < A; ++a) {
    const T g = sig[a];
    const T dg = ds * (g - g * g);
    s_sig[a] += ds * g;
    s_dsig[a] += dg;
    acc[a] += dg;
  }
}

template <typename T>
void sigmoid_backward_row_noacc(T ds, const T* __restrict sig, T* __restrict s_sig,
                                T* __restrict s_dsig, int64_t A) {
  for (int64_t a = 0; a < A; ++a) {
    const T g = sig[a];
    s_sig[a] += ds * g;
    s_dsig[a] += ds * (g - g * g);
  }
}

// d_s (B, Q, S), sig (B, Q, S, A), w (A) → s_sig (B, Q, A) = Σ_j d_s σ,
// d_q (B, Q, A) = w ⊙ Σ_j d_s σ(1 − σ), acc (B, S, A) += Σ_q d_s σ(1 − σ) if not null.
template <typename T>
void sigmoid_scores_backward_impl(const T* ds, const T* sig, const T* w, T* s_sig, T* d_q, T* acc,
                                  int64_t B, int64_t Q, int64_t S, int64_t A) {
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, Q * S * A));
  at::parallel_for(0, B, grain, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      for (int64_t t = 0; t < Q; ++t) {
        const int64_t bq = b * Q + t;
        T* ss = s_sig + bq * A;
        T* dq = d_q + bq * A;
        for (int64_t a = 0; a < A; ++a) ss[a] = dq[a] = T(0);
        for (int64_t j = 0; j < S; ++j) {
          const int64_t r = bq * S + j;
          if (acc != nullptr) {
            sigmoid_backward_row(ds[r], sig + r * A, ss, dq, acc + (b * S + j) * A, A);
          } else {
            sigmoid_backward_row_noacc(ds[r], sig + r * A, ss, dq, A);
          }
        }
        for (int64_t a = 0; a < A; ++a) dq[a] *= w[a];
      }
    }
  });
}

}  // namespace
