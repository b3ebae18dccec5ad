// 2-D convolution over [N, C, H, W] input (NCHW, or NHWC when channels-last) with square kernels,
// symmetric stride and zero padding, and an optional bias. Weight [out, in, k, k] as
// torch.nn.Conv2d (so initial values and checkpoints line up); the kernels are ops::conv2d_*
// (oneDNN on the CPU, cuDNN on GPUs).
#pragma once

#include "lockstep/nn/module.hpp"
#include "lockstep/ops/ops.hpp"

namespace lockstep::nn {

class Conv2d final : public Module {
 public:
  Conv2d(std::int64_t in_channels, std::int64_t out_channels, int kernel, int stride = 1,
         int padding = 0, bool bias = true, Device device = Device::cpu());

  std::string type() const override { return "conv"; }
  std::string describe() const override;
  Shape output_shape(const Shape& input) const override;
  Tensor forward(ops::Context& ctx, const Tensor& x) override;
  Tensor backward(ops::Context& ctx, const Tensor& dy) override;
  void reset_parameters(std::uint64_t seed, const std::string& prefix) override;
  void collect_parameters(const std::string& prefix, std::vector<Parameter*>& out) override;
  double forward_flops(const Shape& input) const override;
  bool supports_channels_last() const override { return true; }
  void set_channels_last(bool on) override;

  // Whether only a BatchNorm reads this convolution's output (a ResNet block sets it): on a bf16
  // context whose backend keeps that activation in bf16 (ops::bf16_conv_bn_activations) the output
  // is then written rounded to bf16, as PyTorch's autocast does, and the BatchNorm reads it so.
  void set_output_to_batchnorm(bool on) { output_to_bn_ = on; }
  bool reads_bf16_input() const override { return true; }

  Parameter& weight() { return weight_; }
  Parameter& bias() { return bias_; }  // undefined value when built without bias

  std::unique_ptr<Module> clone_structure(Device device) const override {
    return std::make_unique<Conv2d>(in_, out_, kernel_, params_.stride_h, params_.pad_h, has_bias_,
                                    device);
  }

 private:
  std::int64_t in_, out_;
  int kernel_;
  ops::Conv2dParams params_;
  bool has_bias_;
  bool output_to_bn_ = false;
  Parameter weight_, bias_;
  Tensor x_;
};

}  // namespace lockstep::nn
