// Context: everything one replica needs to run ops on its device: the device, a thread pool (CPU)
// or a compute stream with cuBLAS/cuDNN handles (CUDA), and the backend that owns the kernels.
// One Context per replica and per thread; two Contexts may run ops concurrently from two threads
// (the DataParallel baseline does), so nothing here is process-global.
#pragma once

#include <cstdint>
#include <memory>

#include "lockstep/core/device.hpp"
#include "lockstep/core/thread_pool.hpp"

namespace lockstep::ops {

class Backend;

// Threads per CPU replica when nothing else is said: 1, so that `ranks x threads <= cores`
// holds by default under mpirun -np <cores>. Single-rank runs set it from the config.
inline constexpr int kDefaultCpuThreads = 1;

class Context {
 public:
  explicit Context(Device device = Device::cpu(), int threads = kDefaultCpuThreads);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  Device device() const { return device_; }
  int threads() const { return threads_; }
  Backend& backend() { return *backend_; }
  ThreadPool& pool() { return *pool_; }
  // Waits until all work queued on this context has finished (no-op on the CPU).
  void synchronize();
  // Orders this context after `producer`: work queued here from now on starts only after all
  // work queued on `producer` so far has finished, without blocking the host when both are on
  // GPUs (an event on producer's stream that this stream waits for). Needed whenever one context
  // reads what another wrote, e.g. DataParallel replicas reading the master's fresh weights.
  // A no-op when producer is a CPU context (CPU ops are done when they return).
  void wait_for(Context& producer);

 private:
  Device device_;
  int threads_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<Backend> backend_;
};

}  // namespace lockstep::ops
