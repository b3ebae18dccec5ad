// A layer of one's own, written outside lockstep: the gated linear unit of Dauphin et al. (2017),
//   y = (x W^T + b) * sigmoid(x V^T + c)        x: [N, in], y: [N, out]
// It is a lockstep::nn::Module like the built-in layers: forward caches what backward needs,
// backward accumulates the parameter gradients (+=) and returns dL/dx, and its parameters are
// named (value.weight, value.bias, gate.weight, gate.bias) for checkpoints and the reducer. The two
// projections are lockstep's own Linear modules (their GEMMs and gradients come with them); the
// gate and the product, which ops/ has no kernel for, are plain loops here, so this module runs on
// the CPU only. clone_structure lets DataParallel replicate it.
#pragma once

#include <cmath>
#include <memory>

#include "lockstep/core/error.hpp"
#include "lockstep/nn/linear.hpp"
#include "lockstep/ops/ops.hpp"

namespace custom_model {

class GatedLinearUnit final : public lockstep::nn::Module {
 public:
  using Device = lockstep::Device;
  using Shape = lockstep::Shape;
  using Tensor = lockstep::Tensor;

  GatedLinearUnit(std::int64_t in_features, std::int64_t out_features,
                  Device device = Device::cpu())
      : in_(in_features),
        out_(out_features),
        value_(in_features, out_features, true, device),
        gate_(in_features, out_features, true, device) {}

  std::string type() const override { return "glu"; }
  std::string describe() const override { return lockstep::str("glu(", in_, "->", out_, ")"); }
  Shape output_shape(const Shape& input) const override {
    return value_.output_shape(input);  // both projections: [N, in] -> [N, out]
  }

  Tensor forward(lockstep::ops::Context& ctx, const Tensor& x) override {
    LOCKSTEP_CHECK(x.device().is_cpu(), "glu: runs on the CPU only, got ", x.describe());
    a_ = value_.forward(ctx, x);
    const Tensor g = gate_.forward(ctx, x);
    s_ = Tensor::empty(g.shape());
    y_ = Tensor::empty(g.shape());
    const float *a = a_.data<float>(), *gv = g.data<float>();
    float *s = s_.data<float>(), *y = y_.data<float>();
    for (std::int64_t i = 0; i < g.numel(); ++i) {
      s[i] = 1.0f / (1.0f + std::exp(-gv[i]));
      y[i] = a[i] * s[i];
    }
    return y_;
  }

  // dL/da = dy * s and dL/dg = dy * a * s (1 - s); each projection's backward then adds its
  // parameter gradients and returns its share of dL/dx.
  Tensor backward(lockstep::ops::Context& ctx, const Tensor& dy) override {
    Tensor da = Tensor::empty(dy.shape()), dg = Tensor::empty(dy.shape());
    const float *d = dy.data<float>(), *a = a_.data<float>(), *s = s_.data<float>();
    float *pa = da.data<float>(), *pg = dg.data<float>();
    for (std::int64_t i = 0; i < dy.numel(); ++i) {
      pa[i] = d[i] * s[i];
      pg[i] = d[i] * a[i] * s[i] * (1.0f - s[i]);
    }
    const Tensor dx_gate = gate_.backward(ctx, dg);
    const Tensor dx_value = value_.backward(ctx, da);
    if (!input_grad_) return Tensor();  // neither projection computed one
    Tensor dx = Tensor::empty(dx_value.shape());
    lockstep::ops::add(ctx, dx_value, dx_gate, dx);
    return dx;
  }

  // Each projection initialised as Linear initialises itself, under this module's names.
  void reset_parameters(std::uint64_t seed, const std::string& prefix) override {
    value_.reset_parameters(seed, prefix + "value.");
    gate_.reset_parameters(seed, prefix + "gate.");
  }
  void collect_parameters(const std::string& prefix,
                          std::vector<lockstep::nn::Parameter*>& out) override {
    value_.collect_parameters(prefix + "value.", out);
    gate_.collect_parameters(prefix + "gate.", out);
  }
  void set_input_grad(bool needed) override {
    Module::set_input_grad(needed);
    value_.set_input_grad(needed);
    gate_.set_input_grad(needed);
  }
  double forward_flops(const Shape& input) const override {
    return value_.forward_flops(input) + gate_.forward_flops(input) +
           5.0 * static_cast<double>(out_);
  }
  std::unique_ptr<Module> clone_structure(Device device) const override {
    return std::make_unique<GatedLinearUnit>(in_, out_, device);
  }

 private:
  std::int64_t in_, out_;
  lockstep::nn::Linear value_, gate_;
  Tensor a_, s_, y_;  // the value projection and the gate, cached for backward; the output
};

}  // namespace custom_model
