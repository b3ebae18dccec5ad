// GPU memory for the CUDA backend: a caching device allocator, the synchronous copy core uses for
// Tensor::to()/to_vector(), pinned host buffers, and device discovery.
//
// The allocator keeps freed blocks in per-device free lists ordered by size and hands the
// smallest cached block that fits (within kMaxReuseSlack) to the next request, so after the first
// training step every activation and gradient comes from the cache and cudaMalloc (which
// synchronises the device) is never called again. Blocks are reused in host order: that is safe
// because every op of a device runs on its context's single compute stream, so a kernel queued
// later runs after the kernels that used the block before. Tensors handed to another stream (the
// communication stream) must outlive the work queued there: the Reducer's buckets do.
#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "lockstep/core/allocator.hpp"
#include "lockstep/core/device.hpp"
#include "lockstep/ops/cuda.hpp"
#include "lockstep/ops/device_runtime.hpp"
#include "ops/cuda/check.hpp"
#include "ops/cuda/cuda_backend.hpp"

namespace lockstep {
namespace ops::cuda {
namespace {

// Small requests are rounded to 512 bytes (cuBLAS/cuDNN like 256-byte alignment; 512 keeps bins
// few); requests of 1 MiB and more to 2 MiB, the granularity the driver maps large blocks at.
constexpr std::size_t kSmallRound = 512;
constexpr std::size_t kLargeThreshold = std::size_t{1} << 20;
constexpr std::size_t kLargeRound = std::size_t{2} << 20;
// A cached block serves a request up to this factor smaller than itself; beyond that a new block
// wastes less than a reused one.
constexpr std::size_t kMaxReuseSlack = 2;

std::size_t round_size(std::size_t bytes) {
  std::size_t unit = bytes >= kLargeThreshold ? kLargeRound : kSmallRound;
  return (std::max<std::size_t>(bytes, 1) + unit - 1) / unit * unit;
}

constexpr double kMiB = 1024.0 * 1024.0;

// Makes `device` current for a scope and restores the caller's device after (the current
// device is per-thread state that the caller owns).
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    LOCKSTEP_CHECK_CUDA(cudaGetDevice(&previous_));
    if (previous_ != device) LOCKSTEP_CHECK_CUDA(cudaSetDevice(device));
  }
  ~DeviceScope() { (void)cudaSetDevice(previous_); }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
};

class CachingAllocator final : public Allocator {
 public:
  void* allocate(std::size_t bytes) override {
    int device = 0;
    LOCKSTEP_CHECK_CUDA(cudaGetDevice(&device));
    return allocate_on(Device::cuda(device), bytes);
  }

  void* allocate_on(Device where, std::size_t bytes) override {
    const int device = where.index;
    std::size_t size = round_size(bytes);
    std::lock_guard<std::mutex> lock(mutex_);
    DeviceCache& cache = devices_[device];
    void* ptr = nullptr;
    auto it = cache.free.lower_bound(size);
    if (it != cache.free.end() && it->first <= size * kMaxReuseSlack) {
      size = it->first;
      ptr = it->second;
      cache.free.erase(it);
      cache.cached -= size;
    } else {
      ptr = malloc_on(device, cache, size, bytes);
    }
    live_[ptr] = Block{device, size, bytes};
    cache.in_use += bytes;
    cache.peak = std::max(cache.peak, cache.in_use);
    total_in_use_ += bytes;
    total_peak_ = std::max(total_peak_, total_in_use_);
    return ptr;
  }

  void deallocate(void* ptr, std::size_t) override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(ptr);
    if (it == live_.end()) return;  // not ours: nothing sensible to do in a destructor
    Block block = it->second;
    live_.erase(it);
    DeviceCache& cache = devices_[block.device];
    cache.free.emplace(block.size, ptr);
    cache.cached += block.size;
    cache.in_use -= block.requested;
    total_in_use_ -= block.requested;
  }

  std::size_t bytes_in_use() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return total_in_use_;
  }
  std::size_t peak_bytes_in_use() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return total_peak_;
  }
  void reset_peak_bytes() override {
    std::lock_guard<std::mutex> lock(mutex_);
    total_peak_ = total_in_use_;
    for (auto& entry : devices_)
      entry.second.peak = entry.second.in_use;
  }

  AllocatorStats stats(int device) const {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = devices_.find(device);
    if (it == devices_.end()) return {};
    const DeviceCache& c = it->second;
    return {c.in_use, c.peak, c.cached, c.mallocs};
  }

  void release_cached() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [device, cache] : devices_) {
      DeviceScope scope(device);
      free_cached(cache);
    }
  }

 private:
  struct Block {
    int device;
    std::size_t size;       // rounded, what the cache holds
    std::size_t requested;  // what the tensor asked for
  };
  struct DeviceCache {
    std::multimap<std::size_t, void*> free;
    std::size_t cached = 0, in_use = 0, peak = 0, mallocs = 0;
  };

  void free_cached(DeviceCache& cache) {
    for (auto& [size, ptr] : cache.free)
      LOCKSTEP_CHECK_CUDA(cudaFree(ptr));
    cache.free.clear();
    cache.cached = 0;
  }

  // Called with mutex_ held. On failure, frees this device's cache once and retries.
  void* malloc_on(int device, DeviceCache& cache, std::size_t size, std::size_t requested) {
    DeviceScope scope(device);
    void* ptr = nullptr;
    cudaError_t status = cudaMalloc(&ptr, size);
    if (status == cudaErrorMemoryAllocation && !cache.free.empty()) {
      (void)cudaGetLastError();
      free_cached(cache);
      status = cudaMalloc(&ptr, size);
    }
    if (status == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      std::size_t free_bytes = 0, total_bytes = 0;
      const bool known = cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess;
      (void)cudaGetLastError();
      LOCKSTEP_FAIL_HINT_TYPE(OutOfMemory, "reduce the batch size or the model, or use more GPUs",
                              "out of GPU memory on cuda:", device, ": cannot allocate ",
                              format_bytes(static_cast<double>(requested)), " (",
                              known ? str("free ", format_bytes(static_cast<double>(free_bytes)),
                                          " of ", format_bytes(static_cast<double>(total_bytes)))
                                    : std::string("free memory unknown"),
                              "; ", format_bytes(static_cast<double>(cache.in_use)),
                              " in use by lockstep tensors)");
    }
    LOCKSTEP_CHECK_CUDA(status);
    ++cache.mallocs;
    return ptr;
  }

  mutable std::mutex mutex_;
  std::unordered_map<void*, Block> live_;
  std::map<int, DeviceCache> devices_;
  std::size_t total_in_use_ = 0, total_peak_ = 0;
};

// Leaked on purpose: tensors in static storage may be freed after main returns, and by then the
// CUDA runtime may be gone too; the driver reclaims everything at process exit.
CachingAllocator& caching_allocator() {
  static CachingAllocator* allocator = new CachingAllocator();
  return *allocator;
}

std::atomic<std::uint64_t> g_pageable_copies{0}, g_host_syncs{0};

// core's copy_bytes contract is "synchronous": the source may have been written by a kernel still
// queued on a non-blocking stream, which a plain cudaMemcpy does not wait for, so finish the
// devices' queued work first. This is the slow path (tests, checkpoints, loss.item()); the
// training step uses ops::copy, which is stream-ordered.
void synchronous_copy(Device dst_device, void* dst, Device src_device, const void* src,
                      std::size_t bytes) {
  for (Device d : {src_device, dst_device}) {
    if (!d.is_cuda()) continue;
    DeviceScope scope(d.index);
    LOCKSTEP_CHECK_CUDA(cudaDeviceSynchronize());
    note_host_sync();
  }
  // Host tensors live in pageable memory (core's CPU allocator).
  if (src_device.is_cpu() && dst_device.is_cuda()) note_pageable_copy();
  LOCKSTEP_CHECK_CUDA(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
  // Into device memory, cudaMemcpy may return before the bytes have landed: from pageable memory
  // once they are staged, device to device at once. The copy runs on the legacy default stream,
  // which the backend's streams (all cudaStreamNonBlocking) are not ordered after, so a kernel
  // queued next on a compute stream could read the old bytes (after Tensor::to(cuda),
  // from_vector, copy_from). Waiting here keeps the contract "synchronous": done on return.
  // To the host, cudaMemcpy already returns only when the bytes are there.
  if (dst_device.is_cuda()) {
    DeviceScope scope(dst_device.index);
    LOCKSTEP_CHECK_CUDA(cudaDeviceSynchronize());
    note_host_sync();
  }
}

}  // namespace

void activate_device(int device) {
  int current = -1;
  LOCKSTEP_CHECK_CUDA(cudaGetDevice(&current));
  if (current != device) LOCKSTEP_CHECK_CUDA(cudaSetDevice(device));
}

void register_memory_hooks() {
  static std::once_flag once;
  std::call_once(once, [] {
    set_cuda_allocator(&caching_allocator());
    set_cuda_copy(&synchronous_copy);
    set_device_counters(DeviceKind::CUDA, [](Device d) {
      const TransferStats t = transfer_stats();
      return DeviceCounters{t.host_syncs, t.pageable_copies,
                            allocator_stats(d.index).cuda_malloc_calls};
    });
  });
}

int visible_device_count() {
  static const int count = [] {
    int n = 0;
    // No driver or no device is an answer ("0 GPUs"), not an error.
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    return n;
  }();
  return count;
}

std::string device_description(int device) {
  cudaDeviceProp prop{};
  LOCKSTEP_CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
  return str(prop.name, ", sm_", prop.major, prop.minor, ", ",
             static_cast<double>(prop.totalGlobalMem) / (1024.0 * kMiB), " GiB");
}

void note_pageable_copy() {
  g_pageable_copies.fetch_add(1, std::memory_order_relaxed);
}
void note_host_sync() {
  g_host_syncs.fetch_add(1, std::memory_order_relaxed);
}
TransferStats transfer_stats() {
  return {g_pageable_copies.load(std::memory_order_relaxed),
          g_host_syncs.load(std::memory_order_relaxed)};
}

AllocatorStats allocator_stats(int device) {
  return caching_allocator().stats(device);
}
void release_cached_memory() {
  caching_allocator().release_cached();
}

// ---------------------------------------------------------------- PinnedBuffer

PinnedBuffer::PinnedBuffer(std::size_t bytes) : bytes_(bytes) {
  // Portable: usable from every device's context, so one loader can feed any replica.
  LOCKSTEP_CHECK_CUDA(
      cudaHostAlloc(&data_, std::max<std::size_t>(bytes, 1), cudaHostAllocPortable));
}

PinnedBuffer::~PinnedBuffer() {
  release();
}

PinnedBuffer::PinnedBuffer(PinnedBuffer&& other) noexcept
    : data_(other.data_), bytes_(other.bytes_), last_copy_(other.last_copy_) {
  other.data_ = nullptr;
  other.bytes_ = 0;
  other.last_copy_ = nullptr;
}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    release();
    std::swap(data_, other.data_);
    std::swap(bytes_, other.bytes_);
    std::swap(last_copy_, other.last_copy_);
  }
  return *this;
}

void PinnedBuffer::release() noexcept {
  // A copy may still be reading the memory: wait for it before handing the pages back.
  if (last_copy_) {
    (void)cudaEventSynchronize(last_copy_);
    (void)cudaEventDestroy(last_copy_);
  }
  if (data_) (void)cudaFreeHost(data_);
  data_ = nullptr;
  last_copy_ = nullptr;
  bytes_ = 0;
}

void PinnedBuffer::wait() {
  if (last_copy_) LOCKSTEP_CHECK_CUDA(cudaEventSynchronize(last_copy_));
}

void copy_to_device_async(Context& ctx, PinnedBuffer& src, Tensor& dst) {
  LOCKSTEP_CHECK(dst.device().is_cuda(), "copy_to_device_async: destination ", dst.describe(),
                 " is not on a GPU");
  LOCKSTEP_CHECK(dst.nbytes() <= src.bytes(), "copy_to_device_async: ", dst.describe(), " needs ",
                 dst.nbytes(), " bytes but the pinned buffer holds ", src.bytes());
  cudaStream_t stream = compute_stream(ctx);
  activate_device(ctx.device().index);
  LOCKSTEP_CHECK_CUDA(
      cudaMemcpyAsync(dst.raw_data(), src.data(), dst.nbytes(), cudaMemcpyHostToDevice, stream));
  // Events belong to a device; the first copy decides (a buffer feeds one replica in practice).
  if (!src.last_copy_)
    LOCKSTEP_CHECK_CUDA(cudaEventCreateWithFlags(&src.last_copy_, cudaEventDisableTiming));
  LOCKSTEP_CHECK_CUDA(cudaEventRecord(src.last_copy_, stream));
}

}  // namespace ops::cuda

// Declared in core/device.hpp; the CPU-only build defines them in src/core/dtype_device.cpp.
int cuda_device_count() {
  return ops::cuda::visible_device_count();
}
bool cuda_available() {
  return cuda_device_count() > 0;
}

}  // namespace lockstep
