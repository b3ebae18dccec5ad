// ZeRO-1 checkpoints: a sharded optimizer holds 1/world of its state, but a checkpoint holds it
// whole (the same file as without ZeRO, so any world size and either mode can resume it). Saving
// gathers the shards; restoring needs no communication (Optimizer::load_state takes the shard's
// part of the whole tensors every rank reads).
#pragma once

#include <vector>

#include "lockstep/comm/communicator.hpp"
#include "lockstep/optim/optimizer.hpp"

namespace lockstep::parallel {

// The optimizer's state as whole per-parameter tensors, named as Optimizer::state() names them,
// on every rank: unsharded, state() itself (views, no copy); sharded, for each kind one allgather
// per bucket into a new buffer of the whole layout (transient: it lives as long as the result).
// Collective over `comm` when sharded (the ranks of the shard, in rank order).
std::vector<optim::StateTensor> gather_optimizer_state(comm::Communicator& comm,
                                                       optim::Optimizer& optimizer);

}  // namespace lockstep::parallel
