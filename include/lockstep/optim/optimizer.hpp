// Optimizer: updates a fixed list of parameters from their gradients, one step(ctx) per training
// step. Per-parameter state (momentum, Adam moments) lives in tensors named
// "<parameter name>.<state>", which state() lists so checkpoints can save and restore them in
// place; the step count is the only other state. The learning rate is set by the caller (from an
// LrSchedule) before each step.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/nn/module.hpp"
#include "lockstep/ops/context.hpp"

namespace lockstep::optim {

struct StateTensor {
  std::string name;  // "0.weight.momentum_buffer"
  Tensor value;      // restore by copying into it, not by replacing it
};

class Optimizer {
 public:
  explicit Optimizer(std::vector<nn::Parameter*> params);
  virtual ~Optimizer() = default;

  virtual std::string type() const = 0;  // "sgd", "adamw"
  // One update of every parameter from its current gradient; steps() then grows by one.
  virtual void step(ops::Context& ctx) = 0;
  virtual std::vector<StateTensor> state() = 0;

  float lr() const { return lr_; }
  void set_lr(float lr) { lr_ = lr; }
  std::int64_t steps() const { return steps_; }
  void set_steps(std::int64_t steps) { steps_ = steps; }  // after restoring state()
  const std::vector<nn::Parameter*>& parameters() const { return params_; }

 protected:
  // A state tensor shaped like `p`, zero, on p's device.
  static Tensor zeros_like(const nn::Parameter& p);

  std::vector<nn::Parameter*> params_;
  float lr_ = 0.0f;
  std::int64_t steps_ = 0;
};

}  // namespace lockstep::optim
