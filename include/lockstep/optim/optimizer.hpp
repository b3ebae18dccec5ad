// Optimizer: updates the parameters of a FlatParams from their gradients, one step(ctx) per
// training step, with one fused op over the whole flat layout (optim/flat.hpp). Its state
// (momentum, Adam moments) lives in flat buffers of the same layout; state() lists it per
// parameter as views named "<parameter name>.<state>", so checkpoints save and restore it in
// place; the step count is the only other state. The learning rate is set by the caller (from an
// LrSchedule) before each step.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "lockstep/nn/module.hpp"
#include "lockstep/ops/context.hpp"
#include "lockstep/optim/flat.hpp"

namespace lockstep::optim {

struct StateTensor {
  std::string name;  // "0.weight.momentum_buffer"
  Tensor value;      // restore by copying into it, not by replacing it
};

// Which parameters weight decay applies to (config key optim.decay):
//   all        every parameter (PyTorch's default; the default here)
//   matrices   tensors with ndim >= 2 only (linear and conv weights, embeddings), not biases or
//              normalisation scales and shifts: the GPT-2 / nanoGPT / llm.c rule
enum class DecayScope { All, Matrices };
DecayScope parse_decay_scope(const std::string& name);  // throws naming optim.decay
const char* decay_scope_name(DecayScope scope);

class Optimizer {
 public:
  explicit Optimizer(std::shared_ptr<FlatParams> flat);
  virtual ~Optimizer() = default;

  virtual std::string type() const = 0;  // "sgd", "adamw"
  // One update of every parameter from its current gradient; steps() then grows by one.
  void step(ops::Context& ctx);
  // The same step restricted to `ranges` of the flat layout (a ZeRO-1 rank's shards of the
  // buckets); parameters and state elsewhere are left alone. steps() grows by one.
  void step(ops::Context& ctx, std::span<const ops::FlatRange> ranges);
  virtual std::vector<StateTensor> state() = 0;

  float lr() const { return lr_; }
  void set_lr(float lr) { lr_ = lr; }
  std::int64_t steps() const { return steps_; }
  void set_steps(std::int64_t steps) { steps_ = steps; }  // after restoring state()
  const std::vector<nn::Parameter*>& parameters() const { return flat_->parameters(); }
  const std::shared_ptr<FlatParams>& flat_params() const { return flat_; }

 protected:
  // Updates the given ranges with the step count steps() + 1.
  virtual void update(ops::Context& ctx, std::span<const ops::FlatRange> ranges) = 0;
  // The fused ops' plan for ctx's device, with weight decay where `scope` says.
  const ops::FlatPlan& plan(ops::Context& ctx, DecayScope scope);

  std::shared_ptr<FlatParams> flat_;
  float lr_ = 0.0f;
  std::int64_t steps_ = 0;

 private:
  std::shared_ptr<const ops::FlatPlan> plan_;
};

}  // namespace lockstep::optim
