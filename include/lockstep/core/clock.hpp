// Wall-clock intervals for timings and cadences (steady: never jumps with the system clock).
#pragma once

#include <chrono>

namespace lockstep {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace lockstep
