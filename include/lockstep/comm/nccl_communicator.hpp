// The NCCL backend of Communicator, for tensors on the rank's GPU. Collectives run on a
// dedicated communication stream, ordered after the context's compute stream by an event, so
// they overlap the backward kernels queued after them. Work::wait() orders the compute stream
// after the collective and returns without blocking the host: every later op on the context,
// and every host read (which synchronises), sees the result. A watchdog thread ends the job,
// with a message naming the collective, when one has not finished within the timeout or NCCL
// reports an asynchronous error, instead of letting every rank hang until the wall-clock limit;
// it also bounds ncclCommInitRank and ncclCommDestroy, which wait for every rank. Destroyed while
// an exception unwinds, the communicator aborts (ncclCommAbort) instead of destroying, so the
// failing rank reaches its error message and MPI_Abort instead of blocking on its peers.
// Declared only in CUDA builds (LOCKSTEP_HAVE_CUDA).
#pragma once

#ifdef LOCKSTEP_HAVE_CUDA

#include <array>
#include <cstdint>
#include <memory>

#include "lockstep/comm/communicator.hpp"
#include "lockstep/core/device.hpp"
#include "lockstep/ops/context.hpp"

namespace lockstep::comm {

struct NcclOptions {
  // How long a collective (or the communicator's creation) may stay unfinished before the
  // watchdog ends the job; 0 takes the bootstrap communicator's timeout_s() (dist.timeout_s).
  double timeout_s = 0;
};

// NCCL's 128-byte unique id: rank 0 creates it (ncclGetUniqueId, no GPU needed) and
// broadcasts it over `bootstrap`; every rank returns the same bytes. Collective over bootstrap.
using NcclUniqueIdBytes = std::array<std::uint8_t, 128>;
NcclUniqueIdBytes share_nccl_unique_id(Communicator& bootstrap);

// A NCCL communicator over the same ranks as `bootstrap` (the MPI communicator), on ctx's GPU
// (choose it with comm::select_gpu, which gives every rank of a node its own). Host-side helpers
// (vector allreduce, string broadcast/allgather) and the training step go through `bootstrap`,
// which must outlive the result, as must ctx. Collective over bootstrap.
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, ops::Context& ctx,
                                                     const NcclOptions& options = {});

}  // namespace lockstep::comm

#endif  // LOCKSTEP_HAVE_CUDA
