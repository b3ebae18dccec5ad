#include "lockstep/ops/context.hpp"

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

}  // namespace lockstep::ops
