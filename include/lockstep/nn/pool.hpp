// Pooling over [N, C, H, W] input (NCHW, or NHWC when channels-last): max and average pooling
// with a square window, and global average pooling, which reduces [N, C, H, W] to [N, C] (the
// same in either layout) so a linear layer can follow it directly.
// Kernels are ops::pool2d_* (own loops on the CPU and CUDA).
#pragma once

#include "lockstep/nn/module.hpp"
#include "lockstep/ops/ops.hpp"

namespace lockstep::nn {

class Pool2d : public Module {
 public:
  // stride 0 means stride = kernel (PyTorch's default).
  Pool2d(ops::PoolKind kind, int kernel, int stride = 0, int padding = 0);

  std::string type() const override;
  std::string describe() const override;
  Shape output_shape(const Shape& input) const override;
  Tensor forward(ops::Context& ctx, const Tensor& x) override;
  Tensor backward(ops::Context& ctx, const Tensor& dy) override;
  bool supports_channels_last() const override { return true; }
  void set_channels_last(bool on) override;

  std::unique_ptr<Module> clone_structure(Device device) const override;

 private:
  ops::PoolKind kind_;
  ops::Pool2dParams params_;
  Tensor workspace_;  // backend state for backward (argmax for max pooling)
  Shape x_shape_;
};

class MaxPool2d final : public Pool2d {
 public:
  explicit MaxPool2d(int kernel, int stride = 0, int padding = 0)
      : Pool2d(ops::PoolKind::Max, kernel, stride, padding) {}
};

class AvgPool2d final : public Pool2d {
 public:
  explicit AvgPool2d(int kernel, int stride = 0, int padding = 0)
      : Pool2d(ops::PoolKind::Avg, kernel, stride, padding) {}
};

class GlobalAvgPool final : public Module {
 public:
  std::string type() const override { return "gap"; }
  Shape output_shape(const Shape& input) const override;
  bool supports_channels_last() const override { return true; }
  Tensor forward(ops::Context& ctx, const Tensor& x) override;
  Tensor backward(ops::Context& ctx, const Tensor& dy) override;

  std::unique_ptr<Module> clone_structure(Device) const override {
    return std::make_unique<GlobalAvgPool>();
  }

 private:
  ops::Pool2dParams params_for(const Shape& input) const;
  Tensor workspace_;
  Shape x_shape_;
};

}  // namespace lockstep::nn
