// DeviceRuntime: the asynchronous machinery of an accelerator as CUDA's runtime shapes it —
// streams that run work in order, events that mark a point of a stream, page-locked host memory
// and copies from it that run on a stream — behind one interface, so that the code above the
// kernels that orders work (the input stager, the section timer, Context::wait_for, the
// communicators) is written once and runs on every device kind: on the CUDA backend, and on the
// emulated GPU (src/ops/emu) on machines without one. A CPU context has no runtime (nullptr).
//
// The rules are CUDA's: work queued on one stream runs in order; two streams are unordered unless
// one waits for an event of the other; the host sees a result only after it waited for it. Every
// wait of the host for queued compute is counted (device_counters), as are copies from pageable
// host memory and device allocations that reach the driver.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/core/device.hpp"
#include "lockstep/core/tensor.hpp"
#include "lockstep/ops/context.hpp"
#include "lockstep/ops/staging_ring.hpp"

namespace lockstep::ops {

class DeviceRuntime {
 public:
  // Opaque handles (a cudaStream_t or cudaEvent_t, or the emulator's): two types, so that a
  // stream cannot be passed where an event is meant.
  struct StreamHandle;
  struct EventHandle;
  using Stream = StreamHandle*;
  using Event = EventHandle*;

  virtual ~DeviceRuntime() = default;
  // The stream every op of this runtime's context runs on.
  virtual Stream compute_stream() = 0;
  virtual Stream create_stream() = 0;         // non-blocking, as the compute stream
  virtual void destroy_stream(Stream s) = 0;  // waits for its work first
  virtual Event create_event(bool timing) = 0;
  virtual void destroy_event(Event e) = 0;
  // Marks the point of `s` reached by the work queued on it so far.
  virtual void record(Event e, Stream s) = 0;
  // Work queued on `s` from now on starts after the last recorded point of `e`; the host goes on.
  virtual void wait(Stream s, Event e) = 0;
  // The host waits for the last recorded point of `e`. Not counted as a host sync: callers that
  // wait for compute count it themselves (note_host_sync).
  virtual void host_wait(Event e) = 0;
  virtual void host_wait(Stream s) = 0;
  // True when the last recorded point of `e` has passed; never waits.
  virtual bool query(Event e) = 0;
  // Seconds between two passed points of timing events of one stream.
  virtual double elapsed_seconds(Event start, Event end) = 0;
  // Page-locked host memory: copies from it run asynchronously on a stream.
  virtual void* alloc_pinned(std::size_t bytes) = 0;
  virtual void free_pinned(void* p) = 0;
  // dst <- src on `s` (host<->device or device<->device); from pinned memory it returns at once.
  virtual void copy_async(void* dst, const void* src, std::size_t bytes, Stream s) = 0;
  virtual void note_host_sync() = 0;
  // Runs fn on the host when `s` reaches this point; work queued on `s` after it waits for fn to
  // return (cudaLaunchHostFunc). fn must not queue work on any stream.
  virtual void host_func(Stream s, std::function<void()> fn) = 0;
  // A host tensor over t's memory, for host code that runs in stream order (host_func): the
  // emulated device's memory is host memory behind its device addresses; a GPU's is not, and
  // this returns an undefined tensor.
  virtual Tensor host_view(const Tensor& t) {
    (void)t;
    return Tensor();
  }
};

// Counters of a device kind's host-side costs, over the process, for tests and the trainer's log
// records: all stay constant over a steady-state training step, except for the reads the step
// asks for. All zero for the CPU.
struct DeviceCounters {
  // Host waits for a device or a compute stream (synchronize(), reads of values, copies to the
  // host). Waits for staged input copies are not counted: they do not wait for compute.
  std::uint64_t host_syncs = 0;
  // Host-to-device copies from pageable host memory (Tensor::to, ops::copy, uploads of a host
  // vector): each is staged through a driver buffer.
  std::uint64_t pageable_copies = 0;
  // Allocations that reached the driver (cudaMalloc): the caching allocator serves the rest.
  std::uint64_t device_mallocs = 0;
};
DeviceCounters device_counters(Device device);
using DeviceCountersFn = DeviceCounters (*)(Device);
// Called by a device backend when it starts (one function per device kind).
void set_device_counters(DeviceKind kind, DeviceCountersFn fn);

// Moves input batches (host tensors) to ctx's device through two slots of pinned host memory
// and device memory, copied on a stream of its own so that batch k's copy runs while batch k - 1
// computes (the ordering rules: ops/staging_ring.hpp). Slot memory is allocated by the first
// batches and grown only when a batch is bigger: in a steady state staging allocates nothing,
// copies nothing from pageable memory and never waits for the compute stream. The host waits only
// for the copy of batch k - 2, enqueued a whole step earlier. Not thread-safe: one per replica.
class InputStager {
 public:
  // Throws when ctx has no device runtime (a CPU context needs no staging).
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
    void* pinned = nullptr;
    std::size_t pinned_bytes = 0;
    Tensor device;  // 1-d, of the lane's dtype; its batches are views of its first elements
  };
  struct Slot {
    Lane lanes[kMaxLanes];
    DeviceRuntime::Event copied = nullptr;    // copy stream: the slot's latest copy has finished
    DeviceRuntime::Event released = nullptr;  // compute stream: its latest reader has finished
  };

  Context& ctx_;
  DeviceRuntime& rt_;
  DeviceRuntime::Stream copy_stream_ = nullptr;
  DeviceRuntime::Event now_ = nullptr;  // compute stream, recorded when slot memory is new
  Slot slots_[StagingRing::kSlots];
  StagingRing ring_;
};

// log.trace on a device: a span on the trace's clock (core/trace.hpp) from when ctx's compute
// stream reaches the constructor to when it reaches end(), taken by host functions in stream
// order. Each holds the stream for the callback's few microseconds, so spans are made only while a
// trace window records (off, the constructor is one relaxed load); on a CPU context, none.
class StreamTraceSpan {
 public:
  StreamTraceSpan(Context& ctx, const char* track, std::string name);
  ~StreamTraceSpan() { end(); }
  StreamTraceSpan(const StreamTraceSpan&) = delete;
  StreamTraceSpan& operator=(const StreamTraceSpan&) = delete;
  void end();

 private:
  DeviceRuntime* rt_ = nullptr;  // null: not recording
  DeviceRuntime::Stream stream_ = nullptr;
  const char* track_ = nullptr;
  std::string name_;
  std::shared_ptr<std::int64_t> begin_;
};

// Device time of sections of a context's compute stream (compute, the wait for communication),
// per step, measured with timing events and read without synchronising: a step's times become
// available once the stream has passed its last event, which collect() asks (query) and never
// waits for, unless more than kMaxPending steps are outstanding. Wall-clock timing on the host
// would measure only how fast work is queued.
class SectionTimer {
 public:
  SectionTimer(Context& ctx, int sections);  // throws when ctx has no device runtime
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
    DeviceRuntime::Event start;
    DeviceRuntime::Event end;
  };
  DeviceRuntime::Event event();  // from the pool, else new
  void drop_open_section();

  DeviceRuntime& rt_;
  int sections_;
  std::vector<Mark> current_;               // this step's sections, in order
  std::vector<std::vector<Mark>> pending_;  // closed steps, oldest first
  std::vector<DeviceRuntime::Event> pool_;
};

}  // namespace lockstep::ops
