// Cross-context ordering on GPUs, behind ops::Context::wait_for.
#pragma once

#include "lockstep/ops/context.hpp"

namespace lockstep::ops::cuda {

// waiter's compute stream waits (on the device, not the host) for everything queued on
// producer's compute stream so far. Both contexts must be CUDA contexts; devices may differ.
void order_after(Context& waiter, Context& producer);

}  // namespace lockstep::ops::cuda
