#include "lockstep/nn/activation.hpp"

#include "buffers.hpp"
#include "lockstep/ops/ops.hpp"

namespace lockstep::nn {

Tensor ReLU::forward(ops::Context& ctx, const Tensor& x) {
  Tensor& y = detail::reuse_buffer(y_, x.shape(), x.device());
  ops::relu_forward(ctx, x, y);
  have_output_ = true;
  return y;
}

Tensor ReLU::backward(ops::Context& ctx, const Tensor& dy) {
  // y_ is only rewritten by this layer's next forward, so it still holds this pass's output.
  LOCKSTEP_CHECK_HINT(have_output_, "call forward before each backward",
                      "relu: backward without forward");
  have_output_ = false;
  if (!input_grad_) return Tensor();
  Tensor& dx = detail::reuse_buffer(dx_, y_.shape(), y_.device());
  ops::relu_backward(ctx, y_, dy, dx);
  return dx;
}

Tensor GELU::forward(ops::Context& ctx, const Tensor& x) {
  Tensor& y = detail::reuse_buffer(y_, x.shape(), x.device());
  ops::gelu_forward(ctx, x, y);
  x_ = x;
  return y;
}

Tensor GELU::backward(ops::Context& ctx, const Tensor& dy) {
  Tensor x = detail::take_cached(x_, "gelu");
  if (!input_grad_) return Tensor();
  Tensor& dx = detail::reuse_buffer(dx_, x.shape(), x.device());
  ops::gelu_backward(ctx, x, dy, dx);
  return dx;
}

}  // namespace lockstep::nn
