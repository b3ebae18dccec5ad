// DataParallelEngine: the single-process baseline, as torch.nn.DataParallel does it. One process,
// one thread and one Context per replica; replica 0 is the master and owns the optimizer. Each
// step the master copies its parameters (and buffers) to the other replicas, each replica's
// thread runs forward and backward on its slice of the batch, and the replicas' gradients are
// summed onto the master, which alone steps. Same layers, ops and optimizer code as DDP: only the
// way gradients meet differs (gather to one replica instead of an allreduce among equals).
#pragma once

#include <memory>
#include <vector>

#include "lockstep/core/thread_pool.hpp"
#include "lockstep/optim/flat.hpp"
#include "lockstep/parallel/ddp.hpp"
#include "lockstep/parallel/engine.hpp"

namespace lockstep::parallel {

struct DataParallelOptions {
  int replicas = 2;
  int threads_per_replica = 1;
  std::vector<Device> devices;  // one per replica; empty = all on the CPU
  InputNormalization input;
  float label_smoothing = 0.0f;  // of the training loss (nn::SoftmaxCrossEntropy)
};

class DataParallelEngine final : public Engine {
 public:
  // Makes the replicas by cloning the master model (nn::Model::clone: any model, spec-built or
  // composed in C++, whose modules can be cloned) onto their devices. `flat`: the master's
  // parameters laid out flat (shared with the optimizer); when null the engine lays them out
  // itself. Every replica gets the same layout, so replicating and gathering are one copy and one
  // sum per replica.
  DataParallelEngine(ops::Context& master_ctx, nn::Model& master, DataParallelOptions options,
                     std::shared_ptr<optim::FlatParams> flat = nullptr);
  ~DataParallelEngine() override;

  nn::Model& model() override { return master_; }
  ops::Context& context() override { return master_ctx_; }
  void begin_step() override;
  Tensor forward_backward(const Tensor& x, const Tensor& y, float loss_scale,
                          bool last_micro) override;
  void finish_gradients() override;
  StepTimes times() const override { return times_; }

  const std::shared_ptr<optim::FlatParams>& flat_params() const { return replicas_[0].flat; }
  int replicas() const { return static_cast<int>(replicas_.size()); }
  // Bytes of parameters, gradients and optimizer-free state each replica holds (index 0 =
  // master, without its optimizer state), for the memory-balance report.
  std::vector<std::int64_t> replica_tensor_bytes() const;

 private:
  struct Replica {
    ops::Context* ctx = nullptr;        // master's context for replica 0
    std::unique_ptr<ops::Context> own;  // replicas 1..k-1
    nn::Model* model = nullptr;
    std::unique_ptr<nn::Model> own_model;
    std::shared_ptr<optim::FlatParams> flat;  // model's parameters; the master's for replica 0
    nn::SoftmaxCrossEntropy loss;
    Tensor input;
    float last_loss = 0;
  };
  void copy_master_to_replicas();

  ops::Context& master_ctx_;
  nn::Model& master_;
  DataParallelOptions options_;
  std::vector<Replica> replicas_;
  ThreadPool threads_;  // one thread per replica; the caller runs replica 0
  StepTimes times_;
};

}  // namespace lockstep::parallel
