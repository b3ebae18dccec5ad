// StopRequest: turns SIGTERM and SIGUSR1 into a flag the training loop polls once per step.
// The handler only stores the signal number in a lock-free atomic (async-signal-safe); the loop
// combines the flag across ranks (allreduce max) so every rank stops at the same step boundary,
// writes a checkpoint and exits with kExitRequeue. One StopRequest may be alive at a time; the
// destructor restores the handlers it replaced, except that after a stop a default (terminating)
// disposition becomes "ignore": the process is on its way to kExitRequeue, and a second signal
// (Slurm's SIGTERM after the SIGUSR1 warning) must not turn that into a death by signal.
//
// SignalThread: where those handlers run. oneDNN's JIT sgemm (Debian 12 ships oneDNN 2.7) points
// rsp into a heap buffer while it computes, and the kernel writes a signal handler's frame below
// rsp: a signal handled on that thread corrupts the heap ("corrupted size vs. prev_size", a
// SIGSEGV in dnnl_sgemm). oneDNN issue #4845, fixed upstream by PR #4855 (2026-03). So no thread
// that computes may take an asynchronous signal: construct a SignalThread first thing in main(),
// before MPI or anything else starts a thread. It blocks the asynchronous signals (kRoutedSignals)
// in the calling thread, so every thread created later inherits the block, and starts one thread
// with them unblocked, which runs their handlers and default actions and nothing else.
#pragma once

#include <memory>
#include <span>

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
  // The run stops on `signal`, received here or on another rank (the loop combines the ranks'
  // flags): from now on it counts as received here, so that when the signal reaches this rank
  // late (mpirun forwards it to each rank in turn) it is ignored after the destructor as a
  // repeated one is, rather than ending the process with the signal's default action.
  void record(int signal);
  // "SIGTERM", "SIGUSR1", or "" when none.
  const char* name() const { return signal_name(requested()); }
  static const char* signal_name(int signal);
};

class SignalThread {
 public:
  // Blocks routed_signals() in the calling thread and starts the thread that takes them; throws
  // lockstep::Error when the thread cannot start.
  SignalThread();
  // Stops that thread and restores the calling thread's signal mask.
  ~SignalThread();
  SignalThread(const SignalThread&) = delete;
  SignalThread& operator=(const SignalThread&) = delete;

  // The Linux thread id (gettid) of the thread that takes the signals.
  long thread_id() const;
  // The process-directed asynchronous signals it takes: stop requests (SIGTERM, SIGUSR1, SIGUSR2,
  // SIGINT, SIGHUP, SIGQUIT), SIGCHLD, SIGALRM, SIGCONT, SIGWINCH, SIGURG, SIGXCPU. Not the
  // synchronous ones (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGPIPE, SIGTRAP), which belong to the
  // thread that caused them, and not SIGPROF, which a sampling profiler aims at computing threads.
  static std::span<const int> routed_signals();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace lockstep::train
