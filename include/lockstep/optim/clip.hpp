// Global gradient-norm clipping as torch.nn.utils.clip_grad_norm_: the L2 norm over all
// gradients together; when it exceeds max_norm every gradient is scaled by
// max_norm / (norm + 1e-6). Call it after gradients are averaged (after the reducer).
//
// Over flat parameters the norm comes from the step's gradient check (one pass over the flat
// gradients, which also answers the NaN/Inf question, and one readback), and clipping is one
// op over the flat buffer. The per-parameter form is kept for parameters outside a FlatParams.
#pragma once

#include <cmath>
#include <vector>

#include "lockstep/nn/module.hpp"
#include "lockstep/ops/context.hpp"
#include "lockstep/optim/flat.hpp"

namespace lockstep::optim {

// What one pass over the gradients tells the trainer.
struct GradientCheck {
  double sum_squares = 0.0;  // over every gradient element, in double (0 or NaN without norm)
  bool has_norm = true;      // whether the squares were summed (else finiteness only)
  bool finite() const { return std::isfinite(sum_squares); }  // every element is finite
  double norm() const;                                        // needs has_norm
};

// The step's check: FlatParams::grad_sum_squares, then its one readback. with_norm = false (no
// clipping) checks finiteness only, at about the cost of the per-parameter all_finite pass. On
// a device that should not wait, queue_gradient_check below keeps the answer on the device.
GradientCheck check_gradients(ops::Context& ctx, FlatParams& flat, bool with_norm = true);

// The same check left on the device, for a loop that does not wait for it (train/loop.cpp, Note
// [Deferred gradient check]): the pass over the gradients, its total into verdict[0] and the
// verdict closed with `taken` (ops::verdict_close). Nothing is read back.
void queue_gradient_check(ops::Context& ctx, FlatParams& flat, bool with_norm, Tensor& verdict,
                          std::int64_t taken);
// A fresh verdict on `device`: f64 [2] zeros (ops/step_verdict.hpp).
Tensor make_verdict(Device device);
// Clips with the norm the verdict holds, on the device: bit for bit what the host form below
// does with the same norm read back; nothing when the step is not finite.
void clip_grad_norm(ops::Context& ctx, FlatParams& flat, double max_norm, const Tensor& verdict);

// Clips with a norm already known (check_gradients' norm()): scales all gradients by
// max_norm / (norm + 1e-6) when that is below 1. Returns the factor applied (1: none).
double clip_grad_norm(ops::Context& ctx, FlatParams& flat, double max_norm, double norm);

// Per parameter: returns the norm before clipping (accumulated in double).
double clip_grad_norm(ops::Context& ctx, const std::vector<nn::Parameter*>& params,
                      double max_norm);

}  // namespace lockstep::optim
