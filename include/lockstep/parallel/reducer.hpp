// Reducer: averages gradients across ranks while backward is still running (PyTorch DDP's
// reducer, over lockstep's Communicator). Gradients live in the flat buffer of a FlatParams
// (optim/flat.hpp), in buckets filled in reverse parameter order because backward produces them
// in that order; every Parameter::grad is a view into its bucket, so neither the layers nor the
// allreduce copy anything, and the optimizer updates the same buffer in one op. When the last
// gradient of a bucket is ready, the bucket's allreduce is queued on the communicator (whose own
// thread runs it) and backward goes on. finish() waits for every bucket and divides by the world
// size, once (or not at all when the caller divided the loss gradient: set_prescaled).
//
// ZeRO-1 (a sharded FlatShard): each bucket is reduce-scattered instead, into a buffer of the
// shard's size; finish() averages it and copies it into the shard's ranges of the flat gradients,
// so the gradients are averaged there only (elsewhere they hold this rank's own sums).
//
// Invariants: buckets are launched in index order on every rank (a bucket that completes early
// waits for its predecessors), so all ranks issue the same collectives in the same order; a
// bucket is never written by compute while its allreduce is in flight (only the next backward,
// after finish(), writes it again); the padding between parameters is zero on every rank, so
// reducing it keeps it zero.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/comm/communicator.hpp"
#include "lockstep/nn/module.hpp"
#include "lockstep/ops/context.hpp"
#include "lockstep/optim/flat.hpp"

namespace lockstep::parallel {

// Defaults, with PyTorch DDP's reasons: 25 MiB buckets amortise per-collective latency while
// leaving room to overlap; the first bucket (the last layers' gradients, ready first) is 1 MiB so
// communication starts as early as possible ("experiments showed 1MB is a reasonable value").
inline constexpr std::size_t kDefaultBucketBytes = 25u << 20;
inline constexpr std::size_t kDefaultFirstBucketBytes = 1u << 20;

struct ReducerOptions {
  std::size_t bucket_bytes = kDefaultBucketBytes;
  std::size_t first_bucket_bytes = kDefaultFirstBucketBytes;
  // The dtype gradients travel in (dist.grad_dtype): F32, or BF16 (PyTorch's bf16_compress_hook:
  // each bucket is rounded to bf16 before the collective, which sums in f32 and rounds to bf16 at
  // each combination, and is widened back to f32 after it; half the bytes on the wire).
  DType grad_dtype = DType::F32;
};

// Parses dist.grad_dtype: "fp32" | "bf16"; throws lockstep::Error naming `key` and the choices.
DType parse_grad_dtype(const std::string& value, const std::string& key);

// The bucket limits these options give a FlatParams layout.
optim::BucketLimits bucket_limits(const ReducerOptions& options);

class Reducer {
 public:
  // Communicates the gradient buckets of `flat`: allreduced, or reduce-scattered to `shard`
  // when it is sharded (flat->shard(comm.rank(), comm.size())), in `grad_dtype` (F32 or BF16).
  Reducer(ops::Context& ctx, comm::Communicator& comm, std::shared_ptr<optim::FlatParams> flat,
          optim::FlatShard shard = {}, DType grad_dtype = DType::F32);
  // Lays the parameters out in a FlatParams of its own, bucketed by `options`.
  Reducer(ops::Context& ctx, comm::Communicator& comm, std::vector<nn::Parameter*> params,
          ReducerOptions options = {});

  // Call before each backward. communicate = false for gradient-accumulation micro-steps (and
  // when sync is off): gradients then only accumulate locally.
  void prepare_for_backward(bool communicate);
  // The model's grad-ready hook: called once per parameter per backward.
  void on_grad_ready(nn::Parameter& param);
  // Waits for every launched bucket and averages the gradients. Throws, naming the parameters,
  // when some gradient never became ready. Returns the seconds spent waiting (exposed
  // communication).
  double finish();
  // true: every gradient this reducer communicates was already divided by the world size (the
  // caller scaled the loss gradient by 1 / size), so finish() only sums. Saves a pass over the
  // whole gradient buffer per step, a tenth of the step's memory traffic for the MLP on a CPU.
  void set_prescaled(bool prescaled) { prescaled_ = prescaled; }
  bool prescaled() const { return prescaled_; }
  // Sets every gradient to zero (one fill of the flat buffer).
  void zero_grad();

  const std::vector<optim::FlatBucket>& buckets() const { return flat_->layout().buckets(); }
  std::size_t num_buckets() const { return buckets().size(); }
  const std::shared_ptr<optim::FlatParams>& flat_params() const { return flat_; }
  DType grad_dtype() const { return grad_dtype_; }

 private:
  void launch_ready_buckets();

  ops::Context& ctx_;
  comm::Communicator& comm_;
  std::shared_ptr<optim::FlatParams> flat_;
  optim::FlatShard shard_;
  DType grad_dtype_ = DType::F32;
  Tensor shard_grads_;                  // ZeRO-1: shard_.numel reduce-scatter results
  std::vector<Tensor> bucket_tensors_;  // views of flat_'s gradient buffer
  // grad_dtype BF16: what the collectives send, one bf16 copy per bucket (allocated once), and
  // for ZeRO-1 the bf16 reduce-scatter results.
  std::vector<Tensor> wire_buckets_;
  Tensor wire_shard_;
  std::vector<std::size_t> bucket_of_param_;
  std::vector<int> pending_;         // per bucket: gradients not yet ready this backward
  std::vector<bool> ready_;          // per parameter
  std::vector<comm::WorkPtr> work_;  // per bucket: in-flight allreduce
  std::size_t next_to_launch_ = 0;
  bool communicate_ = false;
  bool prescaled_ = false;
  bool in_backward_ = false;
};

// Makes every replica start identical whatever its seed: rank 0's parameters and buffers are
// broadcast to all ranks (PyTorch DDP does the same at construction).
void broadcast_state(comm::Communicator& comm, const std::vector<nn::Parameter*>& params,
                     const std::vector<nn::Buffer*>& buffers);
// The same for flat parameters: one broadcast per bucket of values.
void broadcast_state(comm::Communicator& comm, optim::FlatParams& flat,
                     const std::vector<nn::Buffer*>& buffers);

}  // namespace lockstep::parallel
