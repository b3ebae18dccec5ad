// Which transport gradients travel over, decided in one place: NCCL when the replica's tensors
// live on a GPU (bootstrapped over `control`, the MPI communicator, whose rank 0 broadcasts the
// unique id), else `control` itself. Host-side traffic (metrics, stop flags, config checks)
// always stays on `control`.
#pragma once

#include <memory>
#include <string>

#include "lockstep/comm/communicator.hpp"
#include "lockstep/comm/hierarchical.hpp"
#include "lockstep/ops/context.hpp"

namespace lockstep::comm {

// The communicator for tensors on ctx's device: NCCL on a GPU; on CPUs `control` itself (flat) or
// the two-level allreduce over it, as `algorithm` (dist.algorithm) and the node layout decide
// (hierarchical.hpp). When that is `control`, the result shares it without owning it (control
// must outlive the result either way). Refuses, naming the hosts, a job whose nodes differ in
// device kind (they would pick different transports and hang). Collective over control: every
// rank must call it. `description`, when given, receives a line for the log ("flat over
// 2 nodes: node1 (ranks 0-1), node2 (ranks 2-3)").
std::shared_ptr<Communicator> gradient_communicator(
    Communicator& control, ops::Context& ctx,
    AllreduceAlgorithm algorithm = AllreduceAlgorithm::Auto, std::string* description = nullptr);

}  // namespace lockstep::comm
