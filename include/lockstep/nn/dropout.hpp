// Inverted dropout (keep with probability 1-p, scale kept values by 1/(1-p)); the identity in
// evaluation mode. The mask of training forward number c is drawn from
// Philox(seed, hash_combine(hash_string(name), c)), so a run is reproducible whatever the thread
// count or device, and two layers never share a mask. c counts this layer's training forwards;
// a trainer restores it on resume (set_calls) and DDP gives each rank its own seed.
#pragma once

#include "lockstep/nn/module.hpp"

namespace lockstep::nn {

class Dropout final : public Module {
 public:
  explicit Dropout(float p);

  std::string type() const override { return "dropout"; }
  std::string describe() const override;
  Shape output_shape(const Shape& input) const override { return input; }
  Tensor forward(ops::Context& ctx, const Tensor& x) override;
  Tensor backward(ops::Context& ctx, const Tensor& dy) override;
  // Takes the seed and the layer name that select the masks; restarts the call count.
  void reset_parameters(std::uint64_t seed, const std::string& prefix) override;

  float p() const { return p_; }
  void set_seed(std::uint64_t seed) { seed_ = seed; }
  std::uint64_t calls() const { return calls_; }
  void set_calls(std::uint64_t calls) { calls_ = calls; }

  // The copy continues the same masks: same p, seed, layer name and call count.
  std::unique_ptr<Module> clone_structure(Device device) const override;

 private:
  float p_;
  std::uint64_t seed_ = 0;
  std::uint64_t name_hash_ = 0;
  std::uint64_t calls_ = 0;
  bool active_ = false;  // whether the last forward applied a mask
  bool have_forward_ = false;
  Tensor mask_;
  Tensor y_, dx_;
};

}  // namespace lockstep::nn
