// Which GPU each rank drives, decided together by the ranks of a node (train.gpu). The choice
// itself is choose_gpus() in bootstrap.hpp, a pure function; this gathers what it needs: which
// ranks share a node and which physical GPUs (by UUID) each of them sees.
#pragma once

#include <string>

#include "lockstep/comm/bootstrap.hpp"
#include "lockstep/comm/communicator.hpp"
#include "lockstep/core/device.hpp"

namespace lockstep::comm {

// This process's GPUs by UUID, in CUDA device order ("GPU-8f3c..."); empty in a build without
// CUDA or on a machine without a GPU.
VisibleGpus visible_gpus();

// The device index this rank drives: choose_gpus(choice, the visible GPUs of every rank on this
// node, in rank order). `visible` is this rank's own list (visible_gpus(); tests pass their own).
// Collective over comm; every rank gets its own answer or every rank on a node the same error.
int select_local_gpu(Communicator& comm, const GpuChoice& choice, const VisibleGpus& visible);

// cuda:select_local_gpu(comm, GpuChoice::parse(train_gpu), visible_gpus()). Collective.
Device select_gpu(Communicator& comm, const std::string& train_gpu);

}  // namespace lockstep::comm
