// The run's timeline recorder (log.trace): named spans and instants on named tracks of this
// process, recorded only while a window of steps is traced. Every layer records through it (data
// wait in train/, each bucket's readiness in parallel/, each collective on the communication thread
// in comm/, forward and backward in nn/ and parallel/); train/trace_file.hpp merges the ranks onto
// one clock and writes the Chrome trace. Off, a span costs one relaxed atomic load; on, one
// steady-clock read at each end and an append under a mutex (a step records tens to hundreds of
// events, far below the step's own work).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace lockstep::trace {

// One event: a span [begin_ns, end_ns] or, with end_ns < 0, an instant at begin_ns. Times are
// this process's steady clock (trace::now_ns), which the merge maps onto rank 0's.
struct Event {
  std::string track;  // a thread track in the viewer: "data", "compute", "comm", ...
  std::string name;
  std::int64_t begin_ns = 0, end_ns = -1;
  std::int64_t step = 0;  // the optimizer step it belongs to
};

namespace detail {
extern std::atomic<bool> recording;
}

inline bool on() {
  return detail::recording.load(std::memory_order_relaxed);
}
std::int64_t now_ns();

// Starts recording (clears what an earlier window left), at most `max_events` events: recording
// stops by itself at the limit and cut() says so. stop() ends it and hands the events over.
void start(std::size_t max_events);
std::vector<Event> stop();
bool cut();
// The step later events belong to (set by the training loop).
void set_step(std::int64_t step);

void complete(const std::string& track, const std::string& name, std::int64_t begin_ns,
              std::int64_t end_ns);
void instant(const std::string& track, const std::string& name);

// A span from construction to destruction, when recording at construction.
class Span {
 public:
  Span(const char* track, std::string name) {
    if (on()) {
      track_ = track;
      name_ = std::move(name);
      begin_ = now_ns();
    }
  }
  ~Span() { end(); }
  // Ends the span before the scope does.
  void end() {
    if (track_) complete(track_, name_, begin_, now_ns());
    track_ = nullptr;
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  const char* track_ = nullptr;
  std::string name_;
  std::int64_t begin_ = 0;
};

}  // namespace lockstep::trace
