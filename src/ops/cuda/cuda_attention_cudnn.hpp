// cuDNN's fused scaled-dot-product attention (flash) for AttentionKernel::Cudnn, through the cuDNN
// frontend's graph API: causal, scale 1/sqrt(D), bf16 q, k, v, out and gradients, f32 softmax
// statistics (cuDNN's Stats: each row's natural-log log-sum-exp of the scaled scores, which is
// what the attention ops call lse), f32 compute. q, k and v are described to cuDNN with strides
// over the qkv [B, T, 3C] buffer itself (head h of q at features [hD, (h+1)D), k at C + that, v at
// 2C + that), and dq, dk, dv are written into dqkv with the same strides: no transposes.
//
// Invariants: one instance per CUDA context (its cuDNN handle runs on the context's stream);
// graphs are built once per (B, T, heads, D) with their workspace sizes, and a shape cuDNN refuses
// is remembered as refused, so neither is asked again. Execution queues work on the stream and
// never waits for the device; workspaces come from the caching allocator. The backward asks
// cuDNN for its deterministic algorithm: lockstep's runs are bitwise repeatable, and atomically
// accumulated dQ would not be.
//
// The interface is bf16 at its boundary: a GPT block's activations under bf16 are bf16 already and
// pass as they are; f32 tensors are cast to and from it by the CUDA backend (cuda_transformer.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>

#include "lockstep/core/device.hpp"
#include "lockstep/ops/ops.hpp"

namespace lockstep::ops::cuda {

// The cuDNN frontend this build compiled cuDNN's attention with ("1.32.0"), or "" when it was
// built without (then the Cudnn kernel is refused, saying so).
std::string cudnn_frontend_version();

class CudnnAttention {
 public:
  // Loads nothing yet: the first check() opens cuDNN and makes the handle.
  CudnnAttention(Device device, cudaStream_t stream);
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // {Cudnn, what runs} when this build has the frontend, cuDNN loads, p is bf16 and both graphs
  // of the shape build; else {Reference, why not} (cuDNN's own message where it refused).
  AttentionChoice check(Precision p, std::int64_t b, std::int64_t t, int heads,
                        std::int64_t head_dim);

  // qkv bf16 [b, t, 3c] -> out bf16 [b, t, c] and lse f32 [b, heads, t]. check() must have
  // accepted the shape.
  void forward(const std::uint16_t* qkv, std::uint16_t* out, float* lse, std::int64_t b,
               std::int64_t t, std::int64_t c, int heads);
  // dqkv bf16 [b, t, 3c] (overwritten) from the forward's qkv, out and lse and dout bf16 [b, t, c].
  void backward(const std::uint16_t* qkv, const std::uint16_t* out, const std::uint16_t* dout,
                const float* lse, std::uint16_t* dqkv, std::int64_t b, std::int64_t t,
                std::int64_t c, int heads);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lockstep::ops::cuda
