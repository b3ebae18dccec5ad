// The emulated GPU's runtime: what CUDA's runtime does for the CUDA backend, for a device whose
// kernels are the CPU's. It keeps the rules host code can break on a GPU, so that breaking them
// fails here too:
// - Device memory is not host-addressable. A device address is the host address with bit 62
//   set, a non-canonical address on x86-64 (and outside every AArch64 user range), so a host
//   dereference faults at once; the runtime translates it for the kernels it runs.
// - Work is asynchronous. Each stream is an in-order queue run by a worker thread of its own,
//   optionally slowed by a delay per task (LOCKSTEP_EMU_DELAY_US, set_delay_us), so host code
//   that reads without waiting reads stale data. Events mark points of a stream; a stream may
//   wait for another's event. An error in a task is kept by its stream (later kernels on it are
//   skipped, as a CUDA context's sticky error) and thrown by the next host wait.
// - Memory comes from a caching allocator whose blocks are reused in host order, as the CUDA
//   backend's: safe for work on one stream, a race for work on two unless events order them.
// - Copies follow CUDA's rules: from pinned memory they run on a stream; from pageable memory
//   the bytes are staged at the call and written later on the stream (or, for the synchronous
//   copy behind Tensor::to, on the device's legacy stream, which no other stream is ordered
//   after); copies to pageable memory wait.
// - The counters mean what the CUDA backend's mean (DeviceCounters).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "lockstep/ops/device_runtime.hpp"

namespace lockstep::ops::emu {

inline constexpr std::uintptr_t kDeviceTag = std::uintptr_t{1} << 62;

inline bool is_device_address(const void* p) {
  return (reinterpret_cast<std::uintptr_t>(p) & kDeviceTag) != 0;
}
// The host address behind a device address; host addresses pass through unchanged.
inline void* host_address(const void* p) {
  return reinterpret_cast<void*>(reinterpret_cast<std::uintptr_t>(p) & ~kDeviceTag);
}
inline void* device_address(void* host) {
  return reinterpret_cast<void*>(reinterpret_cast<std::uintptr_t>(host) | kDeviceTag);
}

// A host tensor over a device tensor's memory (device addresses translated), for the kernels the
// runtime runs; host and undefined tensors are returned as they are.
Tensor host_view(const Tensor& t);

// Microseconds each task waits before it runs, on every stream (0 by default). Tests raise it to
// make a missing wait visible.
void set_delay_us(int us);
int delay_us();

// An in-order queue of work run by one worker thread.
class Stream {
 public:
  // delay_factor: this stream's tasks wait that many times delay_us().
  Stream(int device, std::string name, int delay_factor = 1);
  ~Stream();  // runs what is queued, then stops
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  // A kernel: skipped once the stream has an error. Control tasks (event records and waits)
  // always run, so that no waiter hangs on a failed stream.
  void enqueue(std::function<void()> task, bool control = false);
  // The host waits until everything queued so far has run, then throws the stream's error, if
  // any (once: the error is cleared by reporting it).
  void synchronize();
  bool idle();
  int device() const { return device_; }
  const std::string& name() const { return name_; }

 private:
  struct Task {
    std::function<void()> run;
    bool control;
  };
  void work();

  const int device_;
  const std::string name_;
  const int delay_factor_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Task> queue_;
  std::uint64_t queued_ = 0, finished_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread worker_;
};

// The stream every copy_bytes() to a device is written on: CUDA's legacy default stream, to which
// the non-blocking streams of the backend are not ordered. Its tasks wait twice the delay, so
// that with a delay set, work queued on another stream after a copy runs before the copy's write
// unless something orders them: a missing order fails deterministically in tests.
Stream& legacy_stream(int device);
// The host waits for every stream of the device (cudaDeviceSynchronize).
void synchronize_device(int device);

// Registers the allocator, the synchronous copy and the counters with core and ops. Idempotent.
void register_hooks();
void note_host_sync();
void note_pageable_copy();
DeviceCounters counters(Device device);

// Page-locked host memory (the emulator's cudaHostAlloc): ordinary memory, but registered, so
// copies can tell it from pageable memory.
void* alloc_pinned(std::size_t bytes);
void free_pinned(void* p);
bool is_pinned(const void* p, std::size_t bytes);

// dst <- src on `stream`, with CUDA's rules for pinned and pageable host memory.
void copy_async(void* dst, const void* src, std::size_t bytes, Stream& stream);

// The DeviceRuntime of one emulated context, over its compute stream.
std::unique_ptr<DeviceRuntime> make_runtime(Stream& compute);

}  // namespace lockstep::ops::emu
