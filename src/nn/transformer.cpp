#include "lockstep/nn/transformer.hpp"

#include "buffers.hpp"
#include "lockstep/ops/ops.hpp"

namespace lockstep::nn {

TransformerBlock::TransformerBlock(std::int64_t dim, int heads, std::int64_t depth, Device device)
    : dim_(dim),
      heads_(heads),
      ln_1_(dim, kLayerNormEps, device),
      attn_(dim, heads, depth, device),
      ln_2_(dim, kLayerNormEps, device),
      mlp_(dim, depth, device) {}

std::string TransformerBlock::describe() const {
  return str("block(dim=", dim_, ", heads=", heads_, ")");
}

Shape TransformerBlock::output_shape(const Shape& input) const {
  LOCKSTEP_CHECK(input.size() == 3 && input[2] == dim_, "block expects input [N, T, ", dim_,
                 "], got ", shape_str(input));
  return input;
}

Tensor TransformerBlock::forward(ops::Context& ctx, const Tensor& x) {
  Tensor a = attn_.forward(ctx, ln_1_.forward(ctx, x));
  Tensor& x1 = detail::reuse_buffer(x1_, x.shape(), x.device());
  ops::add(ctx, x, a, x1);
  a = Tensor();
  Tensor m = mlp_.forward(ctx, ln_2_.forward(ctx, x1));
  Tensor& y = detail::reuse_buffer(y_, x.shape(), x.device());
  ops::add(ctx, x1, m, y);
  return y;
}

Tensor TransformerBlock::backward(ops::Context& ctx, const Tensor& dy) {
  // dx1 = dy + ln_2'(mlp'(dy));  dx = dx1 + ln_1'(attn'(dx1))
  Tensor dx1 = ln_2_.backward_add(ctx, mlp_.backward(ctx, dy), dy);
  Tensor dx = ln_1_.backward_add(ctx, attn_.backward(ctx, dx1), dx1);
  if (!input_grad_) return Tensor();
  return dx;
}

void TransformerBlock::reset_parameters(std::uint64_t seed, const std::string& prefix) {
  ln_1_.reset_parameters(seed, prefix + "ln_1.");
  attn_.reset_parameters(seed, prefix + "attn.");
  ln_2_.reset_parameters(seed, prefix + "ln_2.");
  mlp_.reset_parameters(seed, prefix + "mlp.");
}

void TransformerBlock::collect_parameters(const std::string& prefix, std::vector<Parameter*>& out) {
  ln_1_.collect_parameters(prefix + "ln_1.", out);
  attn_.collect_parameters(prefix + "attn.", out);
  ln_2_.collect_parameters(prefix + "ln_2.", out);
  mlp_.collect_parameters(prefix + "mlp.", out);
}

void TransformerBlock::set_input_grad(bool needed) {
  // ln_1's dx is also the sum node's output: it is computed either way (the op makes it in the
  // same pass as the LayerNorm's parameter gradients).
  Module::set_input_grad(needed);
}

double TransformerBlock::forward_flops(const Shape& input) const {
  return attn_.forward_flops(input) + mlp_.forward_flops(input);
}

TiedLmHead::TiedLmHead(Embedding& embedding) : wte_(embedding.token_weight()) {}

std::string TiedLmHead::describe() const {
  return str("lmhead(", wte_.value.dim(1), "->", wte_.value.dim(0), ", tied to ",
             wte_.name.empty() ? std::string("the token embedding") : wte_.name, ")");
}

Shape TiedLmHead::output_shape(const Shape& input) const {
  const std::int64_t c = wte_.value.dim(1);
  LOCKSTEP_CHECK(input.size() == 3 && input[2] == c, "lmhead expects input [N, T, ", c, "], got ",
                 shape_str(input));
  return {input[0] * input[1], wte_.value.dim(0)};
}

Tensor TiedLmHead::forward(ops::Context& ctx, const Tensor& x) {
  const Shape out = output_shape(x.shape());
  Tensor h = x.view({out[0], x.dim(2)});
  Tensor& y = detail::reuse_buffer(y_, out, x.device());
  ops::gemm(ctx, false, true, 1.0f, h, wte_.value, 0.0f, y);
  x_ = x;
  return y;
}

Tensor TiedLmHead::backward(ops::Context& ctx, const Tensor& dy) {
  Tensor x = detail::take_cached(x_, "lmhead");
  Tensor h = x.view({dy.dim(0), x.dim(2)});
  // The table's first gradient contribution; the embedding adds its own later in backward.
  ops::gemm(ctx, true, false, 1.0f, dy, h, 1.0f, wte_.grad);
  if (!input_grad_) return Tensor();
  Tensor& dx = detail::reuse_buffer(dx_, h.shape(), x.device());
  ops::gemm(ctx, false, false, 1.0f, dy, wte_.value, 0.0f, dx);
  return dx.view(x.shape());
}

double TiedLmHead::forward_flops(const Shape& input) const {
  return 2.0 * static_cast<double>(input[1]) * static_cast<double>(wte_.value.numel());
}

std::unique_ptr<Module> TransformerBlock::clone_structure(Device device) const {
  auto copy = std::make_unique<TransformerBlock>(dim_, heads_, attn_.depth(), device);
  copy->attention().set_kernel(attn_.kernel());
  return copy;
}

}  // namespace lockstep::nn
