// Linear (fully connected) layer: y = x W^T + b for x of shape [N, in]. W is [out, in] as in
// PyTorch, so checkpoints and initial values line up with torch.nn.Linear. Inputs with more than
// two dimensions are an error (put `flatten` before it) rather than silently reshaped.
// Forward and backward are one fused op each (ops::linear_forward / linear_backward: the bias, and
// an activation the layer is given, inside the GEMM where the device can).
// Under train.precision = bf16 the layer takes an f32 or a bf16 input, and its input gradient has
// its input's dtype; its output is f32 unless set_bf16_output asks for a bf16 activation (inside a
// GPT block, where the next op takes one).
#pragma once

#include "lockstep/nn/module.hpp"
#include "lockstep/ops/ops.hpp"

namespace lockstep::nn {

class Linear final : public Module {
 public:
  Linear(std::int64_t in_features, std::int64_t out_features, bool bias = true,
         Device device = Device::cpu());

  std::string type() const override { return "linear"; }
  std::string describe() const override;
  Shape output_shape(const Shape& input) const override;
  Tensor forward(ops::Context& ctx, const Tensor& x) override;
  Tensor backward(ops::Context& ctx, const Tensor& dy) override;
  void reset_parameters(std::uint64_t seed, const std::string& prefix) override;
  void collect_parameters(const std::string& prefix, std::vector<Parameter*>& out) override;
  double forward_flops(const Shape& input) const override;
  void release_buffers() override;
  bool output_overwritable() const override { return true; }  // backward reads x and W only
  // Caches x for backward as forward does (its bf16 copy under the bf16 policy), without the
  // GEMM: an activation recompute gives back the input that drop_input let go.
  void cache_input(ops::Context& ctx, const Tensor& x);
  void drop_input();

  // An MLP's pair, c_fc with its activation and c_proj folding that activation's backward:
  // forward_act returns act(x W^T + b) and writes x W^T + b into pre_act, a [N, out] buffer the
  // caller keeps for the backward; backward_act is backward for a layer whose input x was
  // act(pre_act) (the output of the layer before's forward_act), and returns dL/d pre_act.
  Tensor forward_act(ops::Context& ctx, const Tensor& x, ops::Activation act, Tensor& pre_act);
  Tensor backward_act(ops::Context& ctx, const Tensor& dy, ops::Activation act,
                      const Tensor& pre_act);
  // forward_act's output again, bit for bit, from its pre_act and the input still cached for
  // backward (train.recompute = gelu); drop_output lets forward_act's output go until then.
  Tensor recompute_act(ops::Context& ctx, ops::Activation act, Tensor& pre_act);
  void drop_output() { y_ = Tensor(); }

  // On a bf16 context, write the output (and forward_act's pre_act) as a bf16 activation; f32
  // otherwise, and by default. output_dtype says which ctx gets.
  void set_bf16_output(bool on) { bf16_output_ = on; }
  bool bf16_output() const { return bf16_output_; }
  DType output_dtype(const ops::Context& ctx) const;

  std::int64_t in_features() const { return in_; }
  std::int64_t out_features() const { return out_; }
  Parameter& weight() { return weight_; }
  Parameter& bias() { return bias_; }  // undefined value when built without bias

  std::unique_ptr<Module> clone_structure(Device device) const override {
    auto copy = std::make_unique<Linear>(in_, out_, has_bias_, device);
    copy->set_bf16_output(bf16_output_);
    return copy;
  }

 private:
  std::int64_t in_, out_;
  bool has_bias_;
  bool bf16_output_ = false;
  Parameter weight_, bias_;
  Tensor x_;                    // input cached for backward (its bf16 copy under the bf16 policy)
  DType x_dtype_ = DType::F32;  // the input's own dtype: the input gradient's
  Tensor y_, dx_;               // reused output buffers
  Tensor x16_, dy16_;           // reused bf16 copies of x and dy (bf16 policy only)

  Tensor run_backward(ops::Context& ctx, const Tensor& dy, ops::Activation input_act,
                      const Tensor& input_pre_act);
};

}  // namespace lockstep::nn
