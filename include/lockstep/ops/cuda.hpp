// CUDA-specific extras beyond ops.hpp: page-locked host buffers for input batches, the input
// stager that copies batches on a stream of its own, a timer of compute-stream sections on the
// device, and the backend's counters. Declared only in CUDA builds (LOCKSTEP_HAVE_CUDA); layer
// code stays device-agnostic and needs none of this.
#pragma once

#ifdef LOCKSTEP_HAVE_CUDA

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/core/tensor.hpp"
#include "lockstep/ops/context.hpp"
#include "lockstep/ops/staging_ring.hpp"

struct CUevent_st;   // cudaEvent_t without including cuda_runtime.h
struct CUstream_st;  // cudaStream_t

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

// Moves input batches (host tensors) to ctx's GPU through two slots of pinned host memory and
// device memory, copied on a stream of its own so that batch k's copy runs while batch k - 1
// computes (the ordering rules: ops/staging_ring.hpp). Slot memory is allocated by the first
// batches and grown only when a batch is bigger: in a steady state staging allocates nothing,
// copies nothing from pageable memory and never waits for the compute stream. The host waits only
// for the copy of batch k - 2, enqueued a whole step earlier. Not thread-safe: one per replica.
class InputStager {
 public:
  explicit InputStager(Context& ctx);
  ~InputStager();
  InputStager(const InputStager&) = delete;
  InputStager& operator=(const InputStager&) = delete;

  // Copies the host tensors of one batch (x, y, ...; at most kMaxLanes) to the device and returns
  // them there, same shapes and dtypes, readable by every op queued on ctx from now on. They stay
  // valid until the second stage() after this one: ops of this batch may be queued until then.
  std::vector<Tensor> stage(const std::vector<Tensor>& host);

  static constexpr std::size_t kMaxLanes = 4;

 private:
  struct Lane {
    PinnedBuffer pinned;
    Tensor device;  // 1-d, of the lane's dtype; its batches are views of its first elements
  };
  struct Slot {
    Lane lanes[kMaxLanes];
    CUevent_st* copied = nullptr;    // copy stream: the slot's latest copy has finished
    CUevent_st* released = nullptr;  // compute stream: the slot's latest reader has finished
  };

  Context& ctx_;
  CUstream_st* copy_stream_ = nullptr;
  CUevent_st* now_ = nullptr;  // compute stream, recorded when a slot's device memory is new
  Slot slots_[StagingRing::kSlots];
  StagingRing ring_;
};

// Device time of sections of a context's compute stream (compute, the wait for communication),
// per step, measured with CUDA events and read without synchronising: a step's times become
// available once the stream has passed its last event, which collect() asks of the driver
// (cudaEventQuery) and never waits for, unless more than kMaxPending steps are outstanding.
// Wall-clock timing on the host would measure only how fast work is queued.
class SectionTimer {
 public:
  SectionTimer(Context& ctx, int sections);
  ~SectionTimer();
  SectionTimer(const SectionTimer&) = delete;
  SectionTimer& operator=(const SectionTimer&) = delete;

  // Records the start and the end of a section of the current step on the compute stream; a
  // section may run several times a step (micro-steps): its times add up. A section begun and
  // never ended (an exception in between) is dropped.
  void begin(int section);
  void end(int section);
  // Closes the current step and returns the seconds per section of the closed steps the stream
  // has finished, summed, forgetting them; steps still running stay for a later call.
  std::vector<double> collect();

  static constexpr std::size_t kMaxPending = 4;

 private:
  struct Mark {
    int section;
    CUevent_st* start;
    CUevent_st* end;
  };
  CUevent_st* event();  // from the pool, else new
  void drop_open_section();

  Context& ctx_;
  int sections_;
  std::vector<Mark> current_;               // this step's sections, in order
  std::vector<std::vector<Mark>> pending_;  // closed steps, oldest first
  std::vector<CUevent_st*> pool_;
};

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
