// lockstep-bench pool: what one parallel region of the CPU ops costs on this machine, the
// median time of an empty fork-join of the ThreadPool every CPU Context runs its own loops on
// (ThreadPool::run with --threads threads), after the caller has run alone for 0, 20 and 100 us
// (back to back; as between a step's small ops; long enough for an idle core to go to sleep).
// An op split over the threads gains only where its one-thread time is several times this; where
// it is tens of microseconds (virtual machines whose idle vCPUs halt without polling), small ops
// get slower with more threads, and more ranks with fewer threads each are the better layout
// (docs/PERFORMANCE.md, "On a CPU with AMX").
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "bench.hpp"
#include "lockstep/core/error.hpp"
#include "lockstep/core/thread_pool.hpp"

namespace lockstep::bench {
namespace {

using Clock = std::chrono::steady_clock;

double micros_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

int run(const Args& args) {
  const int threads = static_cast<int>(args.get_int("threads", 2));
  const int reps = static_cast<int>(args.get_int("reps", 2000));
  LOCKSTEP_CHECK(threads >= 1, "--threads must be at least 1, got ", threads);
  LOCKSTEP_CHECK(reps >= 5, "--reps must be at least 5 (a median), got ", reps);
  ThreadPool pool(threads);
  const std::function<void(int, int)> empty = [](int, int) {};
  for (int i = 0; i < 100; ++i)  // warm-up: the workers exist and have run once
    pool.run(empty);
  std::string results;
  for (int gap_us : {0, 20, 100}) {
    std::vector<double> us;
    us.reserve(static_cast<std::size_t>(reps));
    for (int i = 0; i < reps; ++i) {
      const auto gap0 = Clock::now();
      while (micros_since(gap0) < gap_us) {
      }
      const auto t0 = Clock::now();
      pool.run(empty);
      us.push_back(micros_since(t0));
    }
    std::sort(us.begin(), us.end());
    const double med = median(us), p90 = us[us.size() * 9 / 10];
    std::fprintf(stderr,
                 "pool: %d threads, after %3d us alone: empty fork-join median %.1f us, "
                 "p90 %.1f us\n",
                 threads, gap_us, med, p90);
    results += str(results.empty() ? "" : ", ", "{\"gap_us\": ", gap_us, ", \"median_us\": ", med,
                   ", \"p90_us\": ", p90, "}");
  }
  write_output(args, str("{\"benchmark\": \"pool\", \"machine\": ", machine_json(),
                         ", \"threads\": ", threads, ", \"reps\": ", reps, ", \"results\": [",
                         results, "]}\n"));
  return 0;
}

}  // namespace

LOCKSTEP_BENCH("pool",
               "cost of one parallel region: an empty fork-join of the ops' thread pool "
               "(--threads=2 --reps=2000)",
               "reps threads", run);

}  // namespace lockstep::bench
