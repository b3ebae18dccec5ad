// The fused flat-buffer ops: the optimizer updates and the per-segment sum of squares, each
// covering many tensors in one launch. Here are the plan (a chunk table, per-slot chunk ranges
// and a partial-sum buffer, all on the device, made once), the kernels, their launchers and
// CudaBackend's flat_* methods.
//
// Trade-offs:
// - The work is a table of chunks (at most kFlatChunk elements of one segment each, one thread
//   block per chunk, as PyTorch's multi_tensor_apply does): a chunk carries its segment's slot and
//   weight-decay flag, so segments that differ only in that flag share the launch. Each launcher
//   runs the `count` chunks of the device table `chunks` from index `first` on, each clipped to
//   [begin, end).
// - The element formulas are the per-tensor kernels' (cuda_loss_optim.cu) written once more per
//   chunk; the tests compare the two on the GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "lockstep/ops/ops.hpp"
#include "lockstep/ops/step_verdict.hpp"
#include "ops/cuda/block_reduce.cuh"
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_backend.hpp"

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

namespace {

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
  bool first = a.first_step;
  if (a.verdict != nullptr) {
    std::int64_t step = a.step;
    if (!verdict_applies(a.verdict, step)) return;
    first = step == 1;
  }
  const ChunkRange r = chunk_range(chunks, begin, end);
  const float wd = r.decay ? a.weight_decay : 0.0f;
  for (i64 i = r.lo + threadIdx.x; i < r.hi; i += blockDim.x) {
    float g = grad[i] + wd * param[i];
    if (a.momentum != 0.0f) {
      float b = first ? g : a.momentum * buf[i - origin] + (1.0f - a.dampening) * g;
      buf[i - origin] = b;
      g = a.nesterov ? g + a.momentum * b : b;
    }
    param[i] -= a.lr * g;
  }
}

__global__ void flat_adamw_kernel(const FlatChunk* chunks, i64 begin, i64 end, float* param,
                                  const float* grad, float* m, float* v, i64 origin, AdamWArgs a) {
  float step_size = a.step_size, inv_sqrt_bc2 = a.inv_sqrt_bc2;
  if (a.verdict != nullptr) {
    std::int64_t step = a.step;
    if (!verdict_applies(a.verdict, step)) return;
    if (step != a.step) {  // updates were skipped: the bias corrections of the real count
      const double t = static_cast<double>(step);
      step_size = static_cast<float>(a.lr / (1.0 - pow(static_cast<double>(a.beta1), t)));
      inv_sqrt_bc2 = static_cast<float>(1.0 / sqrt(1.0 - pow(static_cast<double>(a.beta2), t)));
    }
  }
  const ChunkRange r = chunk_range(chunks, begin, end);
  const float decay = r.decay ? a.decay : 1.0f;
  for (i64 i = r.lo + threadIdx.x; i < r.hi; i += blockDim.x) {
    const i64 s = i - origin;
    float g = grad[i];
    float mi = a.beta1 * m[s] + (1.0f - a.beta1) * g;
    float vi = a.beta2 * v[s] + (1.0f - a.beta2) * g * g;
    m[s] = mi;
    v[s] = vi;
    param[i] = param[i] * decay - step_size * mi / (sqrtf(vi) * inv_sqrt_bc2 + a.eps);
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

// The step verdict's kernels (ops/step_verdict.hpp): two doubles, one thread.
__global__ void verdict_add_kernel(const double* total, double* verdict, bool first) {
  verdict[0] = (first ? 0.0 : verdict[0]) + total[0];
}

__global__ void verdict_close_kernel(double* verdict, long long taken) {
  std::int64_t step = 0;
  verdict[1] =
      verdict[1] - static_cast<double>(taken) + (verdict_applies(verdict, step) ? 0.0 : 1.0);
}

// scale_kernel's multiply by the clipping factor, which every thread computes from the verdict.
__global__ void clip_by_verdict_kernel(float* x, i64 n, const double* verdict, double max_norm) {
  const double coef = clip_coefficient(max_norm, verdict[0]);
  if (!(coef < 1.0)) return;
  const float c = static_cast<float>(coef);
  LOCKSTEP_GRID_STRIDE(i, n) x[i] *= c;
}

unsigned grid_of(i64 count) {
  // count <= the chunk table's size, which make_flat_plan keeps below 2^31.
  return static_cast<unsigned>(count);
}

}  // namespace

// State tensors hold the layout's elements from `origin` on: element i is state[i - origin].
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

// partials[c - first] = sum of squares of chunk c (for the `count` chunks run); then per slot s,
// sums[s] = the sum of those partials over the slot's chunks, where
// slot_chunks[2s], slot_chunks[2s + 1] give the slot's first chunk and chunk count in the whole
// table; finally sums[slots] = sums[0] + ... + sums[slots - 1] in slot order. Deterministic:
// fixed trees, no atomics. squares = false adds x * 0 instead (0, or NaN for a non-finite x).
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

namespace {

// The chunk table and per-slot ranges, uploaded once; `partials` is scratch the sum-of-squares
// launches write, so a plan serves one context's stream (as FlatParams and optimizers use it).
class CudaFlatPlan final : public FlatPlan {
 public:
  CudaFlatPlan(Device device, std::vector<FlatSegment> segments, std::int64_t numel, cudaStream_t s)
      : FlatPlan(std::move(segments), numel, device) {
    std::vector<i64> slot_chunks(2 * static_cast<std::size_t>(slots()), 0);
    for (const FlatSegment& seg : this->segments()) {
      slot_chunks[2 * static_cast<std::size_t>(seg.slot)] = static_cast<i64>(chunks.size());
      for (i64 b = seg.offset; b < seg.offset + seg.numel; b += kFlatChunk)
        chunks.push_back(
            {b, std::min(b + kFlatChunk, seg.offset + seg.numel), seg.slot, seg.decay ? 1 : 0});
      slot_chunks[2 * static_cast<std::size_t>(seg.slot) + 1] =
          static_cast<i64>(chunks.size()) - slot_chunks[2 * static_cast<std::size_t>(seg.slot)];
    }
    LOCKSTEP_CHECK(chunks.size() < static_cast<std::size_t>(INT_MAX), "flat plan: ", chunks.size(),
                   " chunks exceed one kernel grid");
    // Every device buffer of the plan is allocated here, once: the steps allocate nothing.
    const auto chunk_bytes = static_cast<std::int64_t>(chunks.size() * sizeof(FlatChunk));
    device_chunks = Tensor::empty({std::max<std::int64_t>(chunk_bytes, 1)}, DType::U8, device);
    const auto slot_bytes = static_cast<std::int64_t>(slot_chunks.size() * sizeof(i64));
    device_slot_chunks = Tensor::empty({std::max<std::int64_t>(slot_bytes, 1)}, DType::U8, device);
    partials = Tensor::empty({std::max<std::int64_t>(static_cast<std::int64_t>(chunks.size()), 1)},
                             DType::F64, device);
    // From pageable memory the copies return once the bytes are staged, so the vectors may go.
    if (!chunks.empty()) note_pageable_copy();
    if (!slot_chunks.empty()) note_pageable_copy();
    if (!chunks.empty())
      LOCKSTEP_CHECK_CUDA(cudaMemcpyAsync(device_chunks.raw_data(), chunks.data(),
                                          static_cast<std::size_t>(chunk_bytes),
                                          cudaMemcpyHostToDevice, s));
    if (!slot_chunks.empty())
      LOCKSTEP_CHECK_CUDA(cudaMemcpyAsync(device_slot_chunks.raw_data(), slot_chunks.data(),
                                          static_cast<std::size_t>(slot_bytes),
                                          cudaMemcpyHostToDevice, s));
  }

  // The chunks that overlap `range`: first index and count.
  std::pair<i64, i64> chunks_in(FlatRange range) const {
    if (range.begin >= range.end) return {0, 0};
    auto lo = std::partition_point(chunks.begin(), chunks.end(),
                                   [&](const FlatChunk& c) { return c.end <= range.begin; });
    auto hi = std::partition_point(lo, chunks.end(),
                                   [&](const FlatChunk& c) { return c.begin < range.end; });
    return {static_cast<i64>(lo - chunks.begin()), static_cast<i64>(hi - lo)};
  }

  const FlatChunk* table() const { return static_cast<const FlatChunk*>(device_chunks.raw_data()); }

  std::vector<FlatChunk> chunks;  // by offset; the host copy of device_chunks
  Tensor device_chunks;           // FlatChunk[chunks.size()] as bytes
  Tensor device_slot_chunks;      // i64 [slots][2] as bytes: first chunk, chunk count
  Tensor partials;                // f64 [chunks.size()]
};

const CudaFlatPlan& cuda_plan(const FlatPlan& plan) {
  const auto* p = dynamic_cast<const CudaFlatPlan*>(&plan);
  LOCKSTEP_CHECK(p != nullptr, "a flat plan made by another backend was given to the CUDA backend");
  return *p;
}

}  // namespace

std::shared_ptr<const FlatPlan> make_flat_plan(Device device, std::vector<FlatSegment> segments,
                                               std::int64_t numel, cudaStream_t s) {
  return std::make_shared<CudaFlatPlan>(device, std::move(segments), numel, s);
}

void flat_sgd_update(const FlatPlan& plan, FlatRange range, Tensor& param, const Tensor& grad,
                     Tensor& momentum_buf, std::int64_t state_origin, const SgdParams& p,
                     cudaStream_t s) {
  const CudaFlatPlan& cp = cuda_plan(plan);
  auto [first, count] = cp.chunks_in(range);
  SgdArgs a{p.lr, p.momentum, p.dampening, p.weight_decay, p.nesterov, p.first_step};
  if (p.verdict.defined()) {
    a.verdict = p.verdict.data<double>();
    a.step = p.step;
  }
  float* buf = p.momentum != 0.0f ? momentum_buf.data<float>() : nullptr;
  cuda::flat_sgd_update(cp.table(), first, count, range.begin, range.end, param.data<float>(),
                        grad.data<float>(), buf, state_origin, a, s);
}

void flat_adamw_update(const FlatPlan& plan, FlatRange range, Tensor& param, const Tensor& grad,
                       Tensor& m, Tensor& v, std::int64_t state_origin, const AdamWParams& p,
                       cudaStream_t s) {
  const CudaFlatPlan& cp = cuda_plan(plan);
  auto [first, count] = cp.chunks_in(range);
  AdamWArgs a = adamw_args(p);
  if (p.verdict.defined()) {
    a.verdict = p.verdict.data<double>();
    a.step = p.step;
    a.lr = p.lr;
  }
  cuda::flat_adamw_update(cp.table(), first, count, range.begin, range.end, param.data<float>(),
                          grad.data<float>(), m.data<float>(), v.data<float>(), state_origin, a, s);
}

void flat_sum_squares(const FlatPlan& plan, FlatRange range, const Tensor& x, Tensor& sums,
                      bool squares, cudaStream_t s) {
  const CudaFlatPlan& cp = cuda_plan(plan);
  auto [first, count] = cp.chunks_in(range);
  cuda::flat_sum_squares(cp.table(), first, count, range.begin, range.end, x.data<float>(),
                         static_cast<const i64*>(cp.device_slot_chunks.raw_data()), plan.slots(),
                         cp.partials.data<double>(), sums.data<double>(), squares, s);
}

// ---- CudaBackend's methods
std::shared_ptr<const FlatPlan> CudaBackend::make_flat_plan(std::vector<FlatSegment> segments,
                                                            std::int64_t numel) {
  activate();
  return cuda::make_flat_plan(device_, std::move(segments), numel, stream_);
}
void CudaBackend::flat_sgd_update(const FlatPlan& plan, FlatRange range, Tensor& param,
                                  const Tensor& grad, Tensor& momentum_buf,
                                  std::int64_t state_origin, const SgdParams& p) {
  activate();
  cuda::flat_sgd_update(plan, range, param, grad, momentum_buf, state_origin, p, stream_);
}
void CudaBackend::flat_adamw_update(const FlatPlan& plan, FlatRange range, Tensor& param,
                                    const Tensor& grad, Tensor& m, Tensor& v,
                                    std::int64_t state_origin, const AdamWParams& p) {
  activate();
  cuda::flat_adamw_update(plan, range, param, grad, m, v, state_origin, p, stream_);
}
void CudaBackend::flat_sum_squares(const FlatPlan& plan, FlatRange range, const Tensor& x,
                                   Tensor& sums, FlatSums what) {
  activate();
  cuda::flat_sum_squares(plan, range, x, sums, what == FlatSums::Squares, stream_);
}

void CudaBackend::verdict_add(const Tensor& total, Tensor& verdict, bool first) {
  activate();
  verdict_add_kernel<<<1, 1, 0, stream_>>>(total.data<double>(), verdict.data<double>(), first);
  LOCKSTEP_CHECK_LAUNCH();
}
void CudaBackend::verdict_close(Tensor& verdict, std::int64_t taken) {
  activate();
  verdict_close_kernel<<<1, 1, 0, stream_>>>(verdict.data<double>(), taken);
  LOCKSTEP_CHECK_LAUNCH();
}
void CudaBackend::clip_by_verdict(Tensor& x, const Tensor& verdict, double max_norm) {
  activate();
  LOCKSTEP_LAUNCH(clip_by_verdict_kernel, x.numel(), stream_, x.data<float>(), x.numel(),
                  verdict.data<double>(), max_norm);
}

}  // namespace lockstep::ops::cuda
