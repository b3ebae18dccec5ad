// Deterministic warp and block reductions for lockstep's kernels: a fixed shuffle tree inside a
// warp and a fixed order across warps, so the same inputs give the same bits run after run (no
// atomics). Internal linkage (an anonymous namespace): every .cu file that includes it gets its
// own.
#pragma once

#include <cuda_runtime.h>

namespace lockstep::ops::cuda {
namespace {

template <class T>
__device__ T warp_sum(T v) {
  for (int offset = 16; offset > 0; offset >>= 1)
    v += __shfl_down_sync(0xffffffffu, v, offset);
  return v;
}

template <class T>
__device__ T warp_max(T v) {
  for (int offset = 16; offset > 0; offset >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Sum over the block, returned to every thread. Safe to call several times in a row.
template <class T>
__device__ T block_sum(T v) {
  __shared__ T partial[32];
  __shared__ T total;
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // a previous call may still be reading `total`/`partial`
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    int warps = (blockDim.x + 31) >> 5;
    T w = lane < warps ? partial[lane] : T(0);
    w = warp_sum(w);
    if (lane == 0) total = w;
  }
  __syncthreads();
  return total;
}

}  // namespace
}  // namespace lockstep::ops::cuda
