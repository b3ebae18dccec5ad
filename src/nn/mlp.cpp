#include "lockstep/nn/mlp.hpp"

#include <cmath>

#include "buffers.hpp"
#include "lockstep/nn/init.hpp"
#include "lockstep/ops/ops.hpp"

namespace lockstep::nn {

Mlp::Mlp(std::int64_t dim, std::int64_t depth, Device device)
    : dim_(dim),
      depth_(depth),
      c_fc_(dim, 4 * dim, true, device),
      c_proj_(4 * dim, dim, true, device) {
  LOCKSTEP_CHECK(depth_ >= 1, "mlp: depth must be positive, got ", depth_);
  c_fc_.set_bf16_output(true);  // read only by c_proj, which takes bf16 on a bf16 context
}

std::string Mlp::describe() const {
  return str("mlp(", dim_, "->", 4 * dim_, "->", dim_, ")");
}

Shape Mlp::output_shape(const Shape& input) const {
  LOCKSTEP_CHECK(input.size() == 3 && input[2] == dim_, "mlp expects input [N, T, ", dim_,
                 "], got ", shape_str(input));
  return input;
}

// c_fc's GELU runs inside c_fc's op (ops::linear_forward), keeping its input h for the backward;
// c_proj's backward folds the GELU's backward into its input-gradient GEMM and hands c_fc
// dL/dh directly. Under bf16, h, the GELU's output and their gradients are bf16 activations.
Tensor Mlp::forward(ops::Context& ctx, const Tensor& x) {
  const Shape shape = output_shape(x.shape());
  const std::int64_t rows = shape[0] * shape[1];
  Tensor& h = detail::reuse_buffer(pre_act_, {rows, 4 * dim_}, x.device(), c_fc_.output_dtype(ctx));
  Tensor g = c_fc_.forward_act(ctx, x.view({rows, dim_}), ops::Activation::GeluTanh, h);
  h_ = h;
  Tensor y = c_proj_.forward(ctx, g);
  if (recompute_gelu_) {  // backward makes it again
    c_proj_.drop_input();
    c_fc_.drop_output();
  }
  return y.view(shape);
}

Tensor Mlp::backward(ops::Context& ctx, const Tensor& dy) {
  Tensor h = detail::take_cached(h_, "mlp");
  const Shape shape = dy.shape();
  if (recompute_gelu_)
    c_proj_.cache_input(ctx, c_fc_.recompute_act(ctx, ops::Activation::GeluTanh, h));
  Tensor dh = c_proj_.backward_act(ctx, dy.view({h.dim(0), dim_}), ops::Activation::GeluTanh, h);
  if (recompute_gelu_) {
    c_proj_.drop_input();
    c_fc_.drop_output();
  }
  h = Tensor();
  Tensor dx = c_fc_.backward(ctx, dh);
  if (!dx.defined()) return Tensor();
  return dx.view(shape);
}

void Mlp::reset_parameters(std::uint64_t seed, const std::string& prefix) {
  const float proj_std = 0.02f / static_cast<float>(std::sqrt(2.0 * static_cast<double>(depth_)));
  init_normal(c_fc_.weight().value, 0.02f, seed, prefix + "c_fc.weight");
  init_constant(c_fc_.bias().value, 0.0f);
  init_normal(c_proj_.weight().value, proj_std, seed, prefix + "c_proj.weight");
  init_constant(c_proj_.bias().value, 0.0f);
}

void Mlp::collect_parameters(const std::string& prefix, std::vector<Parameter*>& out) {
  c_fc_.collect_parameters(prefix + "c_fc.", out);
  c_proj_.collect_parameters(prefix + "c_proj.", out);
}

void Mlp::release_buffers() {
  h_ = pre_act_ = Tensor();
  c_fc_.release_buffers();
  c_proj_.release_buffers();
}

void Mlp::set_input_grad(bool needed) {
  Module::set_input_grad(needed);
  c_fc_.set_input_grad(needed);
}

double Mlp::forward_flops(const Shape& input) const {
  const Shape shape = output_shape(input);
  return 2.0 * static_cast<double>(shape[1]) * 8.0 * static_cast<double>(dim_) *
         static_cast<double>(dim_);
}

}  // namespace lockstep::nn
