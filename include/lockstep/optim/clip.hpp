// Global gradient-norm clipping as torch.nn.utils.clip_grad_norm_: the L2 norm over all
// gradients together; when it exceeds max_norm every gradient is scaled by
// max_norm / (norm + 1e-6). Call it after gradients are averaged (after the reducer).
#pragma once

#include <vector>

#include "lockstep/nn/module.hpp"
#include "lockstep/ops/context.hpp"

namespace lockstep::optim {

// Returns the norm before clipping (accumulated in double).
double clip_grad_norm(ops::Context& ctx, const std::vector<nn::Parameter*>& params,
                      double max_norm);

}  // namespace lockstep::optim
