#include "lockstep/ops/context.hpp"

#include <algorithm>

#include "lockstep/core/error.hpp"
#include "lockstep/ops/backend.hpp"
#ifdef LOCKSTEP_HAVE_CUDA
#include "ops/cuda/stream_order.hpp"
#endif

namespace lockstep::ops {

Context::Context(Device device, int threads) : device_(device), threads_(threads) {
  LOCKSTEP_CHECK(threads >= 1, "a context needs at least one thread, got ", threads);
  if (device.is_cpu()) {
    pool_ = std::make_unique<ThreadPool>(threads);
    backend_ = make_cpu_backend(*this);
  } else {
#ifdef LOCKSTEP_HAVE_CUDA
    pool_ = std::make_unique<ThreadPool>(1);
    backend_ = make_cuda_backend(*this);
#else
    LOCKSTEP_FAIL_HINT("rebuild with the CUDA toolkit installed, or set device = cpu", "device ",
                       device.str(), " requested but this build has no CUDA backend");
#endif
  }
}

Context::~Context() = default;

void Context::synchronize() {
  backend_->synchronize();
}

void Context::wait_for(Context& producer) {
  if (&producer == this || producer.device().is_cpu()) return;
#ifdef LOCKSTEP_HAVE_CUDA
  if (device_.is_cpu()) {
    producer.synchronize();  // a CPU context cannot wait on a stream: the host waits
    return;
  }
  cuda::order_after(*this, producer);
#endif
}

void Context::set_precision(Precision p) {
  backend_->check_precision(p);
  precision_ = p;
}

std::string Context::precision_info() {
  return backend_->precision_info(precision_);
}

void Context::begin_reuse(const std::vector<Tensor>& unchanged) {
  reuse_.clear();  // keeps its capacity: no allocation per step
  for (const Tensor& t : unchanged) {
    if (t.defined()) reuse_.emplace_back(reinterpret_cast<std::uintptr_t>(t.raw_data()), t.numel());
  }
  std::sort(reuse_.begin(), reuse_.end());
  reuse_window_ = ++reuse_windows_opened_;
}

void Context::end_reuse() {
  reuse_.clear();
  reuse_window_ = 0;
}

std::uint64_t Context::reuse_id(const Tensor& t) const {
  if (reuse_window_ == 0 || !t.defined()) return 0;
  const std::pair<std::uintptr_t, std::int64_t> key(reinterpret_cast<std::uintptr_t>(t.raw_data()),
                                                    t.numel());
  return std::binary_search(reuse_.begin(), reuse_.end(), key) ? reuse_window_ : 0;
}

}  // namespace lockstep::ops
