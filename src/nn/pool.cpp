#include "lockstep/nn/pool.hpp"

namespace lockstep::nn {

Pool2d::Pool2d(ops::PoolKind kind, int kernel, int stride, int padding) : kind_(kind) {
  if (stride == 0) stride = kernel;
  // padding <= kernel / 2, not 2 * padding <= kernel: the doubling overflows for huge paddings.
  LOCKSTEP_CHECK(kernel > 0 && stride > 0 && padding >= 0 && padding <= kernel / 2, type(),
                 ": bad arguments kernel=", kernel, " stride=", stride, " pad=", padding,
                 " (padding may be at most half the kernel)");
  params_.kernel_h = params_.kernel_w = kernel;
  params_.stride_h = params_.stride_w = stride;
  params_.pad_h = params_.pad_w = padding;
}

std::string Pool2d::type() const {
  return kind_ == ops::PoolKind::Max ? "maxpool" : "avgpool";
}

std::string Pool2d::describe() const {
  return str(type(), "(k=", params_.kernel_h, ", stride=", params_.stride_h,
             ", pad=", params_.pad_h, ")");
}

Shape Pool2d::output_shape(const Shape& input) const {
  LOCKSTEP_CHECK(input.size() == 4, type(), " expects input [N, C, H, W], got ", shape_str(input));
  std::int64_t h =
      ops::window_output_size(input[2], params_.kernel_h, params_.stride_h, params_.pad_h);
  std::int64_t w =
      ops::window_output_size(input[3], params_.kernel_w, params_.stride_w, params_.pad_w);
  LOCKSTEP_CHECK(h > 0 && w > 0, type(), " window ", params_.kernel_h, " does not fit input ",
                 shape_str(input));
  return {input[0], input[1], h, w};
}

void Pool2d::set_channels_last(bool on) {
  Module::set_channels_last(on);
  params_.layout = image_layout();
}

Tensor Pool2d::forward(ops::Context& ctx, const Tensor& x) {
  Tensor y = ctx.transient(output_shape(x.shape()));
  ops::pool2d_forward(ctx, kind_, x, y, workspace_, params_);
  x_shape_ = x.shape();
  return y;
}

Tensor Pool2d::backward(ops::Context& ctx, const Tensor& dy) {
  LOCKSTEP_CHECK(!x_shape_.empty(), type(), ": backward without forward");
  if (!input_grad_) return Tensor();
  Tensor dx = ctx.transient(x_shape_);
  ops::pool2d_backward(ctx, kind_, dy, workspace_, dx, params_);
  return dx;
}

ops::Pool2dParams GlobalAvgPool::params_for(const Shape& input) const {
  ops::Pool2dParams p;
  p.kernel_h = p.stride_h = static_cast<int>(input[2]);
  p.kernel_w = p.stride_w = static_cast<int>(input[3]);
  p.pad_h = p.pad_w = 0;
  p.layout = image_layout();
  return p;
}

Shape GlobalAvgPool::output_shape(const Shape& input) const {
  LOCKSTEP_CHECK(input.size() == 4, "gap expects input [N, C, H, W], got ", shape_str(input));
  return {input[0], input[1]};
}

Tensor GlobalAvgPool::forward(ops::Context& ctx, const Tensor& x) {
  Shape out = output_shape(x.shape());
  Tensor y = ctx.transient({out[0], out[1], 1, 1});
  ops::pool2d_forward(ctx, ops::PoolKind::Avg, x, y, workspace_, params_for(x.shape()));
  x_shape_ = x.shape();
  return y.view(out);
}

Tensor GlobalAvgPool::backward(ops::Context& ctx, const Tensor& dy) {
  LOCKSTEP_CHECK(!x_shape_.empty(), "gap: backward without forward");
  if (!input_grad_) return Tensor();
  Tensor dx = ctx.transient(x_shape_);
  ops::pool2d_backward(ctx, ops::PoolKind::Avg, dy.view({dy.dim(0), dy.dim(1), 1, 1}), workspace_,
                       dx, params_for(x_shape_));
  return dx;
}

std::unique_ptr<Module> Pool2d::clone_structure(Device) const {
  if (kind_ == ops::PoolKind::Max)
    return std::make_unique<MaxPool2d>(params_.kernel_h, params_.stride_h, params_.pad_h);
  return std::make_unique<AvgPool2d>(params_.kernel_h, params_.stride_h, params_.pad_h);
}

}  // namespace lockstep::nn
