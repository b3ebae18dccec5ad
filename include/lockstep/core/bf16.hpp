// bfloat16 scalars as raw bits: the conversions every bf16 path shares (the CPU backend's cast,
// the MPI reduction of bf16 gradients). bf16 is f32's upper half: 8 exponent bits, 7 stored
// significand bits.
#pragma once

#include <bit>
#include <cstdint>

namespace lockstep {

// Round to nearest even; NaN stays a (quiet) NaN; f32 subnormals become signed zero, as
// AVX512-BF16's vcvtneps2bf16 does, so a result never depends on which path converted it.
// Finite values within half a bf16 step of the largest bf16 round to it; larger ones to Inf.
inline std::uint16_t float_to_bf16(float f) {
  std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  if ((u & 0x7f800000u) == 0) u &= 0x80000000u;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

// Exact.
inline float bf16_to_float(std::uint16_t b) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}

}  // namespace lockstep
