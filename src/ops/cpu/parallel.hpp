// Fork-join helpers over a Context's ThreadPool for the CPU kernels. They pass the pool a lambda
// that captures a single pointer, so std::function keeps it in its small buffer and a call does
// not touch the heap.
#pragma once

#include <algorithm>
#include <cstdint>

#include "lockstep/core/thread_pool.hpp"

// Elementwise outputs may be the same tensor as an input (in place: relu_backward into dy,
// axpy, optimizer updates), never a partially overlapping view. GCC's runtime alias check
// treats exact aliasing as overlap and falls back to scalar code, so the loops that allow it
// say there is no loop-carried dependence.
#if defined(__GNUC__) && !defined(__clang__)
#define LOCKSTEP_IVDEP _Pragma("GCC ivdep")
#else
#define LOCKSTEP_IVDEP
#endif

namespace lockstep::ops::cpu {

// Runs f(begin, end) on contiguous ranges covering [0, n): one range per pool thread when there
// are at least `grain` items per thread, else f(0, n) on the calling thread. Use only where the
// result does not depend on how [0, n) is cut (elementwise work, disjoint outputs).
template <class F>
void parallel_range(ThreadPool& pool, std::int64_t n, std::int64_t grain, const F& f) {
  if (n <= 0) return;
  std::int64_t parts = std::min<std::int64_t>(pool.size(), n / std::max<std::int64_t>(grain, 1));
  if (parts <= 1) {
    f(std::int64_t{0}, n);
    return;
  }
  struct Job {
    const F* f;
    std::int64_t n, parts;
  } job{&f, n, parts};
  const Job* jp = &job;
  pool.run([jp](int part, int) {
    if (part >= jp->parts) return;
    std::int64_t begin = jp->n * part / jp->parts, end = jp->n * (part + 1) / jp->parts;
    if (begin < end) (*jp->f)(begin, end);
  });
}

// Like parallel_range but the range is cut at multiples of `align` (e.g. 4 for Philox blocks,
// or a cache line of floats), the last part taking the remainder.
template <class F>
void parallel_range_aligned(ThreadPool& pool, std::int64_t n, std::int64_t grain,
                            std::int64_t align, const F& f) {
  std::int64_t units = (n + align - 1) / align;
  parallel_range(pool, units, std::max<std::int64_t>(grain / align, 1),
                 [&](std::int64_t ub, std::int64_t ue) { f(ub * align, std::min(ue * align, n)); });
}

}  // namespace lockstep::ops::cpu
