// Portable SIMD for the CPU kernels that the compiler will not vectorise on its own (exp,
// compares and selects: without -fno-trapping-math GCC keeps float compares as branches). GCC
// vector extensions, 16 floats wide: one AVX-512 register, two AVX2 registers or four SSE ones,
// so the same source runs on any x86-64. Hot loops are compiled three times (LOCKSTEP_SIMD_CLONES:
// AVX-512F, AVX2, baseline) and the loader picks the best the CPU has, since the project builds
// for baseline x86-64 unless LOCKSTEP_NATIVE is on.
//
// Every lane does the same IEEE operations in the same order on every clone (ISO C++ mode turns
// off FMA contraction), so results are bitwise identical whichever clone runs; reductions add
// lanes in a fixed order.
#pragma once

#include <cstdint>
#include <cstring>

#include "lockstep/core/simd_clones.hpp"

// Vector arguments wider than the baseline ABI only ever pass between always-inline helpers of
// one translation unit: the ABI note GCC prints for them does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"

#define LOCKSTEP_SIMD_INLINE inline __attribute__((always_inline))

namespace lockstep::ops::cpu::simd {

inline constexpr int kWidth = 16;
typedef float vf __attribute__((vector_size(kWidth * sizeof(float))));
typedef std::int32_t vi __attribute__((vector_size(kWidth * sizeof(std::int32_t))));

LOCKSTEP_SIMD_INLINE vf splat(float v) {
  return vf{} + v;
}
LOCKSTEP_SIMD_INLINE vf load(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
LOCKSTEP_SIMD_INLINE void store(float* p, vf v) {
  std::memcpy(p, &v, sizeof v);
}
// The first n (< kWidth) lanes from p, the rest `fill`.
LOCKSTEP_SIMD_INLINE vf load_partial(const float* p, std::int64_t n, float fill) {
  float tmp[kWidth];
  for (int j = 0; j < kWidth; ++j)
    tmp[j] = j < n ? p[j] : fill;
  return load(tmp);
}
LOCKSTEP_SIMD_INLINE void store_partial(float* p, vf v, std::int64_t n) {
  float tmp[kWidth];
  store(tmp, v);
  for (std::int64_t j = 0; j < n; ++j)
    p[j] = tmp[j];
}
LOCKSTEP_SIMD_INLINE vf vmax(vf a, vf b) {
  return a > b ? a : b;
}
LOCKSTEP_SIMD_INLINE float hmax(vf v) {
  float m = v[0];
  for (int j = 1; j < kWidth; ++j)
    m = m > v[j] ? m : v[j];
  return m;
}
// Lanes added pairwise in a fixed tree, so the result does not depend on the clone.
LOCKSTEP_SIMD_INLINE float hsum(vf v) {
  float t[kWidth];
  store(t, v);
  for (int w = kWidth / 2; w >= 1; w /= 2)
    for (int j = 0; j < w; ++j)
      t[j] += t[j + w];
  return t[0];
}

// e^x to about 1 ulp (Cephes' expf: Cody-Waite reduction by ln 2, degree-6 polynomial), for x
// clamped to [-87.3, 88.7]; exp(-inf) gives 2^-126 * e^-0.0x, i.e. ~1e-38, never NaN. NaN in
// gives NaN out.
LOCKSTEP_SIMD_INLINE vf exp(vf x) {
  x = x < -87.3f ? splat(-87.3f) : x;
  x = x > 88.7f ? splat(88.7f) : x;
  // n = round(x / ln 2) by the 1.5 * 2^23 trick: adding it pushes the fraction bits out.
  vf n = x * 1.44269504088896341f + 12582912.0f;
  vi e = reinterpret_cast<vi>(n) - reinterpret_cast<vi>(splat(12582912.0f));
  n = n - 12582912.0f;
  vf r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  vf p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  // p * 2^n by adding n to the exponent; n in [-126, 128] keeps it a normal float except at the
  // clamp (2^128 would overflow: split it in two).
  vi half = e >> 1;
  vf scale1 = reinterpret_cast<vf>((half + 127) << 23);
  vf scale2 = reinterpret_cast<vf>((e - half + 127) << 23);
  return p * scale1 * scale2;
}

}  // namespace lockstep::ops::cpu::simd
