// SectionTimer (include/lockstep/ops/cuda.hpp): CUDA events around sections of the compute
// stream. The elapsed time between two events of one stream is the time the stream took from
// the first to the second, idle gaps included: for compute, the device's time for the queued
// kernels (and for any input copy it waited for); for the wait for communication, how long the
// stream stood still until the gradients were complete. Events come from a pool, so a steady
// state creates none.
#include <algorithm>

#include "lockstep/ops/cuda.hpp"
#include "ops/cuda/check.hpp"
#include "ops/cuda/cuda_backend.hpp"

namespace lockstep::ops::cuda {

SectionTimer::SectionTimer(Context& ctx, int sections) : ctx_(ctx), sections_(sections) {
  LOCKSTEP_CHECK(ctx.device().is_cuda(), "SectionTimer: context on ", ctx.device().str(),
                 " is not a GPU's");
}

SectionTimer::~SectionTimer() {
  (void)cudaSetDevice(ctx_.device().index);
  auto destroy = [](const std::vector<Mark>& marks) {
    for (const Mark& m : marks) {
      (void)cudaEventDestroy(m.start);
      if (m.end) (void)cudaEventDestroy(m.end);
    }
  };
  destroy(current_);
  for (const auto& step : pending_)
    destroy(step);
  for (cudaEvent_t e : pool_)
    (void)cudaEventDestroy(e);
}

cudaEvent_t SectionTimer::event() {
  if (!pool_.empty()) {
    cudaEvent_t e = pool_.back();
    pool_.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  LOCKSTEP_CHECK_CUDA(cudaEventCreate(&e));  // with timing, unlike the ordering events
  return e;
}

// A section left open (an exception between begin and end) is not timed.
void SectionTimer::drop_open_section() {
  if (current_.empty() || current_.back().end != nullptr) return;
  pool_.push_back(current_.back().start);
  current_.pop_back();
}

void SectionTimer::begin(int section) {
  LOCKSTEP_CHECK(section >= 0 && section < sections_, "SectionTimer: section ", section, " of ",
                 sections_);
  drop_open_section();
  activate_device(ctx_.device().index);
  cudaEvent_t start = event();
  current_.push_back({section, start, nullptr});
  LOCKSTEP_CHECK_CUDA(cudaEventRecord(start, compute_stream(ctx_)));
}

void SectionTimer::end(int section) {
  LOCKSTEP_CHECK(
      !current_.empty() && current_.back().end == nullptr && current_.back().section == section,
      "SectionTimer: end(", section, ") without its begin");
  activate_device(ctx_.device().index);
  current_.back().end = event();
  LOCKSTEP_CHECK_CUDA(cudaEventRecord(current_.back().end, compute_stream(ctx_)));
}

std::vector<double> SectionTimer::collect() {
  drop_open_section();
  activate_device(ctx_.device().index);
  if (!current_.empty()) pending_.push_back(std::move(current_));
  current_.clear();
  std::vector<double> seconds(static_cast<std::size_t>(sections_), 0.0);
  std::size_t done = 0;
  for (; done < pending_.size(); ++done) {
    const std::vector<Mark>& step = pending_[done];
    // Events of one stream complete in order: the step is done when its last event is. A
    // backlog beyond kMaxPending (the host far ahead of the device) waits for the oldest.
    const bool must = pending_.size() - done > kMaxPending;
    if (must) {
      LOCKSTEP_CHECK_CUDA(cudaEventSynchronize(step.back().end));
      note_host_sync();
    } else {
      const cudaError_t state = cudaEventQuery(step.back().end);
      if (state == cudaErrorNotReady) {
        // Not an error, but the runtime may still keep it as the last one, where the next
        // LOCKSTEP_CHECK_LAUNCH would find it (PyTorch's caching allocator clears it too).
        (void)cudaGetLastError();
        break;
      }
      LOCKSTEP_CHECK_CUDA(state);
    }
    for (const Mark& m : step) {
      float ms = 0.0f;
      LOCKSTEP_CHECK_CUDA(cudaEventElapsedTime(&ms, m.start, m.end));
      seconds[static_cast<std::size_t>(m.section)] += static_cast<double>(ms) * 1e-3;
      pool_.push_back(m.start);
      pool_.push_back(m.end);
    }
  }
  pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(done));
  return seconds;
}

}  // namespace lockstep::ops::cuda
