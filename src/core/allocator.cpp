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

 private:
  std::atomic<std::size_t> in_use_{0};
  std::atomic<std::size_t> peak_{0};
};

Allocator* g_cuda_allocator = nullptr;
CopyBytesFn g_cuda_copy = nullptr;

}  // namespace

Allocator& allocator_for(Device device) {
  static CpuAllocator cpu;
  if (device.is_cpu()) return cpu;
  LOCKSTEP_CHECK_HINT(g_cuda_allocator != nullptr,
                      "build with the CUDA toolkit and run on a machine with a GPU, or set "
                      "device = cpu",
                      "no CUDA allocator: this process has no CUDA backend (device ", device.str(),
                      ")");
  return *g_cuda_allocator;
}

void set_cuda_allocator(Allocator* allocator) {
  g_cuda_allocator = allocator;
}
void set_cuda_copy(CopyBytesFn fn) {
  g_cuda_copy = fn;
}

void copy_bytes(Device dst_device, void* dst, Device src_device, const void* src,
                std::size_t bytes) {
  if (bytes == 0) return;
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memcpy(dst, src, bytes);
    return;
  }
  LOCKSTEP_CHECK(g_cuda_copy != nullptr, "copy between ", src_device.str(), " and ",
                 dst_device.str(), " needs the CUDA backend");
  g_cuda_copy(dst_device, dst, src_device, src, bytes);
}

}  // namespace lockstep
