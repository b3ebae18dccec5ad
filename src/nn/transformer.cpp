#include "lockstep/nn/transformer.hpp"

#include <algorithm>
#include <utility>

#include "buffers.hpp"
#include "lockstep/nn/loss.hpp"
#include "lockstep/ops/ops.hpp"

namespace lockstep::nn {

TransformerBlock::TransformerBlock(std::int64_t dim, int heads, std::int64_t depth, Device device)
    : dim_(dim),
      heads_(heads),
      ln_1_(dim, kLayerNormEps, device),
      attn_(dim, heads, depth, device),
      ln_2_(dim, kLayerNormEps, device),
      mlp_(dim, depth, device) {
  // Under bf16, everything between the residual stream's reads and writes is a bf16 activation
  // (Note [bf16 residual stream] in transformer.hpp: the stream itself stays f32).
  ln_1_.set_bf16_output(true);
  attn_.set_bf16_output(true);
  ln_2_.set_bf16_output(true);
  mlp_.set_bf16_output(true);
}

std::string TransformerBlock::describe() const {
  return str("block(dim=", dim_, ", heads=", heads_, ")");
}

Shape TransformerBlock::output_shape(const Shape& input) const {
  LOCKSTEP_CHECK(input.size() == 3 && input[2] == dim_, "block expects input [N, T, ", dim_,
                 "], got ", shape_str(input));
  return input;
}

// The residual sum x1 = x + a and ln_2 are one op (ops::residual_layernorm_forward): x1 is written
// and normalised in one pass. The block's output sum is not fused with the next block's ln_1 (as
// llm.c does across layers): that would make each block compute part of its successor, coupling
// modules that the spec, recompute and DataParallel's clones treat one by one, for one pass over
// [B, T, C] per block (0.3 GB of the 60 GB a gpt2-124m step moves, docs/GPT.md).
Tensor TransformerBlock::forward_branches(ops::Context& ctx, const Tensor& x) {
  Tensor a = attn_.forward(ctx, ln_1_.forward(ctx, x));
  Tensor& x1 = detail::reuse_buffer(x1_, x.shape(), x.device());
  Tensor h = ln_2_.forward_add(ctx, x, a, x1);
  a = Tensor();
  return mlp_.forward(ctx, h);
}

void TransformerBlock::release_activations() {
  ln_1_.release_buffers();
  attn_.release_buffers();
  ln_2_.release_buffers();
  mlp_.release_buffers();
  x1_ = Tensor();
}

Tensor TransformerBlock::forward(ops::Context& ctx, const Tensor& x) {
  Tensor m = forward_branches(ctx, x);
  Tensor& y = detail::reuse_buffer(y_, x.shape(), x.device());
  ops::add(ctx, x1_, m, y);
  if (recompute_ == Recompute::Block) {
    // Kept: the input (the previous block's output, held anyway) and the output.
    m = Tensor();
    release_activations();
    x_ = x;
  }
  return y;
}

Tensor TransformerBlock::backward(ops::Context& ctx, const Tensor& dy) {
  if (recompute_ == Recompute::Block) forward_branches(ctx, detail::take_cached(x_, "block"));
  // dx1 = dy + ln_2'(mlp'(dy));  dx = dx1 + ln_1'(attn'(dx1))
  Tensor dx1 = ln_2_.backward_add(ctx, mlp_.backward(ctx, dy), dy);
  Tensor dx = ln_1_.backward_add(ctx, attn_.backward(ctx, dx1), dx1);
  if (recompute_ == Recompute::Block) {
    dx1 = Tensor();
    release_activations();  // dx lives on in the handle returned
  }
  if (!input_grad_) return Tensor();
  return dx;
}

void TransformerBlock::release_buffers() {
  release_activations();
  y_ = x_ = Tensor();
}

void TransformerBlock::set_recompute(Recompute mode) {
  recompute_ = mode;
  mlp_.set_recompute_gelu(mode == Recompute::Gelu);
  x_ = Tensor();
}

Recompute recompute_from_name(const std::string& name) {
  if (name == "none") return Recompute::None;
  if (name == "gelu") return Recompute::Gelu;
  if (name == "block") return Recompute::Block;
  LOCKSTEP_FAIL("recompute must be none, gelu or block, got '", name, "'");
}

std::int64_t set_recompute(Model& model, Recompute mode) {
  std::int64_t blocks = 0;
  for_each_module(model, [&](Module& m) {
    if (auto* block = dynamic_cast<TransformerBlock*>(&m)) {
      block->set_recompute(mode);
      ++blocks;
    }
  });
  return blocks;
}

std::vector<CausalSelfAttention*> attention_layers(Model& model) {
  std::vector<CausalSelfAttention*> layers;
  for_each_module(model, [&](Module& m) {
    if (auto* block = dynamic_cast<TransformerBlock*>(&m))
      layers.push_back(&block->attention());  // a member of the block, not a child module
    else if (auto* attention = dynamic_cast<CausalSelfAttention*>(&m))
      layers.push_back(attention);
  });
  return layers;
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

TiedLmHead::TiedLmHead(Embedding& embedding)
    : wte_(embedding.token_weight()), vocab_(embedding.vocab()) {}

std::string TiedLmHead::describe() const {
  return str("lmhead(", wte_.value.dim(1), "->", vocab_, ", tied to ",
             wte_.name.empty() ? std::string("the token embedding") : wte_.name, ")");
}

Shape TiedLmHead::output_shape(const Shape& input) const {
  const std::int64_t c = wte_.value.dim(1);
  LOCKSTEP_CHECK(input.size() == 3 && input[2] == c, "lmhead expects input [N, T, ", c, "], got ",
                 shape_str(input));
  return {input[0] * input[1], vocab_};
}

Tensor TiedLmHead::forward(ops::Context& ctx, const Tensor& x) {
  const Shape out = output_shape(x.shape());
  Tensor h = x.view({out[0], x.dim(2)});
  Tensor& y = detail::reuse_buffer(y_, out, x.device());
  ops::gemm(ctx, false, true, 1.0f, h, unpadded(wte_, wte_.value), 0.0f, y);
  x_ = x;
  return y;
}

Tensor TiedLmHead::backward(ops::Context& ctx, const Tensor& dy) {
  Tensor x = detail::take_cached(x_, "lmhead");
  Tensor h = x.view({dy.dim(0), x.dim(2)});
  // The table's first gradient contribution; the embedding adds its own later in backward.
  Tensor dwte = unpadded(wte_, wte_.grad);
  ops::gemm(ctx, true, false, 1.0f, dy, h, 1.0f, dwte);
  if (!input_grad_) return Tensor();
  Tensor& dx = detail::reuse_buffer(dx_, h.shape(), x.device());
  ops::gemm(ctx, false, false, 1.0f, dy, unpadded(wte_, wte_.value), 0.0f, dx);
  return dx.view(x.shape());
}

// Under the bf16 policy two GEMMs read each chunk of h (logits, the table's gradient) and two each
// chunk of dlogits (the table's gradient, dh): as Linear does, each is rounded to bf16 once into a
// buffer of its own, which the GEMMs use as it is (the bits of rounding per GEMM).
Tensor TiedLmHead::forward_loss(ops::Context& ctx, const Tensor& x, const Tensor& labels,
                                const FusedLoss& loss) {
  const std::int64_t rows = output_shape(x.shape())[0], c = x.dim(2);
  const std::int64_t padded = wte_.value.dim(0);
  const std::int64_t want =
      loss.chunk_rows == kLossChunkAuto ? loss_chunk_rows(padded) : loss.chunk_rows;
  const std::int64_t chunk = want > 0 ? std::min(want, rows) : rows;
  const bool bf16 = ctx.precision() == ops::Precision::BF16;
  Tensor h = x.view({rows, c});
  if (bf16 && h.dtype() == DType::F32) {
    Tensor& h16 = detail::reuse_buffer(h16_, h.shape(), x.device(), DType::BF16);
    ops::cast(ctx, h, h16);
    h = h16;
  }
  Tensor& logits = detail::reuse_buffer(chunk_, {chunk, padded}, x.device());
  Tensor d16 =
      bf16 ? detail::reuse_buffer(d16_, {chunk, padded}, x.device(), DType::BF16) : Tensor();
  Tensor& row_loss = detail::reuse_buffer(row_loss_, {rows}, x.device(), DType::F64);
  Tensor& dx = detail::reuse_buffer(dx_, {rows, c}, x.device());
  for (std::int64_t first = 0; first < rows; first += chunk) {
    const std::int64_t n = std::min(chunk, rows - first);
    const Tensor hr = h.sub(first * c, {n, c});
    Tensor lr = n == chunk ? logits : logits.sub(0, {n, padded});
    ops::gemm(ctx, false, true, 1.0f, hr, wte_.value, 0.0f, lr);
    ops::softmax_xent_chunk(ctx, lr, labels, first, vocab_, loss.grad_scale, row_loss,
                            loss.label_smoothing);
    Tensor dr = lr;  // dlogits of the chunk, as the two GEMMs below read them
    if (bf16) {
      dr = n == chunk ? d16 : d16.sub(0, {n, padded});
      ops::cast(ctx, lr, dr);
    }
    // As backward: the table's gradient first, then dh over the vocabulary's columns.
    ops::gemm(ctx, true, false, 1.0f, dr, hr, 1.0f, wte_.grad);
    if (input_grad_) {
      Tensor dxr = dx.sub(first * c, {n, c});
      ops::gemm_leading(ctx, vocab_, 1.0f, dr, wte_.value, 0.0f, dxr);
    }
  }
  Tensor& mean = detail::reuse_buffer(loss_, {1}, x.device());
  ops::mean_row_loss(ctx, row_loss, mean);
  loss_input_ = x.shape();
  return mean;
}

Tensor TiedLmHead::backward_loss(ops::Context& ctx) {
  (void)ctx;
  LOCKSTEP_CHECK_HINT(!loss_input_.empty(), "call forward_loss before each backward_loss",
                      "lmhead: backward_loss without forward_loss");
  const Shape shape = std::exchange(loss_input_, Shape{});
  if (!input_grad_) return Tensor();
  return dx_.view(shape);
}

void TiedLmHead::release_buffers() {
  x_ = y_ = dx_ = chunk_ = row_loss_ = loss_ = h16_ = d16_ = Tensor();
  loss_input_.clear();
}

double TiedLmHead::forward_flops(const Shape& input) const {
  return 2.0 * static_cast<double>(input[1]) * static_cast<double>(vocab_) *
         static_cast<double>(wte_.value.dim(1));
}

std::unique_ptr<Module> TransformerBlock::clone_structure(Device device) const {
  auto copy = std::make_unique<TransformerBlock>(dim_, heads_, attn_.depth(), device);
  copy->attention().set_kernel(attn_.kernel());
  copy->set_recompute(recompute_);
  return copy;
}

}  // namespace lockstep::nn
