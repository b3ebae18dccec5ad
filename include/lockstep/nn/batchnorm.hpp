// Batch normalisation over [N, C] (BatchNorm1d) or [N, C, H, W] (BatchNorm2d), statistics per
// channel, as torch.nn.BatchNorm*d: gamma = 1, beta = 0 at start; running mean/var (Buffers, 0
// and 1 at start) updated with momentum 0.1 and the unbiased variance in training mode and used
// in evaluation mode. backward is correct in both modes (evaluation mode: a fixed affine map).
// Channels-last, BatchNorm2d is BatchNorm1d over the [N*H*W, C] rows: the same statistics, each
// pixel's channels contiguous.
#pragma once

#include "lockstep/nn/module.hpp"
#include "lockstep/ops/ops.hpp"

namespace lockstep::nn {

// PyTorch's defaults.
inline constexpr float kBatchNormEps = 1e-5f;
inline constexpr float kBatchNormMomentum = 0.1f;

class BatchNorm : public Module {
 public:
  // spatial_dims: 0 for BatchNorm1d ([N, C]), 2 for BatchNorm2d ([N, C, H, W]).
  BatchNorm(int spatial_dims, std::int64_t channels, float eps = kBatchNormEps,
            float momentum = kBatchNormMomentum, Device device = Device::cpu());

  std::string type() const override { return spatial_dims_ == 0 ? "bn1d" : "bn2d"; }
  std::string describe() const override;
  Shape output_shape(const Shape& input) const override;
  Tensor forward(ops::Context& ctx, const Tensor& x) override;
  Tensor backward(ops::Context& ctx, const Tensor& dy) override;
  void reset_parameters(std::uint64_t seed, const std::string& prefix) override;
  void collect_parameters(const std::string& prefix, std::vector<Parameter*>& out) override;
  void collect_buffers(const std::string& prefix, std::vector<Buffer*>& out) override;
  bool supports_channels_last() const override { return spatial_dims_ == 2; }

  // The ReLU after this layer (and, for a residual block's last BatchNorm, the shortcut's sum
  // before it) in this layer's op (ops::batchnorm_act_forward_*), so the normalised values are
  // never stored and read again; a bf16_output (only on a bf16 context, for a convolution that
  // would round its input anyway, or a block that reads it as it is) is written rounded. Same
  // values as bn -> [add ->] relu, except that with a bf16 output an f32 value too small to survive
  // the rounding (below bf16's normal range) counts as ReLU's zero in the backward. backward(dy)
  // then takes the ReLU's output gradient (with a residual, the ReLU's output is relu_output(),
  // which a block keeps for its shortcut's gradient before calling backward).
  Tensor forward_relu(ops::Context& ctx, const Tensor& x, bool bf16_output);
  Tensor forward_residual_relu(ops::Context& ctx, const Tensor& x, const Tensor& residual,
                               bool bf16_output = false);
  const Tensor& relu_output() const { return y_; }
  // backward of a plain forward whose output reached a ReLU (another layer's, output relu_y) only
  // through a sum: dy masked by relu_y > 0 (a downsampling shortcut's BatchNorm, whose block ends
  // in + and ReLU), in the BatchNorm's backward (ops::batchnorm_relu_backward) when training.
  Tensor backward_through_relu(ops::Context& ctx, const Tensor& dy, const Tensor& relu_y);
  // The input gradient goes to a convolution's backward, which rounds it to bf16 on a bf16
  // context: it is then written rounded (training mode), saving that pass.
  void set_input_grad_to_conv(bool on) { input_grad_to_conv_ = on; }

  Parameter& weight() { return gamma_; }
  Parameter& bias() { return beta_; }
  Buffer& running_mean() { return running_mean_; }
  Buffer& running_var() { return running_var_; }

  std::unique_ptr<Module> clone_structure(Device device) const override;

 private:
  Tensor forward_impl(ops::Context& ctx, const Tensor& x, const ops::BatchNormEpilogue& epilogue,
                      DType out);
  Tensor backward_impl(ops::Context& ctx, const Tensor& dy);
  Tensor relu_backward_train(ops::Context& ctx, const Tensor& dy, const Tensor& relu_y);
  DType input_grad_dtype(const ops::Context& ctx) const;
  Tensor backward_eval(ops::Context& ctx, const Tensor& x, const Tensor& dy, Tensor& dx);
  // What the ops see of t: t itself, or channels-last its [N*H*W, C] rows.
  Tensor as_ops_input(const Tensor& t) const;

  int spatial_dims_;
  std::int64_t channels_;
  float eps_, momentum_;
  Parameter gamma_, beta_;
  Buffer running_mean_, running_var_;
  bool forward_was_training_ = true;
  Tensor x_;
  Tensor y_;                 // the output, kept when the forward fused a ReLU
  bool fused_relu_ = false;  // the last forward's
  bool input_grad_to_conv_ = false;
  Tensor save_mean_, save_invstd_;
  Tensor zeros_, ones_, scratch_;  // evaluation-mode backward only
};

class BatchNorm1d final : public BatchNorm {
 public:
  explicit BatchNorm1d(std::int64_t features, float eps = kBatchNormEps,
                       float momentum = kBatchNormMomentum, Device device = Device::cpu())
      : BatchNorm(0, features, eps, momentum, device) {}
};

class BatchNorm2d final : public BatchNorm {
 public:
  explicit BatchNorm2d(std::int64_t channels, float eps = kBatchNormEps,
                       float momentum = kBatchNormMomentum, Device device = Device::cpu())
      : BatchNorm(2, channels, eps, momentum, device) {}
};

}  // namespace lockstep::nn
