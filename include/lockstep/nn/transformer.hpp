// The GPT-2 transformer pieces above the single layers: the pre-LN block
//   x1 = x + attn(ln_1(x)),  y = x1 + mlp(ln_2(x1))
// and the language-model head tied to the token embedding, logits = ln_f(h) wte^T, which turns
// [N, T, C] into one row of vocabulary logits per position, [N * T, V].
//
// Note [bf16 residual stream]. Under train.precision = bf16 everything a block computes between
// its reads and writes of the residual stream is a bf16 activation (ln_1's and ln_2's outputs,
// qkv, the attention's output, the MLP's hidden activations, the branches' outputs, and their
// gradients), while the stream itself (x, x1, y) and its gradient stay f32, as under PyTorch's
// autocast; llm.c keeps the stream in bf16 too. Measured on a 12-block GPT (width 64, 4 x 128
// tokens, 3 seeds, at initialisation and after 100 AdamW steps): the gradients' norm-wise error
// against fp32 is 0.37-0.46% with an f32 stream (0.34-0.42% with f32 activations everywhere),
// 0.62-0.80% with a bf16 stream, whose worst parameter reached 5% (1.1% with the f32 stream).
// The f32 stream costs 0.8 ms of a predicted 21.5 ms gpt2-124m step (bench/gpt_step_model.py
// --residual=bf16): docs/GPT.md, "bf16 activations".
#pragma once

#include "lockstep/nn/attention.hpp"
#include "lockstep/nn/embedding.hpp"
#include "lockstep/nn/layernorm.hpp"
#include "lockstep/nn/mlp.hpp"
#include "lockstep/nn/model.hpp"

namespace lockstep::nn {

// Activation recompute (train.recompute): what a block keeps between forward and backward.
//   none   everything backward reads (the default);
//   gelu   all but the MLP's GELU output, which backward computes again from its input;
//   block  only the block's input: backward runs the block's forward again first, and the
//          block's activations and buffers are let go after its backward, so one block's are
//          held at a time.
// The recomputed values are those forward made (the same kernels on the same inputs), so the
// gradients are bitwise those of none.
enum class Recompute { None, Gelu, Block };
Recompute recompute_from_name(const std::string& name);  // throws naming the choices

class TransformerBlock final : public Module {
 public:
  // depth: the number of blocks in the model (scales the residual projections' initialisation).
  TransformerBlock(std::int64_t dim, int heads, std::int64_t depth = 1,
                   Device device = Device::cpu());

  std::string type() const override { return "block"; }
  std::string describe() const override;
  Shape output_shape(const Shape& input) const override;
  // x1 = x + attn(..) is written by ln_2 in the pass that normalises it (LayerNorm::forward_add).
  Tensor forward(ops::Context& ctx, const Tensor& x) override;
  // The residual sums pass their gradient to both branches; each LayerNorm backward adds the
  // skip path's gradient in the same pass (ops::layernorm_backward's dresidual).
  Tensor backward(ops::Context& ctx, const Tensor& dy) override;
  void reset_parameters(std::uint64_t seed, const std::string& prefix) override;
  void collect_parameters(const std::string& prefix, std::vector<Parameter*>& out) override;
  void set_input_grad(bool needed) override;
  double forward_flops(const Shape& input) const override;
  void release_buffers() override;

  CausalSelfAttention& attention() { return attn_; }
  void set_recompute(Recompute mode);
  Recompute recompute() const { return recompute_; }

  std::unique_ptr<Module> clone_structure(Device device) const override;

 private:
  std::int64_t dim_;
  int heads_;
  LayerNorm ln_1_;
  CausalSelfAttention attn_;
  LayerNorm ln_2_;
  Mlp mlp_;
  Recompute recompute_ = Recompute::None;
  Tensor x1_, y_;  // residual stream after attention, and the output (reused buffers)
  Tensor x_;       // the input, cached for backward under Recompute::Block only

  // x1 = x + attn(ln_1(x)) and mlp(ln_2(x1)): everything but the output sum.
  Tensor forward_branches(ops::Context& ctx, const Tensor& x);
  void release_activations();
};

// Sets the recompute mode of every TransformerBlock in the model (nested ones too); returns how
// many blocks there are.
std::int64_t set_recompute(Model& model, Recompute mode);

// Every causal self-attention layer of the model (nested ones too), in model order: where
// train.attention sets the kernel (CausalSelfAttention::set_kernel) and reads the shape.
std::vector<CausalSelfAttention*> attention_layers(Model& model);

// Logits [N * T, V] = h [N * T, C] wte^T with the embedding's own token table: no parameter of
// its own (collect_parameters adds nothing), so the table is listed, bucketed and reported ready
// once, by the embedding. Its backward adds dlogits^T h into the table's gradient before the
// embedding (earlier in the model, later in backward) adds its scatter. forward and backward use
// the vocabulary's V rows of a padded table only: logits are [N * T, V] whatever the padding.
//
// The fused training step (forward_loss; nn::SoftmaxCrossEntropy's Logits::Fused), after
// Liger-Kernel's FusedLinearCrossEntropy: the rows of h are taken loss.chunk_rows at a time (by
// default nn::loss_chunk_rows(Vp): 512 for GPT-2), and
// for each chunk r, in one [rows, Vp] buffer (Vp: the padded table's rows)
//   logits_r  = h_r wte^T                                      gemm
//   dlogits_r = (softmax_V(logits_r) - target) * grad_scale    softmax_xent_chunk, in place;
//                                                              the padded columns get 0
//   dh_r      = dlogits_r[:, :V] wte[:V]                       gemm_leading
//   dwte     += dlogits_r^T h_r                                gemm, accumulating
// and the loss is the mean of the rows' losses (mean_row_loss). No [N * T, V] tensor exists; the
// gradients are complete when forward_loss returns, so they need the scale then (the engines know
// it before forward). Against the unfused path: the loss, dh and every row of dwte but the sum over
// chunks are the same operations on the same rows; dwte's K-sum cut into chunks is bitwise the
// one GEMM's only where the cuts are the GEMM library's own K blocks (docs/GPT.md, "The chunked
// classifier and loss"), and at chunk_rows = 0 (one chunk) always.
class TiedLmHead final : public Module {
 public:
  explicit TiedLmHead(Embedding& embedding);

  std::string type() const override { return "lmhead"; }
  std::string describe() const override;
  Shape output_shape(const Shape& input) const override;
  Tensor forward(ops::Context& ctx, const Tensor& x) override;
  Tensor backward(ops::Context& ctx, const Tensor& dy) override;
  double forward_flops(const Shape& input) const override;
  bool output_overwritable() const override { return true; }  // backward reads x and wte only
  bool fuses_loss() const override { return true; }
  Tensor forward_loss(ops::Context& ctx, const Tensor& x, const Tensor& labels,
                      const FusedLoss& loss) override;
  Tensor backward_loss(ops::Context& ctx) override;
  void release_buffers() override;

  // The table it reads; a Sequential holding both clones the pair (alone, a head cannot be cloned:
  // the default clone_structure throws).
  const Parameter& token_weight() const { return wte_; }

 private:
  Parameter& wte_;      // the embedding's; survives moves of the Model (layers are heap-allocated)
  std::int64_t vocab_;  // logits per row: the table's rows less its padding
  Tensor x_;            // [N * T, C], cached for backward
  Tensor y_, dx_;
  Tensor chunk_, row_loss_, loss_;  // forward_loss: [chunk, Vp] logits, f64 [N * T], [1]
  Tensor h16_, d16_;                // forward_loss under bf16: h and a chunk's dlogits, rounded
  Shape loss_input_;                // forward_loss's x shape, for dx; empty when none pending
};

}  // namespace lockstep::nn
