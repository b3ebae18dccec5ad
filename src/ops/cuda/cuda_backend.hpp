// What the rest of the CUDA code (memory.cpp, comm/cuda) needs from the CUDA backend without
// seeing its class: the compute stream of a context, and the process-wide memory hooks.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include "lockstep/core/allocator.hpp"

#include "lockstep/ops/context.hpp"
#include "lockstep/ops/device_runtime.hpp"

namespace lockstep::ops::cuda {

// The compute stream of a CUDA context (cudaStreamNonBlocking; every op of `ctx` runs on it).
// Throws lockstep::Error naming the device when ctx is not a CUDA context.
cudaStream_t compute_stream(Context& ctx);

// The DeviceRuntime of a context whose compute stream is `compute` (runtime.cpp).
std::unique_ptr<DeviceRuntime> make_runtime(int device, cudaStream_t compute);

// Makes `device` current on the calling thread (a no-op when it already is). The CUDA runtime's
// current device is per thread, and the allocator allocates on it.
void activate_device(int device);

// Registers the caching allocator and the synchronous copy with core (set_cuda_allocator,
// set_cuda_copy). Idempotent; make_cuda_backend calls it.
void register_memory_hooks();

// Counted into transfer_stats() (ops/cuda.hpp) by every call site that does what they name.
void note_pageable_copy();
void note_host_sync();

// Number of visible GPUs, 0 when the runtime has no driver or no device (cached once).
int visible_device_count();

}  // namespace lockstep::ops::cuda
