// Fused flat-buffer kernels: see flat_kernels.hpp. The element formulas are the per-tensor
// kernels' (kernels.cu) written once more per chunk; the tests compare the two on the GPU.
#include <cuda_runtime.h>

#include "ops/cuda/block_reduce.cuh"
#include "ops/cuda/check.hpp"
#include "ops/cuda/flat_kernels.hpp"

namespace lockstep::ops::cuda {
namespace {

constexpr int kThreads = 256;

struct ChunkRange {
  i64 lo, hi;
  bool decay;
};

__device__ ChunkRange chunk_range(const FlatChunk* chunks, i64 begin, i64 end) {
  const FlatChunk c = chunks[blockIdx.x];
  return {c.begin > begin ? c.begin : begin, c.end < end ? c.end : end, c.decay != 0};
}

__global__ void flat_sgd_kernel(const FlatChunk* chunks, i64 begin, i64 end, float* param,
                                const float* grad, float* buf, i64 origin, SgdArgs a) {
  const ChunkRange r = chunk_range(chunks, begin, end);
  const float wd = r.decay ? a.weight_decay : 0.0f;
  for (i64 i = r.lo + threadIdx.x; i < r.hi; i += blockDim.x) {
    float g = grad[i] + wd * param[i];
    if (a.momentum != 0.0f) {
      float b = a.first_step ? g : a.momentum * buf[i - origin] + (1.0f - a.dampening) * g;
      buf[i - origin] = b;
      g = a.nesterov ? g + a.momentum * b : b;
    }
    param[i] -= a.lr * g;
  }
}

__global__ void flat_adamw_kernel(const FlatChunk* chunks, i64 begin, i64 end, float* param,
                                  const float* grad, float* m, float* v, i64 origin, AdamWArgs a) {
  const ChunkRange r = chunk_range(chunks, begin, end);
  const float decay = r.decay ? a.decay : 1.0f;
  for (i64 i = r.lo + threadIdx.x; i < r.hi; i += blockDim.x) {
    const i64 s = i - origin;
    float g = grad[i];
    float mi = a.beta1 * m[s] + (1.0f - a.beta1) * g;
    float vi = a.beta2 * v[s] + (1.0f - a.beta2) * g * g;
    m[s] = mi;
    v[s] = vi;
    param[i] = param[i] * decay - a.step_size * mi / (sqrtf(vi) * a.inv_sqrt_bc2 + a.eps);
  }
}

__global__ void flat_chunk_sum_squares_kernel(const FlatChunk* chunks, i64 begin, i64 end,
                                              const float* x, bool squares, double* partials) {
  const ChunkRange r = chunk_range(chunks, begin, end);
  double acc = 0.0;
  for (i64 i = r.lo + threadIdx.x; i < r.hi; i += blockDim.x) {
    double v = x[i];
    acc += v * (squares ? v : 0.0);
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

// One block per slot: its chunks' partials (those among the `count` run from chunk `first`).
__global__ void flat_slot_sums_kernel(const double* partials, i64 first, i64 count,
                                      const i64* slot_chunks, double* sums) {
  const int slot = blockIdx.x;
  i64 lo = slot_chunks[2 * slot], hi = lo + slot_chunks[2 * slot + 1];
  lo = lo > first ? lo : first;
  hi = hi < first + count ? hi : first + count;
  double acc = 0.0;
  for (i64 c = lo + threadIdx.x; c < hi; c += blockDim.x)
    acc += partials[c - first];
  acc = block_sum(acc);
  if (threadIdx.x == 0) sums[slot] = acc;
}

// sums[slots] = sums[0] + ... + sums[slots - 1], one after the other as the CPU adds them: the
// block stages the slots in shared memory so the one adding thread waits on no global load.
__global__ void flat_total_kernel(double* sums, int slots) {
  __shared__ double staged[kThreads];
  double total = 0.0;
  for (int base = 0; base < slots; base += kThreads) {
    const int n = slots - base < kThreads ? slots - base : kThreads;
    if (static_cast<int>(threadIdx.x) < n) staged[threadIdx.x] = sums[base + threadIdx.x];
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int k = 0; k < n; ++k)
        total += staged[k];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) sums[slots] = total;
}

unsigned grid_of(i64 count) {
  // count <= the chunk table's size, which make_flat_plan keeps below 2^31.
  return static_cast<unsigned>(count);
}

}  // namespace

void flat_sgd_update(const FlatChunk* chunks, i64 first, i64 count, i64 begin, i64 end,
                     float* param, const float* grad, float* buf, i64 origin, const SgdArgs& a,
                     cudaStream_t s) {
  if (count <= 0) return;
  flat_sgd_kernel<<<grid_of(count), kThreads, 0, s>>>(chunks + first, begin, end, param, grad, buf,
                                                      origin, a);
  LOCKSTEP_CHECK_LAUNCH();
}

void flat_adamw_update(const FlatChunk* chunks, i64 first, i64 count, i64 begin, i64 end,
                       float* param, const float* grad, float* m, float* v, i64 origin,
                       const AdamWArgs& a, cudaStream_t s) {
  if (count <= 0) return;
  flat_adamw_kernel<<<grid_of(count), kThreads, 0, s>>>(chunks + first, begin, end, param, grad, m,
                                                        v, origin, a);
  LOCKSTEP_CHECK_LAUNCH();
}

void flat_sum_squares(const FlatChunk* chunks, i64 first, i64 count, i64 begin, i64 end,
                      const float* x, const i64* slot_chunks, int slots, double* partials,
                      double* sums, bool squares, cudaStream_t s) {
  if (count > 0) {
    flat_chunk_sum_squares_kernel<<<grid_of(count), kThreads, 0, s>>>(chunks + first, begin, end, x,
                                                                      squares, partials);
    LOCKSTEP_CHECK_LAUNCH();
  }
  if (slots > 0) {
    flat_slot_sums_kernel<<<static_cast<unsigned>(slots), kThreads, 0, s>>>(partials, first, count,
                                                                            slot_chunks, sums);
    LOCKSTEP_CHECK_LAUNCH();
  }
  flat_total_kernel<<<1, kThreads, 0, s>>>(sums, slots);
  LOCKSTEP_CHECK_LAUNCH();
}

}  // namespace lockstep::ops::cuda
