// Elementwise activations. ReLU keeps its output for backward (relu'(x) is read off y > 0);
// GELU is the exact erf form (torch.nn.GELU's default) and keeps its input. Both work on any
// memory order, channels-last included.
#pragma once

#include "lockstep/nn/module.hpp"

namespace lockstep::nn {

class ReLU final : public Module {
 public:
  std::string type() const override { return "relu"; }
  Shape output_shape(const Shape& input) const override { return input; }
  bool supports_channels_last() const override { return true; }
  Tensor forward(ops::Context& ctx, const Tensor& x) override;
  Tensor backward(ops::Context& ctx, const Tensor& dy) override;

  std::unique_ptr<Module> clone_structure(Device) const override {
    return std::make_unique<ReLU>();
  }

 private:
  Tensor y_;  // forward's output, for backward
};

class GELU final : public Module {
 public:
  std::string type() const override { return "gelu"; }
  Shape output_shape(const Shape& input) const override { return input; }
  bool supports_channels_last() const override { return true; }
  Tensor forward(ops::Context& ctx, const Tensor& x) override;
  Tensor backward(ops::Context& ctx, const Tensor& dy) override;

  std::unique_ptr<Module> clone_structure(Device) const override {
    return std::make_unique<GELU>();
  }

 private:
  Tensor x_;
};

}  // namespace lockstep::nn
