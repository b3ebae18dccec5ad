// Layer normalisation over the last dimension (torch.nn.LayerNorm(dim), eps 1e-5): weight 1 and
// bias 0 at initialisation. A pre-LN transformer block needs a residual sum next to two of them:
// forward_add normalises x + a and writes the sum in the same pass, backward_add folds the
// residual gradient into the same pass. The input (a residual stream) and its gradient are f32;
// under train.precision = bf16 the output may be a bf16 activation (set_bf16_output, for the
// layers of a GPT block that read it), and its gradient then comes in bf16.
#pragma once

#include "lockstep/nn/module.hpp"

namespace lockstep::nn {

inline constexpr float kLayerNormEps = 1e-5f;

class LayerNorm final : public Module {
 public:
  explicit LayerNorm(std::int64_t dim, float eps = kLayerNormEps, Device device = Device::cpu());

  std::string type() const override { return "ln"; }
  std::string describe() const override;
  Shape output_shape(const Shape& input) const override;
  Tensor forward(ops::Context& ctx, const Tensor& x) override;
  // forward(x + a), with x + a written into `sum` (the caller's buffer, of x's shape, which it may
  // read, and which this layer caches as its input for backward), in one pass.
  Tensor forward_add(ops::Context& ctx, const Tensor& x, const Tensor& a, Tensor& sum);
  Tensor backward(ops::Context& ctx, const Tensor& dy) override;
  // dL/dx + dresidual (an undefined dresidual means zero), in one pass.
  Tensor backward_add(ops::Context& ctx, const Tensor& dy, const Tensor& dresidual);
  void reset_parameters(std::uint64_t seed, const std::string& prefix) override;
  void collect_parameters(const std::string& prefix, std::vector<Parameter*>& out) override;
  void release_buffers() override { x_ = y_ = mean_ = rstd_ = dx_ = Tensor(); }

  // On a bf16 context, write the output as a bf16 activation; f32 otherwise, and by default.
  void set_bf16_output(bool on) { bf16_output_ = on; }
  DType output_dtype(const ops::Context& ctx) const;

  Parameter& weight() { return weight_; }
  Parameter& bias() { return bias_; }

  std::unique_ptr<Module> clone_structure(Device device) const override {
    auto copy = std::make_unique<LayerNorm>(dim_, eps_, device);
    copy->set_bf16_output(bf16_output_);
    return copy;
  }

 private:
  std::int64_t dim_;
  float eps_;
  bool bf16_output_ = false;
  Parameter weight_, bias_;
  Tensor x_;                // input cached for backward
  Tensor y_, mean_, rstd_;  // output and per-row statistics (reused buffers)
  Tensor dx_;
};

}  // namespace lockstep::nn
