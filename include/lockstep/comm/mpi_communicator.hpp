// The MPI backend of Communicator for host tensors. One communication thread per communicator
// runs every operation in FIFO order: Open MPI does not progress non-blocking collectives
// unless some thread sits in MPI, and the Reducer enqueues bucket allreduces from the backward
// pass while compute continues. Sync calls go through the same queue, so all ranks issue their
// MPI calls in the order their callers made them. Each collective is started non-blocking and
// polled with a back-off, bounded by a timeout that ends the job with a report of the ranks that
// did not arrive (src/comm/mpi_watch.hpp); while idle, the thread answers such reports' queries.
#pragma once

#include <functional>
#include <memory>

#include "lockstep/comm/bootstrap.hpp"
#include "lockstep/comm/communicator.hpp"

namespace lockstep::comm {

struct MpiOptions {
  // A collective unfinished after this long ends the job (dist.timeout_s).
  double timeout_s = kDefaultTimeoutSeconds;
};

// A communicator over a duplicate of MPI_COMM_WORLD (errors returned, not fatal, and turned
// into lockstep::Error). Needs at least MPI_THREAD_SERIALIZED; a second live MPI communicator
// needs MPI_THREAD_MULTIPLE. Must be destroyed before `session`. Collective.
std::unique_ptr<Communicator> make_mpi_communicator(const MpiSession& session,
                                                    const MpiOptions& options = {});

// Benchmark baseline only: MPI_Allreduce called directly on the calling thread, over the same
// MPI communicator as `comm` (from make_mpi_communicator), bypassing its queue. Throws if
// `comm` is not an MPI communicator or has operations in flight (MPI calls must not overlap).
void mpi_allreduce_on_caller(Communicator& comm, Tensor& t, ReduceOp op = ReduceOp::Sum);

// Runs fn on the MPI communicator's thread, after what is queued before it, and returns once it
// has run, rethrowing its exception (which, unlike a failed collective, leaves the communicator
// usable). The way for other code to call MPI while an MPI communicator is alive: the thread
// polls MPI even when idle, and MPI_THREAD_SERIALIZED forbids two threads in MPI at once.
// Not a collective (no sequence number); fn must not block on other ranks.
void run_on_mpi_thread(Communicator& comm, const std::function<void()>& fn);

}  // namespace lockstep::comm
