// Token + learned position embedding (GPT-2's wte and wpe): y[b, t] = wte[x[b, t]] + wpe[t] for
// i32 tokens x [B, T], T <= ctx. The token table is also the LM head's weight (TiedLmHead borrows
// it), so its gradient sums both uses; this layer is the last that backward reaches, so the
// model's grad-ready hook reports the shared table once, after both uses.
#pragma once

#include "lockstep/nn/module.hpp"

namespace lockstep::nn {

class Embedding final : public Module {
 public:
  Embedding(std::int64_t vocab, std::int64_t ctx, std::int64_t dim, Device device = Device::cpu());

  std::string type() const override { return "embed"; }
  std::string describe() const override;
  // [N, T] -> [N, T, dim]; T > ctx is an error naming ctx.
  Shape output_shape(const Shape& input) const override;
  Tensor forward(ops::Context& ctx, const Tensor& tokens) override;
  // Accumulates the table gradients; tokens have no gradient, so this returns an undefined Tensor.
  Tensor backward(ops::Context& ctx, const Tensor& dy) override;
  // wte ~ N(0, 0.02), wpe ~ N(0, 0.01) (llm.c's GPT-2 initialisation).
  void reset_parameters(std::uint64_t seed, const std::string& prefix) override;
  void collect_parameters(const std::string& prefix, std::vector<Parameter*>& out) override;

  std::int64_t vocab() const { return vocab_; }
  std::int64_t context() const { return ctx_; }
  std::int64_t dim() const { return dim_; }
  Parameter& token_weight() { return wte_; }
  Parameter& position_weight() { return wpe_; }

  std::unique_ptr<Module> clone_structure(Device device) const override {
    return std::make_unique<Embedding>(vocab_, ctx_, dim_, device);
  }

 private:
  std::int64_t vocab_, ctx_, dim_;
  Parameter wte_, wpe_;
  Tensor tokens_;  // cached for backward
  Tensor y_;
};

}  // namespace lockstep::nn
