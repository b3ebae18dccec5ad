// Engine: how one training process turns a batch into averaged gradients on the model the
// optimizer updates. The trainer is written once over this interface; the strategies differ only
// here:
//   DdpEngine          one replica per MPI rank; gradients averaged by the Reducer during backward
//                      (parallel = ddp, and parallel = none as the 1-rank case); with ZeRO-1
//                      (dist.zero = 1) reduce-scattered, updated by shard, then allgathered.
//   DataParallelEngine one process, one thread per replica; replica 0 is the master (parallel =
//   dp).
#pragma once

#include <cstdint>

#include "lockstep/core/tensor.hpp"
#include "lockstep/nn/model.hpp"
#include "lockstep/ops/context.hpp"
#include "lockstep/optim/clip.hpp"
#include "lockstep/optim/optimizer.hpp"

namespace lockstep::parallel {

// Seconds spent in each part of an optimizer step on this process (wall-clock, summed over the
// step's micro-steps).
struct StepTimes {
  double compute = 0;       // forward, loss, backward (including overlapped communication)
  double comm_exposed = 0;  // waiting for gradient communication after backward
  double param_copy = 0;    // DataParallel: copying master parameters to the replicas
  double grad_gather = 0;   // DataParallel: summing replica gradients onto the master
};

class Engine {
 public:
  virtual ~Engine() = default;

  // The model the optimizer updates, and the context it runs on.
  virtual nn::Model& model() = 0;
  virtual ops::Context& context() = 0;

  // Starts an optimizer step: gradients to zero (and, for DP, replicas refreshed).
  virtual void begin_step() = 0;
  // Forward, loss and backward of one micro-batch (host tensors x [b, ...], i32 y [b]),
  // accumulating into the gradients with dL/dlogits scaled by loss_scale. last_micro marks the
  // micro-step after which gradients must be complete (DDP communicates only then).
  // Returns the micro-batch's mean loss, a one-element f32 tensor that is not read here: on a
  // GPU it stays on the device (reading it would wait for the step and its communication), and
  // the trainer reads the losses of a whole log interval at once. It may be overwritten by the
  // next forward_backward, so copy it (ops::copy on context()) before that.
  virtual Tensor forward_backward(const Tensor& x, const Tensor& y, float loss_scale,
                                  bool last_micro) = 0;
  // Waits until the gradients of the model() are complete and averaged.
  virtual void finish_gradients() = 0;
  // Time split of the step since begin_step().
  virtual StepTimes times() const = 0;

  // The step's gradient check (finiteness, and the global norm when with_norm) over the averaged
  // gradients of `flat`, the same answer on every rank. A ZeRO-1 engine holds averaged gradients
  // only in its shard: it checks the shard and adds the partial sums over the ranks.
  virtual optim::GradientCheck check_gradients(optim::FlatParams& flat, bool with_norm) {
    return optim::check_gradients(context(), flat, with_norm);
  }
  // The same check left on the device (optim::queue_gradient_check): its answer goes to `verdict`
  // (f64 [2], ops/step_verdict.hpp) without a read back, the same on every rank.
  virtual void queue_gradient_check(optim::FlatParams& flat, bool with_norm, Tensor& verdict,
                                    std::int64_t taken) {
    optim::queue_gradient_check(context(), flat, with_norm, verdict, taken);
  }
  // The optimizer's update from the averaged gradients. A ZeRO-1 engine updates its shard and
  // then allgathers the parameters, so every rank again holds the whole model.
  virtual void step(optim::Optimizer& optimizer) { optimizer.step(context()); }
};

}  // namespace lockstep::parallel
