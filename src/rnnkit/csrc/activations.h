// The activation functions of the gate loops.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace {

// float32 exp/sigmoid/tanh: branch-free (Cephes polynomials, ~1-2 ulp) so that GCC
// vectorises the gate loops; NaN propagates.
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
  // |x| < 0.625: the odd polynomial x + x^3 P(x^2), in Horner form
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  p = p * z * ax + ax;
  return std::copysign(ax < 0.625f ? p : big, x);
}
// float64 exp/sigmoid/tanh: branch-free too (Cephes' rational forms, within 2 ulp of the
// C library's), so that the float64 gate loops vectorise: the C library's exp and tanh
// are one call per element, which made float64 inference 1.4-1.5x torch's time.
inline double exp_d(double x) {
  x = x > 709.0 ? 709.0 : x;
  x = x < -708.0 ? -708.0 : x;
  const double fx = std::floor(x * 1.4426950408889634073599 + 0.5);
  x = x - fx * 6.93145751953125e-1;
  x = x - fx * 1.42860682030941723212e-6;
  const double xx = x * x;
  const double px = x * ((1.26177193074810590878e-4 * xx + 3.02994407707441961300e-2) * xx +
                         9.99999999999999999910e-1);
  const double qx = ((3.00198505138664455042e-6 * xx + 2.52448340349684104192e-3) * xx +
                     2.27265548208155028766e-1) *
                        xx +
                    2.00000000000000000009e0;
  const double r = 1.0 + 2.0 * (px / (qx - px));
  // 2^fx, fx in [-1021, 1023]: 2^52 + 2^51 + fx holds fx in its low bits (no conversion
  // to an integer, which AVX2 has no vector instruction for)
  const int64_t bits = std::bit_cast<int64_t>(fx + 6755399441055744.0);
  return r * std::bit_cast<double>(static_cast<int64_t>(static_cast<uint64_t>(bits + 1023) << 52));
}
inline double sigm(double x) { return 1.0 / (1.0 + exp_d(-x)); }
inline double tanh_(double x) {
  const double ax = std::fabs(x);
  const double big = 1.0 - 2.0 / (exp_d(2.0 * ax) + 1.0);
  const double z = x * x;
  // |x| < 0.625: x + x z P(z)/Q(z)
  const double p =
      (-9.64399179425052238628e-1 * z - 9.92877231001918586564e1) * z - 1.61468768441708447952e3;
  const double q = ((z + 1.12811678491632931402e2) * z + 2.23548839060100448583e3) * z +
                   4.84406305325125486048e3;
  const double small = ax + ax * z * (p / q);
  return std::copysign(ax < 0.625 ? small : big, x);
}

}  // namespace

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define RNNKIT_ACT_AVX2 1

namespace {

// The same functions on 8 floats, written out: the same operations in the same order
// as exp_f, sigm and tanh_ above (GCC contracts their a * b + c into the FMAs written
// here), so results are equal to the bit. Why by hand: GCC vectorises the scalar
// clamps `x > 88 ? 88 : x` as compare + blend (two instructions on the multiply pipes)
// where min/max is one, with the same NaN rule (min(88, NaN) = NaN); and the gate loops
// split in two (lstm.h) only pay once each loop is lean.
inline __m256 exp8(__m256 x, bool above_minus_87 = false) {
  x = _mm256_min_ps(_mm256_set1_ps(88.0f), x);  // the first operand unless x < it or NaN
  if (!above_minus_87) x = _mm256_max_ps(_mm256_set1_ps(-87.0f), x);
  const __m256 fx = _mm256_round_ps(
      _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)),
      _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fmadd_ps(fx, _mm256_set1_ps(2.12194440e-4f), x);
  const __m256 z = _mm256_mul_ps(x, x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_add_ps(_mm256_fmadd_ps(y, z, x), _mm256_set1_ps(1.0f));
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}
inline __m256 sigm8(__m256 x) {
  const __m256 one = _mm256_set1_ps(1.0f);
  return _mm256_div_ps(one, _mm256_add_ps(one, exp8(_mm256_xor_ps(x, _mm256_set1_ps(-0.0f)))));
}
inline __m256 tanh8(__m256 x) {
  const __m256 sign = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f);
  const __m256 ax = _mm256_andnot_ps(sign, x);
  // 2|x| >= 0 (or NaN): the lower clamp of exp_f changes nothing
  const __m256 e = exp8(_mm256_add_ps(ax, ax), true);
  const __m256 big = _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, one)));
  const __m256 z = _mm256_mul_ps(x, x);
  __m256 p = _mm256_set1_ps(-5.70498872745e-3f);
  p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(2.06390887954e-2f));
  p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(-5.37397155531e-2f));
  p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(1.33314422036e-1f));
  p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(-3.33332819422e-1f));
  p = _mm256_fmadd_ps(_mm256_mul_ps(p, z), ax, ax);
  const __m256 small = _mm256_cmp_ps(ax, _mm256_set1_ps(0.625f), _CMP_LT_OQ);
  return _mm256_or_ps(_mm256_blendv_ps(big, p, small), _mm256_and_ps(x, sign));  // copysign
}

// The gate loops' loads: 8 floats from p + j, and (a + b) + c — the scalar loops' order
// for projection, bias and recurrent part.
inline __m256 ld8(const float* p, int64_t j) { return _mm256_loadu_ps(p + j); }
inline __m256 sum8(const float* a, const float* b, const float* c, int64_t j) {
  return _mm256_add_ps(_mm256_add_ps(ld8(a, j), ld8(b, j)), ld8(c, j));
}

}  // namespace
#endif
