// Linear (fully connected) layer: y = x W^T + b for x of shape [N, in]. W is [out, in] as in
// PyTorch, so checkpoints and initial values line up with torch.nn.Linear. Inputs with more than
// two dimensions are an error (put `flatten` before it) rather than silently reshaped.
#pragma once

#include "lockstep/nn/module.hpp"

namespace lockstep::nn {

class Linear final : public Module {
 public:
  Linear(std::int64_t in_features, std::int64_t out_features, bool bias = true,
         Device device = Device::cpu());

  std::string type() const override { return "linear"; }
  std::string describe() const override;
  Shape output_shape(const Shape& input) const override;
  Tensor forward(ops::Context& ctx, const Tensor& x) override;
  Tensor backward(ops::Context& ctx, const Tensor& dy) override;
  void reset_parameters(std::uint64_t seed, const std::string& prefix) override;
  void collect_parameters(const std::string& prefix, std::vector<Parameter*>& out) override;
  double forward_flops(const Shape& input) const override;
  void release_buffers() override;
  bool output_overwritable() const override { return true; }  // backward reads x and W only
  // Caches x for backward as forward does (its bf16 copy under the bf16 policy), without the
  // GEMM: an activation recompute gives back the input that drop_input let go.
  void cache_input(ops::Context& ctx, const Tensor& x);
  void drop_input();

  std::int64_t in_features() const { return in_; }
  std::int64_t out_features() const { return out_; }
  Parameter& weight() { return weight_; }
  Parameter& bias() { return bias_; }  // undefined value when built without bias

  std::unique_ptr<Module> clone_structure(Device device) const override {
    return std::make_unique<Linear>(in_, out_, has_bias_, device);
  }

 private:
  std::int64_t in_, out_;
  bool has_bias_;
  Parameter weight_, bias_;
  Tensor x_;           // input cached for backward (its bf16 copy under the bf16 policy)
  Tensor y_, dx_;      // reused output buffers
  Tensor x16_, dy16_;  // reused bf16 copies of x and dy (bf16 policy only)
};

}  // namespace lockstep::nn
