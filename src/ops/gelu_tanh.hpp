// GELU, tanh form, as one scalar formula for host and device code: the CUDA kernels
// (cuda_transformer.cu) call it, the host tests check it against float64 at the extremes, and the
// CPU's SIMD kernels (cpu/cpu_transformer.cpp) do the same operations in the same order on
// vectors, with the same clamp inside their simd::exp.
//
// With u = sqrt(2/pi) (x + 0.044715 x^3) and s = sigmoid(2u) = 1 / (1 + e^{-2u}):
// 0.5 (1 + tanh u) = s and 1 - tanh^2 u = 4 s (1 - s) with 1 - s = s e^{-2u}. Written this way
// neither the value nor the derivative subtracts nearly equal numbers in the tails, where
// 1 - tanh^2 would lose all its digits.
//
// e^{-2u} takes its argument clamped to [kGeluExpMin, kGeluExpMax], as simd::exp does. Unclamped,
// it overflows to inf below x = -10.3 and the derivative's s * e is 0 * inf = NaN (the CUDA
// kernel's bug before this header). What the clamp costs, and what non-finite inputs give:
// - x below about -10.4: s stays near e^{-88.7} = 3e-39 instead of underflowing, so gelu and
//   gelu' are tiny non-zero numbers (gelu'(-1e4) = -6e-28) where float64 says 0: far below the
//   float32 resolution of anything they are added to. (Beyond |x| = 1e12 the derivative's x^3
//   terms grow enough for this to matter; activations that large have diverged long before.)
// - x = +inf or -inf gives gelu = x and gelu' = x (not the limits 0 and 1): a non-finite
//   activation stays non-finite, so the gradient check reports it. NaN gives NaN (the clamp is
//   written with compares that keep a NaN, not with fmin/fmax, which would drop it).
#pragma once

#include <cmath>

#include "lockstep/ops/host_device.hpp"

namespace lockstep::ops {

inline constexpr float kSqrt2OverPi = 0.7978845608028654f;
inline constexpr float kGeluCoeff = 0.044715f;
// e^t stays a normal, finite float on [kGeluExpMin, kGeluExpMax] (FLT_MIN = e^-87.34,
// FLT_MAX = e^88.72), so 1 + e^t is finite and 1 / (1 + e^t) is not 0.
inline constexpr float kGeluExpMin = -87.3f;
inline constexpr float kGeluExpMax = 88.7f;

LOCKSTEP_HOST_DEVICE inline float gelu_tanh_exp(float t) {
  t = t < kGeluExpMin ? kGeluExpMin : t;
  t = t > kGeluExpMax ? kGeluExpMax : t;
  return expf(t);
}

LOCKSTEP_HOST_DEVICE inline float gelu_tanh(float x) {
  const float u = kSqrt2OverPi * (x + kGeluCoeff * x * x * x);
  return x / (1.0f + gelu_tanh_exp(-2.0f * u));
}

// d/dx of gelu_tanh, times the incoming gradient g.
LOCKSTEP_HOST_DEVICE inline float gelu_tanh_grad(float x, float g) {
  const float x2 = x * x;
  const float e = gelu_tanh_exp(-2.0f * kSqrt2OverPi * (x + kGeluCoeff * x2 * x));
  const float s = 1.0f / (1.0f + e);
  const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCoeff * x2);
  return g * (s + 2.0f * x * s * (s * e) * du);
}

}  // namespace lockstep::ops
