// bf16 activations in the CPU kernels (ops.hpp, "Activations in bf16"): a kernel that reads a bf16
// tensor widens the rows or chunks it is about to use into a thread's scratch and runs its f32
// code on them; one that writes a bf16 tensor runs its f32 code into scratch and rounds what it
// made. So a bf16 op is bitwise cast(f32 op(widened inputs)), the scratch is a row or a chunk that
// stays in L1/L2, and no pass over memory is added: the activations' bytes are halved.
#pragma once

#include <cstddef>
#include <cstdint>

#include "lockstep/core/bf16.hpp"
#include "lockstep/core/tensor.hpp"

namespace lockstep::ops::cpu {

// Elements an elementwise kernel converts at a time: 8 KB of floats, well inside L1.
inline constexpr std::int64_t kBf16Chunk = 2048;

// dst[i] = src[i] (exact), single-threaded.
void widen_bf16(const std::uint16_t* src, float* dst, std::int64_t n);
// dst[i] = bf16(src[i]), round to nearest even as ops::cast rounds (vcvtneps2bf16 where the CPU
// has AVX512-BF16, the same bits otherwise), single-threaded.
void round_to_bf16(const float* src, std::uint16_t* dst, std::int64_t n);

// A buffer of at least n floats owned by the calling thread (`slot`, 0 to 3, tells a kernel's
// buffers apart); it grows to the largest request and is then reused, so a steady-state step does
// not allocate. Valid until the same thread asks for the same slot again.
float* thread_scratch(std::size_t n, int slot = 0);

// An element of an f32 or bf16 activation as f32 (exact), for kernels templated on the type.
[[gnu::always_inline]] inline float widened(float v) {
  return v;
}
[[gnu::always_inline]] inline float widened(std::uint16_t v) {
  return bf16_to_float(v);
}

inline const std::uint16_t* bf16_in(const Tensor& t) {
  return static_cast<const std::uint16_t*>(t.raw_data());
}
inline std::uint16_t* bf16_out(const Tensor& t) {
  return static_cast<std::uint16_t*>(t.raw_data());
}

}  // namespace lockstep::ops::cpu
