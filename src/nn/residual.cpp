#include "lockstep/nn/residual.hpp"

#include "lockstep/nn/init.hpp"
#include "lockstep/nn/model.hpp"
#include "lockstep/ops/ops.hpp"

namespace lockstep::nn {

ResidualBlock::ResidualBlock(std::int64_t in_channels, std::int64_t out_channels, int stride,
                             Device device)
    : in_(in_channels), out_(out_channels), stride_(stride) {
  if (stride != 1 || in_channels != out_channels) {
    downsample_conv_ =
        std::make_unique<Conv2d>(in_channels, out_channels, 1, stride, 0, false, device);
    downsample_bn_ =
        std::make_unique<BatchNorm2d>(out_channels, kBatchNormEps, kBatchNormMomentum, device);
    downsample_bn_->set_input_grad_to_conv(true);
    downsample_conv_->set_output_to_batchnorm(true);
  }
}

Shape ResidualBlock::output_shape(const Shape& input) const {
  Shape main = input;
  for (const Named& layer : branch_)
    main = layer.module->output_shape(main);
  if (has_downsample()) {
    Shape shortcut = downsample_conv_->output_shape(input);
    LOCKSTEP_CHECK(shortcut == main, type(), ": shortcut shape ", shape_str(shortcut),
                   " differs from the main path ", shape_str(main), " for input ",
                   shape_str(input));
  }
  return main;
}

namespace {
// Whether branch layer i is a ReLU that the BatchNorm before it ran (ResidualBlock::forward).
template <class Layers>
bool fused_into_bn(const Layers& branch, std::size_t i) {
  return i > 0 && dynamic_cast<const ReLU*>(branch[i].module.get()) &&
         dynamic_cast<const BatchNorm*>(branch[i - 1].module.get());
}
}  // namespace

Tensor ResidualBlock::forward(ops::Context& ctx, const Tensor& x) {
  LOCKSTEP_CHECK(!branch_.empty() && branch_.back().module.get() == last_bn_, type(),
                 ": the branch must end with its last BatchNorm");
  const std::size_t last = branch_.size() - 1;
  Tensor h = x;
  for (std::size_t i = 0; i < last; ++i) {
    Module& m = *branch_[i].module;
    if (auto* bn = dynamic_cast<BatchNorm*>(branch_[i + 1].module.get())) {
      bn->set_input_grad_to_conv(dynamic_cast<const Conv2d*>(&m) != nullptr);
      if (auto* conv = dynamic_cast<Conv2d*>(&m)) conv->set_output_to_batchnorm(true);
    }
    if (fused_into_bn(branch_, i + 1)) {
      // A convolution after the ReLU rounds its input to bf16 anyway: written rounded.
      const bool conv_next =
          i + 2 < branch_.size() && dynamic_cast<const Conv2d*>(branch_[i + 2].module.get());
      h = static_cast<BatchNorm&>(m).forward_relu(ctx, h, conv_next);
      ++i;
      continue;
    }
    h = m.forward(ctx, h);
  }
  Tensor shortcut = x;
  if (has_downsample()) shortcut = downsample_bn_->forward(ctx, downsample_conv_->forward(ctx, x));
  const bool y16 = output_bf16_ && ops::bf16_conv_bn_activations(ctx);
  return last_bn_->forward_residual_relu(ctx, h, shortcut, y16);
}

Tensor ResidualBlock::backward(ops::Context& ctx, const Tensor& dy) {
  // The sum node passes its gradient (dsum = dy where the closing ReLU's output y > 0) unchanged
  // to both the main path and the shortcut. dsum is never stored: each consumer masks dy by y
  // itself, the last BatchNorm and a downsampling BatchNorm inside their backward
  // (ops::batchnorm_relu_backward) and an identity shortcut in the final sum
  // (ops::relu_backward_add); the bits are those of relu_backward, then the BatchNorms' backward
  // and add.
  const Tensor y = last_bn_->relu_output();
  Tensor dx_main = last_bn_->backward(ctx, dy);
  for (std::size_t i = branch_.size() - 1; i-- > 0;) {
    if (fused_into_bn(branch_, i)) continue;  // in its BatchNorm's backward
    dx_main = branch_[i].module->backward(ctx, dx_main);
  }
  Tensor dx_short;
  if (has_downsample()) {
    dx_short = downsample_conv_->backward(ctx, downsample_bn_->backward_through_relu(ctx, dy, y));
  }
  if (!input_grad_) return Tensor();
  Tensor dx = ctx.transient(dx_main.shape());
  if (has_downsample())
    ops::add(ctx, dx_main, dx_short, dx);
  else
    ops::relu_backward_add(ctx, y, dy, dx_main, dx);
  return dx;
}

void ResidualBlock::reset_parameters(std::uint64_t seed, const std::string& prefix) {
  for (Named& layer : branch_)
    layer.module->reset_parameters(seed, prefix + layer.name + ".");
  if (has_downsample()) {
    downsample_conv_->reset_parameters(seed, prefix + "downsample.0.");
    downsample_bn_->reset_parameters(seed, prefix + "downsample.1.");
  }
}

void ResidualBlock::collect_parameters(const std::string& prefix, std::vector<Parameter*>& out) {
  for (Named& layer : branch_)
    layer.module->collect_parameters(prefix + layer.name + ".", out);
  if (has_downsample()) {
    downsample_conv_->collect_parameters(prefix + "downsample.0.", out);
    downsample_bn_->collect_parameters(prefix + "downsample.1.", out);
  }
}

void ResidualBlock::collect_buffers(const std::string& prefix, std::vector<Buffer*>& out) {
  for (Named& layer : branch_)
    layer.module->collect_buffers(prefix + layer.name + ".", out);
  if (has_downsample()) downsample_bn_->collect_buffers(prefix + "downsample.1.", out);
}

void ResidualBlock::set_training(bool training) {
  Module::set_training(training);
  for (Named& layer : branch_)
    layer.module->set_training(training);
  if (has_downsample()) {
    downsample_conv_->set_training(training);
    downsample_bn_->set_training(training);
  }
}

void ResidualBlock::set_input_grad(bool needed) {
  // Only the layers that see the block's input can skip their dx; the inner ones feed the
  // gradients of the layers before them and must always produce it.
  Module::set_input_grad(needed);
  branch_.front().module->set_input_grad(needed);
  if (has_downsample()) downsample_conv_->set_input_grad(needed);
}

bool ResidualBlock::supports_channels_last() const {
  for (const Named& layer : branch_)
    if (!layer.module->supports_channels_last()) return false;
  return true;
}

void ResidualBlock::set_channels_last(bool on) {
  Module::set_channels_last(on);
  for (Named& layer : branch_)
    layer.module->set_channels_last(on);
  if (has_downsample()) {
    downsample_conv_->set_channels_last(on);
    downsample_bn_->set_channels_last(on);
  }
}

double ResidualBlock::forward_flops(const Shape& input) const {
  // Convolutions only, as for a plain conv layer (BatchNorm, the ReLUs and the sum are O(1) per
  // element against O(k^2 C) per output for the convolutions).
  double flops = 0.0;
  Shape h = input;
  for (const Named& layer : branch_) {
    if (dynamic_cast<const Conv2d*>(layer.module.get())) flops += layer.module->forward_flops(h);
    h = layer.module->output_shape(h);
  }
  if (has_downsample()) flops += downsample_conv_->forward_flops(input);
  return flops;
}

BasicBlock::BasicBlock(std::int64_t in_channels, std::int64_t out_channels, int stride,
                       Device device)
    : ResidualBlock(in_channels, out_channels, stride, device) {
  add<Conv2d>("conv1", in_channels, out_channels, 3, stride, 1, false, device);
  add<BatchNorm2d>("bn1", out_channels, kBatchNormEps, kBatchNormMomentum, device);
  add<ReLU>("");
  add<Conv2d>("conv2", out_channels, out_channels, 3, 1, 1, false, device);
  set_last_bn(add<BatchNorm2d>("bn2", out_channels, kBatchNormEps, kBatchNormMomentum, device));
}

std::string BasicBlock::describe() const {
  return str("res(", in_, "->", out_, ", stride=", stride_, shortcut_text(), ")");
}

Bottleneck::Bottleneck(std::int64_t in_channels, std::int64_t width, int stride, Device device)
    : ResidualBlock(in_channels, kExpansion * width, stride, device), width_(width) {
  add<Conv2d>("conv1", in_channels, width, 1, 1, 0, false, device);
  add<BatchNorm2d>("bn1", width, kBatchNormEps, kBatchNormMomentum, device);
  add<ReLU>("");
  add<Conv2d>("conv2", width, width, 3, stride, 1, false, device);
  add<BatchNorm2d>("bn2", width, kBatchNormEps, kBatchNormMomentum, device);
  add<ReLU>("");
  add<Conv2d>("conv3", width, kExpansion * width, 1, 1, 0, false, device);
  set_last_bn(
      add<BatchNorm2d>("bn3", kExpansion * width, kBatchNormEps, kBatchNormMomentum, device));
}

std::string Bottleneck::describe() const {
  return str("bottleneck(", in_, "->", width_, "->", out_, ", stride=", stride_, shortcut_text(),
             ")");
}

std::int64_t zero_init_residual(Model& model) {
  std::int64_t blocks = 0;
  for_each_module(model, [&](Module& m) {
    if (auto* block = dynamic_cast<ResidualBlock*>(&m)) {
      init_constant(block->last_bn().weight().value, 0.0f);
      ++blocks;
    }
  });
  return blocks;
}

}  // namespace lockstep::nn
