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
  // Starts the peak over at the bytes in use now, so a benchmark can read one phase's peak
  // (lockstep-bench gpt: the activation memory of a step).
  virtual void reset_peak_bytes() = 0;
};

// The allocator that owns memory on `device` (lives for the whole process).
Allocator& allocator_for(Device device);
// Registered by a device backend (ops/cuda, ops/emu) at start-up, one per device kind; the CPU's
// is built in. nullptr unregisters.
void set_device_allocator(DeviceKind kind, Allocator* allocator);
inline void set_cuda_allocator(Allocator* allocator) {
  set_device_allocator(DeviceKind::CUDA, allocator);
}

// Copies bytes between any two devices (host<->device, device<->device, host<->host);
// synchronous: when it returns, the destination holds the bytes and any later op, on any
// stream, sees them. The fast, stream-ordered copies live in ops/.
void copy_bytes(Device dst_device, void* dst, Device src_device, const void* src,
                std::size_t bytes);
using CopyBytesFn = void (*)(Device, void*, Device, const void*, std::size_t);
void set_device_copy(DeviceKind kind, CopyBytesFn fn);
inline void set_cuda_copy(CopyBytesFn fn) {
  set_device_copy(DeviceKind::CUDA, fn);
}

}  // namespace lockstep
