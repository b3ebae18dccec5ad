// log.trace: a Chrome trace (the JSON that Perfetto's UI and chrome://tracing open) of a window of
// optimizer steps (log.trace_steps = A:B), every rank's events merged by rank 0 onto its clock.
// Clock offsets are measured over the control communicator at the window's start and end (a
// broadcast from rank 0 and an allgather back bound each rank's offset to an interval; rounds are
// intersected) and interpolated linearly between them, so clock drift is corrected; the residual
// (half the narrowest interval) is written into the file as clock_residual_us.
// One process track per rank ("rank R on HOST"), one thread track per trace::Event track.
#pragma once

#include <cstdint>
#include <string>

#include "lockstep/comm/communicator.hpp"

namespace lockstep::train {

// The trace window: steps [first, last], 1-based optimizer steps.
struct TraceSteps {
  std::int64_t first = 0, last = 0;
};
// "A:B" (A <= B, both >= 1), an error naming log.trace_steps otherwise.
TraceSteps parse_trace_steps(const std::string& text);

// Events a rank may record in one window before the window is cut (with a warning): about 120
// bytes each in the file, so the file stays under ~120 MB per rank at the default.
constexpr std::int64_t kTraceMaxEventsPerRank = 1'000'000;

class TraceWindow {
 public:
  TraceWindow() = default;  // off
  // `path` is truncated now on rank 0 (an unwritable path fails here, before training).
  TraceWindow(comm::Communicator& comm, std::string path, TraceSteps steps);
  bool enabled() const { return comm_ != nullptr; }

  // Collective when a window boundary is reached (every rank calls both at every step).
  void before_step(std::int64_t step);  // `step` is about to run
  // `step` has run: after the window's last step writes the file and returns true (note() says
  // where).
  bool after_step(std::int64_t step);
  // Whether after_step(step) or finish(step) would write the window now: a device whose loop
  // never waits for it must be drained first, so that its stream's spans are recorded.
  bool closes_at(std::int64_t step) const { return open_ && step >= steps_.last; }
  bool open() const { return open_; }
  // The run ends: a window still open is written (cut short). Returns a message for the log
  // ("" when nothing to say).
  std::string finish(std::int64_t step);
  const std::string& note() const { return note_; }

 private:
  struct Offset {
    double lo = 0, hi = 0;  // this rank's clock minus rank 0's, ns: within [lo, hi]
  };
  std::vector<Offset> measure_offsets();
  void write(std::int64_t last_step);

  comm::Communicator* comm_ = nullptr;
  std::string path_;
  TraceSteps steps_;
  bool open_ = false;
  std::int64_t start_ns_ = 0;  // rank 0's clock at the window's start
  std::vector<Offset> start_offsets_;
  std::string note_;
};

}  // namespace lockstep::train
