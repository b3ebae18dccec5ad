// Internal to comm/: lets other comm/ files run MPI code on an MPI communicator's own
// communication thread, in FIFO order with its collectives, so algorithms built from several
// MPI calls (hierarchical.cpp) need neither a second MPI thread nor MPI_THREAD_MULTIPLE.
#pragma once

#include <functional>
#include <string>

#include "comm/mpi_check.hpp"
#include "lockstep/comm/communicator.hpp"

namespace lockstep::comm::detail {

// Queues job(world) on the thread of `mpi` (from make_mpi_communicator); `world` is its
// duplicate of MPI_COMM_WORLD (errors returned). `what` names the job in errors. Throws naming
// the backend when `mpi` is not an MPI communicator.
WorkPtr submit_mpi_job(Communicator& mpi, std::string what, std::function<void(MPI_Comm)> job);

class CollectiveWatch;
// The same for a job that is a collective of its own (several MPI calls that every rank makes):
// it is bracketed as one collective under dist.timeout_s, and must wait for its requests with
// watch.wait(...) (never a blocking MPI call), so that a rank that never arrives is reported
// and ends the job, as for the communicator's own collectives (mpi_watch.hpp).
WorkPtr submit_watched_mpi_job(Communicator& mpi, std::string what,
                               std::function<void(MPI_Comm, CollectiveWatch&)> job);

}  // namespace lockstep::comm::detail
