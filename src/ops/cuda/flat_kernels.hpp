// Launchers for the fused flat-buffer kernels (flat_kernels.cu): the optimizer updates and the
// per-segment sum of squares, each covering many tensors in one launch. The work is a table of
// chunks (at most kFlatChunk elements of one segment each, one thread block per chunk, as
// PyTorch's multi_tensor_apply does): a chunk carries its segment's slot and weight-decay flag,
// so segments that differ only in that flag share the launch. Each launcher runs the `count`
// chunks of the device table `chunks` from index `first` on, each clipped to [begin, end).
// Plain pointers, as in kernels.hpp; none synchronises.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/kernels.hpp"

namespace lockstep::ops::cuda {

// 16 elements per thread of a 256-thread block: a 1M-element layout already gives 256 blocks,
// enough to fill an H200, and short chunks keep the tail of each segment cheap.
inline constexpr i64 kFlatChunk = 4096;

struct FlatChunk {
  i64 begin, end;  // elements of the flat buffer
  std::int32_t slot;
  std::int32_t decay;  // 1: apply weight decay
};
static_assert(sizeof(FlatChunk) == 24);

// State tensors hold the layout's elements from `origin` on: element i is state[i - origin].
void flat_sgd_update(const FlatChunk* chunks, i64 first, i64 count, i64 begin, i64 end,
                     float* param, const float* grad, float* buf, i64 origin, const SgdArgs& a,
                     cudaStream_t s);
void flat_adamw_update(const FlatChunk* chunks, i64 first, i64 count, i64 begin, i64 end,
                       float* param, const float* grad, float* m, float* v, i64 origin,
                       const AdamWArgs& a, cudaStream_t s);
// partials[c - first] = sum of squares of chunk c (for the `count` chunks run); then per slot s,
// sums[s] = the sum of those partials over the slot's chunks, where
// slot_chunks[2s], slot_chunks[2s + 1] give the slot's first chunk and chunk count in the whole
// table; finally sums[slots] = sums[0] + ... + sums[slots - 1] in slot order. Deterministic:
// fixed trees, no atomics. squares = false adds x * 0 instead (0, or NaN for a non-finite x).
void flat_sum_squares(const FlatChunk* chunks, i64 first, i64 count, i64 begin, i64 end,
                      const float* x, const i64* slot_chunks, int slots, double* partials,
                      double* sums, bool squares, cudaStream_t s);

}  // namespace lockstep::ops::cuda
