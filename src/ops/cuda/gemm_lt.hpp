// bf16 GEMM through cuBLASLt for the bf16 policy: C = alpha * op(A) op(B) + beta * C with A and B
// bf16, CUBLAS_COMPUTE_32F (f32 accumulation on bf16 tensor cores) and an f32 C, so parameter
// gradients never pass through bf16; or a bf16 C (beta 0), a GPT block's activation written from
// the f32 accumulator rounded once. The algorithm for each (shape, transposes, pointer alignments,
// beta = 0 or not, C's type) is chosen once by cuBLASLt's heuristic and cached with its
// descriptors; one workspace per context. Where the heuristic has no algorithm
// for a shape (CUBLAS_STATUS_NOT_SUPPORTED or none found), bf16() says so once per shape and the
// caller runs the same product through cublasGemmEx (bf16 inputs, f32 accumulation and output):
// slower than cuBLASLt's best, but a run that cannot start is worse.
//
// Epilogues (LtEpilogue) fold what follows a GEMM into it, for the fused linear ops (ops.hpp,
// linear_forward / linear_backward): the bias, the GELU (tanh form, GPT-2's) keeping its input as
// the "aux" matrix, the GELU's backward from that aux, the bias gradient. cuBLASLt's rules, checked
// before it is asked: the bias or bias-gradient vector 16-byte aligned, the aux matrix 16-byte
// aligned with a leading dimension that is a multiple of 8. The bias, the bias gradient and the aux
// have the output's type: f32, or bf16 with a bf16 C (so the caller passes a bf16 copy of the
// bias there, as PyTorch's autocast does). Where the rules or the heuristic say no, bf16() returns
// false
// (warned once per process for epilogues) and the caller composes the same result from the plain
// GEMM and its own kernels.
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

// What follows the product in the same kernel, in row-major terms for C [m, n] = op(a) op(b):
//   Bias         C = op(a) op(b) + bias, bias [n] added to every row
//   GeluAuxBias  aux = op(a) op(b) + bias (bias may be null: none), C = gelu_tanh(aux)
//   DGelu        C = gelu_tanh'(aux) * (op(a) op(b)); beta must be 0
//   BGradA       C as without epilogue, and bias [m] = the sums over k of op(a)'s rows: for the
//                weight gradient dW = dy^T x (op(a) = dy^T), the bias gradient
// (cuBLASLt's A is our b and its B our a, LtGemm::bf16 says why: BGradA is its BGRADB.)
enum class LtEpilogueKind { None, Bias, GeluAuxBias, DGelu, BGradA };

struct LtEpilogue {
  LtEpilogueKind kind = LtEpilogueKind::None;
  const void* bias = nullptr;  // Bias, GeluAuxBias (may be null): read; BGradA: written. C's type
  void* aux = nullptr;         // GeluAuxBias: written; DGelu: read. [m, aux_ld] of C's type
  std::int64_t aux_ld = 0;     // elements between aux rows
};

class LtGemm {
 public:
  LtGemm(Device device, cudaStream_t stream);
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  // Row-major a ([m, k], or [k, m] when trans_a), b ([k, n], or [n, k] when trans_b), both bf16;
  // c is [m, n], f32 or (c_bf16, beta 0) bf16. Queued on the stream; does not synchronise.
  // Returns false, having queued
  // nothing, when cuBLASLt has no algorithm for this shape and epilogue (warned once per process
  // for plain GEMMs and once for epilogues). The same arguments (pointers' alignments included)
  // always choose the same algorithm: the same bits.
  [[nodiscard]] bool bf16(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
                          std::int64_t k, float alpha, const void* a, const void* b, float beta,
                          void* c, bool c_bf16, const LtEpilogue& epilogue = {});

 private:
  struct Plan;
  // m, n, k, transposes, beta != 0, the alignments of a, b, c, bias and aux, epilogue, aux_ld,
  // C's type.
  using Key = std::array<std::int64_t, 14>;

  // Sets the epilogue's bias and aux pointers on a plan's descriptor.
  static cublasStatus_t set_pointers(cublasLtMatmulDesc_t op, const LtEpilogue& epilogue);

  Device device_;
  cudaStream_t stream_;
  cublasLtHandle_t handle_ = nullptr;
  Tensor workspace_;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace lockstep::ops::cuda
