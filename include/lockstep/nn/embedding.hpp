// Token + learned position embedding (GPT-2's wte and wpe): y[b, t] = wte[x[b, t]] + wpe[t] for
// i32 tokens x [B, T], T <= ctx. The token table is also the LM head's weight (TiedLmHead borrows
// it), so its gradient sums both uses; this layer is the last that backward reaches, so the
// model's grad-ready hook reports the shared table once, after both uses.
//
// A padded vocabulary: the table has padded_vocab(vocab, pad_vocab) rows, the last of them
// padding (Parameter::padded_rows): zero, never read by a token (ids >= vocab are errors, as
// without padding), masked out of the LM head's loss, so their gradient is zero and they stay
// zero. They exist for the GPU: the head's GEMMs over a vocabulary of 50304 columns (GPT-2's 50257
// padded, llm.c's padded_vocab_size) read aligned rows and whole tiles.
#pragma once

#include "lockstep/nn/module.hpp"

namespace lockstep::nn {

// The default multiple the table's rows are padded to (spec argument pad_vocab; 1 = none): 128
// columns of f32 or bf16 logits are whole tiles of every cuBLAS and cuDNN GEMM kernel and 512 /
// 256-byte aligned rows, as llm.c pads GPT-2's 50257 to 50304. On the CPU it changes no bit of the
// loss or the gradients (docs/GPT.md, "A padded vocabulary").
inline constexpr std::int64_t kVocabPadding = 128;

// vocab rounded up to a multiple of pad_vocab; an error naming pad_vocab (and saying what fits)
// when that does not fit an i32 token id, or pad_vocab < 1.
std::int64_t padded_vocab(std::int64_t vocab, std::int64_t pad_vocab);

class Embedding final : public Module {
 public:
  Embedding(std::int64_t vocab, std::int64_t ctx, std::int64_t dim, Device device = Device::cpu(),
            std::int64_t pad_vocab = kVocabPadding);

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
  std::int64_t pad_vocab() const { return pad_vocab_; }
  std::int64_t context() const { return ctx_; }
  std::int64_t dim() const { return dim_; }
  Parameter& token_weight() { return wte_; }
  Parameter& position_weight() { return wpe_; }

  std::unique_ptr<Module> clone_structure(Device device) const override {
    return std::make_unique<Embedding>(vocab_, ctx_, dim_, device, pad_vocab_);
  }

 private:
  std::int64_t vocab_, ctx_, dim_, pad_vocab_;
  Parameter wte_, wpe_;
  Tensor tokens_;  // cached for backward
  Tensor y_;
};

}  // namespace lockstep::nn
