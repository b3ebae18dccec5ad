// The MPI communicator's in-place allreduce, started non-blocking and waited for through the
// CollectiveWatch (so it is bounded by dist.timeout_s and sleeps instead of spinning). Short
// buffers use recursive doubling over point-to-point messages: Open MPI's MPI_Iallreduce builds a
// fresh schedule and scratch buffer per call, which cost ~1.5 us more than the blocking
// MPI_Allreduce on a few bytes (docs/DISTRIBUTED.md), while a short allreduce is log2(p) message
// exchanges. Long buffers use MPI_Iallreduce (Open MPI: its ring algorithm, set in MpiSession).
// Every rank computes the same bits: each round combines two operands that both partners hold,
// and the operations (sum, max, min) are commutative.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <vector>

#include "comm/mpi_watch.hpp"

namespace lockstep::comm::detail {

// Buffers up to this size take the point-to-point path. MPICH switches at 2 KiB for large
// communicators; at 2 ranks both paths cost the same from ~16 KiB on (measured here).
inline constexpr std::size_t kShortAllreduceBytes = 8 << 10;

// data <- op over every rank of comm of data (count elements of type, `bytes` in all). Runs on
// the communication thread; `scratch` is its reusable receive buffer.
void allreduce_in_place(void* data, int count, MPI_Datatype type, std::size_t bytes, MPI_Op op,
                        MPI_Comm comm, CollectiveWatch& watch, std::vector<std::byte>& scratch);

}  // namespace lockstep::comm::detail
