#include "lockstep/nn/linear.hpp"

#include "buffers.hpp"
#include "lockstep/nn/init.hpp"
#include "lockstep/ops/ops.hpp"

namespace lockstep::nn {

Linear::Linear(std::int64_t in_features, std::int64_t out_features, bool bias, Device device)
    : in_(in_features), out_(out_features), has_bias_(bias) {
  LOCKSTEP_CHECK(in_ > 0 && out_ > 0, "linear: features must be positive, got in=", in_,
                 " out=", out_);
  weight_ = make_parameter({out_, in_}, device);
  if (has_bias_) bias_ = make_parameter({out_}, device);
  weight_.overwrites_grad = bias_.overwrites_grad = true;  // backward writes both whole
}

std::string Linear::describe() const {
  return str("linear(", in_, "->", out_, has_bias_ ? "" : ", bias=0", ")");
}

Shape Linear::output_shape(const Shape& input) const {
  LOCKSTEP_CHECK_HINT(input.size() == 2, "put `flatten` before a linear layer",
                      "linear expects input [N, ", in_, "], got ", shape_str(input));
  LOCKSTEP_CHECK(input[1] == in_, "linear expects input [N, ", in_, "], got ", shape_str(input));
  return {input[0], out_};
}

// Under the bf16 policy both GEMMs that read x (forward, weight gradient) and both that read dy
// (weight gradient, input gradient) would each round it to bf16 again. Instead the layer rounds
// an f32 x or dy once into a bf16 buffer of its own and passes that: the GEMMs then use it as it
// is, so the bits are those of converting per GEMM (the same conversion kernel) with half the
// conversions. Measured on AMX, where the conversions are a fifth of the MLP step
// (docs/PERFORMANCE.md, "Precision"). A bf16 x or dy (a GPT block's activations) is used as it is:
// nothing to convert. Under fp32 and tf32 nothing is converted and x is kept as it is.
namespace {
bool rounds_to_bf16(const ops::Context& ctx, const Tensor& t) {
  return ctx.precision() == ops::Precision::BF16 && t.dtype() == DType::F32;
}
}  // namespace

DType Linear::output_dtype(const ops::Context& ctx) const {
  return bf16_output_ && ctx.precision() == ops::Precision::BF16 ? DType::BF16 : DType::F32;
}

void Linear::cache_input(ops::Context& ctx, const Tensor& x) {
  x_ = Tensor();  // a forward without backward (evaluation) leaves it set; free x16_ for reuse
  x_dtype_ = x.dtype();
  Tensor operand = x;
  if (rounds_to_bf16(ctx, x)) {
    operand = detail::reuse_buffer(x16_, x.shape(), x.device(), DType::BF16);
    ops::cast(ctx, x, operand);
  }
  x_ = operand;  // backward reads x only through the weight-gradient GEMM
}

void Linear::drop_input() {
  x_ = Tensor();
  x16_ = Tensor();
}

Tensor Linear::forward(ops::Context& ctx, const Tensor& x) {
  Tensor none;
  return forward_act(ctx, x, ops::Activation::None, none);
}

Tensor Linear::forward_act(ops::Context& ctx, const Tensor& x, ops::Activation act,
                           Tensor& pre_act) {
  Shape out = output_shape(x.shape());
  Tensor& y = detail::reuse_buffer(y_, out, x.device(), output_dtype(ctx));
  cache_input(ctx, x);
  ops::linear_forward(ctx, x_, weight_.value, bias_.value, act, y, pre_act);
  return y;
}

Tensor Linear::recompute_act(ops::Context& ctx, ops::Activation act, Tensor& pre_act) {
  LOCKSTEP_CHECK_HINT(x_.defined(), "recompute before this layer's backward",
                      "linear: recompute_act without the input cached by forward");
  Tensor& y = detail::reuse_buffer(y_, pre_act.shape(), pre_act.device(), pre_act.dtype());
  ops::linear_recompute_activation(ctx, x_, weight_.value, bias_.value, act, pre_act, y);
  return y;
}

void Linear::release_buffers() {
  drop_input();
  y_ = dx_ = dy16_ = Tensor();
}

Tensor Linear::backward(ops::Context& ctx, const Tensor& dy) {
  return run_backward(ctx, dy, ops::Activation::None, Tensor());
}

Tensor Linear::backward_act(ops::Context& ctx, const Tensor& dy, ops::Activation act,
                            const Tensor& pre_act) {
  return run_backward(ctx, dy, act, pre_act);
}

Tensor Linear::run_backward(ops::Context& ctx, const Tensor& dy, ops::Activation input_act,
                            const Tensor& input_pre_act) {
  Tensor x = detail::take_cached(x_, "linear");
  Tensor dy16;
  if (input_grad_ && rounds_to_bf16(ctx, dy)) {  // two GEMMs read dy: round it once
    dy16 = detail::reuse_buffer(dy16_, dy.shape(), dy.device(), DType::BF16);
    ops::cast(ctx, dy, dy16);
  }
  // dW += dy^T x and db += column sums of dy: both accumulate, as parameter gradients must,
  // unless zero_grad left them stale: then they are overwritten (the weight GEMM's beta = 0 never
  // reads the old dW). The bias gradient sums dy as it came (f32, or a bf16 activation).
  ops::LinearBackward p;
  p.overwrite_dw = weight_.grad_stale;
  p.overwrite_db = has_bias_ && bias_.grad_stale;
  p.input_act = input_act;
  p.input_pre_act = input_pre_act;
  Tensor dx;
  if (input_grad_) dx = detail::reuse_buffer(dx_, x.shape(), x.device(), x_dtype_);
  Tensor db = has_bias_ ? bias_.grad : Tensor();
  ops::linear_backward(ctx, x, weight_.value, dy, dy16, weight_.grad, db, dx, p);
  weight_.grad_stale = false;
  if (has_bias_) bias_.grad_stale = false;
  return dx;
}

void Linear::reset_parameters(std::uint64_t seed, const std::string& prefix) {
  float bound = default_init_bound(in_);
  init_uniform(weight_.value, bound, seed, prefix + "weight");
  if (has_bias_) init_uniform(bias_.value, bound, seed, prefix + "bias");
}

void Linear::collect_parameters(const std::string& prefix, std::vector<Parameter*>& out) {
  weight_.name = prefix + "weight";
  out.push_back(&weight_);
  if (has_bias_) {
    bias_.name = prefix + "bias";
    out.push_back(&bias_);
  }
}

double Linear::forward_flops(const Shape& input) const {
  (void)input;
  return 2.0 * static_cast<double>(in_) * static_cast<double>(out_);
}

}  // namespace lockstep::nn
