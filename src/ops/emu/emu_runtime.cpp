// The emulated GPU's runtime (emu_runtime.hpp): streams, events, memory, copies and counters.
#include "ops/emu/emu_runtime.hpp"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <unordered_map>
#include <vector>

#include "lockstep/core/allocator.hpp"
#include "lockstep/core/error.hpp"

namespace lockstep::ops::emu {
namespace {

using Clock = std::chrono::steady_clock;

std::atomic<int> g_delay_us{[] {
  const char* text = std::getenv("LOCKSTEP_EMU_DELAY_US");
  return text && *text ? std::atoi(text) : 0;
}()};

std::atomic<std::uint64_t> g_host_syncs{0}, g_pageable_copies{0};

// ---------------------------------------------------------------- devices and their streams

struct DeviceState {
  std::mutex mutex;  // guards streams
  std::set<Stream*> streams;
  std::once_flag legacy_once;
  std::unique_ptr<Stream> legacy;
};

DeviceState& device_state(int device) {
  // Leaked on purpose: streams of static objects may outlive static destruction order.
  static std::mutex mutex;
  static auto* devices = new std::map<int, std::unique_ptr<DeviceState>>();
  std::lock_guard<std::mutex> lock(mutex);
  auto& d = (*devices)[device];
  if (!d) d = std::make_unique<DeviceState>();
  return *d;
}

// ---------------------------------------------------------------- memory

class CachingAllocator final : public Allocator {
 public:
  void* allocate(std::size_t bytes) override { return allocate_on(Device::emu(0), bytes); }

  void* allocate_on(Device where, std::size_t bytes) override {
    // The CUDA backend's rounding (512 bytes, 2 MiB from 1 MiB on) and reuse slack: the same
    // blocks are cached, so the same steady state allocates nothing.
    const std::size_t unit = bytes >= (std::size_t{1} << 20) ? (std::size_t{2} << 20) : 512;
    std::size_t size = (std::max<std::size_t>(bytes, 1) + unit - 1) / unit * unit;
    std::lock_guard<std::mutex> lock(mutex_);
    Cache& cache = caches_[where.index];
    void* host = nullptr;
    auto it = cache.free.lower_bound(size);
    if (it != cache.free.end() && it->first <= size * 2) {
      size = it->first;
      host = it->second;
      cache.free.erase(it);
    } else {
      host = std::aligned_alloc(512, size);
      if (!host)
        LOCKSTEP_FAIL_HINT_TYPE(OutOfMemory, "reduce the batch size or the model",
                                "out of memory on ", where.str(), ": cannot allocate ",
                                format_bytes(static_cast<double>(bytes)));
      ++cache.mallocs;
    }
    void* ptr = device_address(host);
    live_[ptr] = Block{where.index, size, bytes, host};
    in_use_ += bytes;
    peak_ = std::max(peak_, in_use_);
    return ptr;
  }

  void deallocate(void* ptr, std::size_t) override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(ptr);
    if (it == live_.end()) return;
    caches_[it->second.device].free.emplace(it->second.size, it->second.host);
    in_use_ -= it->second.requested;
    live_.erase(it);
  }

  std::size_t bytes_in_use() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return in_use_;
  }
  std::size_t peak_bytes_in_use() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return peak_;
  }
  void reset_peak_bytes() override {
    std::lock_guard<std::mutex> lock(mutex_);
    peak_ = in_use_;
  }
  std::uint64_t mallocs(int device) const {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = caches_.find(device);
    return it == caches_.end() ? 0 : it->second.mallocs;
  }

 private:
  // Blocks are kept by their host addresses too: leak checkers (LeakSanitizer) look for those,
  // and would take every cached block for a leak if only its device address were stored.
  struct Block {
    int device;
    std::size_t size, requested;
    void* host;
  };
  struct Cache {
    std::multimap<std::size_t, void*> free;  // host addresses
    std::uint64_t mallocs = 0;
  };
  mutable std::mutex mutex_;
  std::unordered_map<void*, Block> live_;
  std::map<int, Cache> caches_;
  std::size_t in_use_ = 0, peak_ = 0;
};

// Leaked on purpose, as the CUDA backend's: tensors in static storage may be freed after main.
CachingAllocator& caching_allocator() {
  static auto* allocator = new CachingAllocator();
  return *allocator;
}

std::mutex g_pinned_mutex;
std::map<std::uintptr_t, std::size_t>& pinned_ranges() {
  static auto* ranges = new std::map<std::uintptr_t, std::size_t>();
  return *ranges;
}

// core's copy_bytes contract is "synchronous": when it returns, any later op on any stream sees
// the bytes. As the CUDA backend's synchronous_copy: first the devices finish their queued work
// (the source may have been written by a kernel still queued); then the copy, as cudaMemcpy does
// it. From pageable memory cudaMemcpy returns once the bytes are staged and writes them on the
// legacy stream, which the non-blocking compute streams are not ordered after; so the copy is
// waited for before returning.
void synchronous_copy(Device dst_device, void* dst, Device src_device, const void* src,
                      std::size_t bytes) {
  for (Device d : {src_device, dst_device}) {
    if (!d.is_emu()) continue;
    synchronize_device(d.index);
    note_host_sync();
  }
  if (src_device.is_cpu() && dst_device.is_emu()) {
    note_pageable_copy();
    auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src),
                                                      static_cast<const char*>(src) + bytes);
    Stream& legacy = legacy_stream(dst_device.index);
    legacy.enqueue(
        [dst, staged] { std::memcpy(host_address(dst), staged->data(), staged->size()); });
    legacy.synchronize();
    note_host_sync();
    return;
  }
  std::memcpy(host_address(dst), host_address(src), bytes);
}

// ---------------------------------------------------------------- events

struct Signal {
  std::mutex mutex;
  std::condition_variable done_cv;
  bool done = false;
  Clock::time_point at;

  void set() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      at = Clock::now();
      done = true;
    }
    done_cv.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mutex);
    done_cv.wait(lock, [this] { return done; });
  }
  bool passed() {
    std::lock_guard<std::mutex> lock(mutex);
    return done;
  }
};

// An event is the signal of its latest record: a stream that waits holds that signal, so a later
// record (or destroying the event) does not change what it waits for, as in CUDA.
struct Event {
  std::shared_ptr<Signal> latest;
};

class Runtime final : public DeviceRuntime {
 public:
  explicit Runtime(emu::Stream& compute) : compute_(compute) {}

  Stream compute_stream() override { return handle(&compute_); }
  Stream create_stream() override {
    return handle(new emu::Stream(compute_.device(), compute_.name() + "/side"));
  }
  void destroy_stream(Stream s) override { delete as_stream(s); }
  Event create_event(bool) override { return handle(new emu::Event()); }
  void destroy_event(Event e) override { delete as_event(e); }

  void record(Event e, Stream s) override {
    auto signal = std::make_shared<Signal>();
    as_event(e)->latest = signal;
    as_stream(s)->enqueue([signal] { signal->set(); }, true);
  }
  void wait(Stream s, Event e) override {
    std::shared_ptr<Signal> signal = as_event(e)->latest;
    if (signal) as_stream(s)->enqueue([signal] { signal->wait(); }, true);
  }
  void host_wait(Event e) override {
    if (const std::shared_ptr<Signal>& signal = as_event(e)->latest) signal->wait();
  }
  void host_wait(Stream s) override { as_stream(s)->synchronize(); }
  bool query(Event e) override {
    const std::shared_ptr<Signal>& signal = as_event(e)->latest;
    return !signal || signal->passed();
  }
  double elapsed_seconds(Event start, Event end) override {
    const std::shared_ptr<Signal>& a = as_event(start)->latest;
    const std::shared_ptr<Signal>& b = as_event(end)->latest;
    LOCKSTEP_CHECK(a && b && a->passed() && b->passed(),
                   "elapsed_seconds: an event not recorded or not passed yet");
    return std::chrono::duration<double>(b->at - a->at).count();
  }
  void* alloc_pinned(std::size_t bytes) override { return emu::alloc_pinned(bytes); }
  void free_pinned(void* p) override { emu::free_pinned(p); }
  void copy_async(void* dst, const void* src, std::size_t bytes, Stream s) override {
    emu::copy_async(dst, src, bytes, *as_stream(s));
  }
  void note_host_sync() override { emu::note_host_sync(); }
  void host_func(Stream s, std::function<void()> fn) override {
    as_stream(s)->enqueue(std::move(fn));
  }
  Tensor host_view(const Tensor& t) override { return emu::host_view(t); }

 private:
  static emu::Stream* as_stream(Stream s) { return reinterpret_cast<emu::Stream*>(s); }
  static emu::Event* as_event(Event e) { return reinterpret_cast<emu::Event*>(e); }
  static Stream handle(emu::Stream* s) { return reinterpret_cast<Stream>(s); }
  static Event handle(emu::Event* e) { return reinterpret_cast<Event>(e); }

  emu::Stream& compute_;
};

}  // namespace

Tensor host_view(const Tensor& t) {
  if (!t.defined() || !t.device().is_emu()) return t;
  return Tensor::borrow(host_address(t.raw_data()), t.shape(), t.dtype(), Device::cpu());
}

void set_delay_us(int us) {
  g_delay_us.store(std::max(us, 0));
}
int delay_us() {
  return g_delay_us.load();
}

// ---------------------------------------------------------------- Stream

Stream::Stream(int device, std::string name, int delay_factor)
    : device_(device), name_(std::move(name)), delay_factor_(delay_factor) {
  DeviceState& d = device_state(device_);
  {
    std::lock_guard<std::mutex> lock(d.mutex);
    d.streams.insert(this);
  }
  worker_ = std::thread([this] { work(); });
}

Stream::~Stream() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  worker_.join();
  DeviceState& d = device_state(device_);
  std::lock_guard<std::mutex> lock(d.mutex);
  d.streams.erase(this);
  if (error_) {
    try {
      std::rethrow_exception(error_);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "lockstep: %s (emu:%d) ended with an unreported error: %s\n",
                   name_.c_str(), device_, e.what());
    }
  }
}

void Stream::enqueue(std::function<void()> task, bool control) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back({std::move(task), control});
    ++queued_;
  }
  changed_.notify_all();
}

void Stream::work() {
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and nothing left
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    bool skip = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      skip = error_ && !task.control;
    }
    if (!skip) {
      if (!task.control && delay_us() > 0)
        std::this_thread::sleep_for(std::chrono::microseconds(delay_us() * delay_factor_));
      try {
        task.run();
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!error_) error_ = std::current_exception();
      }
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++finished_;
    }
    changed_.notify_all();
  }
}

void Stream::synchronize() {
  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    const std::uint64_t target = queued_;
    changed_.wait(lock, [&] { return finished_ >= target; });
    std::swap(error, error_);
  }
  if (error) std::rethrow_exception(error);
}

bool Stream::idle() {
  std::lock_guard<std::mutex> lock(mutex_);
  return finished_ == queued_;
}

Stream& legacy_stream(int device) {
  DeviceState& d = device_state(device);
  std::call_once(d.legacy_once,
                 [&] { d.legacy = std::make_unique<Stream>(device, "legacy stream", 2); });
  return *d.legacy;
}

void synchronize_device(int device) {
  DeviceState& d = device_state(device);
  std::vector<Stream*> streams;
  {
    std::lock_guard<std::mutex> lock(d.mutex);
    streams.assign(d.streams.begin(), d.streams.end());
  }
  // Streams are owned by contexts that this thread's caller keeps alive while it synchronises.
  std::exception_ptr first;
  for (Stream* s : streams) {
    try {
      s->synchronize();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

// ---------------------------------------------------------------- memory, copies, counters

void register_hooks() {
  static std::once_flag once;
  std::call_once(once, [] {
    set_device_allocator(DeviceKind::EMU, &caching_allocator());
    set_device_copy(DeviceKind::EMU, &synchronous_copy);
    set_device_counters(DeviceKind::EMU, &counters);
  });
}

void note_host_sync() {
  g_host_syncs.fetch_add(1, std::memory_order_relaxed);
}
void note_pageable_copy() {
  g_pageable_copies.fetch_add(1, std::memory_order_relaxed);
}

DeviceCounters counters(Device device) {
  return {g_host_syncs.load(), g_pageable_copies.load(), caching_allocator().mallocs(device.index)};
}

void* alloc_pinned(std::size_t bytes) {
  const std::size_t size = (std::max<std::size_t>(bytes, 1) + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, size);
  LOCKSTEP_CHECK(p != nullptr, "out of host memory: cannot pin ",
                 format_bytes(static_cast<double>(bytes)));
  std::lock_guard<std::mutex> lock(g_pinned_mutex);
  pinned_ranges()[reinterpret_cast<std::uintptr_t>(p)] = size;
  return p;
}

void free_pinned(void* p) {
  if (!p) return;
  {
    std::lock_guard<std::mutex> lock(g_pinned_mutex);
    pinned_ranges().erase(reinterpret_cast<std::uintptr_t>(p));
  }
  std::free(p);
}

bool is_pinned(const void* p, std::size_t bytes) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  std::lock_guard<std::mutex> lock(g_pinned_mutex);
  auto& ranges = pinned_ranges();
  auto it = ranges.upper_bound(a);
  if (it == ranges.begin()) return false;
  --it;
  return a >= it->first && a + bytes <= it->first + it->second;
}

void copy_async(void* dst, const void* src, std::size_t bytes, Stream& stream) {
  if (bytes == 0) return;
  const bool from_pageable = !is_device_address(src) && !is_pinned(src, bytes);
  const bool to_pageable = !is_device_address(dst) && !is_pinned(dst, bytes);
  if (from_pageable) {
    // Staged at the call: the caller may reuse the source at once.
    note_pageable_copy();
    auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src),
                                                      static_cast<const char*>(src) + bytes);
    stream.enqueue(
        [dst, staged] { std::memcpy(host_address(dst), staged->data(), staged->size()); });
  } else {
    stream.enqueue([dst, src, bytes] { std::memcpy(host_address(dst), host_address(src), bytes); });
  }
  // To pageable memory the copy is synchronous: the host waits for the stream.
  if (to_pageable) {
    stream.synchronize();
    note_host_sync();
  }
}

std::unique_ptr<DeviceRuntime> make_runtime(Stream& compute) {
  return std::make_unique<Runtime>(compute);
}

}  // namespace lockstep::ops::emu
