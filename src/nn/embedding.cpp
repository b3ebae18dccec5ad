#include "lockstep/nn/embedding.hpp"

#include <cstdint>
#include <limits>

#include "buffers.hpp"
#include "lockstep/nn/init.hpp"
#include "lockstep/ops/ops.hpp"

namespace lockstep::nn {

std::int64_t padded_vocab(std::int64_t vocab, std::int64_t pad_vocab) {
  LOCKSTEP_CHECK_HINT(pad_vocab >= 1, "pad_vocab=1 turns the padding off",
                      "pad_vocab must be a positive multiple, got ", pad_vocab);
  // Row ids are i32 tokens; the kernels index rows with 32-bit counts too.
  constexpr std::int64_t kMaxRows = std::numeric_limits<std::int32_t>::max();
  LOCKSTEP_CHECK_HINT(vocab <= kMaxRows, "tokens are i32: a vocabulary has at most 2147483647 ids",
                      "vocab = ", vocab, " is more than i32 token ids address (", kMaxRows, ")");
  const std::int64_t rows = (vocab + pad_vocab - 1) / pad_vocab * pad_vocab;
  LOCKSTEP_CHECK_HINT(rows <= kMaxRows, "give pad_vocab=1 (no padding) or a smaller pad_vocab",
                      "vocab = ", vocab, " padded to a multiple of pad_vocab = ", pad_vocab,
                      " needs ", rows, " rows, more than i32 token ids address (", kMaxRows, ")");
  return rows;
}

Embedding::Embedding(std::int64_t vocab, std::int64_t ctx, std::int64_t dim, Device device,
                     std::int64_t pad_vocab)
    : vocab_(vocab), ctx_(ctx), dim_(dim), pad_vocab_(pad_vocab) {
  LOCKSTEP_CHECK(vocab_ > 0 && ctx_ > 0 && dim_ > 0,
                 "embed: vocab, ctx and dim must be positive, "
                 "got vocab=",
                 vocab_, " ctx=", ctx_, " dim=", dim_);
  const std::int64_t rows = padded_vocab(vocab_, pad_vocab_);  // before anything is allocated
  wte_ = make_parameter({rows, dim_}, device);
  wte_.padded_rows = rows - vocab_;
  wpe_ = make_parameter({ctx_, dim_}, device);
}

std::string Embedding::describe() const {
  return str("embed(vocab=", vocab_, ", ctx=", ctx_, ", dim=", dim_, ")");
}

Shape Embedding::output_shape(const Shape& input) const {
  LOCKSTEP_CHECK_HINT(input.size() == 2, "give token sequences: sample shape {T}",
                      "embed expects tokens [N, T], got ", shape_str(input));
  LOCKSTEP_CHECK_HINT(input[1] <= ctx_,
                      "raise the model's ctx or train on sequences of at most ctx tokens",
                      "embed: sequences of ", input[1],
                      " tokens are longer than the model's "
                      "context ctx = ",
                      ctx_);
  return {input[0], input[1], dim_};
}

Tensor Embedding::forward(ops::Context& ctx, const Tensor& tokens) {
  Tensor& y = detail::reuse_buffer(y_, output_shape(tokens.shape()), tokens.device());
  // The vocabulary's rows only: a token id in the padding is as wrong as any other >= vocab.
  ops::embedding_forward(ctx, tokens, unpadded(wte_, wte_.value), wpe_.value, y);
  tokens_ = tokens;
  return y;
}

Tensor Embedding::backward(ops::Context& ctx, const Tensor& dy) {
  Tensor tokens = detail::take_cached(tokens_, "embed");
  Tensor dwte = unpadded(wte_, wte_.grad);
  ops::embedding_backward(ctx, tokens, dy, dwte, wpe_.grad);
  return Tensor();
}

void Embedding::reset_parameters(std::uint64_t seed, const std::string& prefix) {
  // The vocabulary's rows draw what an unpadded table's would; the padding is zero.
  Tensor rows = unpadded(wte_, wte_.value);
  init_normal(rows, 0.02f, seed, prefix + "wte");
  if (wte_.padded_rows > 0) {
    Tensor padding = wte_.value.sub(rows.numel(), {wte_.padded_rows, dim_});
    init_constant(padding, 0.0f);
  }
  init_normal(wpe_.value, 0.01f, seed, prefix + "wpe");
}

void Embedding::collect_parameters(const std::string& prefix, std::vector<Parameter*>& out) {
  wte_.name = prefix + "wte";
  wpe_.name = prefix + "wpe";
  out.push_back(&wte_);
  out.push_back(&wpe_);
}

}  // namespace lockstep::nn
