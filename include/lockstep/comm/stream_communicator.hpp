// NCCL's semantics over a host communicator, for a device whose runtime runs host code in stream
// order (the emulated GPU, ops/device_runtime.hpp): each collective is issued in the caller's
// order, runs after everything queued on the context's compute stream so far (the gradients it
// reduces), completes on a communication stream of its own, and Work::wait() orders the compute
// stream after it without blocking the host (barrier() does block, as NCCL's). The data travels
// over `host` (the MPI communicator, or the hierarchical allreduce over it), on host views of the
// device tensors. A watchdog ends the job, naming the collective, when one has not finished
// within the timeout, as the NCCL communicator's does. So DdpEngine, ZeRO-1, the Reducer's
// buckets and the trainer take their GPU code paths, and are tested, on machines without a GPU.
#pragma once

#include <memory>

#include "lockstep/comm/communicator.hpp"
#include "lockstep/ops/context.hpp"

namespace lockstep::comm {

// `control`: the MPI communicator (host values, the training step, and the queue that keeps
// every rank's collectives in one order); `host`: what the tensors travel over (control itself,
// or a communicator over it). Both, and ctx, must outlive the result. timeout_s <= 0 takes
// control's (dist.timeout_s). Throws when ctx's device has no runtime that can run host code.
std::unique_ptr<Communicator> make_stream_communicator(Communicator& control,
                                                       std::shared_ptr<Communicator> host,
                                                       ops::Context& ctx, double timeout_s = 0);

}  // namespace lockstep::comm
