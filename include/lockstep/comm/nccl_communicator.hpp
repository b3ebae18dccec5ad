// The NCCL backend of Communicator, for tensors on the rank's GPU. Collectives run on a
// dedicated communication stream, ordered after the context's compute stream by an event, so
// they overlap the backward kernels queued after them. Work::wait() orders the compute stream
// after the collective and returns without blocking the host: every later op on the context,
// and every host read (which synchronises), sees the result. A watchdog thread ends the job,
// with a message naming the collective, when one has not finished within the timeout or NCCL
// reports an asynchronous error, instead of letting every rank hang until the wall-clock limit.
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

// How long a collective may stay unfinished before the watchdog aborts the job. Generous: a
// healthy allreduce takes milliseconds, but the first one of a job also waits for the slowest
// rank's start-up (data loading, cudnnFind); PyTorch's default is 10 minutes as well.
inline constexpr double kDefaultNcclTimeoutSeconds = 600.0;

struct NcclOptions {
  double timeout_s = kDefaultNcclTimeoutSeconds;
  // See gpu_for_local_rank: false when the launcher gives each rank its own GPU(s).
  bool shared_visibility = true;
};

// The GPU this rank drives: cuda:gpu_for_local_rank(local rank, local size, visible GPUs).
// Throws naming both counts when a node has more ranks than visible GPUs.
Device nccl_device_for(const Communicator& bootstrap, bool shared_visibility = true);

// NCCL's 128-byte unique id: rank 0 creates it (ncclGetUniqueId, no GPU needed) and
// broadcasts it over `bootstrap`; every rank returns the same bytes. Collective over bootstrap.
using NcclUniqueIdBytes = std::array<std::uint8_t, 128>;
NcclUniqueIdBytes share_nccl_unique_id(Communicator& bootstrap);

// A NCCL communicator over the same ranks as `bootstrap` (the MPI communicator), on ctx's GPU,
// which must be nccl_device_for(bootstrap). Host-side helpers (vector allreduce, string
// broadcast/allgather) go through `bootstrap`, which must outlive the result, as must ctx.
// Collective over bootstrap.
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, ops::Context& ctx,
                                                     const NcclOptions& options = {});

}  // namespace lockstep::comm

#endif  // LOCKSTEP_HAVE_CUDA
