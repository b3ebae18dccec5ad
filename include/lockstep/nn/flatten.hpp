// Flatten: [N, d1, d2, ...] -> [N, d1*d2*...], a view (no copy) forward and backward.
#pragma once

#include "lockstep/nn/module.hpp"

namespace lockstep::nn {

class Flatten final : public Module {
 public:
  std::string type() const override { return "flatten"; }
  Shape output_shape(const Shape& input) const override;
  Tensor forward(ops::Context& ctx, const Tensor& x) override;
  Tensor backward(ops::Context& ctx, const Tensor& dy) override;

  std::unique_ptr<Module> clone_structure(Device) const override {
    return std::make_unique<Flatten>();
  }

 private:
  Shape x_shape_;
};

}  // namespace lockstep::nn
