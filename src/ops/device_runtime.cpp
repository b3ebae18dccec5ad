// The device-generic code over DeviceRuntime (include/lockstep/ops/device_runtime.hpp): the input
// stager, the section timer and the registry of device counters. It runs unchanged on the CUDA
// backend and on the emulated GPU, so the tests on the emulated device test it.
#include "lockstep/ops/device_runtime.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "lockstep/core/error.hpp"
#include "lockstep/core/trace.hpp"
#include "lockstep/ops/backend.hpp"

namespace lockstep::ops {
namespace {

constexpr std::size_t kKinds = 3;  // DeviceKind's values
std::atomic<DeviceCountersFn> g_counters[kKinds] = {};

DeviceRuntime& runtime_of(Context& ctx, const char* what) {
  DeviceRuntime* rt = ctx.backend().runtime();
  LOCKSTEP_CHECK(rt != nullptr, what, ": context on ", ctx.device().str(),
                 " has no device runtime (a CPU context needs none)");
  return *rt;
}

}  // namespace

DeviceCounters device_counters(Device device) {
  if (device.is_cpu()) return {};
  DeviceCountersFn fn = g_counters[static_cast<std::size_t>(device.kind)].load();
  return fn ? fn(device) : DeviceCounters{};
}

void set_device_counters(DeviceKind kind, DeviceCountersFn fn) {
  g_counters[static_cast<std::size_t>(kind)].store(fn);
}

// ---------------------------------------------------------------- InputStager
// One batch, in the order StagingRing gives:
//   1. host: wait for the slot's previous copy (batch k - 2), then memcpy the batch into the
//      slot's pinned buffers; the previous copy was enqueued a step ago, so this rarely waits;
//   2. compute stream: record the other slot's release event (all of batch k - 1's reads of it
//      are queued before whatever is queued next);
//   3. copy stream: wait for this slot's release event (recorded at batch k - 1's start, so
//      after batch k - 2's compute), copy each lane, record the slot's copy event;
//   4. compute stream: wait for the copy event; the ops of batch k read the slot after it.
// Slot memory comes from the caching allocator, whose blocks are safe to reuse in compute-stream
// order only: a block handed out now may still be read by compute work already queued, so the
// copy stream waits for all of it (now_) before its first copy into new device memory.

InputStager::InputStager(Context& ctx) : ctx_(ctx), rt_(runtime_of(ctx, "InputStager")) {
  copy_stream_ = rt_.create_stream();
  now_ = rt_.create_event(false);
  for (Slot& slot : slots_) {
    slot.copied = rt_.create_event(false);
    slot.released = rt_.create_event(false);
  }
}

InputStager::~InputStager() {
  // A copy may still be writing the slots' device memory or reading their pinned pages: let it
  // finish before both go back (the compute stream already waits for every copy it reads).
  rt_.destroy_stream(copy_stream_);
  for (Slot& slot : slots_) {
    rt_.destroy_event(slot.copied);
    rt_.destroy_event(slot.released);
    for (Lane& lane : slot.lanes)
      if (lane.pinned) rt_.free_pinned(lane.pinned);
  }
  rt_.destroy_event(now_);
}

std::vector<Tensor> InputStager::stage(const std::vector<Tensor>& host) {
  LOCKSTEP_CHECK(host.size() <= kMaxLanes, "InputStager: ", host.size(),
                 " tensors in one batch, at most ", kMaxLanes);
  for (const Tensor& t : host)
    LOCKSTEP_CHECK(t.device().is_cpu(), "InputStager: ", t.describe(), " is not a host tensor");
  DeviceRuntime::Stream compute = rt_.compute_stream();
  const StagingRing::Turn turn = ring_.next();
  Slot& slot = slots_[turn.slot];

  if (turn.wait_copy) rt_.host_wait(slot.copied);
  if (turn.record_release >= 0) rt_.record(slots_[turn.record_release].released, compute);
  if (turn.wait_release) rt_.wait(copy_stream_, slot.released);

  std::vector<Tensor> out;
  out.reserve(host.size());
  bool new_memory = false;
  for (std::size_t i = 0; i < host.size(); ++i) {
    const Tensor& src = host[i];
    Lane& lane = slot.lanes[i];
    if (lane.pinned_bytes < src.nbytes()) {
      // Its previous copy has finished (waited for above, or none yet).
      if (lane.pinned) rt_.free_pinned(lane.pinned);
      lane.pinned = rt_.alloc_pinned(src.nbytes());
      lane.pinned_bytes = src.nbytes();
    }
    if (!lane.device.defined() || lane.device.dtype() != src.dtype() ||
        lane.device.numel() < src.numel()) {
      lane.device =
          Tensor::empty({std::max<std::int64_t>(src.numel(), 1)}, src.dtype(), ctx_.device());
      new_memory = true;
    }
    if (src.nbytes() > 0) std::memcpy(lane.pinned, src.raw_data(), src.nbytes());
    out.push_back(lane.device.sub(0, src.shape()));
  }
  if (new_memory) {
    rt_.record(now_, compute);
    rt_.wait(copy_stream_, now_);
  }
  for (std::size_t i = 0; i < host.size(); ++i)
    if (out[i].nbytes() > 0)
      rt_.copy_async(out[i].raw_data(), slot.lanes[i].pinned, out[i].nbytes(), copy_stream_);
  rt_.record(slot.copied, copy_stream_);
  rt_.wait(compute, slot.copied);
  return out;
}

// ---------------------------------------------------------------- SectionTimer
// The elapsed time between two events of one stream is the time the stream took from the first
// to the second, idle gaps included: for compute, the device's time for the queued kernels (and
// for any input copy it waited for); for the wait for communication, how long the stream stood
// still until the gradients were complete. Events come from a pool: a steady state creates none.

StreamTraceSpan::StreamTraceSpan(Context& ctx, const char* track, std::string name) {
  if (!trace::on() || ctx.backend().runtime() == nullptr) return;
  rt_ = ctx.backend().runtime();
  stream_ = rt_->compute_stream();
  track_ = track;
  name_ = std::move(name);
  begin_ = std::make_shared<std::int64_t>(0);
  rt_->host_func(stream_, [begin = begin_] { *begin = trace::now_ns(); });
}

void StreamTraceSpan::end() {
  if (rt_ == nullptr) return;
  rt_->host_func(stream_, [begin = begin_, track = std::string(track_), name = std::move(name_)] {
    trace::complete(track, name, *begin, trace::now_ns());
  });
  rt_ = nullptr;
}

SectionTimer::SectionTimer(Context& ctx, int sections)
    : rt_(runtime_of(ctx, "SectionTimer")), sections_(sections) {}

SectionTimer::~SectionTimer() {
  auto destroy = [this](const std::vector<Mark>& marks) {
    for (const Mark& m : marks) {
      rt_.destroy_event(m.start);
      if (m.end) rt_.destroy_event(m.end);
    }
  };
  destroy(current_);
  for (const auto& step : pending_)
    destroy(step);
  for (DeviceRuntime::Event e : pool_)
    rt_.destroy_event(e);
}

DeviceRuntime::Event SectionTimer::event() {
  if (!pool_.empty()) {
    DeviceRuntime::Event e = pool_.back();
    pool_.pop_back();
    return e;
  }
  return rt_.create_event(true);  // with timing, unlike the ordering events
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
  DeviceRuntime::Event start = event();
  current_.push_back({section, start, nullptr});
  rt_.record(start, rt_.compute_stream());
}

void SectionTimer::end(int section) {
  LOCKSTEP_CHECK(
      !current_.empty() && current_.back().end == nullptr && current_.back().section == section,
      "SectionTimer: end(", section, ") without its begin");
  current_.back().end = event();
  rt_.record(current_.back().end, rt_.compute_stream());
}

std::vector<double> SectionTimer::collect() {
  drop_open_section();
  if (!current_.empty()) pending_.push_back(std::move(current_));
  current_.clear();
  std::vector<double> seconds(static_cast<std::size_t>(sections_), 0.0);
  std::size_t done = 0;
  for (; done < pending_.size(); ++done) {
    const std::vector<Mark>& step = pending_[done];
    // Events of one stream complete in order: the step is done when its last event is. A
    // backlog beyond kMaxPending (the host far ahead of the device) waits for the oldest.
    if (pending_.size() - done > kMaxPending) {
      rt_.host_wait(step.back().end);
      rt_.note_host_sync();
    } else if (!rt_.query(step.back().end)) {
      break;
    }
    for (const Mark& m : step) {
      seconds[static_cast<std::size_t>(m.section)] += rt_.elapsed_seconds(m.start, m.end);
      pool_.push_back(m.start);
      pool_.push_back(m.end);
    }
  }
  pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(done));
  return seconds;
}

}  // namespace lockstep::ops
