// Which transport gradients travel over, decided in one place: NCCL when the replica's tensors
// live on a GPU (bootstrapped over `control`, the MPI communicator, whose rank 0 broadcasts the
// unique id), else `control` itself. Host-side traffic (metrics, stop flags, config checks)
// always stays on `control`.
#pragma once

#include <memory>

#include "lockstep/comm/communicator.hpp"
#include "lockstep/ops/context.hpp"

namespace lockstep::comm {

// The communicator for tensors on ctx's device. When that is `control`, the result shares it
// without owning it (control must outlive the result either way). Collective over control when
// it builds a NCCL communicator: every rank must call it with a context on the same kind of
// device.
std::shared_ptr<Communicator> gradient_communicator(Communicator& control, ops::Context& ctx);

}  // namespace lockstep::comm
