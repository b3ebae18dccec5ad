#include "lockstep/nn/residual.hpp"

#include "buffers.hpp"
#include "lockstep/ops/ops.hpp"

namespace lockstep::nn {

BasicBlock::BasicBlock(std::int64_t in_channels, std::int64_t out_channels, int stride,
                       Device device)
    : in_(in_channels),
      out_(out_channels),
      stride_(stride),
      conv1_(in_channels, out_channels, 3, stride, 1, false, device),
      bn1_(out_channels, kBatchNormEps, kBatchNormMomentum, device),
      conv2_(out_channels, out_channels, 3, 1, 1, false, device),
      bn2_(out_channels, kBatchNormEps, kBatchNormMomentum, device) {
  if (stride != 1 || in_channels != out_channels) {
    downsample_conv_ =
        std::make_unique<Conv2d>(in_channels, out_channels, 1, stride, 0, false, device);
    downsample_bn_ =
        std::make_unique<BatchNorm2d>(out_channels, kBatchNormEps, kBatchNormMomentum, device);
  }
}

std::string BasicBlock::describe() const {
  return str("res(", in_, "->", out_, ", stride=", stride_, has_downsample() ? ", downsample" : "",
             ")");
}

Shape BasicBlock::output_shape(const Shape& input) const {
  Shape main = bn2_.output_shape(conv2_.output_shape(conv1_.output_shape(input)));
  if (has_downsample()) {
    Shape shortcut = downsample_conv_->output_shape(input);
    LOCKSTEP_CHECK(shortcut == main, "res: shortcut shape ", shape_str(shortcut),
                   " differs from the main path ", shape_str(main), " for input ",
                   shape_str(input));
  }
  return main;
}

Tensor BasicBlock::forward(ops::Context& ctx, const Tensor& x) {
  Tensor h = conv1_.forward(ctx, x);
  h = bn1_.forward(ctx, h);
  h = relu1_.forward(ctx, h);
  h = conv2_.forward(ctx, h);
  h = bn2_.forward(ctx, h);
  Tensor shortcut = x;
  if (has_downsample()) shortcut = downsample_bn_->forward(ctx, downsample_conv_->forward(ctx, x));
  Tensor& sum = detail::reuse_buffer(sum_, h.shape(), h.device());
  ops::add(ctx, h, shortcut, sum);
  return relu_out_.forward(ctx, sum);
}

Tensor BasicBlock::backward(ops::Context& ctx, const Tensor& dy) {
  // The sum node passes its gradient unchanged to both the main path and the shortcut.
  Tensor dsum = relu_out_.backward(ctx, dy);
  Tensor d = bn2_.backward(ctx, dsum);
  d = conv2_.backward(ctx, d);
  d = relu1_.backward(ctx, d);
  d = bn1_.backward(ctx, d);
  Tensor dx_main = conv1_.backward(ctx, d);
  Tensor dx_short = dsum;
  if (has_downsample()) {
    dx_short = downsample_conv_->backward(ctx, downsample_bn_->backward(ctx, dsum));
  }
  if (!input_grad_) return Tensor();
  Tensor& dx = detail::reuse_buffer(dx_, dx_main.shape(), dx_main.device());
  ops::add(ctx, dx_main, dx_short, dx);
  return dx;
}

void BasicBlock::reset_parameters(std::uint64_t seed, const std::string& prefix) {
  conv1_.reset_parameters(seed, prefix + "conv1.");
  bn1_.reset_parameters(seed, prefix + "bn1.");
  conv2_.reset_parameters(seed, prefix + "conv2.");
  bn2_.reset_parameters(seed, prefix + "bn2.");
  if (has_downsample()) {
    downsample_conv_->reset_parameters(seed, prefix + "downsample.0.");
    downsample_bn_->reset_parameters(seed, prefix + "downsample.1.");
  }
}

void BasicBlock::collect_parameters(const std::string& prefix, std::vector<Parameter*>& out) {
  conv1_.collect_parameters(prefix + "conv1.", out);
  bn1_.collect_parameters(prefix + "bn1.", out);
  conv2_.collect_parameters(prefix + "conv2.", out);
  bn2_.collect_parameters(prefix + "bn2.", out);
  if (has_downsample()) {
    downsample_conv_->collect_parameters(prefix + "downsample.0.", out);
    downsample_bn_->collect_parameters(prefix + "downsample.1.", out);
  }
}

void BasicBlock::collect_buffers(const std::string& prefix, std::vector<Buffer*>& out) {
  bn1_.collect_buffers(prefix + "bn1.", out);
  bn2_.collect_buffers(prefix + "bn2.", out);
  if (has_downsample()) downsample_bn_->collect_buffers(prefix + "downsample.1.", out);
}

void BasicBlock::set_training(bool training) {
  Module::set_training(training);
  for (Module* m : {static_cast<Module*>(&conv1_), static_cast<Module*>(&bn1_),
                    static_cast<Module*>(&relu1_), static_cast<Module*>(&conv2_),
                    static_cast<Module*>(&bn2_), static_cast<Module*>(&relu_out_)}) {
    m->set_training(training);
  }
  if (has_downsample()) {
    downsample_conv_->set_training(training);
    downsample_bn_->set_training(training);
  }
}

void BasicBlock::set_input_grad(bool needed) {
  // Only the layers that see the block's input can skip their dx; the inner ones feed the
  // gradients of conv1/bn1 and must always produce it.
  Module::set_input_grad(needed);
  conv1_.set_input_grad(needed);
  if (has_downsample()) downsample_conv_->set_input_grad(needed);
}

double BasicBlock::forward_flops(const Shape& input) const {
  Shape h = conv1_.output_shape(input);
  double flops = conv1_.forward_flops(input) + conv2_.forward_flops(h);
  if (has_downsample()) flops += downsample_conv_->forward_flops(input);
  return flops;
}

}  // namespace lockstep::nn
