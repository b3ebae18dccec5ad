#include "lockstep/core/allocator.hpp"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <new>
#include <string>

#include "lockstep/core/error.hpp"

namespace lockstep {
namespace {

// "available 3.1 GiB of 23.4 GiB" from /proc/meminfo (MemAvailable counts reclaimable cache).
std::string host_memory_text() {
  std::ifstream meminfo("/proc/meminfo");
  double total = -1, available = -1;
  for (std::string key; meminfo >> key;) {
    double kib = 0;
    meminfo >> kib;
    if (key == "MemTotal:") total = kib * 1024;
    if (key == "MemAvailable:") available = kib * 1024;
    meminfo.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  if (total < 0 || available < 0) return "free memory unknown";
  return "available " + format_bytes(available) + " of " + format_bytes(total);
}

class CpuAllocator final : public Allocator {
 public:
  // Larger requests cannot be met on any machine and would overflow the rounding below.
  static constexpr std::size_t kMaxBytes = std::size_t{1} << 56;

  void* allocate(std::size_t bytes) override {
    constexpr std::size_t kAlign = 64;
    std::size_t rounded = (std::max<std::size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
    void* p = bytes <= kMaxBytes ? std::aligned_alloc(kAlign, rounded) : nullptr;
    if (!p) {
      LOCKSTEP_FAIL_HINT_TYPE(
          OutOfMemory, "lower the batch size, the model size or data.memory_budget_mb",
          "out of host memory: cannot allocate ", format_bytes(static_cast<double>(bytes)), " (",
          host_memory_text(), "; ", format_bytes(static_cast<double>(in_use_.load())),
          " held by this process's tensors)");
    }
    std::size_t now = in_use_.fetch_add(bytes) + bytes;
    std::size_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    return p;
  }
  void deallocate(void* ptr, std::size_t bytes) override {
    std::free(ptr);
    in_use_.fetch_sub(bytes);
  }
  std::size_t bytes_in_use() const override { return in_use_.load(); }
  std::size_t peak_bytes_in_use() const override { return peak_.load(); }
  void reset_peak_bytes() override { peak_.store(in_use_.load()); }

 private:
  std::atomic<std::size_t> in_use_{0};
  std::atomic<std::size_t> peak_{0};
};

constexpr std::size_t kKinds = 3;  // DeviceKind's values
std::atomic<Allocator*> g_allocators[kKinds] = {};
std::atomic<CopyBytesFn> g_copies[kKinds] = {};

std::size_t slot(DeviceKind kind) {
  return static_cast<std::size_t>(kind);
}

const char* backend_hint(DeviceKind kind) {
  return kind == DeviceKind::EMU ? "the emulated device is made by the first ops::Context on it"
                                 : "build with the CUDA toolkit and run on a machine with a GPU, "
                                   "or set device = cpu";
}

}  // namespace

Allocator& allocator_for(Device device) {
  // Never destroyed: a Tensor that outlives main (a static ops::Context's transient buffers, a
  // static tensor) frees into it during exit, whatever the order of static destruction.
  static CpuAllocator& cpu = *new CpuAllocator;
  if (device.is_cpu()) return cpu;
  Allocator* a = g_allocators[slot(device.kind)].load(std::memory_order_acquire);
  LOCKSTEP_CHECK_HINT(a != nullptr, backend_hint(device.kind), "no allocator for ", device.str(),
                      ": this process has not started that device's backend");
  return *a;
}

void set_device_allocator(DeviceKind kind, Allocator* allocator) {
  g_allocators[slot(kind)].store(allocator, std::memory_order_release);
}
void set_device_copy(DeviceKind kind, CopyBytesFn fn) {
  g_copies[slot(kind)].store(fn, std::memory_order_release);
}

void copy_bytes(Device dst_device, void* dst, Device src_device, const void* src,
                std::size_t bytes) {
  if (bytes == 0) return;
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memcpy(dst, src, bytes);
    return;
  }
  const DeviceKind kind = dst_device.is_cpu() ? src_device.kind : dst_device.kind;
  LOCKSTEP_CHECK(src_device.is_cpu() || dst_device.is_cpu() || src_device.kind == dst_device.kind,
                 "copy between ", src_device.str(), " and ", dst_device.str(),
                 ": devices of two kinds exchange data through the host");
  CopyBytesFn fn = g_copies[slot(kind)].load(std::memory_order_acquire);
  LOCKSTEP_CHECK_HINT(fn != nullptr, backend_hint(kind), "copy between ", src_device.str(), " and ",
                      dst_device.str(), ": this process has not started that device's backend");
  fn(dst_device, dst, src_device, src, bytes);
}

}  // namespace lockstep
