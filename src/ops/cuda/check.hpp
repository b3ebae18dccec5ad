// Checks for every CUDA runtime (lockstep/ops/cuda_check.hpp), cuBLAS and cuDNN call (the latter
// two through dyn::, opened on first use: ops/cuda/dynload.hpp): a failure throws lockstep::Error
// naming the call, file:line and the library's own error string, so a message in a Slurm log of a
// 512-rank job says which call failed where. LOCKSTEP_CHECK_LAUNCH() follows every kernel launch
// (launch errors are otherwise reported by some later, unrelated call).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include "lockstep/core/error.hpp"
#include "lockstep/ops/cuda_check.hpp"  // LOCKSTEP_CHECK_CUDA
#include "ops/cuda/dyn_libs.hpp"

#define LOCKSTEP_CHECK_CUBLAS(call)                                                               \
  do {                                                                                            \
    cublasStatus_t lockstep_status_ = (call);                                                     \
    if (lockstep_status_ != CUBLAS_STATUS_SUCCESS) [[unlikely]]                                   \
      LOCKSTEP_FAIL(#call, " failed: ", ::lockstep::dyn::cublasGetStatusString(lockstep_status_), \
                    " (", ::lockstep::dyn::cublasGetStatusName(lockstep_status_), ")");           \
  } while (0)

#define LOCKSTEP_CHECK_CUDNN(call)                                                               \
  do {                                                                                           \
    cudnnStatus_t lockstep_status_ = (call);                                                     \
    if (lockstep_status_ != CUDNN_STATUS_SUCCESS) [[unlikely]]                                   \
      LOCKSTEP_FAIL(#call, " failed: ", ::lockstep::dyn::cudnnGetErrorString(lockstep_status_)); \
  } while (0)

#define LOCKSTEP_CHECK_LAUNCH() LOCKSTEP_CHECK_CUDA(cudaGetLastError())
