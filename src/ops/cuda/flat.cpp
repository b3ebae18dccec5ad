#include "ops/cuda/flat.hpp"

#include <algorithm>
#include <climits>
#include <cmath>

#include "ops/cuda/check.hpp"
#include "ops/cuda/cuda_backend.hpp"
#include "ops/cuda/flat_kernels.hpp"

namespace lockstep::ops::cuda {
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

AdamWArgs adamw_args(const AdamWParams& p) {
  const double t = static_cast<double>(p.step);
  return AdamWArgs{
      p.beta1,
      p.beta2,
      p.eps,
      1.0f - p.lr * p.weight_decay,
      static_cast<float>(p.lr / (1.0 - std::pow(static_cast<double>(p.beta1), t))),
      static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(static_cast<double>(p.beta2), t)))};
}

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
  float* buf = p.momentum != 0.0f ? momentum_buf.data<float>() : nullptr;
  cuda::flat_sgd_update(cp.table(), first, count, range.begin, range.end, param.data<float>(),
                        grad.data<float>(), buf, state_origin, a, s);
}

void flat_adamw_update(const FlatPlan& plan, FlatRange range, Tensor& param, const Tensor& grad,
                       Tensor& m, Tensor& v, std::int64_t state_origin, const AdamWParams& p,
                       cudaStream_t s) {
  const CudaFlatPlan& cp = cuda_plan(plan);
  auto [first, count] = cp.chunks_in(range);
  cuda::flat_adamw_update(cp.table(), first, count, range.begin, range.end, param.data<float>(),
                          grad.data<float>(), m.data<float>(), v.data<float>(), state_origin,
                          adamw_args(p), s);
}

void flat_sum_squares(const FlatPlan& plan, FlatRange range, const Tensor& x, Tensor& sums,
                      bool squares, cudaStream_t s) {
  const CudaFlatPlan& cp = cuda_plan(plan);
  auto [first, count] = cp.chunks_in(range);
  cuda::flat_sum_squares(cp.table(), first, count, range.begin, range.end, x.data<float>(),
                         static_cast<const i64*>(cp.device_slot_chunks.raw_data()), plan.slots(),
                         cp.partials.data<double>(), sums.data<double>(), squares, s);
}

}  // namespace lockstep::ops::cuda
