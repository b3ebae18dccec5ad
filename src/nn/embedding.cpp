#include "lockstep/nn/embedding.hpp"

#include "buffers.hpp"
#include "lockstep/nn/init.hpp"
#include "lockstep/ops/ops.hpp"

namespace lockstep::nn {

Embedding::Embedding(std::int64_t vocab, std::int64_t ctx, std::int64_t dim, Device device)
    : vocab_(vocab), ctx_(ctx), dim_(dim) {
  LOCKSTEP_CHECK(vocab_ > 0 && ctx_ > 0 && dim_ > 0,
                 "embed: vocab, ctx and dim must be positive, "
                 "got vocab=",
                 vocab_, " ctx=", ctx_, " dim=", dim_);
  wte_ = make_parameter({vocab_, dim_}, device);
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
  ops::embedding_forward(ctx, tokens, wte_.value, wpe_.value, y);
  tokens_ = tokens;
  return y;
}

Tensor Embedding::backward(ops::Context& ctx, const Tensor& dy) {
  Tensor tokens = detail::take_cached(tokens_, "embed");
  ops::embedding_backward(ctx, tokens, dy, wte_.grad, wpe_.grad);
  return Tensor();
}

void Embedding::reset_parameters(std::uint64_t seed, const std::string& prefix) {
  init_normal(wte_.value, 0.02f, seed, prefix + "wte");
  init_normal(wpe_.value, 0.01f, seed, prefix + "wpe");
}

void Embedding::collect_parameters(const std::string& prefix, std::vector<Parameter*>& out) {
  wte_.name = prefix + "wte";
  wpe_.name = prefix + "wpe";
  out.push_back(&wte_);
  out.push_back(&wpe_);
}

}  // namespace lockstep::nn
