// A step's verdict, as scalar formulas for host and device code: what a training step does with
// its gradient check (the sum of squares over every averaged gradient) when the host does not wait
// for it. The CPU kernels, the CUDA kernels and optim/clip.cpp's host path all call these, so the
// clipping factor and the skip decision are the same bits wherever they are computed (double
// sqrt and division are correctly rounded on both).
//
// The verdict tensor (ops::verdict_add, ops::verdict_close) is f64 [2] on the step's device:
//   [0] the step's gradient sum of squares: finite exactly when every gradient element is;
//   [1] how many updates were skipped (non-finite [0]) since the host last took the count.
// A fused optimizer update given the verdict does nothing when [0] is not finite, and counts its
// step as p.step - [1] (the host counts every step it issues; it learns which were skipped at the
// next log step and then corrects its own count, passing `taken` to the next verdict_close).
#pragma once

#include <cmath>
#include <cstdint>

#include "lockstep/ops/host_device.hpp"

namespace lockstep::ops {

// torch.nn.utils.clip_grad_norm_'s factor for gradients of global norm `norm`:
// max_norm / (norm + 1e-6) (the 1e-6 keeps the clipped norm just under max_norm). Gradients are
// scaled by it (rounded to f32) only when it is below 1; a NaN norm gives NaN, which is not.
LOCKSTEP_HOST_DEVICE inline double clip_coefficient_of_norm(double max_norm, double norm) {
  return max_norm / (norm + 1e-6);
}
// The same from the gradients' sum of squares (the norm is its square root, as
// optim::GradientCheck::norm() takes it on the host).
LOCKSTEP_HOST_DEVICE inline double clip_coefficient(double max_norm, double sum_squares) {
#ifdef __CUDA_ARCH__
  return clip_coefficient_of_norm(max_norm, sqrt(sum_squares));
#else
  return clip_coefficient_of_norm(max_norm, std::sqrt(sum_squares));
#endif
}

// Whether an update under `verdict` (f64 [2] as above) is applied, and if so its step count:
// `step` less the updates skipped since the host's count was last corrected.
LOCKSTEP_HOST_DEVICE inline bool verdict_applies(const double* verdict, std::int64_t& step) {
  // x - x is 0 for every finite x and NaN for an Inf or a NaN: one test for host and device.
  if (!(verdict[0] - verdict[0] == 0.0)) return false;
  step -= static_cast<std::int64_t>(verdict[1]);
  return true;
}

}  // namespace lockstep::ops
