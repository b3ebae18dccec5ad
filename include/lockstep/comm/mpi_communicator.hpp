// The MPI backend of Communicator for host tensors. One communication thread per communicator
// runs every operation in FIFO order: Open MPI does not progress non-blocking collectives
// unless some thread sits in MPI, and the Reducer enqueues bucket allreduces from the backward
// pass while compute continues. Sync calls go through the same queue, so all ranks issue their
// MPI calls in the order their callers made them.
#pragma once

#include <memory>

#include "lockstep/comm/bootstrap.hpp"
#include "lockstep/comm/communicator.hpp"

namespace lockstep::comm {

// A communicator over a duplicate of MPI_COMM_WORLD (errors returned, not fatal, and turned
// into lockstep::Error). Needs at least MPI_THREAD_SERIALIZED; a second live MPI communicator
// needs MPI_THREAD_MULTIPLE. Must be destroyed before `session`.
std::unique_ptr<Communicator> make_mpi_communicator(const MpiSession& session);

// Benchmark baseline only: MPI_Allreduce called directly on the calling thread, over the same
// MPI communicator as `comm` (from make_mpi_communicator), bypassing its queue. Throws if
// `comm` is not an MPI communicator or has operations in flight (MPI calls must not overlap).
void mpi_allreduce_on_caller(Communicator& comm, Tensor& t, ReduceOp op = ReduceOp::Sum);

}  // namespace lockstep::comm
