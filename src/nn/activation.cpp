#include "lockstep/nn/activation.hpp"

#include "buffers.hpp"
#include "lockstep/ops/ops.hpp"

namespace lockstep::nn {

Tensor ReLU::forward(ops::Context& ctx, const Tensor& x) {
  y_ = ctx.transient(x.shape());
  ops::relu_forward(ctx, x, y_);
  return y_;
}

Tensor ReLU::backward(ops::Context& ctx, const Tensor& dy) {
  // The output kept from forward (relu'(x) is read off y > 0), handed back to the context's
  // transients once read.
  Tensor y = detail::take_cached(y_, "relu");
  if (!input_grad_) return Tensor();
  Tensor dx = ctx.transient(y.shape());
  ops::relu_backward(ctx, y, dy, dx);
  return dx;
}

Tensor GELU::forward(ops::Context& ctx, const Tensor& x) {
  Tensor y = ctx.transient(x.shape());
  ops::gelu_forward(ctx, x, y);
  x_ = x;
  return y;
}

Tensor GELU::backward(ops::Context& ctx, const Tensor& dy) {
  Tensor x = detail::take_cached(x_, "gelu");
  if (!input_grad_) return Tensor();
  Tensor dx = ctx.transient(x.shape());
  ops::gelu_backward(ctx, x, dy, dx);
  return dx;
}

}  // namespace lockstep::nn
