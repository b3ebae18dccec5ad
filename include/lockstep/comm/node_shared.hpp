// Host memory shared by the ranks of one node, for data every rank reads but none changes (a
// data set held in memory once per node instead of once per rank). Local rank 0 creates a POSIX
// shared-memory object, reserves all its pages up front (so a full /dev/shm is an error here,
// not a SIGBUS later) and maps it writable; the other local ranks map it read-only. The name is
// unlinked as soon as every local rank has mapped it, so a crash never leaves it in /dev/shm.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "lockstep/comm/communicator.hpp"

namespace lockstep::comm {

struct NodeSharedBlock {
  void* data = nullptr;  // `bytes` of host memory, the same bytes on every local rank
  std::int64_t bytes = 0;
  bool writer = false;  // local rank 0: the one rank of the node that fills it
  // Every local rank calls it once, the writer after filling (ok = false: filling failed). It
  // returns when the contents are visible to all local ranks; on a reader whose writer failed
  // it throws naming the block. Collective over the node.
  std::function<void(bool ok)> published;
  std::shared_ptr<void> mapping;  // unmaps when the last holder lets go (no collective needed)
};

// Collective over every rank of `mpi` (an MPI communicator: make_mpi_communicator), all with the
// same `bytes`. `what` names the contents in errors; `hint` says how to do without sharing
// (e.g. "set data.node_shared = off"). Throws on every local rank, naming `what`, the size and
// /dev/shm, when the node's shared memory cannot hold it.
NodeSharedBlock allocate_node_shared(Communicator& mpi, std::int64_t bytes, const std::string& what,
                                     const std::string& hint);

}  // namespace lockstep::comm
