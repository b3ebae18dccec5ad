// ResNet's residual blocks (He et al. 2016), as torchvision.models.resnet builds them:
//   y = relu(branch(x) + shortcut(x))
// The shortcut is the identity when the shape is kept, else a 1x1 strided conv plus BatchNorm
// ("downsample", as torchvision names it). Convolutions have no bias (BatchNorm follows).
//   BasicBlock (ResNet-18/34, the CIFAR ResNets): conv1 3x3(stride)-bn1-relu-conv2 3x3-bn2.
//   Bottleneck (ResNet-50/101/152, "v1.5"): conv1 1x1-bn1-relu-conv2 3x3(stride)-bn2-relu-
//   conv3 1x1-bn3, output 4 x width channels. v1.5 puts the stride on the 3x3, where v1 (the
//   paper) put it on the first 1x1; torchvision and the published 76.1% top-1 are v1.5.
// Parameter names are torchvision's ("conv1.weight", "bn3.bias", "downsample.0.weight").
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/nn/activation.hpp"
#include "lockstep/nn/batchnorm.hpp"
#include "lockstep/nn/conv.hpp"

namespace lockstep::nn {

class Model;

// What the two blocks share: the branch as a list of named layers, the shortcut, the sum and
// the closing ReLU. A subclass only lists its branch, ending with its last BatchNorm.
// The forward runs each BatchNorm -> ReLU pair of the branch as one op, and the last BatchNorm
// with the sum and the closing ReLU as another (BatchNorm::forward_relu, forward_residual_relu):
// each pass over an activation a ResNet-50 step saves is worth as much as the BatchNorm's own
// (docs/PERFORMANCE.md).
class ResidualBlock : public Module {
 public:
  Shape output_shape(const Shape& input) const override;
  Tensor forward(ops::Context& ctx, const Tensor& x) override;
  Tensor backward(ops::Context& ctx, const Tensor& dy) override;
  void reset_parameters(std::uint64_t seed, const std::string& prefix) override;
  void collect_parameters(const std::string& prefix, std::vector<Parameter*>& out) override;
  void collect_buffers(const std::string& prefix, std::vector<Buffer*>& out) override;
  void set_training(bool training) override;
  void set_input_grad(bool needed) override;
  double forward_flops(const Shape& input) const override;
  bool supports_channels_last() const override;  // its layers do; the sum is elementwise
  void set_channels_last(bool on) override;
  // Its input goes to convolutions and, for an identity shortcut, into the closing sum, which
  // reads bf16 as it is; its output is bf16 when the next layer reads that (Module).
  bool reads_bf16_input() const override { return true; }
  void set_output_bf16(bool on) override { output_bf16_ = on; }
  bool output_bf16() const { return output_bf16_; }

  bool has_downsample() const { return downsample_conv_ != nullptr; }
  // The BatchNorm that closes the branch: with its scale 0 the block starts as
  // relu(shortcut(x)) (zero_init_residual below).
  BatchNorm& last_bn() { return *last_bn_; }

 protected:
  ResidualBlock(std::int64_t in_channels, std::int64_t out_channels, int stride, Device device);
  // Appends a layer to the branch, named as torchvision names it ("" for a ReLU).
  template <class M, class... Args>
  M& add(const char* name, Args&&... args) {
    auto m = std::make_unique<M>(std::forward<Args>(args)...);
    M& ref = *m;
    branch_.push_back({name, std::move(m)});
    return ref;
  }
  void set_last_bn(BatchNorm& bn) { last_bn_ = &bn; }
  std::string shortcut_text() const { return has_downsample() ? ", downsample" : ""; }

  std::int64_t in_, out_;
  int stride_;

 private:
  struct Named {
    std::string name;
    std::unique_ptr<Module> module;
  };
  std::vector<Named> branch_;
  BatchNorm* last_bn_ = nullptr;
  std::unique_ptr<Conv2d> downsample_conv_;  // null for the identity shortcut
  std::unique_ptr<BatchNorm2d> downsample_bn_;
  bool output_bf16_ = false;
};

// The basic block: two 3x3 convolutions, the first with the block's stride (spec token `res`).
class BasicBlock final : public ResidualBlock {
 public:
  BasicBlock(std::int64_t in_channels, std::int64_t out_channels, int stride = 1,
             Device device = Device::cpu());

  std::string type() const override { return "res"; }
  std::string describe() const override;
  std::unique_ptr<Module> clone_structure(Device device) const override {
    return std::make_unique<BasicBlock>(in_, out_, stride_, device);
  }
};

// The bottleneck block: 1x1 down to `width`, 3x3 with the block's stride, 1x1 up to
// kExpansion * width (spec token `bottleneck`).
class Bottleneck final : public ResidualBlock {
 public:
  static constexpr std::int64_t kExpansion = 4;

  Bottleneck(std::int64_t in_channels, std::int64_t width, int stride = 1,
             Device device = Device::cpu());

  std::string type() const override { return "bottleneck"; }
  std::string describe() const override;
  std::unique_ptr<Module> clone_structure(Device device) const override {
    return std::make_unique<Bottleneck>(in_, width_, stride_, device);
  }

 private:
  std::int64_t width_;
};

// torchvision's zero_init_residual (Goyal et al. 2017, "Accurate, Large Minibatch SGD"): sets the
// scale (gamma) of every residual block's last BatchNorm to 0, so each block starts as
// relu(shortcut(x)) and the network as a shallower one, which trains better at large batch.
// Looks through nested Sequentials; returns the number of blocks changed.
std::int64_t zero_init_residual(Model& model);

}  // namespace lockstep::nn
