// Dense GEMM: CudaBackend::gemm (cublasSgemm for fp32, cublasGemmEx for tf32) and LtGemm
// (gemm_lt.hpp: cuBLASLt for bf16, falling back to cublasGemmEx where its heuristic has no
// algorithm).
#include "ops/cuda/gemm_lt.hpp"

#include <atomic>
#include <climits>
#include <cstdio>

#include "ops/cuda/check.hpp"
#include "ops/cuda/cuda_backend.hpp"

namespace lockstep::ops::cuda {
namespace {

std::uint64_t as_u64(std::int64_t v, const char* what) {
  LOCKSTEP_CHECK(v >= 0 && v <= INT_MAX, "bf16 gemm ", what, " = ", v,
                 " exceeds cuBLASLt's 32-bit dimension limit");
  return static_cast<std::uint64_t>(v);
}

// The largest power of two (up to 256) dividing the address: cuBLASLt must be told the real
// alignment, since its heuristic otherwise assumes 256 bytes and may pick a kernel that faults
// on a view (a gradient inside a bucket, say).
std::uint32_t alignment(const void* p) {
  auto a = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t align = 256;
  while (align > 1 && a % align != 0)
    align >>= 1;
  return align;
}

}  // namespace

struct LtGemm::Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool has_algo = false;  // false: the heuristic had none; the caller falls back

  ~Plan() {
    if (c) dyn::cublasLtMatrixLayoutDestroy(c);
    if (b) dyn::cublasLtMatrixLayoutDestroy(b);
    if (a) dyn::cublasLtMatrixLayoutDestroy(a);
    if (op) dyn::cublasLtMatmulDescDestroy(op);
  }
};

LtGemm::LtGemm(Device device, cudaStream_t stream) : device_(device), stream_(stream) {
  LOCKSTEP_CHECK_CUBLAS(dyn::cublasLtCreate(&handle_));
}

LtGemm::~LtGemm() {
  plans_.clear();
  if (handle_) dyn::cublasLtDestroy(handle_);
}

bool LtGemm::bf16(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                  float alpha, const void* a, const void* b, float beta, float* c) {
  const std::uint32_t align_a = alignment(a), align_b = alignment(b), align_c = alignment(c);
  const Key key{m, n, k, trans_a, trans_b, beta != 0.0f, align_a, align_b, align_c};
  auto it = plans_.find(key);
  if (it == plans_.end()) {
    auto plan = std::make_unique<Plan>();
    // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T, and a row-major matrix
    // read as column-major is its transpose: cuBLASLt's "A" is our b and its "B" our a, each
    // with its own transpose flag (the same trick as cublasSgemm in cuda_backend.cpp).
    const std::uint64_t um = as_u64(m, "M"), un = as_u64(n, "N"), uk = as_u64(k, "K");
    LOCKSTEP_CHECK_CUBLAS(dyn::cublasLtMatmulDescCreate(&plan->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t op_a = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    LOCKSTEP_CHECK_CUBLAS(dyn::cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA,
                                                              &op_a, sizeof(op_a)));
    LOCKSTEP_CHECK_CUBLAS(dyn::cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB,
                                                              &op_b, sizeof(op_b)));
    // Stored (column-major) shapes: b is [k, n] row-major = n x k column-major (ld n), or
    // [n, k] = k x n (ld k) when transposed; likewise a.
    if (trans_b)
      LOCKSTEP_CHECK_CUBLAS(dyn::cublasLtMatrixLayoutCreate(&plan->a, CUDA_R_16BF, uk, un, uk));
    else
      LOCKSTEP_CHECK_CUBLAS(dyn::cublasLtMatrixLayoutCreate(&plan->a, CUDA_R_16BF, un, uk, un));
    if (trans_a)
      LOCKSTEP_CHECK_CUBLAS(dyn::cublasLtMatrixLayoutCreate(&plan->b, CUDA_R_16BF, um, uk, um));
    else
      LOCKSTEP_CHECK_CUBLAS(dyn::cublasLtMatrixLayoutCreate(&plan->b, CUDA_R_16BF, uk, um, uk));
    LOCKSTEP_CHECK_CUBLAS(dyn::cublasLtMatrixLayoutCreate(&plan->c, CUDA_R_32F, un, um, un));

    cublasLtMatmulPreference_t pref = nullptr;
    LOCKSTEP_CHECK_CUBLAS(dyn::cublasLtMatmulPreferenceCreate(&pref));
    const std::uint64_t ws = kLtWorkspaceBytes;
    // cuBLASLt's "A" is b and its "B" is a (see above).
    const std::uint32_t lt_align_a = align_b, lt_align_b = align_a;
    cublasStatus_t status = dyn::cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
    if (status == CUBLAS_STATUS_SUCCESS)
      status = dyn::cublasLtMatmulPreferenceSetAttribute(
          pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &lt_align_a, sizeof(lt_align_a));
    if (status == CUBLAS_STATUS_SUCCESS)
      status = dyn::cublasLtMatmulPreferenceSetAttribute(
          pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &lt_align_b, sizeof(lt_align_b));
    if (status == CUBLAS_STATUS_SUCCESS)
      status = dyn::cublasLtMatmulPreferenceSetAttribute(
          pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c, sizeof(align_c));
    if (status == CUBLAS_STATUS_SUCCESS)
      status = dyn::cublasLtMatmulPreferenceSetAttribute(
          pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c, sizeof(align_c));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    if (status == CUBLAS_STATUS_SUCCESS)
      status = dyn::cublasLtMatmulAlgoGetHeuristic(handle_, plan->op, plan->a, plan->b, plan->c,
                                                   plan->c, pref, 1, &result, &found);
    dyn::cublasLtMatmulPreferenceDestroy(pref);
    // NOT_SUPPORTED is the heuristic's "nothing for this configuration", not a failure.
    if (status != CUBLAS_STATUS_NOT_SUPPORTED) LOCKSTEP_CHECK_CUBLAS(status);
    plan->has_algo = status == CUBLAS_STATUS_SUCCESS && found > 0;
    if (plan->has_algo) {
      plan->algo = result.algo;
    } else {
      static std::atomic<bool> warned{false};
      if (!warned.exchange(true))
        std::fprintf(stderr,
                     "warning: cuBLASLt has no bf16 algorithm for C[%lld, %lld] = op(A)[%lld, "
                     "%lld] op(B)[%lld, %lld] (trans_a=%d, trans_b=%d, alignments %u/%u/%u "
                     "bytes); using cublasGemmEx for it (same bf16 inputs, f32 accumulation and "
                     "output; further such shapes are not reported)\n",
                     static_cast<long long>(m), static_cast<long long>(n),
                     static_cast<long long>(m), static_cast<long long>(k),
                     static_cast<long long>(k), static_cast<long long>(n), trans_a ? 1 : 0,
                     trans_b ? 1 : 0, align_a, align_b, align_c);
    }
    it = plans_.emplace(key, std::move(plan)).first;
  }
  if (!it->second->has_algo) return false;
  if (!workspace_.defined())
    workspace_ = Tensor::empty({static_cast<std::int64_t>(kLtWorkspaceBytes)}, DType::U8, device_);
  const Plan& p = *it->second;
  LOCKSTEP_CHECK_CUBLAS(dyn::cublasLtMatmul(handle_, p.op, &alpha, b, p.a, a, p.b, &beta, c, p.c, c,
                                            p.c, &p.algo, workspace_.raw_data(), kLtWorkspaceBytes,
                                            stream_));
  return true;
}

namespace {

int as_int(std::int64_t v, const char* what) {
  LOCKSTEP_CHECK(v >= 0 && v <= INT_MAX, "gemm ", what, " = ", v,
                 " exceeds cuBLAS's 32-bit dimension limit");
  return static_cast<int>(v);
}

}  // namespace

// ---- dense linear algebra. Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T,
// and a row-major matrix read as column-major is its transpose: so call cuBLAS with the
// operands swapped and the same transpose flags.
void CudaBackend::gemm(bool trans_a, bool trans_b, float alpha, const Tensor& a, const Tensor& b,
                       float beta, Tensor& c) {
  activate();
  int m = as_int(c.dim(0), "M"), n = as_int(c.dim(1), "N");
  int k = as_int(trans_a ? a.dim(0) : a.dim(1), "K");
  if (m == 0 || n == 0) return;
  if (k == 0) {  // op(A) op(B) is zero: c = beta * c, without 0 * NaN surprises when beta = 0
    if (beta == 0.0f)
      fill(c, 0.0f);
    else
      cuda::scale(c.data<float>(), beta, c.numel(), stream_);
    return;
  }
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  switch (ctx_.precision()) {
    case Precision::FP32:
      LOCKSTEP_CHECK_CUBLAS(dyn::cublasSgemm(cublas_, op_b, op_a, n, m, k, &alpha, b.data<float>(),
                                             as_int(b.dim(1), "ldb"), a.data<float>(),
                                             as_int(a.dim(1), "lda"), &beta, c.data<float>(), n));
      return;
    case Precision::TF32:
      LOCKSTEP_CHECK_CUBLAS(dyn::cublasGemmEx(
          cublas_, op_b, op_a, n, m, k, &alpha, b.data<float>(), CUDA_R_32F,
          as_int(b.dim(1), "ldb"), a.data<float>(), CUDA_R_32F, as_int(a.dim(1), "lda"), &beta,
          c.data<float>(), CUDA_R_32F, n, CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT));
      return;
    case Precision::BF16: {
      Tensor a16 = casts_.get(ctx_, a, 0, to_bf16());
      Tensor b16 = casts_.get(ctx_, b, 1, to_bf16());
      if (!lt_) lt_ = std::make_unique<LtGemm>(device_, stream_);
      if (lt_->bf16(trans_a, trans_b, m, n, k, alpha, a16.raw_data(), b16.raw_data(), beta,
                    c.data<float>()))
        return;
      // cuBLASLt's heuristic had no algorithm for this shape (gemm_lt.hpp): the same product,
      // bf16 in and f32 accumulation and output, through cublasGemmEx.
      LOCKSTEP_CHECK_CUBLAS(dyn::cublasGemmEx(
          cublas_, op_b, op_a, n, m, k, &alpha, b16.raw_data(), CUDA_R_16BF,
          as_int(b.dim(1), "ldb"), a16.raw_data(), CUDA_R_16BF, as_int(a.dim(1), "lda"), &beta,
          c.data<float>(), CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      return;
    }
  }
}

// gemm over the first k of the inner dimension (ops::gemm_leading): the same calls as gemm, told
// k and the operands' real row lengths. Under bf16 through cublasGemmEx, which takes any leading
// dimension (LtGemm's layouts assume rows of exactly k).
void CudaBackend::gemm_leading(std::int64_t k64, float alpha, const Tensor& a, const Tensor& b,
                               float beta, Tensor& c) {
  activate();
  const int m = as_int(c.dim(0), "M"), n = as_int(c.dim(1), "N"), k = as_int(k64, "K");
  const int lda = as_int(a.dim(1), "lda"), ldb = as_int(b.dim(1), "ldb");
  if (m == 0 || n == 0) return;
  switch (ctx_.precision()) {
    case Precision::FP32:
      LOCKSTEP_CHECK_CUBLAS(dyn::cublasSgemm(cublas_, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &alpha,
                                             b.data<float>(), ldb, a.data<float>(), lda, &beta,
                                             c.data<float>(), n));
      return;
    case Precision::TF32:
      LOCKSTEP_CHECK_CUBLAS(dyn::cublasGemmEx(
          cublas_, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &alpha, b.data<float>(), CUDA_R_32F, ldb,
          a.data<float>(), CUDA_R_32F, lda, &beta, c.data<float>(), CUDA_R_32F, n,
          CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT));
      return;
    case Precision::BF16: {
      Tensor a16 = casts_.get(ctx_, a, 0, to_bf16());
      Tensor b16 = casts_.get(ctx_, b, 1, to_bf16());
      LOCKSTEP_CHECK_CUBLAS(dyn::cublasGemmEx(cublas_, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &alpha,
                                              b16.raw_data(), CUDA_R_16BF, ldb, a16.raw_data(),
                                              CUDA_R_16BF, lda, &beta, c.data<float>(), CUDA_R_32F,
                                              n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      return;
    }
  }
}

}  // namespace lockstep::ops::cuda
