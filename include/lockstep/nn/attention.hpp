// GPT-2's causal self-attention on [B, T, C]: qkv = c_attn(x) (one fused [C, 3C] projection),
// per head softmax(q k^T / sqrt(C / heads)) v over the causal prefix (ops::attention_forward:
// no [T, T] matrix is kept), y = c_proj(attention). c_proj is a residual projection: its
// initial weights are scaled by 1 / sqrt(2 depth) (GPT-2), depth being the number of blocks.
// Under train.precision = bf16, qkv, the attention's output and their gradients are bf16
// activations; the output is f32 unless set_bf16_output asks for bf16 (a GPT block).
#pragma once

#include "lockstep/nn/linear.hpp"
#include "lockstep/ops/ops.hpp"

namespace lockstep::nn {

class CausalSelfAttention final : public Module {
 public:
  CausalSelfAttention(std::int64_t dim, int heads, std::int64_t depth = 1,
                      Device device = Device::cpu());

  std::string type() const override { return "attn"; }
  std::string describe() const override;
  Shape output_shape(const Shape& input) const override;
  Tensor forward(ops::Context& ctx, const Tensor& x) override;
  Tensor backward(ops::Context& ctx, const Tensor& dy) override;
  // Weights N(0, 0.02), c_proj's N(0, 0.02 / sqrt(2 depth)), biases 0.
  void reset_parameters(std::uint64_t seed, const std::string& prefix) override;
  void collect_parameters(const std::string& prefix, std::vector<Parameter*>& out) override;
  void set_input_grad(bool needed) override;
  double forward_flops(const Shape& input) const override;
  void release_buffers() override;

  int heads() const { return heads_; }
  std::int64_t dim() const { return dim_; }
  // Which attention kernel the ops use (ops::AttentionKernel: train.attention sets it; tests and
  // benchmarks compare the others). Auto is resolved by the ops at every call, per shape.
  void set_kernel(ops::AttentionKernel kernel) { kernel_ = kernel; }
  ops::AttentionKernel kernel() const { return kernel_; }
  std::int64_t depth() const { return depth_; }
  // On a bf16 context, write the output as a bf16 activation (Linear::set_bf16_output).
  void set_bf16_output(bool on) { c_proj_.set_bf16_output(on); }

  std::unique_ptr<Module> clone_structure(Device device) const override;

 private:
  std::int64_t dim_;
  int heads_;
  std::int64_t depth_;
  ops::AttentionKernel kernel_ = ops::AttentionKernel::Auto;
  Linear c_attn_, c_proj_;
  Tensor qkv_;        // [B, T, 3C], cached for backward
  Tensor att_, lse_;  // attention output [B, T, C] and row log-sum-exp [B, heads, T]
  Tensor dqkv_;
};

}  // namespace lockstep::nn
