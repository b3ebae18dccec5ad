#include "lockstep/train/signals.hpp"

#include <atomic>
#include <csignal>

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
  sigaction(SIGTERM, &g_old_term, nullptr);
  sigaction(SIGUSR1, &g_old_usr1, nullptr);
  g_installed.store(false);
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

}  // namespace lockstep::train
