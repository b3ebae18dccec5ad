// Reusable layer buffers (the conv-net layers use the context's shared transients instead,
// ops::Context::transient). A layer keeps its output and dL/dx tensors between calls and writes
// the next call's result into them when that is safe: same shape, dtype and device, and the
// layer's handle is the only one left (the next layer released its cached input at the end of
// its backward). Anything still held elsewhere gets a fresh tensor instead, so a caller that
// keeps an output never sees it change. This keeps the steady-state training step free of
// allocations (a fresh 1 MB block from malloc costs page faults on every step).
#pragma once

#include "lockstep/core/tensor.hpp"

namespace lockstep::nn::detail {

inline Tensor& reuse_buffer(Tensor& slot, const Shape& shape, Device device,
                            DType dtype = DType::F32) {
  bool reusable = slot.defined() && slot.shape() == shape && slot.dtype() == dtype &&
                  slot.device() == device && slot.offset() == 0 && slot.storage().use_count() == 1;
  if (!reusable) slot = Tensor::empty(shape, dtype, device);
  return slot;
}

// Hands out the input cached by forward and forgets it (one backward per forward).
inline Tensor take_cached(Tensor& cache, const char* layer) {
  LOCKSTEP_CHECK_HINT(cache.defined(), "call forward before each backward", layer,
                      ": backward without a cached input from forward");
  Tensor x = std::move(cache);
  cache = Tensor();
  return x;
}

}  // namespace lockstep::nn::detail
