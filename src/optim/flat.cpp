#include "lockstep/optim/flat.hpp"

#include <algorithm>
#include <cstdint>

#include "lockstep/core/error.hpp"
#include "lockstep/nn/model.hpp"

namespace lockstep::optim {
namespace {

constexpr std::int64_t kAlign = ops::kFlatAlignBytes / static_cast<std::int64_t>(sizeof(float));

std::int64_t align_up(std::int64_t n) {
  return (n + kAlign - 1) / kAlign * kAlign;
}

// An f32 buffer whose first element sits on a kFlatAlignBytes boundary, filled from `values`.
// The allocators promise less (64 bytes on the CPU), so take kAlign elements more and start where
// the address is aligned; only the address is looked at here, never the memory behind it.
Tensor aligned_buffer(const std::vector<float>& values, Device device) {
  const auto numel = static_cast<std::int64_t>(values.size());
  Tensor raw = Tensor::empty({numel + kAlign}, DType::F32, device);
  const auto address = reinterpret_cast<std::uintptr_t>(raw.raw_data());
  LOCKSTEP_CHECK(address % sizeof(float) == 0, "flat buffer: misaligned allocation at ", address);
  const auto bytes_to_boundary =
      (ops::kFlatAlignBytes - static_cast<std::int64_t>(address % ops::kFlatAlignBytes)) %
      ops::kFlatAlignBytes;
  Tensor t = raw.sub(bytes_to_boundary / static_cast<std::int64_t>(sizeof(float)), {numel});
  t.copy_from(values);
  return t;
}

}  // namespace

FlatLayout FlatLayout::build(const std::vector<nn::Parameter*>& params,
                             const BucketLimits& limits) {
  LOCKSTEP_CHECK(limits.shards >= 1, "flat parameters: ", limits.shards,
                 " shards per bucket; need at least 1");
  FlatLayout layout;
  // Bucket assignment (PyTorch DDP's rule): parameters in reverse order, a new bucket once the
  // current one holds at least its limit.
  std::size_t bytes = 0;
  for (std::size_t k = params.size(); k-- > 0;) {
    std::size_t limit =
        layout.buckets_.size() == 1 ? limits.first_bucket_bytes : limits.bucket_bytes;
    if (layout.buckets_.empty() || bytes >= limit) {
      layout.buckets_.emplace_back();
      bytes = 0;
    }
    layout.buckets_.back().params.push_back(k);
    bytes += static_cast<std::size_t>(params[k]->value.numel()) * sizeof(float);
  }
  // Offsets: buckets one after the other, each parameter on an aligned boundary.
  layout.segments_.resize(params.size());
  std::int64_t offset = 0;
  for (FlatBucket& bucket : layout.buckets_) {
    bucket.begin = offset;
    for (std::size_t k : bucket.params) {
      ops::FlatSegment& s = layout.segments_[k];
      s.offset = offset;
      s.numel = params[k]->value.numel();
      s.slot = static_cast<std::int32_t>(k);
      offset = align_up(offset + s.numel);
    }
    // Padding up to a multiple of shards x kAlign (no-op for one shard: offset is aligned).
    const std::int64_t block = kAlign * std::max(1, limits.shards);
    offset = (offset + block - 1) / block * block;
    bucket.end = offset;
  }
  layout.numel_ = offset;
  return layout;
}

FlatParams::FlatParams(std::vector<nn::Parameter*> params, const BucketLimits& limits)
    : params_(std::move(params)), limits_(limits) {
  LOCKSTEP_CHECK(!params_.empty(), "flat parameters: no parameters to lay out");
  device_ = params_[0]->value.device();
  for (const nn::Parameter* p : params_) {
    LOCKSTEP_CHECK(p->value.defined() && p->value.dtype() == DType::F32 && p->value.numel() > 0,
                   "flat parameters: ", p->name, " is ", p->value.describe(),
                   "; only non-empty f32 parameters are laid out");
    LOCKSTEP_CHECK(p->value.device() == device_, "flat parameters: ", p->name, " is on ",
                   p->value.device().str(), " but ", params_[0]->name, " on ", device_.str());
    LOCKSTEP_CHECK(!p->grad.defined() || p->grad.shape() == p->value.shape(),
                   "flat parameters: ", p->name, " has a gradient ", p->grad.describe(),
                   " for a value ", p->value.describe());
    LOCKSTEP_CHECK_HINT(p->value.storage()->bytes() == p->value.nbytes(),
                        "build one FlatParams per model and give it to the optimizer and the "
                        "engine (e.g. optim::Sgd(engine.flat_params(), ...))",
                        "flat parameters: ", p->name,
                        " already lives in a larger buffer (laid out by another FlatParams?)");
  }
  layout_ = FlatLayout::build(params_, limits);
  const std::int64_t n = layout_.numel();
  // Stage on the host: one copy per buffer to the device, and the padding comes out zero.
  std::vector<float> values(static_cast<std::size_t>(n), 0.0f), grads(values);
  for (std::size_t k = 0; k < params_.size(); ++k) {
    const auto at = static_cast<std::ptrdiff_t>(layout_.segments()[k].offset);
    std::vector<float> v = params_[k]->value.to_vector<float>();
    std::copy(v.begin(), v.end(), values.begin() + at);
    if (params_[k]->grad.defined()) {
      std::vector<float> g = params_[k]->grad.to_vector<float>();
      std::copy(g.begin(), g.end(), grads.begin() + at);
    }
  }
  values_ = aligned_buffer(values, device_);
  grads_ = aligned_buffer(grads, device_);
  for (std::size_t k = 0; k < params_.size(); ++k) {
    params_[k]->value = view(values_, k);
    params_[k]->grad = view(grads_, k);
  }
  // What zero_grad fills: the runs between gradients whose layer overwrites them. The layout
  // holds the parameters in reverse order, so walking them backwards walks it from the start;
  // the padding between filled gradients goes with them (it is zero).
  std::int64_t run_begin = 0;
  for (std::size_t k = params_.size(); k-- > 0;) {
    if (!params_[k]->overwrites_grad) continue;
    const ops::FlatSegment& s = layout_.segments()[k];
    if (s.offset > run_begin) zero_runs_.push_back({run_begin, s.offset});
    run_begin = s.offset + s.numel;
  }
  if (n > run_begin) zero_runs_.push_back({run_begin, n});
}

Tensor FlatParams::value_bucket(std::size_t b) const {
  const FlatBucket& bucket = layout_.buckets().at(b);
  return values_.sub(bucket.begin, {bucket.numel()});
}

Tensor FlatParams::grad_bucket(std::size_t b) const {
  const FlatBucket& bucket = layout_.buckets().at(b);
  return grads_.sub(bucket.begin, {bucket.numel()});
}

Tensor FlatParams::zeros() const {
  return aligned_buffer(std::vector<float>(static_cast<std::size_t>(layout_.numel()), 0.0f),
                        device_);
}

Tensor FlatParams::zeros(std::int64_t numel) const {
  return aligned_buffer(std::vector<float>(static_cast<std::size_t>(numel), 0.0f), device_);
}

FlatShard FlatParams::shard(int rank, int count) const {
  LOCKSTEP_CHECK(count >= 1 && rank >= 0 && rank < count, "flat parameters: shard ", rank, " of ",
                 count);
  FlatShard s;
  s.rank = rank;
  s.count = count;
  for (std::size_t b = 0; b < layout_.buckets().size(); ++b) {
    const FlatBucket& bucket = layout_.buckets()[b];
    LOCKSTEP_CHECK_HINT(
        bucket.numel() % (kAlign * count) == 0,
        str("lay the parameters out with BucketLimits::shards = ", count, " (the world size)"),
        "flat parameters: bucket ", b, " holds ", bucket.numel(),
        " elements, which do not split into ", count, " aligned shards");
    const std::int64_t len = bucket.numel() / count;
    s.ranges.push_back({bucket.begin + rank * len, bucket.begin + (rank + 1) * len});
    s.offsets.push_back(s.numel);
    s.numel += len;
  }
  return s;
}

std::int64_t FlatShard::state_origin(const ops::FlatRange& range) const {
  for (std::size_t i = 0; i < ranges.size(); ++i)
    if (ranges[i].begin <= range.begin && range.end <= ranges[i].end)
      return ranges[i].begin - offsets[i];
  // Unsharded, the state buffer is the layout: any range (several buckets too) has origin 0.
  LOCKSTEP_CHECK(!sharded(), "optimizer: range [", range.begin, ", ", range.end,
                 ") is not inside rank ", rank, "'s shard of one bucket (ZeRO-1: a rank updates ",
                 "only its own shards)");
  return 0;
}

Tensor FlatParams::view(const Tensor& buffer, std::size_t k) const {
  LOCKSTEP_CHECK(buffer.numel() == layout_.numel(), "flat parameters: a buffer of ",
                 buffer.describe(), " does not have the layout's ", layout_.numel(), " elements");
  return buffer.sub(layout_.segments().at(k).offset, params_[k]->value.shape());
}

void FlatParams::zero_grad(ops::Context& ctx) {
  for (const ops::FlatRange& r : zero_runs_) {
    Tensor run = grads_.sub(r.begin, {r.end - r.begin});
    ops::fill(ctx, run, 0.0f);
  }
  for (nn::Parameter* p : params_)
    if (p->overwrites_grad) p->grad_stale = true;
}

void FlatParams::settle(ops::Context& ctx) {
  nn::settle_stale_grads(ctx, params_);
}

std::shared_ptr<const ops::FlatPlan> FlatParams::make_plan(ops::Context& ctx,
                                                           const std::vector<bool>& decay) const {
  LOCKSTEP_CHECK(decay.empty() || decay.size() == params_.size(), "flat parameters: ", decay.size(),
                 " decay flags for ", params_.size(), " parameters");
  std::vector<ops::FlatSegment> segments = layout_.segments();
  for (std::size_t k = 0; k < segments.size(); ++k)
    segments[k].decay = decay.empty() || decay[k];
  return ops::make_flat_plan(ctx, std::move(segments), layout_.numel());
}

const Tensor& FlatParams::grad_sum_squares(ops::Context& ctx, ops::FlatSums what,
                                           std::optional<ops::FlatRange> range) {
  settle(ctx);
  if (!stats_plan_ || stats_plan_->device() != ctx.device()) stats_plan_ = make_plan(ctx);
  if (!sums_.defined() || sums_.device() != ctx.device())
    sums_ =
        Tensor::empty({static_cast<std::int64_t>(params_.size()) + 1}, DType::F64, ctx.device());
  ops::flat_sum_squares(ctx, *stats_plan_, range.value_or(ops::FlatRange{0, layout_.numel()}),
                        grads_, sums_, what);
  return sums_;
}

Tensor FlatParams::grad_sum_squares_total() const {
  LOCKSTEP_CHECK(sums_.defined(),
                 "flat parameters: grad_sum_squares_total before grad_sum_squares");
  return sums_.sub(static_cast<std::int64_t>(params_.size()), {1});
}

double FlatParams::read_grad_sum_squares(ops::Context& ctx) {
  LOCKSTEP_CHECK(sums_.defined(), "flat parameters: read_grad_sum_squares before grad_sum_squares");
  if (!sums_host_.defined()) sums_host_ = Tensor::empty({1}, DType::F64);
  ops::copy(ctx, sums_.sub(static_cast<std::int64_t>(params_.size()), {1}), sums_host_);
  return sums_host_.to_vector<double>()[0];
}

}  // namespace lockstep::optim
