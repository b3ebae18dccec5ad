#include "lockstep/nn/batchnorm.hpp"

#include "buffers.hpp"
#include "lockstep/nn/init.hpp"
#include "lockstep/ops/ops.hpp"

namespace lockstep::nn {

BatchNorm::BatchNorm(int spatial_dims, std::int64_t channels, float eps, float momentum,
                     Device device)
    : spatial_dims_(spatial_dims), channels_(channels), eps_(eps), momentum_(momentum) {
  LOCKSTEP_CHECK(spatial_dims == 0 || spatial_dims == 2, "batchnorm: spatial_dims must be 0 or 2");
  LOCKSTEP_CHECK(channels > 0 && eps > 0.0f && momentum >= 0.0f && momentum <= 1.0f,
                 "batchnorm: bad arguments channels=", channels, " eps=", eps,
                 " momentum=", momentum);
  gamma_ = make_parameter({channels}, device);
  beta_ = make_parameter({channels}, device);
  running_mean_ = Buffer{"", Tensor::empty({channels}, DType::F32, device)};
  running_var_ = Buffer{"", Tensor::empty({channels}, DType::F32, device)};
  save_mean_ = Tensor::empty({channels}, DType::F32, device);
  save_invstd_ = Tensor::empty({channels}, DType::F32, device);
  reset_parameters(0, "");
}

std::string BatchNorm::describe() const {
  return str(type(), "(", channels_, ")");
}

Shape BatchNorm::output_shape(const Shape& input) const {
  std::size_t rank = static_cast<std::size_t>(2 + spatial_dims_);
  LOCKSTEP_CHECK(input.size() == rank && input[1] == channels_, type(), " expects input [N, ",
                 channels_, spatial_dims_ ? ", H, W" : "", "], got ", shape_str(input));
  return input;
}

void BatchNorm::reset_parameters(std::uint64_t seed, const std::string& prefix) {
  (void)seed;
  (void)prefix;
  init_constant(gamma_.value, 1.0f);
  init_constant(beta_.value, 0.0f);
  init_constant(running_mean_.value, 0.0f);
  init_constant(running_var_.value, 1.0f);
}

Tensor BatchNorm::as_ops_input(const Tensor& t) const {
  if (!channels_last_ || t.ndim() != 4) return t;
  return t.view({t.numel() / channels_, channels_});
}

Tensor BatchNorm::forward(ops::Context& ctx, const Tensor& x) {
  return forward_impl(ctx, x, {}, DType::F32);
}

Tensor BatchNorm::forward_relu(ops::Context& ctx, const Tensor& x, bool bf16_output) {
  const bool bf16 = bf16_output && ctx.precision() == ops::Precision::BF16;
  return forward_impl(ctx, x, {Tensor(), true}, bf16 ? DType::BF16 : DType::F32);
}

Tensor BatchNorm::forward_residual_relu(ops::Context& ctx, const Tensor& x, const Tensor& residual,
                                        bool bf16_output) {
  const bool bf16 = bf16_output && ctx.precision() == ops::Precision::BF16;
  return forward_impl(ctx, x, {as_ops_input(residual), true}, bf16 ? DType::BF16 : DType::F32);
}

Tensor BatchNorm::forward_impl(ops::Context& ctx, const Tensor& x,
                               const ops::BatchNormEpilogue& epilogue, DType out) {
  Tensor y = ctx.transient(output_shape(x.shape()), out);
  Tensor xo = as_ops_input(x), yo = as_ops_input(y);
  const bool fused = epilogue.relu || epilogue.residual.defined() || out != DType::F32;
  if (training_ && !fused) {
    ops::batchnorm_forward_train(ctx, xo, gamma_.value, beta_.value, yo, save_mean_, save_invstd_,
                                 running_mean_.value, running_var_.value, momentum_, eps_);
  } else if (training_) {
    ops::batchnorm_act_forward_train(ctx, xo, gamma_.value, beta_.value, epilogue, yo, save_mean_,
                                     save_invstd_, running_mean_.value, running_var_.value,
                                     momentum_, eps_);
  } else if (!fused) {
    ops::batchnorm_forward_eval(ctx, xo, gamma_.value, beta_.value, running_mean_.value,
                                running_var_.value, eps_, yo);
  } else {
    ops::batchnorm_act_forward_eval(ctx, xo, gamma_.value, beta_.value, running_mean_.value,
                                    running_var_.value, eps_, epilogue, yo);
  }
  forward_was_training_ = training_;
  fused_relu_ = epilogue.relu;
  x_ = x;
  y_ = epilogue.relu ? y : Tensor();
  return y;
}

Tensor BatchNorm::backward(ops::Context& ctx, const Tensor& dy) {
  if (!fused_relu_ || !forward_was_training_) return backward_impl(ctx, dy);
  // Through the fused ReLU in one op (training mode: the saved statistics).
  return relu_backward_train(ctx, dy, detail::take_cached(y_, type().c_str()));
}

// Training mode's backward with dy masked by relu_y > 0, in one op.
Tensor BatchNorm::relu_backward_train(ops::Context& ctx, const Tensor& dy, const Tensor& relu_y) {
  Tensor x = detail::take_cached(x_, type().c_str());
  Tensor dx = ctx.transient(x.shape(), input_grad_dtype(ctx));
  Tensor dxo = as_ops_input(dx);
  ops::batchnorm_relu_backward(ctx, as_ops_input(x), as_ops_input(relu_y), as_ops_input(dy),
                               gamma_.value, save_mean_, save_invstd_, dxo, gamma_.grad,
                               beta_.grad);
  if (!input_grad_) return Tensor();
  return dx;
}

Tensor BatchNorm::backward_through_relu(ops::Context& ctx, const Tensor& dy, const Tensor& relu_y) {
  LOCKSTEP_CHECK(!fused_relu_, type(), ": backward_through_relu follows a plain forward");
  if (!forward_was_training_) {
    Tensor dz = ctx.transient(dy.shape());
    ops::relu_backward(ctx, relu_y, dy, dz);
    return backward_impl(ctx, dz);
  }
  return relu_backward_train(ctx, dy, relu_y);
}

DType BatchNorm::input_grad_dtype(const ops::Context& ctx) const {
  return input_grad_to_conv_ && ctx.precision() == ops::Precision::BF16 ? DType::BF16 : DType::F32;
}

// The BatchNorm's own backward, dy being the gradient of its normalised output (a fused ReLU's,
// outside evaluation mode's fixed map, undone first).
Tensor BatchNorm::backward_impl(ops::Context& ctx, const Tensor& dy_in) {
  Tensor dy = dy_in;
  if (fused_relu_ && y_.defined()) {  // evaluation mode through a fused ReLU
    Tensor y = detail::take_cached(y_, type().c_str());
    if (y.dtype() != DType::F32) {
      Tensor wide = ctx.transient(y.shape());
      ops::cast(ctx, y, wide);
      y = wide;
    }
    dy = ctx.transient(y.shape());
    ops::relu_backward(ctx, y, dy_in, dy);
  }
  Tensor x = detail::take_cached(x_, type().c_str());
  if (!forward_was_training_) {
    Tensor dx = ctx.transient(x.shape());
    return backward_eval(ctx, as_ops_input(x), as_ops_input(dy), dx);
  }
  Tensor dx = ctx.transient(x.shape(), input_grad_dtype(ctx));
  Tensor dxo = as_ops_input(dx);
  ops::batchnorm_backward(ctx, as_ops_input(x), as_ops_input(dy), gamma_.value, save_mean_,
                          save_invstd_, dxo, gamma_.grad, beta_.grad);
  if (!input_grad_) return Tensor();
  return dx;
}

// In evaluation mode y = gamma * (x - running_mean) * invstd + beta is a fixed per-channel affine
// map, so dx = dy * gamma * invstd, dgamma = sum dy * xhat and dbeta = sum dy. The ops interface
// has no per-channel scale, so this is written with the batchnorm ops themselves (it runs only
// for frozen-statistics fine-tuning and tests, not in the training step):
//   invstd = bn_eval(ones[1, C]; gamma 1, beta 0, mean 0, var running_var)
//   dgamma, dbeta via batchnorm_backward with (running_mean, invstd) as the saved statistics
//   dx = bn_eval(dy; gamma, beta 0, mean 0, var running_var)
// x and dy are what the ops see (as_ops_input); dx is the layer's output buffer.
Tensor BatchNorm::backward_eval(ops::Context& ctx, const Tensor& x, const Tensor& dy, Tensor& dx) {
  Device device = x.device();
  Shape row{1, channels_};
  if (!zeros_.defined()) {
    zeros_ = Tensor::empty({channels_}, DType::F32, device);
    ones_ = Tensor::empty(row, DType::F32, device);
    ops::fill(ctx, zeros_, 0.0f);
    ops::fill(ctx, ones_, 1.0f);
  }
  Tensor invstd_row = Tensor::empty(row, DType::F32, device);
  ops::batchnorm_forward_eval(ctx, ones_, ones_.view({channels_}), zeros_, zeros_,
                              running_var_.value, eps_, invstd_row);
  Tensor invstd = invstd_row.view({channels_});
  Tensor& scratch = detail::reuse_buffer(scratch_, x.shape(), device);
  ops::batchnorm_backward(ctx, x, dy, gamma_.value, running_mean_.value, invstd, scratch,
                          gamma_.grad, beta_.grad);
  if (!input_grad_) return Tensor();
  Tensor dxo = as_ops_input(dx);
  ops::batchnorm_forward_eval(ctx, dy, gamma_.value, zeros_, zeros_, running_var_.value, eps_, dxo);
  return dx;
}

void BatchNorm::collect_parameters(const std::string& prefix, std::vector<Parameter*>& out) {
  gamma_.name = prefix + "weight";
  beta_.name = prefix + "bias";
  out.push_back(&gamma_);
  out.push_back(&beta_);
}

void BatchNorm::collect_buffers(const std::string& prefix, std::vector<Buffer*>& out) {
  running_mean_.name = prefix + "running_mean";
  running_var_.name = prefix + "running_var";
  out.push_back(&running_mean_);
  out.push_back(&running_var_);
}

std::unique_ptr<Module> BatchNorm::clone_structure(Device device) const {
  if (spatial_dims_ == 0) return std::make_unique<BatchNorm1d>(channels_, eps_, momentum_, device);
  return std::make_unique<BatchNorm2d>(channels_, eps_, momentum_, device);
}

}  // namespace lockstep::nn
