#include "lockstep/core/allocator.hpp"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>

#include "lockstep/core/error.hpp"

namespace lockstep {
namespace {

class CpuAllocator final : public Allocator {
 public:
  void* allocate(std::size_t bytes) override {
    constexpr std::size_t kAlign = 64;
    std::size_t rounded = (std::max<std::size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
    void* p = std::aligned_alloc(kAlign, rounded);
    if (!p) throw std::bad_alloc();
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
