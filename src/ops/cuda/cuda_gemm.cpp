// Dense GEMM: CudaBackend::gemm (cublasSgemm for fp32, cublasGemmEx for tf32) and LtGemm
// (gemm_lt.hpp: cuBLASLt for bf16, falling back to cublasGemmEx where its heuristic has no
// algorithm); the fused linear ops, which fold bias, GELU and bias gradient into cuBLASLt's
// epilogues under bf16.
#include "ops/cuda/gemm_lt.hpp"

#include <atomic>
#include <climits>
#include <cstdio>
#include <string>

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

namespace {

cublasLtEpilogue_t lt_epilogue(const LtEpilogue& e) {
  switch (e.kind) {
    case LtEpilogueKind::None:
      return CUBLASLT_EPILOGUE_DEFAULT;
    case LtEpilogueKind::Bias:
      return CUBLASLT_EPILOGUE_BIAS;
    case LtEpilogueKind::GeluAuxBias:
      return e.bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    case LtEpilogueKind::DGelu:
      return CUBLASLT_EPILOGUE_DGELU;
    case LtEpilogueKind::BGradA:
      return CUBLASLT_EPILOGUE_BGRADB;  // cuBLASLt's B is our a
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

const char* epilogue_name(LtEpilogueKind kind) {
  switch (kind) {
    case LtEpilogueKind::None:
      return "no";
    case LtEpilogueKind::Bias:
      return "the BIAS";
    case LtEpilogueKind::GeluAuxBias:
      return "the GELU_AUX(_BIAS)";
    case LtEpilogueKind::DGelu:
      return "the DGELU";
    case LtEpilogueKind::BGradA:
      return "the BGRADB";
  }
  return "an unknown";
}

// cuBLASLt's documented rules for epilogue operands; "" when they hold.
std::string epilogue_rule_broken(const LtEpilogue& e, std::int64_t n) {
  if (e.bias && alignment(e.bias) < 16) return "the bias vector is not 16-byte aligned";
  if (e.kind == LtEpilogueKind::GeluAuxBias || e.kind == LtEpilogueKind::DGelu) {
    if (!e.aux) return "no aux matrix was given";
    if (alignment(e.aux) < 16) return "the aux matrix is not 16-byte aligned";
    if (e.aux_ld % 8 != 0 || e.aux_ld < n)
      return "the aux leading dimension is not a multiple of 8 as wide as the output";
  }
  return "";
}

}  // namespace

bool LtGemm::bf16(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                  float alpha, const void* a, const void* b, float beta, void* c, bool c_bf16,
                  const LtEpilogue& e) {
  const std::uint32_t align_a = alignment(a), align_b = alignment(b), align_c = alignment(c);
  const std::uint32_t align_bias = e.bias ? alignment(e.bias) : 0;
  const std::uint32_t align_aux = e.aux ? alignment(e.aux) : 0;
  const Key key{m,        n,          k,         trans_a,
                trans_b,  beta != 0,  align_a,   align_b,
                align_c,  align_bias, align_aux, static_cast<std::int64_t>(e.kind),
                e.aux_ld, c_bf16};
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
    LOCKSTEP_CHECK_CUBLAS(
        dyn::cublasLtMatrixLayoutCreate(&plan->c, c_bf16 ? CUDA_R_16BF : CUDA_R_32F, un, um, un));

    std::string broken;
    cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
    if (e.kind != LtEpilogueKind::None) {
      broken = epilogue_rule_broken(e, n);
      if (broken.empty()) {
        // The operands' pointers are set now too: the heuristic reads their alignment from them.
        const cublasLtEpilogue_t epi = lt_epilogue(e);
        status = dyn::cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                                     sizeof(epi));
        if (status == CUBLAS_STATUS_SUCCESS && e.aux) {
          const std::int64_t ld = e.aux_ld;
          status = dyn::cublasLtMatmulDescSetAttribute(
              plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof(ld));
        }
        if (status == CUBLAS_STATUS_SUCCESS) status = set_pointers(plan->op, e);
      }
    }

    cublasLtMatmulPreference_t pref = nullptr;
    LOCKSTEP_CHECK_CUBLAS(dyn::cublasLtMatmulPreferenceCreate(&pref));
    const std::uint64_t ws = kLtWorkspaceBytes;
    // cuBLASLt's "A" is b and its "B" is a (see above).
    const std::uint32_t lt_align_a = align_b, lt_align_b = align_a;
    if (status == CUBLAS_STATUS_SUCCESS)
      status = dyn::cublasLtMatmulPreferenceSetAttribute(
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
    if (status == CUBLAS_STATUS_SUCCESS && broken.empty())
      status = dyn::cublasLtMatmulAlgoGetHeuristic(handle_, plan->op, plan->a, plan->b, plan->c,
                                                   plan->c, pref, 1, &result, &found);
    dyn::cublasLtMatmulPreferenceDestroy(pref);
    // NOT_SUPPORTED is the heuristic's "nothing for this configuration", not a failure; with an
    // epilogue, so is an attribute this cuBLASLt does not take (INVALID_VALUE).
    const bool no_answer =
        status == CUBLAS_STATUS_NOT_SUPPORTED ||
        (e.kind != LtEpilogueKind::None && status == CUBLAS_STATUS_INVALID_VALUE);
    if (!no_answer) LOCKSTEP_CHECK_CUBLAS(status);
    plan->has_algo = broken.empty() && status == CUBLAS_STATUS_SUCCESS && found > 0;
    if (plan->has_algo) {
      plan->algo = result.algo;
    } else if (e.kind == LtEpilogueKind::None) {
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
    } else {
      static std::atomic<bool> warned{false};
      if (!warned.exchange(true))
        std::fprintf(stderr,
                     "warning: cuBLASLt %s %s epilogue for the bf16 C[%lld, %lld] = op(A)[%lld, "
                     "%lld] op(B)[%lld, %lld]%s%s; computing it with the plain GEMM and separate "
                     "kernels instead (same result; further such cases are not reported)\n",
                     broken.empty() ? "has no algorithm with" : "cannot take",
                     epilogue_name(e.kind), static_cast<long long>(m), static_cast<long long>(n),
                     static_cast<long long>(m), static_cast<long long>(k),
                     static_cast<long long>(k), static_cast<long long>(n),
                     broken.empty() ? "" : ": ", broken.c_str());
    }
    it = plans_.emplace(key, std::move(plan)).first;
  }
  if (!it->second->has_algo) return false;
  if (!workspace_.defined())
    workspace_ = Tensor::empty({static_cast<std::int64_t>(kLtWorkspaceBytes)}, DType::U8, device_);
  const Plan& p = *it->second;
  // Plans are keyed by the pointers' alignments, not the pointers: this call's go in now.
  if (e.kind != LtEpilogueKind::None) LOCKSTEP_CHECK_CUBLAS(set_pointers(p.op, e));
  LOCKSTEP_CHECK_CUBLAS(dyn::cublasLtMatmul(handle_, p.op, &alpha, b, p.a, a, p.b, &beta, c, p.c, c,
                                            p.c, &p.algo, workspace_.raw_data(), kLtWorkspaceBytes,
                                            stream_));
  return true;
}

cublasStatus_t LtGemm::set_pointers(cublasLtMatmulDesc_t op, const LtEpilogue& e) {
  cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
  if (e.bias)
    status = dyn::cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &e.bias,
                                                 sizeof(e.bias));
  if (status == CUBLAS_STATUS_SUCCESS && e.aux)
    status = dyn::cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                 &e.aux, sizeof(e.aux));
  return status;
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
    if (c.dtype() == DType::BF16)  // beta is 0 (ops.cpp): +0.0 is all zero bits
      LOCKSTEP_CHECK_CUDA(cudaMemsetAsync(c.raw_data(), 0, c.nbytes(), stream_));
    else if (beta == 0.0f)
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
      const bool c16 = c.dtype() == DType::BF16;  // an activation: written rounded, beta 0
      if (lt().bf16(trans_a, trans_b, m, n, k, alpha, a16.raw_data(), b16.raw_data(), beta,
                    c.raw_data(), c16))
        return;
      // cuBLASLt's heuristic had no algorithm for this shape (gemm_lt.hpp): the same product,
      // bf16 in and f32 accumulation, through cublasGemmEx.
      LOCKSTEP_CHECK_CUBLAS(dyn::cublasGemmEx(cublas_, op_b, op_a, n, m, k, &alpha, b16.raw_data(),
                                              CUDA_R_16BF, as_int(b.dim(1), "ldb"), a16.raw_data(),
                                              CUDA_R_16BF, as_int(a.dim(1), "lda"), &beta,
                                              c.raw_data(), c16 ? CUDA_R_16BF : CUDA_R_32F, n,
                                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      return;
    }
  }
}

LtGemm& CudaBackend::lt() {
  if (!lt_) lt_ = std::make_unique<LtGemm>(device_, stream_);
  return *lt_;
}

// ---- the fused linear ops (ops.hpp). Under bf16 each tries its cuBLASLt epilogue and composes
// what cuBLASLt declines from the plain GEMM and the element kernels (Backend's compose_*), so a
// shape without an epilogue algorithm still runs, warned once (gemm_lt.hpp). Under fp32 and tf32
// they are the compositions: the epilogues exist for the bf16 path only (cuBLASLt's f32 kernels
// with epilogues are not what cublasSgemm runs, and fp32 is the reference the others are held to).
// With bf16 activations (a GPT block's) the epilogues write bf16: the output and the GELU's aux
// input in bf16, the bias read in bf16 (cuBLASLt takes it in the output's type: the bias is
// rounded once per reuse window, as a parameter, in the cast cache), and DGELU rounds dx once
// where the composition rounds the product, then the GELU's backward.

bool CudaBackend::linear_forward_epilogue(const Tensor& x, const Tensor& w, const Tensor& b,
                                          Activation act, Tensor& y, Tensor& pre_act) {
  const std::int64_t m = x.dim(0), n = w.dim(0), k = w.dim(1);
  if (ctx_.precision() != Precision::BF16 || m == 0 || n == 0 || k == 0) return false;
  if (act == Activation::None && !b.defined()) return false;  // nothing to fold
  const bool out16 = y.dtype() == DType::BF16;
  Tensor b16 = out16 && b.defined() ? casts_.get(ctx_, b, 2, to_bf16()) : Tensor();
  LtEpilogue e;
  e.bias = b.defined() ? (out16 ? b16.raw_data() : b.raw_data()) : nullptr;
  if (act == Activation::GeluTanh) {
    e.kind = LtEpilogueKind::GeluAuxBias;
    e.aux = pre_act.raw_data();
    e.aux_ld = n;
  } else {
    e.kind = LtEpilogueKind::Bias;
  }
  Tensor x16 = casts_.get(ctx_, x, 0, to_bf16());
  Tensor w16 = casts_.get(ctx_, w, 1, to_bf16());
  return lt().bf16(false, true, m, n, k, 1.0f, x16.raw_data(), w16.raw_data(), 0.0f, y.raw_data(),
                   out16, e);
}

void CudaBackend::linear_forward(const Tensor& x, const Tensor& w, const Tensor& b, Activation act,
                                 Tensor& y, Tensor& pre_act) {
  activate();
  if (!linear_forward_epilogue(x, w, b, act, y, pre_act))
    Backend::linear_forward(x, w, b, act, y, pre_act);
}

// The epilogue's GELU is cuBLASLt's, whose bits gelu_tanh_forward need not match: the recompute
// runs the forward's GEMM again (the same key, so the same algorithm: the same bits; its aux
// output rewrites pre_act with the values it holds). Where the forward composed, so does this.
void CudaBackend::linear_recompute_activation(const Tensor& x, const Tensor& w, const Tensor& b,
                                              Activation act, Tensor& pre_act, Tensor& y) {
  activate();
  if (!linear_forward_epilogue(x, w, b, act, y, pre_act))
    Backend::linear_recompute_activation(x, w, b, act, pre_act, y);
}

void CudaBackend::linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy,
                                  const Tensor& dy16, Tensor& dw, Tensor& db, Tensor& dx,
                                  const LinearBackward& p) {
  activate();
  const Tensor& dy_operand = dy16.defined() ? dy16 : dy;
  const std::int64_t rows = dy.dim(0), out = w.dim(0), in = w.dim(1);
  if (ctx_.precision() != Precision::BF16 || rows == 0 || out == 0 || in == 0) {
    Backend::linear_backward(x, w, dy, dy16, dw, db, dx, p);
    return;
  }
  Tensor d16 = casts_.get(ctx_, dy_operand, 0, to_bf16());
  // dW = dy^T x, and an overwritten bias gradient as the epilogue's column sums of dy16 (cuBLASLt
  // writes it whole, so an accumulating one is composed: sum_rows adds into it).
  bool dw_done = false, db_done = !db.defined();
  if (db.defined() && p.overwrite_db) {
    Tensor x16 = casts_.get(ctx_, x, 1, to_bf16());
    LtEpilogue e;
    e.kind = LtEpilogueKind::BGradA;
    e.bias = db.data<float>();
    dw_done = db_done = lt().bf16(true, false, out, in, rows, 1.0f, d16.raw_data(), x16.raw_data(),
                                  p.overwrite_dw ? 0.0f : 1.0f, dw.data<float>(), false, e);
  }
  if (!dw_done) compose_linear_dw(x, d16, dw, p.overwrite_dw);
  if (!db_done) compose_linear_db(dy, db, p.overwrite_db);
  if (!dx.defined()) return;
  if (p.input_act == Activation::GeluTanh) {
    Tensor w16 = casts_.get(ctx_, w, 1, to_bf16());
    LtEpilogue e;
    e.kind = LtEpilogueKind::DGelu;
    e.aux = p.input_pre_act.raw_data();  // read only, by DGELU; of dx's type
    e.aux_ld = in;
    if (lt().bf16(false, false, rows, in, out, 1.0f, d16.raw_data(), w16.raw_data(), 0.0f,
                  dx.raw_data(), dx.dtype() == DType::BF16, e))
      return;
  }
  compose_linear_dx(w, d16, dx, p);
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
