// DdpEngine: lockstep's DistributedDataParallel. Each MPI rank owns one replica; at construction
// rank 0's parameters and buffers are broadcast so replicas start identical whatever their seed;
// during backward the Reducer averages gradient buckets as they complete. BatchNorm running
// statistics follow PyTorch's default (broadcast_buffers=True): rank 0's buffers are broadcast
// at the start of every step, so evaluation on any rank uses the same statistics.
//
// ZeRO-1 (DdpOptions::zero, more than one rank): the flat layout's buckets are padded to split
// into world-size aligned shards; the Reducer reduce-scatters each bucket as it completes, the
// optimizer (made with shard()) updates rank r's block of every bucket and keeps state only for
// it, and step() then allgathers each bucket of parameters in place. Gradient averaging is DDP's
// (sum, then one scale by 1/world); only the order of the sum may differ.
#pragma once

#include <memory>
#include <vector>

#include "lockstep/comm/communicator.hpp"
#include "lockstep/nn/loss.hpp"
#include "lockstep/ops/device_runtime.hpp"
#include "lockstep/parallel/engine.hpp"
#include "lockstep/parallel/reducer.hpp"

namespace lockstep::parallel {

// How raw input batches become network inputs: y = (x/255 - mean[c]) / std[c] for u8 data;
// i32 token ids are not normalised.
struct InputNormalization {
  std::vector<float> mean;
  std::vector<float> stddev;
};

struct DdpOptions {
  ReducerOptions reducer;
  bool sync = true;   // false: no gradient communication at all (to measure its cost)
  bool zero = false;  // ZeRO-1 (dist.zero = 1); needs sync; with one rank it changes nothing
  InputNormalization input;
  float label_smoothing = 0.0f;  // of the training loss (nn::SoftmaxCrossEntropy)
};

class DdpEngine final : public Engine {
 public:
  // `flat`: the model's parameters laid out flat (shared with the optimizer); when null the
  // engine lays them out itself, bucketed by options.reducer (and, for zero, sharded for this
  // world size), and flat_params() returns it.
  DdpEngine(ops::Context& ctx, nn::Model& model, comm::Communicator& comm, DdpOptions options,
            std::shared_ptr<optim::FlatParams> flat = nullptr);

  nn::Model& model() override { return model_; }
  ops::Context& context() override { return ctx_; }
  void begin_step() override;
  Tensor forward_backward(const Tensor& x, const Tensor& y, float loss_scale,
                          bool last_micro) override;
  void finish_gradients() override;
  StepTimes times() const override { return times_; }
  optim::GradientCheck check_gradients(optim::FlatParams& flat, bool with_norm) override;
  void queue_gradient_check(optim::FlatParams& flat, bool with_norm, Tensor& verdict,
                            std::int64_t taken) override;
  void step(optim::Optimizer& optimizer) override;

  // This rank's ZeRO-1 shard (count 1, the whole layout, without zero): give it to the optimizer.
  const optim::FlatShard& shard() const { return shard_; }
  const Reducer& reducer() const { return *reducer_; }
  const std::shared_ptr<optim::FlatParams>& flat_params() const { return reducer_->flat_params(); }

 private:
  float averaging_scale() const;  // 1 / size when gradients are averaged across ranks, else 1

  ops::Context& ctx_;
  nn::Model& model_;
  comm::Communicator& comm_;
  DdpOptions options_;
  optim::FlatShard shard_;
  std::unique_ptr<Reducer> reducer_;
  nn::SoftmaxCrossEntropy loss_;
  Tensor input_;  // normalised input on the device, reused across steps
  // Host batches to a device: pinned, double-buffered, on a copy stream (made by the first batch).
  std::unique_ptr<ops::InputStager> stager_;
  // Compute and the wait for communication timed on the device (host clocks would time only the
  // queuing). times() then reports them for the steps the device finished before begin_step():
  // in the trainer, the previous step.
  std::unique_ptr<ops::SectionTimer> timer_;
  StepTimes times_;
};

// Prepares a host batch for the network on ctx's device: copy (when the device is a GPU) and
// normalise into `out` (reallocated only when the shape changes). Shared by every engine. i32
// token ids pass through unnormalised (`out` then shares x's storage on the CPU).
void prepare_input(ops::Context& ctx, const Tensor& x, const InputNormalization& norm, Tensor& out);

}  // namespace lockstep::parallel
