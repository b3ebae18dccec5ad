// The CUDA backend's DeviceRuntime (ops/device_runtime.hpp): thin wrappers of the CUDA runtime
// over one context's compute stream. The code that orders work with them (the input stager, the
// section timer, Context::wait_for) is device-generic and is tested on the emulated GPU.
#include <cuda_runtime.h>

#include <functional>
#include <memory>

#include "lockstep/ops/device_runtime.hpp"
#include "ops/cuda/check.hpp"
#include "ops/cuda/cuda_backend.hpp"

namespace lockstep::ops::cuda {
namespace {

cudaStream_t as_stream(DeviceRuntime::Stream s) {
  return reinterpret_cast<cudaStream_t>(s);
}
cudaEvent_t as_event(DeviceRuntime::Event e) {
  return reinterpret_cast<cudaEvent_t>(e);
}
DeviceRuntime::Stream handle(cudaStream_t s) {
  return reinterpret_cast<DeviceRuntime::Stream>(s);
}
DeviceRuntime::Event handle(cudaEvent_t e) {
  return reinterpret_cast<DeviceRuntime::Event>(e);
}

class CudaRuntime final : public DeviceRuntime {
 public:
  CudaRuntime(int device, cudaStream_t compute) : device_(device), compute_(compute) {}

  Stream compute_stream() override { return handle(compute_); }
  Stream create_stream() override {
    activate_device(device_);
    cudaStream_t s = nullptr;
    LOCKSTEP_CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return handle(s);
  }
  void destroy_stream(Stream s) override {
    // Called from destructors: wait, then release, reporting nothing.
    (void)cudaSetDevice(device_);
    (void)cudaStreamSynchronize(as_stream(s));
    (void)cudaStreamDestroy(as_stream(s));
  }
  Event create_event(bool timing) override {
    activate_device(device_);
    cudaEvent_t e = nullptr;
    LOCKSTEP_CHECK_CUDA(
        cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
    return handle(e);
  }
  void destroy_event(Event e) override { (void)cudaEventDestroy(as_event(e)); }
  void record(Event e, Stream s) override {
    // An event must be recorded on a stream of its own device; a stream may wait for an event of
    // another device.
    activate_device(device_);
    LOCKSTEP_CHECK_CUDA(cudaEventRecord(as_event(e), as_stream(s)));
  }
  void wait(Stream s, Event e) override {
    LOCKSTEP_CHECK_CUDA(cudaStreamWaitEvent(as_stream(s), as_event(e), 0));
  }
  void host_wait(Event e) override { LOCKSTEP_CHECK_CUDA(cudaEventSynchronize(as_event(e))); }
  void host_wait(Stream s) override { LOCKSTEP_CHECK_CUDA(cudaStreamSynchronize(as_stream(s))); }
  bool query(Event e) override {
    const cudaError_t state = cudaEventQuery(as_event(e));
    if (state == cudaErrorNotReady) {
      // Not an error, but the runtime may still keep it as the last one, where the next
      // LOCKSTEP_CHECK_LAUNCH would find it (PyTorch's caching allocator clears it too).
      (void)cudaGetLastError();
      return false;
    }
    LOCKSTEP_CHECK_CUDA(state);
    return true;
  }
  double elapsed_seconds(Event start, Event end) override {
    float ms = 0.0f;
    LOCKSTEP_CHECK_CUDA(cudaEventElapsedTime(&ms, as_event(start), as_event(end)));
    return static_cast<double>(ms) * 1e-3;
  }
  void* alloc_pinned(std::size_t bytes) override {
    void* p = nullptr;
    // Portable: usable from every device's context, so one loader can feed any replica.
    LOCKSTEP_CHECK_CUDA(cudaHostAlloc(&p, bytes > 0 ? bytes : 1, cudaHostAllocPortable));
    return p;
  }
  void free_pinned(void* p) override { (void)cudaFreeHost(p); }
  void copy_async(void* dst, const void* src, std::size_t bytes, Stream s) override {
    activate_device(device_);
    LOCKSTEP_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, as_stream(s)));
  }
  void note_host_sync() override { cuda::note_host_sync(); }
  void host_func(Stream s, std::function<void()> fn) override {
    auto* heap = new std::function<void()>(std::move(fn));
    const cudaError_t rc = cudaLaunchHostFunc(
        as_stream(s),
        [](void* p) {
          std::unique_ptr<std::function<void()>> f(static_cast<std::function<void()>*>(p));
          (*f)();
        },
        heap);
    if (rc != cudaSuccess) delete heap;
    LOCKSTEP_CHECK_CUDA(rc);
  }

 private:
  int device_;
  cudaStream_t compute_;
};

}  // namespace

std::unique_ptr<DeviceRuntime> make_runtime(int device, cudaStream_t compute) {
  return std::make_unique<CudaRuntime>(device, compute);
}

}  // namespace lockstep::ops::cuda
