#include "lockstep/nn/flatten.hpp"

namespace lockstep::nn {

Shape Flatten::output_shape(const Shape& input) const {
  LOCKSTEP_CHECK(!input.empty(), "flatten needs a batch dimension, got ", shape_str(input));
  // shape_numel checks the product: a huge padding upstream can push it past 2^63.
  return {input[0], shape_numel(Shape(input.begin() + 1, input.end()))};
}

Tensor Flatten::forward(ops::Context& ctx, const Tensor& x) {
  (void)ctx;
  x_shape_ = x.shape();
  return x.view(output_shape(x.shape()));
}

Tensor Flatten::backward(ops::Context& ctx, const Tensor& dy) {
  (void)ctx;
  LOCKSTEP_CHECK(!x_shape_.empty(), "flatten: backward without forward");
  if (!input_grad_) return Tensor();
  return dy.view(x_shape_);
}

}  // namespace lockstep::nn
