// The training loop over a Run: optimizer steps from the state's position until the plan's end
// or a stop signal, with the NaN/Inf policy, progress and metrics every log.every steps,
// checkpoints when due, and evaluation after each epoch. Setup, the state's checkpoint format and
// evaluation live elsewhere (setup.hpp, state.hpp, evaluate.hpp). Collective over run.comm.
#pragma once

#include <cstdint>
#include <string>

#include "lockstep/train/setup.hpp"

namespace lockstep::train {

// Where a run's wall time went, in seconds on this rank (rank 0's are reported). compute holds
// forward and backward (with the communication they overlap) and DataParallel's replica copies;
// comm_exposed the wait for gradients after backward; optimizer the gradient check, clipping and
// the update; checkpoint the time training stood still for saves; other the rest (logging,
// the loss reads, the loop itself). On a GPU these are host times of asynchronous work.
struct TimeShares {
  double compute = 0, comm_exposed = 0, data_wait = 0, optimizer = 0, checkpoint = 0,
         evaluation = 0;
  double other(double wall) const {
    return wall - compute - comm_exposed - data_wait - optimizer - checkpoint - evaluation;
  }
};

struct TrainResult {
  std::int64_t steps = 0;
  std::int64_t epochs = 0;
  double test_accuracy = -1;  // -1 when no evaluation ran
  double test_loss = -1;
  double wall_seconds = 0;
  double samples_per_second = 0;
  double final_train_loss = 0;
  std::int64_t skipped_steps = 0;  // non-finite steps skipped under train.nan_policy = skip
  // Set when the run stopped early on SIGTERM/SIGUSR1 after writing a checkpoint: the app exits
  // with kExitRequeue (signals.hpp).
  bool stopped_by_signal = false;
  std::string checkpoint;  // the last checkpoint written ("" if none)
  TimeShares time;
};

TrainResult train_loop(Run& run);

}  // namespace lockstep::train
