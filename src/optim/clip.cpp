#include "lockstep/optim/clip.hpp"

#include "lockstep/ops/ops.hpp"
#include "lockstep/ops/step_verdict.hpp"

namespace lockstep::optim {
namespace {

void check_max_norm(double max_norm) {
  LOCKSTEP_CHECK(max_norm > 0.0, "clip_grad_norm: max_norm must be positive, got ", max_norm);
}

// The formula is shared with the device's clipping from a verdict (ops/step_verdict.hpp).
double clip_coefficient(double max_norm, double norm) {
  return ops::clip_coefficient_of_norm(max_norm, norm);
}

}  // namespace

double GradientCheck::norm() const {
  LOCKSTEP_CHECK(has_norm,
                 "gradient check: the norm was not computed (check_gradients with "
                 "with_norm = false)");
  return std::sqrt(sum_squares);
}

GradientCheck check_gradients(ops::Context& ctx, FlatParams& flat, bool with_norm) {
  flat.grad_sum_squares(ctx, with_norm ? ops::FlatSums::Squares : ops::FlatSums::FinitenessOnly);
  return GradientCheck{flat.read_grad_sum_squares(ctx), with_norm};
}

void queue_gradient_check(ops::Context& ctx, FlatParams& flat, bool with_norm, Tensor& verdict,
                          std::int64_t taken) {
  flat.grad_sum_squares(ctx, with_norm ? ops::FlatSums::Squares : ops::FlatSums::FinitenessOnly);
  ops::verdict_add(ctx, flat.grad_sum_squares_total(), verdict, /*first=*/true);
  ops::verdict_close(ctx, verdict, taken);
}

Tensor make_verdict(Device device) {
  return Tensor::from_vector<double>({0.0, 0.0}, {2}).to(device);
}

void clip_grad_norm(ops::Context& ctx, FlatParams& flat, double max_norm, const Tensor& verdict) {
  check_max_norm(max_norm);
  ops::clip_by_verdict(ctx, flat.grads(), verdict, max_norm);
}

double clip_grad_norm(ops::Context& ctx, FlatParams& flat, double max_norm, double norm) {
  check_max_norm(max_norm);
  double coef = clip_coefficient(max_norm, norm);
  if (!(coef < 1.0)) return 1.0;  // also for a NaN norm, as the per-parameter form
  // The padding is zero and stays zero: scaling the whole buffer is one op.
  ops::scale(ctx, flat.grads(), static_cast<float>(coef));
  return coef;
}

double clip_grad_norm(ops::Context& ctx, const std::vector<nn::Parameter*>& params,
                      double max_norm) {
  check_max_norm(max_norm);
  double sum = 0.0;
  for (const nn::Parameter* p : params)
    sum += ops::sum_squares(ctx, p->grad);
  double norm = std::sqrt(sum);
  double coef = clip_coefficient(max_norm, norm);
  if (coef < 1.0) {
    for (nn::Parameter* p : params)
      ops::scale(ctx, p->grad, static_cast<float>(coef));
  }
  return norm;
}

}  // namespace lockstep::optim
