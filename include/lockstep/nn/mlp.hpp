// GPT-2's MLP on [B, T, C]: c_fc (C -> 4C), GELU (tanh form), c_proj (4C -> C). c_proj is a
// residual projection: its initial weights are scaled by 1 / sqrt(2 depth), as in GPT-2.
#pragma once

#include "lockstep/nn/linear.hpp"

namespace lockstep::nn {

class Mlp final : public Module {
 public:
  explicit Mlp(std::int64_t dim, std::int64_t depth = 1, Device device = Device::cpu());

  std::string type() const override { return "mlp"; }
  std::string describe() const override;
  Shape output_shape(const Shape& input) const override;
  Tensor forward(ops::Context& ctx, const Tensor& x) override;
  Tensor backward(ops::Context& ctx, const Tensor& dy) override;
  // Weights N(0, 0.02), c_proj's N(0, 0.02 / sqrt(2 depth)), biases 0.
  void reset_parameters(std::uint64_t seed, const std::string& prefix) override;
  void collect_parameters(const std::string& prefix, std::vector<Parameter*>& out) override;
  void set_input_grad(bool needed) override;
  double forward_flops(const Shape& input) const override;

  std::unique_ptr<Module> clone_structure(Device device) const override {
    return std::make_unique<Mlp>(dim_, depth_, device);
  }

 private:
  std::int64_t dim_, depth_;
  Linear c_fc_, c_proj_;
  Tensor h_;       // c_fc output (GELU input), cached for backward
  Tensor g_, dh_;  // GELU output and its input gradient (reused buffers)
};

}  // namespace lockstep::nn
