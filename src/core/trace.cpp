#include "lockstep/core/trace.hpp"

#include <chrono>
#include <cstdlib>
#include <mutex>

namespace lockstep::trace {
namespace detail {
std::atomic<bool> recording{false};
}

namespace {
std::mutex mutex;
std::vector<Event> events;
std::atomic<std::int64_t> current_step{0};
std::size_t limit = 0;
bool was_cut = false;
}  // namespace

namespace {
// A test hook: this process's clock made to run ahead by LOCKSTEP_TEST_TRACE_SKEW_NS and faster by
// LOCKSTEP_TEST_TRACE_DRIFT_PPM, as another host's clock would, so that a test on one machine
// proves the merge aligns ranks (tests/scripts/trace_timeline.sh). Unset: the steady clock.
struct TestClock {
  double skew_ns = 0, drift = 0;
  std::int64_t origin = 0;
  TestClock() {
    if (const char* s = std::getenv("LOCKSTEP_TEST_TRACE_SKEW_NS")) skew_ns = std::atof(s);
    if (const char* d = std::getenv("LOCKSTEP_TEST_TRACE_DRIFT_PPM")) drift = std::atof(d) * 1e-6;
  }
};
std::int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

std::int64_t now_ns() {
  static const TestClock test = [] {
    TestClock t;
    t.origin = steady_ns();
    return t;
  }();
  const std::int64_t t = steady_ns();
  if (test.skew_ns == 0 && test.drift == 0) return t;
  return t + static_cast<std::int64_t>(test.skew_ns +
                                       static_cast<double>(t - test.origin) * test.drift);
}

void start(std::size_t max_events) {
  std::lock_guard<std::mutex> lock(mutex);
  events.clear();
  limit = max_events;
  was_cut = false;
  detail::recording.store(true, std::memory_order_relaxed);
}

std::vector<Event> stop() {
  std::lock_guard<std::mutex> lock(mutex);
  detail::recording.store(false, std::memory_order_relaxed);
  return std::move(events);
}

bool cut() {
  std::lock_guard<std::mutex> lock(mutex);
  return was_cut;
}

void set_step(std::int64_t step) {
  current_step.store(step, std::memory_order_relaxed);
}

void complete(const std::string& track, const std::string& name, std::int64_t begin_ns,
              std::int64_t end_ns) {
  if (!on()) return;
  Event e{track, name, begin_ns, end_ns, current_step.load(std::memory_order_relaxed)};
  std::lock_guard<std::mutex> lock(mutex);
  if (!on()) return;
  if (events.size() >= limit) {
    detail::recording.store(false, std::memory_order_relaxed);
    was_cut = true;
    return;
  }
  events.push_back(std::move(e));
}

void instant(const std::string& track, const std::string& name) {
  if (on()) complete(track, name, now_ns(), -1);
}

}  // namespace lockstep::trace
