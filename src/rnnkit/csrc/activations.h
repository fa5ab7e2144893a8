// The activation functions of the gate loops.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace {

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
  // |x| < 0.625: the odd polynomial x + x^3 P(x^2), in Horner form
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  p = p * z * ax + ax;
  return std::copysign(ax < 0.625f ? p : big, x);
}
inline double sigm(double x) { return 1.0 / (1.0 + std::exp(-x)); }
inline double tanh_(double x) { return std::tanh(x); }

}  // namespace
