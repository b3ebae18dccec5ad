// Flat parameter storage: the values and the gradients of all parameters live in two flat buffers
// with one layout, and every optimizer state tensor in a buffer of the same layout, so a single
// fused op (ops::flat_*) updates the whole model: one launch on a GPU, one parallel loop on the
// CPU. Parameter::value and Parameter::grad are views into the buffers (layers see ordinary
// tensors), and optimizer state is still listed per parameter, so checkpoints are unchanged.
//
// Layout: parameters in reverse order (the order backward produces gradients), each starting on
// an ops::kFlatAlignBytes (256-byte) boundary, so cuBLAS, cuDNN and oneDNN always get aligned
// views. The gaps are padding: zero in every buffer, never read or written by the fused ops, so
// they reach no norm, finiteness check or update. Buckets, the unit the Reducer allreduces, are
// consecutive ranges that partition the layout (bucket 0 first); a ZeRO-1 shard is a range of a
// bucket, and the fused ops take exactly such a range (with state covering only the shard).
// A reduce-scatter will also want each bucket's length divisible by the world size: bucket ends
// are set in one place, FlatLayout::build.
//
// Why in optim: the layout exists so that the optimizer can update everything in one op, and
// the optimizer's state is what ZeRO-1 shards; the Reducer (parallel, a layer above) communicates
// the gradient buckets of this layout, and nn stays unaware of it (a parameter is just a view). One
// FlatParams per model replica; the optimizer and the engine share it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include "lockstep/nn/module.hpp"
#include "lockstep/ops/context.hpp"
#include "lockstep/ops/ops.hpp"

namespace lockstep::optim {

// Bucket limits in bytes of parameter data (padding not counted): a new bucket starts once the
// current one holds at least its limit, a larger parameter gets its bucket alone; bucket 0 (the
// last parameters, whose gradients are ready first) has first_bucket_bytes. DDP's defaults and
// their reasons are parallel::ReducerOptions'; the default here, one bucket, is for a process that
// does not communicate.
struct BucketLimits {
  std::size_t bucket_bytes = std::numeric_limits<std::size_t>::max();
  std::size_t first_bucket_bytes = std::numeric_limits<std::size_t>::max();
  // ZeRO-1: each bucket's length is padded to a multiple of shards x the alignment, so a
  // reduce-scatter splits every bucket into `shards` equal blocks that start aligned (the world
  // size; 1 = no padding beyond the alignment).
  int shards = 1;
};

struct FlatBucket {
  std::vector<std::size_t> params;  // parameter indices, in reverse order
  std::int64_t begin = 0, end = 0;  // elements of the layout; end is the next bucket's begin
  std::int64_t numel() const { return end - begin; }
};

class FlatLayout {
 public:
  static FlatLayout build(const std::vector<nn::Parameter*>& params, const BucketLimits& limits);

  // One per parameter, indexed like the parameter list (slot = index, decay = true).
  const std::vector<ops::FlatSegment>& segments() const { return segments_; }
  const std::vector<FlatBucket>& buckets() const { return buckets_; }
  std::int64_t numel() const { return numel_; }  // padding included

 private:
  std::vector<ops::FlatSegment> segments_;
  std::vector<FlatBucket> buckets_;
  std::int64_t numel_ = 0;
};

// One rank's part of the layout under ZeRO-1: block `rank` of `count` equal blocks of every
// bucket (what a reduce-scatter of the bucket leaves on that rank). Optimizer state for it lives
// back to back in buffers of `numel` elements, range i starting at offsets[i]. With count = 1 the
// ranges are the buckets, which partition the layout, and offsets[i] = ranges[i].begin.
struct FlatShard {
  int rank = 0, count = 1;
  std::vector<ops::FlatRange> ranges;  // per bucket, in bucket order
  std::vector<std::int64_t> offsets;   // per bucket: where its range starts in a shard buffer
  std::int64_t numel = 0;
  bool sharded() const { return count > 1; }
  // Where `range` (inside one of `ranges`) starts in a shard buffer minus where it starts in the
  // layout: the fused ops' state_origin for it. Throws when the range is not this rank's.
  std::int64_t state_origin(const ops::FlatRange& range) const;
};

class FlatParams {
 public:
  // Copies the parameters' values (and gradients; undefined ones become zero) into flat buffers
  // on their device and rebinds Parameter::value and ::grad to views into them. A parameter
  // that already lives in a larger buffer (another FlatParams bound it) is an error: share the
  // first one instead.
  explicit FlatParams(std::vector<nn::Parameter*> params, const BucketLimits& limits = {});
  FlatParams(const FlatParams&) = delete;
  FlatParams& operator=(const FlatParams&) = delete;

  const std::vector<nn::Parameter*>& parameters() const { return params_; }
  const FlatLayout& layout() const { return layout_; }
  const BucketLimits& limits() const { return limits_; }
  Device device() const { return device_; }
  Tensor& values() { return values_; }  // f32 [layout().numel()]
  Tensor& grads() { return grads_; }
  Tensor value_bucket(std::size_t b) const;
  Tensor grad_bucket(std::size_t b) const;
  // A new zero buffer of this layout, aligned like values() (optimizer state); or of `numel`
  // elements (a shard's state).
  Tensor zeros() const;
  Tensor zeros(std::int64_t numel) const;
  // Rank `rank`'s shard among `count` ranks. Every bucket's length must divide into `count`
  // aligned blocks: build with limits().shards a multiple of count (an error says so otherwise).
  FlatShard shard(int rank, int count) const;
  // `buffer` (of this layout) viewed as parameter k's tensor.
  Tensor view(const Tensor& buffer, std::size_t k) const;

  // Every gradient to zero: one fill per run of gradients between those whose layer overwrites
  // them (Parameter::overwrites_grad), which are marked stale instead (one fill of the whole
  // buffer when there are none).
  void zero_grad(ops::Context& ctx);
  // Fills the gradients still marked stale (none after a backward): the optimizer's step and
  // grad_sum_squares call it, so that a step without backward reads zeros.
  void settle(ops::Context& ctx);

  // Starts one pass over every gradient (padding excluded) on ctx's device and returns at once:
  // f64 [parameters + 1] on the device, each parameter's sum of squares and then their total,
  // added in parameter order (the per-parameter loop's result, bit for bit, on the CPU). The
  // total is finite exactly when every gradient element is. FinitenessOnly skips the squares
  // (cheaper on a CPU) and gives 0 or NaN. The next call reuses the tensor.
  // `range` restricts the pass to part of the layout (a ZeRO-1 shard); default: all of it.
  const Tensor& grad_sum_squares(ops::Context& ctx, ops::FlatSums what = ops::FlatSums::Squares,
                                 std::optional<ops::FlatRange> range = std::nullopt);
  // The total of the last grad_sum_squares: f64 [1] on the device, not read.
  Tensor grad_sum_squares_total() const;
  // Reads the total of the last grad_sum_squares back: the one host synchronisation of the
  // check (on a GPU it waits for ctx's stream only, not the whole device).
  double read_grad_sum_squares(ops::Context& ctx);

  // A plan for the fused ops on ctx's device over this layout; decay[k] says whether weight
  // decay applies to parameter k (empty: to all). Make it once and keep it.
  std::shared_ptr<const ops::FlatPlan> make_plan(ops::Context& ctx,
                                                 const std::vector<bool>& decay = {}) const;

 private:
  std::vector<nn::Parameter*> params_;
  BucketLimits limits_;
  FlatLayout layout_;
  Device device_;
  Tensor values_, grads_;
  std::shared_ptr<const ops::FlatPlan> stats_plan_;
  std::vector<ops::FlatRange> zero_runs_;  // what zero_grad fills, in layout order
  Tensor sums_, sums_host_;  // f64 [parameters + 1] on the device; f64 [1] on the host
};

}  // namespace lockstep::optim
