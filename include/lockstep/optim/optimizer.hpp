// Optimizer: updates the parameters of a FlatParams from their gradients, one step(ctx) per
// training step, with one fused op over the whole flat layout (optim/flat.hpp). Its state
// (momentum, Adam moments) lives in flat buffers of the same layout; state() lists it per
// parameter as views named "<parameter name>.<state>", so checkpoints save and restore it in
// place (a padded table's view leaves its padding out, nn::unpadded: that state stays zero, as
// the padding's gradient is); the step count is the only other state. The learning rate is set by
// the caller (from an LrSchedule) before each step.
//
// ZeRO-1: an optimizer made with a FlatShard keeps state for that shard only (1/world of it) and
// step(ctx) updates only the shard's parameters; state() then cannot list whole tensors, so
// checkpoints gather state_buffers() over the ranks (parallel/zero.hpp) and load_state() takes the
// shard's part of whole tensors.
#pragma once

#include <cstdint>
#include <functional>
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
  // `shard` (from flat->shard(rank, world)): keep state for and update only that shard; the
  // default (no ranges) is the whole layout.
  explicit Optimizer(std::shared_ptr<FlatParams> flat, FlatShard shard = {});
  virtual ~Optimizer() = default;

  virtual std::string type() const = 0;  // "sgd", "adamw"
  // One update of every parameter (sharded: of the shard's) from its current gradient; steps()
  // then grows by one.
  void step(ops::Context& ctx);
  // The same step restricted to `ranges` of the flat layout (sharded: each inside one of the
  // shard's ranges); parameters and state elsewhere are left alone. steps() grows by one.
  void step(ops::Context& ctx, std::span<const ops::FlatRange> ranges);
  // The state per parameter as views, "<param>.<kind>" in parameter order (checkpoint names).
  // Unsharded only: a sharded optimizer holds no parameter whole (an error says what to do).
  std::vector<StateTensor> state();
  // The state as this rank holds it: one buffer of shard().numel elements per kind, in the order
  // state() lists kinds ("momentum_buffer"; "exp_avg", "exp_avg_sq").
  virtual std::vector<std::pair<std::string, Tensor>> state_buffers() = 0;
  // Restores every state buffer from whole per-parameter tensors named as state() names them
  // (`whole(name)` returns one, on any device): the shard's part of each. Local, no communication.
  void load_state(ops::Context& ctx, const std::function<Tensor(const std::string&)>& whole);
  // Bytes of optimizer state this rank holds (the ZeRO-1 saving: shard().numel / layout numel).
  std::int64_t state_bytes();
  const FlatShard& shard() const { return shard_; }

  float lr() const { return lr_; }
  void set_lr(float lr) { lr_ = lr; }
  // The device step verdict the fused updates obey (ops/step_verdict.hpp; undefined: none): a
  // loop that does not wait for its gradient check lets the device skip a non-finite step. steps()
  // then counts every step issued until the caller learns which were skipped and corrects it
  // with set_steps.
  void set_verdict(Tensor verdict) { verdict_ = std::move(verdict); }
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
  FlatShard shard_;
  float lr_ = 0.0f;
  std::int64_t steps_ = 0;
  Tensor verdict_;

 private:
  std::shared_ptr<const ops::FlatPlan> plan_;
};

}  // namespace lockstep::optim
