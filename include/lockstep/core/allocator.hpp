// Device memory: one Allocator per device kind. The CPU allocator hands out 64-byte-aligned
// blocks (AVX-512 friendly, one cache line); the CUDA allocator (ops/cuda) caches freed blocks
// by size so the steady-state training step never calls cudaMalloc.
#pragma once

#include <cstddef>

#include "lockstep/core/device.hpp"

namespace lockstep {

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(std::size_t bytes) = 0;
  // Allocates on `device`: one CUDA allocator serves every GPU, and the calling thread's
  // current GPU need not be the tensor's. Storage calls this; the CPU allocator ignores device.
  virtual void* allocate_on(Device device, std::size_t bytes) {
    (void)device;
    return allocate(bytes);
  }
  virtual void deallocate(void* ptr, std::size_t bytes) = 0;
  // Bytes currently handed out by this allocator (for memory reports).
  virtual std::size_t bytes_in_use() const = 0;
  virtual std::size_t peak_bytes_in_use() const = 0;
};

// The allocator that owns memory on `device` (lives for the whole process).
Allocator& allocator_for(Device device);
// Registered by the CUDA backend at start-up; nullptr when there is none.
void set_cuda_allocator(Allocator* allocator);

// Copies bytes between any two devices (host<->device, device<->device, host<->host);
// synchronous. The fast, stream-ordered copies live in ops/.
void copy_bytes(Device dst_device, void* dst, Device src_device, const void* src,
                std::size_t bytes);
using CopyBytesFn = void (*)(Device, void*, Device, const void*, std::size_t);
void set_cuda_copy(CopyBytesFn fn);

}  // namespace lockstep
