#include "lockstep/nn/attention.hpp"

#include <cmath>

#include "buffers.hpp"
#include "lockstep/nn/init.hpp"
#include "lockstep/ops/ops.hpp"

namespace lockstep::nn {

CausalSelfAttention::CausalSelfAttention(std::int64_t dim, int heads, std::int64_t depth,
                                         Device device)
    : dim_(dim),
      heads_(heads),
      depth_(depth),
      c_attn_(dim, 3 * dim, true, device),
      c_proj_(dim, dim, true, device) {
  LOCKSTEP_CHECK(heads_ >= 1 && dim_ % heads_ == 0, "attn: dim ", dim_,
                 " must be a multiple of heads = ", heads_);
  LOCKSTEP_CHECK(depth_ >= 1, "attn: depth must be positive, got ", depth_);
  c_attn_.set_bf16_output(true);  // read only by the attention ops, which take bf16 on a bf16 ctx
}

std::string CausalSelfAttention::describe() const {
  return str("attn(dim=", dim_, ", heads=", heads_, ")");
}

Shape CausalSelfAttention::output_shape(const Shape& input) const {
  LOCKSTEP_CHECK(input.size() == 3 && input[2] == dim_, "attn expects input [N, T, ", dim_,
                 "], got ", shape_str(input));
  return input;
}

Tensor CausalSelfAttention::forward(ops::Context& ctx, const Tensor& x) {
  const Shape shape = output_shape(x.shape());
  const std::int64_t b = shape[0], t = shape[1], rows = b * t;
  Tensor qkv = c_attn_.forward(ctx, x.view({rows, dim_})).view({b, t, 3 * dim_});
  Tensor& att = detail::reuse_buffer(att_, shape, x.device(), qkv.dtype());
  Tensor& lse = detail::reuse_buffer(lse_, {b, heads_, t}, x.device());
  ops::attention_forward(ctx, qkv, heads_, att, lse, kernel_);
  qkv_ = qkv;
  return c_proj_.forward(ctx, att.view({rows, dim_})).view(shape);
}

Tensor CausalSelfAttention::backward(ops::Context& ctx, const Tensor& dy) {
  Tensor qkv = detail::take_cached(qkv_, "attn");
  const std::int64_t b = qkv.dim(0), t = qkv.dim(1), rows = b * t;
  Tensor datt = c_proj_.backward(ctx, dy.view({rows, dim_})).view({b, t, dim_});
  Tensor& dqkv = detail::reuse_buffer(dqkv_, qkv.shape(), qkv.device(), qkv.dtype());
  ops::attention_backward(ctx, qkv, att_, datt, lse_, heads_, dqkv, kernel_);
  qkv = Tensor();  // c_attn may reuse its output buffer next step
  Tensor dx = c_attn_.backward(ctx, dqkv.view({rows, 3 * dim_}));
  if (!dx.defined()) return Tensor();
  return dx.view({b, t, dim_});
}

void CausalSelfAttention::reset_parameters(std::uint64_t seed, const std::string& prefix) {
  const float proj_std = 0.02f / static_cast<float>(std::sqrt(2.0 * static_cast<double>(depth_)));
  init_normal(c_attn_.weight().value, 0.02f, seed, prefix + "c_attn.weight");
  init_constant(c_attn_.bias().value, 0.0f);
  init_normal(c_proj_.weight().value, proj_std, seed, prefix + "c_proj.weight");
  init_constant(c_proj_.bias().value, 0.0f);
}

void CausalSelfAttention::collect_parameters(const std::string& prefix,
                                             std::vector<Parameter*>& out) {
  c_attn_.collect_parameters(prefix + "c_attn.", out);
  c_proj_.collect_parameters(prefix + "c_proj.", out);
}

void CausalSelfAttention::set_input_grad(bool needed) {
  Module::set_input_grad(needed);
  c_attn_.set_input_grad(needed);
}

double CausalSelfAttention::forward_flops(const Shape& input) const {
  const Shape shape = output_shape(input);
  const double b = static_cast<double>(shape[0]), t = static_cast<double>(shape[1]);
  const double d = static_cast<double>(dim_);
  // The projections, plus q.k and p.v over the causal prefix: query s sees s + 1 keys.
  const double projections = 2.0 * b * t * (3.0 * d * d + d * d);
  const double attention = 2.0 * 2.0 * b * d * t * (t + 1.0) / 2.0;
  return (projections + attention) / b;
}

void CausalSelfAttention::release_buffers() {
  qkv_ = att_ = lse_ = dqkv_ = Tensor();
  c_attn_.release_buffers();
  c_proj_.release_buffers();
}

std::unique_ptr<Module> CausalSelfAttention::clone_structure(Device device) const {
  auto copy = std::make_unique<CausalSelfAttention>(dim_, heads_, depth_, device);
  copy->set_kernel(kernel_);
  copy->set_bf16_output(c_proj_.bf16_output());
  return copy;
}

}  // namespace lockstep::nn
