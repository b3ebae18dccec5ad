// GPT-2's MLP on [B, T, C]: c_fc (C -> 4C), GELU (tanh form), c_proj (4C -> C). c_proj is a
// residual projection: its initial weights are scaled by 1 / sqrt(2 depth), as in GPT-2.
// Under train.precision = bf16 the activations inside (c_fc's output, the GELU's, their
// gradients) are bf16; the output is f32 unless set_bf16_output asks for bf16 (a GPT block).
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
  void release_buffers() override;
  // GELU recompute: forward lets the GELU output go once c_proj has read it, and backward
  // computes it again from the kept GELU input (ops::linear_recompute_activation: the forward's
  // bits), which saves one [N * T, 4C] activation per block.
  void set_recompute_gelu(bool on) { recompute_gelu_ = on; }
  bool recompute_gelu() const { return recompute_gelu_; }
  // On a bf16 context, write the output as a bf16 activation (Linear::set_bf16_output).
  void set_bf16_output(bool on) { c_proj_.set_bf16_output(on); }

  std::unique_ptr<Module> clone_structure(Device device) const override {
    auto copy = std::make_unique<Mlp>(dim_, depth_, device);
    copy->set_recompute_gelu(recompute_gelu_);
    copy->set_bf16_output(c_proj_.bf16_output());
    return copy;
  }

 private:
  std::int64_t dim_, depth_;
  bool recompute_gelu_ = false;
  Linear c_fc_, c_proj_;
  Tensor pre_act_;  // GELU input h = c_fc's x W^T + b, in c_fc's output dtype (reused buffer)
  Tensor h_;        // the same, cached for backward
};

}  // namespace lockstep::nn
