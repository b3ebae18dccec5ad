// The NCCL functions the communicator calls, each as dyn::<name> opened on first use
// (lockstep/ops/dynload.hpp): a CPU run of a CUDA-enabled build never loads NCCL.
#pragma once

#include <nccl.h>

#include "lockstep/ops/dynload.hpp"

LOCKSTEP_DYN(Nccl, ncclGetUniqueId)
LOCKSTEP_DYN(Nccl, ncclCommInitRank)
LOCKSTEP_DYN(Nccl, ncclCommDestroy)
LOCKSTEP_DYN(Nccl, ncclCommAbort)
LOCKSTEP_DYN(Nccl, ncclCommGetAsyncError)
LOCKSTEP_DYN(Nccl, ncclGetErrorString)
LOCKSTEP_DYN(Nccl, ncclGetLastError)
LOCKSTEP_DYN(Nccl, ncclAllReduce)
LOCKSTEP_DYN(Nccl, ncclBroadcast)
LOCKSTEP_DYN(Nccl, ncclReduceScatter)
LOCKSTEP_DYN(Nccl, ncclAllGather)
LOCKSTEP_DYN(Nccl, ncclGroupStart)
LOCKSTEP_DYN(Nccl, ncclGroupEnd)
