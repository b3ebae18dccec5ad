// CUDA-specific extras beyond ops.hpp: page-locked host buffers, the backend's counters in CUDA's
// terms and its allocator's cache. Declared only in CUDA builds (LOCKSTEP_HAVE_CUDA); layer code
// stays device-agnostic and needs none of this: the input stager, the section timer and the
// counters every device kind has are in ops/device_runtime.hpp.
#pragma once

#ifdef LOCKSTEP_HAVE_CUDA

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/core/tensor.hpp"
#include "lockstep/ops/context.hpp"

struct CUevent_st;  // cudaEvent_t without including cuda_runtime.h

namespace lockstep::ops::cuda {

// Page-locked host memory (cudaHostAlloc): host-to-device copies from it run asynchronously on
// the compute stream, overlapping the previous step's kernels. Invariant: the buffer is not
// written while a copy from it is in flight; wait() before refilling it. Move-only.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(std::size_t bytes);
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  // Blocks until every copy enqueued from this buffer has finished reading it.
  void wait();

 private:
  friend void copy_to_device_async(Context& ctx, PinnedBuffer& src, Tensor& dst);
  void release() noexcept;

  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  CUevent_st* last_copy_ = nullptr;  // recorded after the latest copy from this buffer
};

// Enqueues dst <- the first dst.nbytes() bytes of src on ctx's compute stream and returns at
// once; ops queued on ctx afterwards see the data.
void copy_to_device_async(Context& ctx, PinnedBuffer& src, Tensor& dst);

// Counters of the CUDA backend's host-side costs, over the process (all devices), for tests and
// the trainer's log records: both stay constant over a steady-state training step on a GPU,
// except for the reads the step asks for.
struct TransferStats {
  // Host-to-device copies from pageable host memory (Tensor::to, ops::copy and the backend's own
  // uploads from a host tensor or vector): each one is staged through a driver buffer, and
  // Tensor::to waits for the device first.
  std::uint64_t pageable_copies = 0;
  // Waits of the host for a device or a compute stream (cudaDeviceSynchronize,
  // cudaStreamSynchronize: synchronize(), reads of values, copies to the host). Waits for an
  // InputStager's or a PinnedBuffer's copy are not counted: they do not wait for compute.
  std::uint64_t host_syncs = 0;
};
TransferStats transfer_stats();

// The caching device allocator's counters for one device.
struct AllocatorStats {
  std::size_t bytes_in_use = 0;  // handed out to live tensors
  std::size_t peak_bytes_in_use = 0;
  std::size_t bytes_cached = 0;       // held by the cache, free for reuse
  std::size_t cuda_malloc_calls = 0;  // constant in a steady-state training loop
};
AllocatorStats allocator_stats(int device);
// "NVIDIA H200, sm_90, 139.8 GiB": for benchmark records and logs.
std::string device_description(int device);

// Returns every cached, unused block to the driver (cudaFree, which synchronises the device).
void release_cached_memory();

}  // namespace lockstep::ops::cuda

#endif  // LOCKSTEP_HAVE_CUDA
