// LOCKSTEP_CHECK_CUDA for every CUDA runtime call, in ops/cuda and in comm's NCCL home: a failure
// throws lockstep::Error naming the call, file:line and the runtime's own error string, so a
// message in a Slurm log of a 512-rank job says which call failed where. CUDA builds only.
#pragma once

#ifdef LOCKSTEP_HAVE_CUDA

#include <cuda_runtime.h>

#include "lockstep/core/error.hpp"

#define LOCKSTEP_CHECK_CUDA(call)                                                   \
  do {                                                                              \
    cudaError_t lockstep_status_ = (call);                                          \
    if (lockstep_status_ != cudaSuccess) [[unlikely]]                               \
      LOCKSTEP_FAIL(#call, " failed: ", cudaGetErrorString(lockstep_status_), " (", \
                    cudaGetErrorName(lockstep_status_), ")");                       \
  } while (0)

#endif  // LOCKSTEP_HAVE_CUDA
