// bf16 GEMM through cuBLASLt for the bf16 policy: C (f32) = alpha * op(A) op(B) + beta * C with
// A and B bf16, CUBLAS_COMPUTE_32F (f32 accumulation on bf16 tensor cores) and an f32 C, so
// outputs and parameter gradients never pass through bf16. The algorithm for each (shape,
// transposes, pointer alignments, beta = 0 or not) is chosen once by cuBLASLt's heuristic and
// cached with its descriptors; one workspace per context. Where the heuristic has no algorithm
// for a shape (CUBLAS_STATUS_NOT_SUPPORTED or none found), bf16() says so once per shape and the
// caller runs the same product through cublasGemmEx (bf16 inputs, f32 accumulation and output):
// slower than cuBLASLt's best, but a run that cannot start is worse.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>

#include "lockstep/core/tensor.hpp"

namespace lockstep::ops::cuda {

// cuBLAS's documented workspace recommendation for Hopper.
inline constexpr std::size_t kLtWorkspaceBytes = std::size_t{32} << 20;

class LtGemm {
 public:
  LtGemm(Device device, cudaStream_t stream);
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  // Row-major a ([m, k], or [k, m] when trans_a), b ([k, n], or [n, k] when trans_b), both bf16;
  // c is f32 [m, n]. Queued on the stream; does not synchronise. Returns false, having queued
  // nothing, when cuBLASLt has no algorithm for this shape (warned once per process).
  [[nodiscard]] bool bf16(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
                          std::int64_t k, float alpha, const void* a, const void* b, float beta,
                          float* c);

 private:
  struct Plan;
  using Key = std::array<std::int64_t, 9>;

  Device device_;
  cudaStream_t stream_;
  cublasLtHandle_t handle_ = nullptr;
  Tensor workspace_;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace lockstep::ops::cuda
