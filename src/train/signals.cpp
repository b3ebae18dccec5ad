#include "lockstep/train/signals.hpp"

#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <csignal>
#include <cstring>
#include <mutex>
#include <thread>

#include "lockstep/core/error.hpp"

namespace lockstep::train {

namespace {

// Process-wide, because a signal handler can reach nothing else.
std::atomic<int> g_signal{0};
std::atomic<bool> g_installed{false};
struct sigaction g_old_term;
struct sigaction g_old_usr1;

static_assert(std::atomic<int>::is_always_lock_free, "the handler needs a lock-free atomic");

extern "C" void on_stop_signal(int signal) {
  // Keeps the first signal: a SIGTERM after the USR1 warning changes nothing about what to do.
  int expected = 0;
  g_signal.compare_exchange_strong(expected, signal);
}

}  // namespace

StopRequest::StopRequest() {
  LOCKSTEP_CHECK(!g_installed.exchange(true), "StopRequest: another one is already installed");
  g_signal.store(0);
  struct sigaction action = {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  // SA_RESTART: a signal during a blocking read or MPI wait must not turn into EINTR failures.
  action.sa_flags = SA_RESTART;
  if (sigaction(SIGTERM, &action, &g_old_term) != 0 ||
      sigaction(SIGUSR1, &action, &g_old_usr1) != 0) {
    g_installed.store(false);
    LOCKSTEP_FAIL("StopRequest: sigaction failed");
  }
}

StopRequest::~StopRequest() {
  // After a stop, a signal whose replaced disposition would end the process is ignored from now
  // on: the run is on its way out with kExitRequeue, and a requeue wrapper must see that status.
  const bool stopped = g_signal.load() != 0;
  for (auto [signal, old] : {std::pair{SIGTERM, &g_old_term}, std::pair{SIGUSR1, &g_old_usr1}}) {
    if (stopped && !(old->sa_flags & SA_SIGINFO) && old->sa_handler == SIG_DFL) {
      struct sigaction ignore = {};
      ignore.sa_handler = SIG_IGN;
      sigemptyset(&ignore.sa_mask);
      sigaction(signal, &ignore, nullptr);
    } else {
      sigaction(signal, old, nullptr);
    }
  }
  g_installed.store(false);
}

void StopRequest::record(int signal) {
  int expected = 0;
  g_signal.compare_exchange_strong(expected, signal);
}

int StopRequest::requested() const {
  return g_signal.load(std::memory_order_relaxed);
}

const char* StopRequest::signal_name(int signal) {
  switch (signal) {
    case 0:
      return "";
    case SIGTERM:
      return "SIGTERM";
    case SIGUSR1:
      return "SIGUSR1";
    default:
      return "another signal";
  }
}

namespace {

constexpr int kRouted[] = {SIGTERM, SIGUSR1, SIGUSR2, SIGINT,   SIGHUP, SIGQUIT,
                           SIGCHLD, SIGALRM, SIGCONT, SIGWINCH, SIGURG, SIGXCPU};

sigset_t routed_set() {
  sigset_t set;
  sigemptyset(&set);
  for (int signal : kRouted)
    sigaddset(&set, signal);
  return set;
}

}  // namespace

struct SignalThread::State {
  sigset_t old_mask;
  std::mutex mutex;
  std::condition_variable wake;
  bool quit = false;
  std::atomic<long> tid{0};
  std::thread thread;
};

SignalThread::SignalThread() : state_(std::make_unique<State>()) {
  const sigset_t set = routed_set();
  int rc = pthread_sigmask(SIG_BLOCK, &set, &state_->old_mask);
  LOCKSTEP_CHECK(rc == 0, "SignalThread: pthread_sigmask failed: ", std::strerror(rc));
  State* state = state_.get();
  try {
    // Started with the signals blocked (it inherits the mask); it unblocks them itself.
    state->thread = std::thread([state, set] {
      state->tid.store(static_cast<long>(::syscall(SYS_gettid)));
      pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
      std::unique_lock lock(state->mutex);
      state->wake.wait(lock, [state] { return state->quit; });
      // Blocked again before it ends, so that no signal is lost to a thread on its way out: one
      // that arrives now stays pending for the process.
      pthread_sigmask(SIG_BLOCK, &set, nullptr);
    });
  } catch (const std::system_error& e) {
    pthread_sigmask(SIG_SETMASK, &state_->old_mask, nullptr);
    LOCKSTEP_FAIL("SignalThread: cannot start the thread that takes signals: ", e.what());
  }
  while (state->tid.load() == 0)
    std::this_thread::yield();
}

SignalThread::~SignalThread() {
  {
    std::lock_guard lock(state_->mutex);
    state_->quit = true;
  }
  state_->wake.notify_all();
  state_->thread.join();
  pthread_sigmask(SIG_SETMASK, &state_->old_mask, nullptr);
}

long SignalThread::thread_id() const {
  return state_->tid.load();
}

std::span<const int> SignalThread::routed_signals() {
  return kRouted;
}

}  // namespace lockstep::train
