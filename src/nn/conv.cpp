#include "lockstep/nn/conv.hpp"

#include "buffers.hpp"
#include "lockstep/nn/init.hpp"

namespace lockstep::nn {

Conv2d::Conv2d(std::int64_t in_channels, std::int64_t out_channels, int kernel, int stride,
               int padding, bool bias, Device device)
    : in_(in_channels), out_(out_channels), kernel_(kernel), has_bias_(bias) {
  LOCKSTEP_CHECK(in_ > 0 && out_ > 0 && kernel > 0 && stride > 0 && padding >= 0,
                 "conv: bad arguments in=", in_, " out=", out_, " kernel=", kernel,
                 " stride=", stride, " pad=", padding);
  params_.stride_h = params_.stride_w = stride;
  params_.pad_h = params_.pad_w = padding;
  weight_ = make_parameter({out_, in_, kernel, kernel}, device);
  if (has_bias_) bias_ = make_parameter({out_}, device);
}

std::string Conv2d::describe() const {
  return str("conv(", in_, "->", out_, ", k=", kernel_, ", stride=", params_.stride_h,
             ", pad=", params_.pad_h, has_bias_ ? "" : ", bias=0", ")");
}

Shape Conv2d::output_shape(const Shape& input) const {
  LOCKSTEP_CHECK(input.size() == 4 && input[1] == in_, "conv expects input [N, ", in_,
                 ", H, W], got ", shape_str(input));
  std::int64_t h = ops::window_output_size(input[2], kernel_, params_.stride_h, params_.pad_h);
  std::int64_t w = ops::window_output_size(input[3], kernel_, params_.stride_w, params_.pad_w);
  LOCKSTEP_CHECK(h > 0 && w > 0, "conv kernel ", kernel_, " (pad ", params_.pad_h,
                 ") does not fit input ", shape_str(input));
  return {input[0], out_, h, w};
}

// Under the bf16 policy the forward and the weight gradient both read x, and the weight and input
// gradients both read dy: each is rounded to bf16 once here, as Linear does, instead of once per
// op inside it (the same rounding), and x is kept for backward in bf16, half its f32 size. A
// channels-last convolution then reads its bf16 activations as they are. dy stays f32 where a
// bias gradient sums it.
namespace {
Tensor rounded_once(ops::Context& ctx, const Tensor& t) {
  if (ctx.precision() != ops::Precision::BF16 || t.dtype() != DType::F32) return t;
  Tensor t16 = ctx.transient(t.shape(), DType::BF16);
  ops::cast(ctx, t, t16);
  return t16;
}
}  // namespace

Tensor Conv2d::forward(ops::Context& ctx, const Tensor& x) {
  x_ = Tensor();  // a forward without backward (evaluation) leaves it set: free it first
  const bool y16 = output_to_bn_ && ctx.precision() == ops::Precision::BF16 &&
                   ops::bf16_conv_bn_activations(ctx);
  Tensor y = ctx.transient(output_shape(x.shape()), y16 ? DType::BF16 : DType::F32);
  x_ = rounded_once(ctx, x);
  ops::conv2d_forward(ctx, x_, weight_.value, has_bias_ ? bias_.value : Tensor(), y, params_);
  return y;
}

Tensor Conv2d::backward(ops::Context& ctx, const Tensor& dy) {
  Tensor x = detail::take_cached(x_, "conv");
  const Tensor dy_operand = has_bias_ || !input_grad_ ? dy : rounded_once(ctx, dy);
  Tensor no_bias;
  ops::conv2d_backward_weights(ctx, x, dy_operand, weight_.grad, has_bias_ ? bias_.grad : no_bias,
                               params_);
  if (!input_grad_) return Tensor();
  Tensor dx = ctx.transient(x.shape());
  ops::conv2d_backward_data(ctx, dy_operand, weight_.value, dx, params_);
  return dx;
}

void Conv2d::set_channels_last(bool on) {
  Module::set_channels_last(on);
  params_.layout = image_layout();
}

void Conv2d::reset_parameters(std::uint64_t seed, const std::string& prefix) {
  float bound = default_init_bound(in_ * kernel_ * kernel_);
  init_uniform(weight_.value, bound, seed, prefix + "weight");
  if (has_bias_) init_uniform(bias_.value, bound, seed, prefix + "bias");
}

void Conv2d::collect_parameters(const std::string& prefix, std::vector<Parameter*>& out) {
  weight_.name = prefix + "weight";
  out.push_back(&weight_);
  if (has_bias_) {
    bias_.name = prefix + "bias";
    out.push_back(&bias_);
  }
}

double Conv2d::forward_flops(const Shape& input) const {
  Shape y = output_shape(input);
  return 2.0 * static_cast<double>(in_ * kernel_ * kernel_) * static_cast<double>(out_) *
         static_cast<double>(y[2] * y[3]);
}

}  // namespace lockstep::nn
