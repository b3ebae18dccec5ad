// The ResNet basic block (He et al. 2016, torchvision's BasicBlock):
//   y = relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))
// conv1 is 3x3 with the block's stride, conv2 3x3 stride 1, both padded by 1 and without bias
// (BatchNorm follows). The shortcut is the identity when shape is kept, else a 1x1 strided conv
// plus BatchNorm ("downsample", as torchvision names it).
#pragma once

#include <memory>

#include "lockstep/nn/activation.hpp"
#include "lockstep/nn/batchnorm.hpp"
#include "lockstep/nn/conv.hpp"

namespace lockstep::nn {

class BasicBlock final : public Module {
 public:
  BasicBlock(std::int64_t in_channels, std::int64_t out_channels, int stride = 1,
             Device device = Device::cpu());

  std::string type() const override { return "res"; }
  std::string describe() const override;
  Shape output_shape(const Shape& input) const override;
  Tensor forward(ops::Context& ctx, const Tensor& x) override;
  Tensor backward(ops::Context& ctx, const Tensor& dy) override;
  void reset_parameters(std::uint64_t seed, const std::string& prefix) override;
  void collect_parameters(const std::string& prefix, std::vector<Parameter*>& out) override;
  void collect_buffers(const std::string& prefix, std::vector<Buffer*>& out) override;
  void set_training(bool training) override;
  void set_input_grad(bool needed) override;
  double forward_flops(const Shape& input) const override;

  bool has_downsample() const { return downsample_conv_ != nullptr; }

  std::unique_ptr<Module> clone_structure(Device device) const override {
    return std::make_unique<BasicBlock>(in_, out_, stride_, device);
  }

 private:
  std::int64_t in_, out_;
  int stride_;
  Conv2d conv1_;
  BatchNorm2d bn1_;
  ReLU relu1_;
  Conv2d conv2_;
  BatchNorm2d bn2_;
  std::unique_ptr<Conv2d> downsample_conv_;  // null for the identity shortcut
  std::unique_ptr<BatchNorm2d> downsample_bn_;
  ReLU relu_out_;
  Tensor sum_, dx_;
};

}  // namespace lockstep::nn
