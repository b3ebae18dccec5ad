// StopRequest: turns SIGTERM and SIGUSR1 into a flag the training loop polls once per step.
// The handler only stores the signal number in a lock-free atomic (async-signal-safe); the loop
// combines the flag across ranks (allreduce max) so every rank stops at the same step boundary,
// writes a checkpoint and exits with kExitRequeue. One StopRequest may be alive at a time; the
// destructor restores the handlers it replaced.
#pragma once

namespace lockstep::train {

// Exit status of a run that stopped on a signal after writing its checkpoint: "requeue me".
// slurm/train-requeue.sbatch requeues the job on exactly this status. 3 is unused by
// lockstep-train otherwise (1 = error, 2 = bad command line), by mpirun/srun for their own
// failures, and below the 128+N range of deaths by signal.
inline constexpr int kExitRequeue = 3;

class StopRequest {
 public:
  // Installs the handlers; throws lockstep::Error if another StopRequest is alive.
  StopRequest();
  ~StopRequest();
  StopRequest(const StopRequest&) = delete;
  StopRequest& operator=(const StopRequest&) = delete;

  // The first signal received (SIGTERM or SIGUSR1), or 0.
  int requested() const;
  // "SIGTERM", "SIGUSR1", or "" when none.
  const char* name() const { return signal_name(requested()); }
  static const char* signal_name(int signal);
};

}  // namespace lockstep::train
