// The launch helpers every .cu of the CUDA backend uses, written once: the block size, the grid
// for an n-element grid-stride loop, the loop itself, and a launch that is skipped when there is
// no work and checked when there is (LOCKSTEP_CHECK_LAUNCH, check.hpp).
//
// Trade-offs, once for every .cu:
// - Simple grid-stride kernels, 256 threads, i64 indices: these ops are memory-bound and small
//   next to the GEMMs and convolutions; clarity wins over the last 10%.
// - Every reduction is deterministic: fixed grids, a fixed tree inside a block (block_reduce.cuh),
//   no float atomics (pool backward gathers instead of scattering). Same inputs, same bits, run
//   after run: the design promises bitwise-identical runs for the same config and world size.
// - Launchers take plain pointers and sizes and one stream; each checks its launch, none
//   synchronises. Internal linkage
// (an anonymous namespace), as in block_reduce.cuh: every .cu file that includes it gets its own.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/check.hpp"

namespace lockstep::ops::cuda {

using i64 = std::int64_t;

namespace {

constexpr int kThreads = 256;
// Enough blocks to fill an H200 (132 SMs x 8 resident 256-thread blocks) several times over;
// grid-stride loops cover the rest.
constexpr i64 kMaxBlocks = 8192;

inline unsigned blocks_for(i64 n) {
  i64 b = (n + kThreads - 1) / kThreads;
  if (b < 1) b = 1;
  if (b > kMaxBlocks) b = kMaxBlocks;
  return static_cast<unsigned>(b);
}

// Element k of channel c in [n, channels, inner] layout (per-channel reductions: the conv bias
// gradient, batch norm).
__device__ __forceinline__ i64 channel_index(i64 k, i64 c, i64 channels, i64 inner) {
  return (k / inner) * channels * inner + c * inner + k % inner;
}

// bf16 as its 16-bit pattern. The rounding is written out with integer operations (not
// __float2bfloat16_rn) so that it is the CPU backend's bit for bit: round to nearest even, NaN
// stays NaN, f32 subnormals flush to signed zero (include/lockstep/core/bf16.hpp).
__device__ __forceinline__ std::uint16_t to_bf16(float f) {
  std::uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  if ((u & 0x7f800000u) == 0) u &= 0x80000000u;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}
__device__ __forceinline__ float from_bf16(std::uint16_t h) {
  return __uint_as_float(static_cast<std::uint32_t>(h) << 16);
}

// Element access for kernels templated on an activation's type (ops.hpp, "Activations in bf16":
// float, or bf16 as std::uint16_t): read widened to f32, written rounded once.
__device__ __forceinline__ float load_f32(const float* p, i64 i) {
  return p[i];
}
__device__ __forceinline__ float load_f32(const std::uint16_t* p, i64 i) {
  return from_bf16(p[i]);
}
__device__ __forceinline__ void store_f32(float* p, i64 i, float v) {
  p[i] = v;
}
__device__ __forceinline__ void store_f32(std::uint16_t* p, i64 i, float v) {
  p[i] = to_bf16(v);
}

}  // namespace
}  // namespace lockstep::ops::cuda

#define LOCKSTEP_GRID_STRIDE(i, n)                                               \
  for (i64 i = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<i64>(blockDim.x) * gridDim.x)

// kernel<<<blocks_for(n), kThreads, 0, s>>>(...) when n > 0, then the launch check.
#define LOCKSTEP_LAUNCH(kernel, n, s, ...)                    \
  do {                                                        \
    if ((n) > 0) {                                            \
      kernel<<<blocks_for(n), kThreads, 0, s>>>(__VA_ARGS__); \
      LOCKSTEP_CHECK_LAUNCH();                                \
    }                                                         \
  } while (0)
