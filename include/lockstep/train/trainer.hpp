// The training loop, written once over dist::Engine: data loading, the optimizer step with its
// schedule and clipping, NaN/Inf policy, cross-rank metrics, evaluation over the whole test set
// exactly once, and the outputs (progress, JSON-lines metrics). Which engine runs underneath
// (DDP over MPI ranks or the threaded DataParallel baseline) comes from train.parallel.
#pragma once

#include <cstdint>
#include <string>

#include "lockstep/comm/communicator.hpp"
#include "lockstep/train/config.hpp"

namespace lockstep::train {

struct TrainResult {
  std::int64_t steps = 0;
  std::int64_t epochs = 0;
  double test_accuracy = -1;  // -1 when no evaluation ran
  double test_loss = -1;
  double wall_seconds = 0;
  double samples_per_second = 0;
  double final_train_loss = 0;
  // Set when the run stopped early on SIGTERM/SIGUSR1 after writing a checkpoint: the app exits
  // with kExitRequeue (signals.hpp).
  bool stopped_by_signal = false;
  std::string checkpoint;  // the last checkpoint written ("" if none)
};

// Threads per rank or DataParallel replica: train.threads, else the cores this rank may use (the
// launcher's binding if it set one, else the node's cores divided by its local ranks) divided by
// the replicas in this process; at least 1.
int resolve_threads(const Config& config, int local_ranks, int replicas);

// Resolves train.parallel = auto: ddp when the job has several ranks, else none.
std::string resolve_parallel(const Config& config, int world_size);

// Stops every rank (lockstep::Error on each) when the rank-invariant settings differ, naming each
// differing key with rank 0's value and the first disagreeing rank's. Collective.
void check_config_agrees(comm::Communicator& comm, const Config& config);

// Runs the experiment on this rank. Collective over `comm`: every rank must call it.
TrainResult run_training(const Config& config, comm::Communicator& comm, bool eval_only = false);

}  // namespace lockstep::train
