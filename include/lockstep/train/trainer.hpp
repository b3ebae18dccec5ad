// A whole run as lockstep-train does it: setup (setup.hpp), then either the training loop
// (loop.hpp) or, with --eval-only, one evaluation of the resumed model; then the parameter export
// (checkpoint.export) and the final record. Which engine runs underneath (DDP over MPI ranks or
// the threaded DataParallel baseline) comes from train.parallel.
#pragma once

#include "lockstep/comm/communicator.hpp"
#include "lockstep/train/config.hpp"
#include "lockstep/train/loop.hpp"

namespace lockstep::train {

// Runs the experiment on this rank. Collective over `comm`: every rank must call it.
TrainResult run_training(const Config& config, comm::Communicator& comm, bool eval_only = false);

}  // namespace lockstep::train
