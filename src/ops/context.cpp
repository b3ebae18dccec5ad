#include "lockstep/ops/context.hpp"

#include <algorithm>

#include "lockstep/core/error.hpp"
#include "lockstep/ops/backend.hpp"
#include "lockstep/ops/device_runtime.hpp"

namespace lockstep::ops {

Context::Context(Device device, int threads) : device_(device), threads_(threads) {
  LOCKSTEP_CHECK(threads >= 1 && threads <= kMaxCpuThreads, "a context needs 1 to ", kMaxCpuThreads,
                 " threads, got ", threads);
  if (device.is_cpu()) {
    pool_ = std::make_unique<ThreadPool>(threads);
    backend_ = make_cpu_backend(*this);
  } else if (device.is_emu()) {
    LOCKSTEP_CHECK_HINT(device.index >= 0 && device.index < emu_device_count(),
                        "use emu:0 to emu:N-1, with N from LOCKSTEP_EMU_DEVICES (default 8)",
                        "device ", device.str(), " requested but this process has ",
                        emu_device_count(), " emulated devices");
    pool_ = std::make_unique<ThreadPool>(1);
#ifdef LOCKSTEP_HAVE_EMU
    backend_ = make_emu_backend(*this);
#endif
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
  DeviceRuntime* from = producer.backend().runtime();
  if (&producer == this || from == nullptr) return;
  DeviceRuntime* to = backend_->runtime();
  if (to == nullptr || producer.device().kind != device_.kind) {
    producer.synchronize();  // a CPU context cannot wait on a stream: the host waits
    return;
  }
  // A fresh event per call: cheap next to the copies it orders, and no state shared between
  // threads (each DataParallel replica's thread may order itself after the master concurrently).
  // Destroying it at once is allowed: the wait already holds the recorded point.
  DeviceRuntime::Event event = from->create_event(false);
  from->record(event, from->compute_stream());
  to->wait(to->compute_stream(), event);
  from->destroy_event(event);
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

Tensor Context::transient(const Shape& shape, DType dtype) {
  const std::int64_t n = shape_numel(shape);
  Tensor* best = nullptr;
  for (Tensor& b : transients_) {
    // Only this list holds a free buffer; views share its storage and count. A buffer more than
    // twice the size asked for stays free for a larger request (a small result in a large buffer
    // makes the next large one allocate).
    if (b.storage().use_count() != 1 || b.dtype() != dtype || b.numel() < n ||
        b.numel() > 2 * std::max<std::int64_t>(n, 1))
      continue;
    if (!best || b.numel() < best->numel()) best = &b;
  }
  if (!best) {
    transients_.push_back(Tensor::empty({std::max<std::int64_t>(n, 1)}, dtype, device_));
    best = &transients_.back();
  }
  return best->sub(0, shape);
}

std::size_t Context::transient_bytes() const {
  std::size_t bytes = 0;
  for (const Tensor& b : transients_)
    bytes += b.nbytes();
  return bytes;
}

}  // namespace lockstep::ops
