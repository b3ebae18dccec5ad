// Internal to comm/: the one place besides the app entry that sees mpi.h. LOCKSTEP_CHECK_MPI
// turns a failing MPI return code (communicators use MPI_ERRORS_RETURN) into lockstep::Error
// carrying the call, MPI's own error string and this process's world rank.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <string>

#include "lockstep/comm/bootstrap.hpp"
#include "lockstep/comm/communicator.hpp"
#include "lockstep/core/dtype.hpp"

namespace lockstep::comm::detail {

std::string mpi_error_string(int code);  // "MPI_ERR_TRUNCATE: message truncated"
[[noreturn]] void mpi_fail(int code, const char* call, const char* file, int line);

// The predefined op (MPI_SUM, ...) for MPI's own types.
MPI_Op to_mpi_op(ReduceOp op);
// The op for reducing `dtype`: the predefined one, or for bf16 (which MPI lacks) one of ours,
// created on first use: each pair of elements is combined in f32 and rounded back to bf16 (round
// to nearest even), as NCCL reduces bf16.
MPI_Op to_mpi_op(ReduceOp op, DType dtype);
// The f32 combinations behind the bf16 ops, shared with the hierarchical node reduction.
struct F32Add {
  float operator()(float x, float y) const { return x + y; }
};
struct F32Max {
  float operator()(float x, float y) const { return std::max(x, y); }
};
struct F32Min {
  float operator()(float x, float y) const { return std::min(x, y); }
};
// The MPI type for reductions over `dtype` (bf16: MPI_UINT16_T, the bits, reduced by the ops
// above); throws naming the dtype when there is none.
MPI_Datatype reduction_type(DType dtype, const char* what);
int to_mpi_thread_level(ThreadLevel level);
ThreadLevel from_mpi_thread_level(int level);
// MPI communicators alive in this process (a second one needs MPI_THREAD_MULTIPLE).
std::atomic<int>& live_mpi_communicators();

}  // namespace lockstep::comm::detail

#define LOCKSTEP_CHECK_MPI(call)                                                       \
  do {                                                                                 \
    const int lockstep_mpi_rc_ = (call);                                               \
    if (lockstep_mpi_rc_ != MPI_SUCCESS) [[unlikely]] {                                \
      ::lockstep::comm::detail::mpi_fail(lockstep_mpi_rc_, #call, __FILE__, __LINE__); \
    }                                                                                  \
  } while (0)
