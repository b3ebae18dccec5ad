#include "lockstep/optim/clip.hpp"

#include <cmath>

#include "lockstep/ops/ops.hpp"

namespace lockstep::optim {

double clip_grad_norm(ops::Context& ctx, const std::vector<nn::Parameter*>& params,
                      double max_norm) {
  LOCKSTEP_CHECK(max_norm > 0.0, "clip_grad_norm: max_norm must be positive, got ", max_norm);
  double sum = 0.0;
  for (const nn::Parameter* p : params)
    sum += ops::sum_squares(ctx, p->grad);
  double norm = std::sqrt(sum);
  // The 1e-6 is PyTorch's: it keeps the clipped norm just under max_norm.
  double coef = max_norm / (norm + 1e-6);
  if (coef < 1.0) {
    for (nn::Parameter* p : params)
      ops::scale(ctx, p->grad, static_cast<float>(coef));
  }
  return norm;
}

}  // namespace lockstep::optim
