// bf16 conversions for the bf16 policy: grid-stride loops over 16-bit patterns, memory-bound and
// tiny next to the GEMMs they feed. The rounding is written out with integer operations (not
// __float2bfloat16_rn) so that it matches the CPU backend bit for bit, subnormal flush included.
#include "ops/cuda/check.hpp"
#include "ops/cuda/precision_kernels.hpp"

namespace lockstep::ops::cuda {
namespace {

constexpr int kThreads = 256;
constexpr std::int64_t kMaxBlocks = 8192;

unsigned blocks_for(std::int64_t n) {
  std::int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > kMaxBlocks ? kMaxBlocks : b));
}

__device__ std::uint16_t to_bf16(float f) {
  std::uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  if ((u & 0x7f800000u) == 0) u &= 0x80000000u;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

__device__ float from_bf16(std::uint16_t h) {
  return __uint_as_float(static_cast<std::uint32_t>(h) << 16);
}

#define LOCKSTEP_GRID_STRIDE(i, n)                                                                 \
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<std::int64_t>(blockDim.x) * gridDim.x)

__global__ void f32_to_bf16_kernel(const float* src, std::uint16_t* dst, std::int64_t n) {
  LOCKSTEP_GRID_STRIDE(i, n) dst[i] = to_bf16(src[i]);
}
__global__ void bf16_to_f32_kernel(const std::uint16_t* src, float* dst, std::int64_t n) {
  LOCKSTEP_GRID_STRIDE(i, n) dst[i] = from_bf16(src[i]);
}
__global__ void add_bf16_to_f32_kernel(const std::uint16_t* src, float* dst, std::int64_t n) {
  LOCKSTEP_GRID_STRIDE(i, n) dst[i] += from_bf16(src[i]);
}

}  // namespace

void f32_to_bf16(const float* src, std::uint16_t* dst, std::int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  f32_to_bf16_kernel<<<blocks_for(n), kThreads, 0, s>>>(src, dst, n);
  LOCKSTEP_CHECK_LAUNCH();
}
void bf16_to_f32(const std::uint16_t* src, float* dst, std::int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  bf16_to_f32_kernel<<<blocks_for(n), kThreads, 0, s>>>(src, dst, n);
  LOCKSTEP_CHECK_LAUNCH();
}
void add_bf16_to_f32(const std::uint16_t* src, float* dst, std::int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  add_bf16_to_f32_kernel<<<blocks_for(n), kThreads, 0, s>>>(src, dst, n);
  LOCKSTEP_CHECK_LAUNCH();
}

}  // namespace lockstep::ops::cuda
