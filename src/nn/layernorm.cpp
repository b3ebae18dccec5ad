#include "lockstep/nn/layernorm.hpp"

#include "buffers.hpp"
#include "lockstep/nn/init.hpp"
#include "lockstep/ops/ops.hpp"

namespace lockstep::nn {

LayerNorm::LayerNorm(std::int64_t dim, float eps, Device device) : dim_(dim), eps_(eps) {
  LOCKSTEP_CHECK(dim_ > 0 && eps_ > 0.0f, "ln: dim and eps must be positive, got dim=", dim_,
                 " eps=", eps_);
  weight_ = make_parameter({dim_}, device);
  bias_ = make_parameter({dim_}, device);
}

std::string LayerNorm::describe() const {
  return str("ln(", dim_, ")");
}

Shape LayerNorm::output_shape(const Shape& input) const {
  LOCKSTEP_CHECK(!input.empty() && input.back() == dim_, "ln expects input [..., ", dim_, "], got ",
                 shape_str(input));
  return input;
}

DType LayerNorm::output_dtype(const ops::Context& ctx) const {
  return bf16_output_ && ctx.precision() == ops::Precision::BF16 ? DType::BF16 : DType::F32;
}

Tensor LayerNorm::forward(ops::Context& ctx, const Tensor& x) {
  Tensor& y = detail::reuse_buffer(y_, output_shape(x.shape()), x.device(), output_dtype(ctx));
  const std::int64_t rows = x.numel() / dim_;
  Tensor& mean = detail::reuse_buffer(mean_, {rows}, x.device());
  Tensor& rstd = detail::reuse_buffer(rstd_, {rows}, x.device());
  ops::layernorm_forward(ctx, x, weight_.value, bias_.value, eps_, y, mean, rstd);
  x_ = x;
  return y;
}

Tensor LayerNorm::forward_add(ops::Context& ctx, const Tensor& x, const Tensor& a, Tensor& sum) {
  Tensor& y = detail::reuse_buffer(y_, output_shape(x.shape()), x.device(), output_dtype(ctx));
  const std::int64_t rows = x.numel() / dim_;
  Tensor& mean = detail::reuse_buffer(mean_, {rows}, x.device());
  Tensor& rstd = detail::reuse_buffer(rstd_, {rows}, x.device());
  ops::residual_layernorm_forward(ctx, x, a, weight_.value, bias_.value, eps_, sum, y, mean, rstd);
  x_ = sum;
  return y;
}

Tensor LayerNorm::backward(ops::Context& ctx, const Tensor& dy) {
  return backward_add(ctx, dy, Tensor());
}

Tensor LayerNorm::backward_add(ops::Context& ctx, const Tensor& dy, const Tensor& dresidual) {
  Tensor x = detail::take_cached(x_, "ln");
  // The op computes dx in the same pass as the parameter gradients, so it is made even when the
  // caller does not need it.
  Tensor& dx = detail::reuse_buffer(dx_, x.shape(), x.device());
  ops::layernorm_backward(ctx, x, dy, weight_.value, mean_, rstd_, dresidual, dx, weight_.grad,
                          bias_.grad);
  if (!input_grad_) return Tensor();
  return dx;
}

void LayerNorm::reset_parameters(std::uint64_t seed, const std::string& prefix) {
  (void)seed;
  (void)prefix;
  init_constant(weight_.value, 1.0f);
  init_constant(bias_.value, 0.0f);
}

void LayerNorm::collect_parameters(const std::string& prefix, std::vector<Parameter*>& out) {
  weight_.name = prefix + "weight";
  bias_.name = prefix + "bias";
  out.push_back(&weight_);
  out.push_back(&bias_);
}

}  // namespace lockstep::nn
