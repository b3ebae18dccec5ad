// The CUDA backend: cuBLAS for GEMM, cuDNN for convolutions, own kernels (kernels.cu) for the
// rest, all queued on one non-blocking compute stream per Context. Nothing here synchronises the
// device; ops that return a host value (count_correct, sum_squares, all_finite) and copies to
// the host wait for this stream only. Arguments were validated by ops.cpp.
//
// Pooling uses own kernels, not cuDNN: cuDNN's pooling backward needs x and y besides dy, but the
// ops interface hands the backward only dy and a backend-owned workspace, so cuDNN would force a
// copy of every pooled activation. An i32 argmax (the size of y) is smaller and gives the same
// tie-breaking (first maximum) as the CPU.
//
// Batch norm uses own kernels (kernels.cu) with PyTorch's semantics: batch statistics with the
// biased variance for normalisation, running_var updated with the unbiased variance,
// running = (1 - momentum) * running + momentum * batch_stat.
//
// Precision (ops/precision.hpp), read from the Context at every GEMM and convolution: fp32 is
// cublasSgemm with cuBLAS's default math (no TF32) and FMA-only cuDNN algorithms, so CUDA
// matches the CPU to float rounding; tf32 is cublasGemmEx with CUBLAS_COMPUTE_32F_FAST_TF32 and
// tensor-core cuDNN algorithms on the same f32 tensors; bf16 converts the operands (CastCache:
// parameters once per reuse window) and runs cuBLASLt (gemm_lt.cpp, f32 accumulation and f32
// output) or cuDNN's bf16 convolutions, whose bf16 outputs are widened back to f32 (the weight
// gradient is added into dw in f32).
#include <algorithm>
#include <bit>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>

#include "lockstep/ops/backend.hpp"
#include "lockstep/ops/cuda.hpp"
#include "lockstep/ops/device_runtime.hpp"
#include "ops/bad_input.hpp"
#include "ops/cast_cache.hpp"
#include "ops/cuda/check.hpp"
#include "ops/cuda/conv.hpp"
#include "ops/cuda/cuda_backend.hpp"
#include "ops/cuda/flat.hpp"
#include "ops/cuda/gemm_lt.hpp"
#include "ops/cuda/kernels.hpp"
#include "ops/cuda/precision_kernels.hpp"
#include "ops/cuda/transformer.hpp"

namespace lockstep::ops {
namespace cuda {
namespace {

std::uint16_t* bf16_data(const Tensor& t) {
  return static_cast<std::uint16_t*>(t.raw_data());
}

int as_int(std::int64_t v, const char* what) {
  LOCKSTEP_CHECK(v >= 0 && v <= INT_MAX, "gemm ", what, " = ", v,
                 " exceeds cuBLAS's 32-bit dimension limit");
  return static_cast<int>(v);
}

// Device words the reductions and the embedding write; the host reads them in one 40-byte copy.
struct DeviceResults {
  unsigned long long bad_label;  // (row << 32 | label) of the first bad label, ~0 when none
  unsigned long long bad_token;  // (position << 32 | token) of the first bad token, ~0 when none
  unsigned long long correct;
  int nonfinite;
  int pad;
  double sum;
};
static_assert(sizeof(DeviceResults) == 40);

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(Context& ctx) : ctx_(ctx), device_(ctx.device()) {
    activate_device(device_.index);
    LOCKSTEP_CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    runtime_ = make_runtime(device_.index, stream_);
    LOCKSTEP_CHECK_CUBLAS(dyn::cublasCreate(&cublas_));
    LOCKSTEP_CHECK_CUBLAS(dyn::cublasSetStream(cublas_, stream_));
    // Default math: cublasSgemm stays true f32 (TF32 only where the policy asks, per call).
    LOCKSTEP_CHECK_CUBLAS(dyn::cublasSetMathMode(cublas_, CUBLAS_DEFAULT_MATH));
    results_ =
        Tensor::empty({static_cast<std::int64_t>(sizeof(DeviceResults))}, DType::U8, device_);
    partials_ = Tensor::empty({kReducePartials}, DType::F64, device_);
    LOCKSTEP_CHECK_CUDA(cudaHostAlloc(&host_results_, sizeof(DeviceResults), cudaHostAllocDefault));
    reset_bad_words();
  }

  ~CudaBackend() override {
    // Destructors must not throw; a failure here has nobody left to report to.
    (void)cudaSetDevice(device_.index);
    (void)cudaStreamSynchronize(stream_);
    casts_ = CastCache();
    lt_.reset();
    conv_.reset();
    dyn::cublasDestroy(cublas_);
    (void)cudaFreeHost(host_results_);
    results_ = Tensor();
    partials_ = Tensor();
    scale_shift_ = Tensor();
    (void)cudaStreamDestroy(stream_);
  }

  cudaStream_t stream() const { return stream_; }
  DeviceRuntime* runtime() override { return runtime_.get(); }

  void synchronize() override {
    activate();
    read_results();  // syncs the stream and reports a bad label seen since the last check
  }

  // ---- memory
  void fill(Tensor& t, float value) override {
    activate();
    std::uint32_t bits = t.dtype() == DType::F32
                             ? std::bit_cast<std::uint32_t>(value)
                             : static_cast<std::uint32_t>(static_cast<std::int32_t>(value));
    fill_u32(static_cast<std::uint32_t*>(t.raw_data()), t.numel(), bits, stream_);
  }

  void copy(const Tensor& src, Tensor& dst) override {
    activate();
    if (src.device().is_cpu() && dst.device().is_cpu()) {
      std::memcpy(dst.raw_data(), src.raw_data(), src.nbytes());
      return;
    }
    // From pageable host memory the call returns once the bytes are staged, so the source may
    // be reused at once; to the host we wait, since the caller reads the data next.
    if (src.device().is_cpu()) note_pageable_copy();
    LOCKSTEP_CHECK_CUDA(
        cudaMemcpyAsync(dst.raw_data(), src.raw_data(), src.nbytes(), cudaMemcpyDefault, stream_));
    if (dst.device().is_cpu()) {
      // The bad-label and bad-token words come back in the same wait (16 bytes into pinned
      // memory, no extra sync): this is how the trainer reads its gradient check, and a bad
      // label must be reported as one, not as the NaN gradient it leads to.
      LOCKSTEP_CHECK_CUDA(cudaMemcpyAsync(&host_results_->bad_label, &results()->bad_label,
                                          kBadWordsBytes, cudaMemcpyDeviceToHost, stream_));
      LOCKSTEP_CHECK_CUDA(cudaStreamSynchronize(stream_));
      note_host_sync();
      raise_bad_input(host_results_->bad_label, host_results_->bad_token);
    }
  }

  // ---- dense linear algebra. Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T,
  // and a row-major matrix read as column-major is its transpose: so call cuBLAS with the
  // operands swapped and the same transpose flags.
  void gemm(bool trans_a, bool trans_b, float alpha, const Tensor& a, const Tensor& b, float beta,
            Tensor& c) override {
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
        LOCKSTEP_CHECK_CUBLAS(dyn::cublasSgemm(
            cublas_, op_b, op_a, n, m, k, &alpha, b.data<float>(), as_int(b.dim(1), "ldb"),
            a.data<float>(), as_int(a.dim(1), "lda"), &beta, c.data<float>(), n));
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

  void add_row_bias(Tensor& y, const Tensor& bias) override {
    activate();
    // y may have any rank: its last dimension is the feature dimension.
    cuda::add_row_bias(y.data<float>(), bias.data<float>(),
                       y.numel() / std::max<std::int64_t>(bias.numel(), 1), bias.numel(), stream_);
  }

  void sum_rows(const Tensor& dy, Tensor& db) override {
    activate();
    sum_rows_acc(dy.data<float>(), db.data<float>(),
                 dy.numel() / std::max<std::int64_t>(db.numel(), 1), db.numel(), stream_);
  }

  // ---- elementwise
  void relu_forward(const Tensor& x, Tensor& y) override {
    activate();
    cuda::relu_forward(x.data<float>(), y.data<float>(), x.numel(), stream_);
  }
  void relu_backward(const Tensor& y, const Tensor& dy, Tensor& dx) override {
    activate();
    cuda::relu_backward(y.data<float>(), dy.data<float>(), dx.data<float>(), y.numel(), stream_);
  }
  void gelu_forward(const Tensor& x, Tensor& y) override {
    activate();
    cuda::gelu_forward(x.data<float>(), y.data<float>(), x.numel(), stream_);
  }
  void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) override {
    activate();
    cuda::gelu_backward(x.data<float>(), dy.data<float>(), dx.data<float>(), x.numel(), stream_);
  }
  void add(const Tensor& a, const Tensor& b, Tensor& out) override {
    activate();
    cuda::add(a.data<float>(), b.data<float>(), out.data<float>(), a.numel(), stream_);
  }
  void axpy(float alpha, const Tensor& x, Tensor& y) override {
    activate();
    cuda::axpy(alpha, x.data<float>(), y.data<float>(), x.numel(), stream_);
  }
  void scale(Tensor& x, float alpha) override {
    activate();
    cuda::scale(x.data<float>(), alpha, x.numel(), stream_);
  }
  void dropout_forward(const Tensor& x, Tensor& y, Tensor& mask, float p, std::uint64_t seed,
                       std::uint64_t stream) override {
    activate();
    cuda::dropout_forward(x.data<float>(), y.data<float>(), mask.data<std::uint8_t>(), x.numel(), p,
                          seed, stream, stream_);
  }
  void dropout_backward(const Tensor& dy, const Tensor& mask, float p, Tensor& dx) override {
    activate();
    cuda::dropout_backward(dy.data<float>(), mask.data<std::uint8_t>(), dx.data<float>(),
                           dy.numel(), p, stream_);
  }

  void normalize_input(const Tensor& x, const std::vector<float>& mean,
                       const std::vector<float>& stddev, Tensor& y) override {
    activate();
    const std::int64_t n = x.dim(0), channels = x.ndim() >= 2 ? x.dim(1) : 1;
    const std::int64_t inner = n * channels != 0 ? x.numel() / (n * channels) : 1;
    // One scale and shift per channel, folded exactly as the CPU backend does. Uploaded only
    // when they change (every step normalises with the same ones): no pageable copy per step.
    // The upload is ordered after the kernels that read the previous values on this stream.
    const float in_scale = x.dtype() == DType::U8 ? 1.0f / 255.0f : 1.0f;
    std::vector<float> host(static_cast<std::size_t>(2 * channels));
    for (std::int64_t c = 0; c < channels; ++c) {
      float m = mean.empty() ? 0.0f : mean[c], s = stddev.empty() ? 1.0f : stddev[c];
      host[c] = in_scale / s;
      host[channels + c] = -m / s;
    }
    if (host != scale_shift_host_) {
      if (!scale_shift_.defined() || scale_shift_.numel() < 2 * channels)
        scale_shift_ = Tensor::empty({2 * channels}, DType::F32, device_);
      scale_shift_host_ = std::move(host);
      // The pageable source is staged before cudaMemcpyAsync returns.
      note_pageable_copy();
      LOCKSTEP_CHECK_CUDA(cudaMemcpyAsync(scale_shift_.raw_data(), scale_shift_host_.data(),
                                          scale_shift_host_.size() * sizeof(float),
                                          cudaMemcpyHostToDevice, stream_));
    }
    if (x.dtype() == DType::U8)
      normalize_u8(x.data<std::uint8_t>(), y.data<float>(), x.numel(), channels, inner,
                   scale_shift_.data<float>(), stream_);
    else
      normalize_f32(x.data<float>(), y.data<float>(), x.numel(), channels, inner,
                    scale_shift_.data<float>(), stream_);
  }

  // ---- convolution and pooling
  void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y,
                      const Conv2dParams& p) override {
    activate();
    if (ctx_.precision() == Precision::BF16) {
      Tensor x16 = casts_.get(ctx_, x, 0, to_bf16()), w16 = casts_.get(ctx_, w, 1, to_bf16());
      Tensor y16 = casts_.scratch(ctx_, 2, y.shape());
      conv().forward(x16, w16, y16, p, Precision::BF16);
      bf16_to_f32(bf16_data(y16), y.data<float>(), y.numel(), stream_);
    } else {
      conv().forward(x, w, y, p, ctx_.precision());
    }
    if (b.defined())
      add_channel_bias(y.data<float>(), b.data<float>(), y.dim(0), y.dim(1), y.dim(2) * y.dim(3),
                       stream_);
  }
  void conv2d_backward_data(const Tensor& dy, const Tensor& w, Tensor& dx,
                            const Conv2dParams& p) override {
    activate();
    if (ctx_.precision() == Precision::BF16) {
      Tensor dy16 = casts_.get(ctx_, dy, 0, to_bf16()), w16 = casts_.get(ctx_, w, 1, to_bf16());
      Tensor dx16 = casts_.scratch(ctx_, 2, dx.shape());
      conv().backward_data(dy16, w16, dx16, p, Precision::BF16);
      bf16_to_f32(bf16_data(dx16), dx.data<float>(), dx.numel(), stream_);
    } else {
      conv().backward_data(dy, w, dx, p, ctx_.precision());
    }
  }
  void conv2d_backward_weights(const Tensor& x, const Tensor& dy, Tensor& dw, Tensor& db,
                               const Conv2dParams& p) override {
    activate();
    if (ctx_.precision() == Precision::BF16) {
      // cuDNN's bf16 convolutions write bf16 (no f32-output configuration in its legacy API),
      // so this micro-step's weight gradient is rounded once, then accumulated in f32.
      Tensor x16 = casts_.get(ctx_, x, 0, to_bf16()), dy16 = casts_.get(ctx_, dy, 1, to_bf16());
      Tensor dw16 = casts_.scratch(ctx_, 2, dw.shape());
      conv().backward_filter(x16, dy16, dw16, p, Precision::BF16, /*accumulate=*/false);
      add_bf16_to_f32(bf16_data(dw16), dw.data<float>(), dw.numel(), stream_);
    } else {
      conv().backward_filter(x, dy, dw, p, ctx_.precision(), /*accumulate=*/true);
    }
    if (db.defined())
      sum_channels_acc(dy.data<float>(), db.data<float>(), dy.dim(0), dy.dim(1),
                       dy.dim(2) * dy.dim(3), stream_);
  }

  void pool2d_forward(PoolKind kind, const Tensor& x, Tensor& y, Tensor& workspace,
                      const Pool2dParams& p) override {
    activate();
    PoolShape s = pool_shape(x.shape(), y.shape(), p);
    if (kind == PoolKind::Avg) {
      avg_pool_forward(x.data<float>(), y.data<float>(), s, stream_);
      return;
    }
    if (!workspace.defined() || workspace.shape() != y.shape() || workspace.dtype() != DType::I32 ||
        workspace.device() != device_)
      workspace = Tensor::empty(y.shape(), DType::I32, device_);
    max_pool_forward(x.data<float>(), y.data<float>(), workspace.data<std::int32_t>(), s, stream_);
  }

  void pool2d_backward(PoolKind kind, const Tensor& dy, const Tensor& workspace, Tensor& dx,
                       const Pool2dParams& p) override {
    activate();
    PoolShape s = pool_shape(dx.shape(), dy.shape(), p);
    if (kind == PoolKind::Avg) {
      avg_pool_backward(dy.data<float>(), dx.data<float>(), s, stream_);
      return;
    }
    LOCKSTEP_CHECK(
        workspace.defined() && workspace.shape() == dy.shape() && workspace.dtype() == DType::I32,
        "max pool backward on ", device_.str(), ": the workspace ", workspace.describe(),
        " is not the one pool2d_forward returned for ", dy.describe());
    max_pool_backward(dy.data<float>(), workspace.data<std::int32_t>(), dx.data<float>(), s,
                      stream_);
  }

  // ---- batch normalisation
  void batchnorm_forward_train(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& y,
                               Tensor& save_mean, Tensor& save_invstd, Tensor& running_mean,
                               Tensor& running_var, float momentum, float eps) override {
    activate();
    auto [n, c, inner] = bn_dims(x);
    cuda::batchnorm_forward_train(x.data<float>(), gamma.data<float>(), beta.data<float>(),
                                  y.data<float>(), save_mean.data<float>(),
                                  save_invstd.data<float>(), running_mean.data<float>(),
                                  running_var.data<float>(), momentum, eps, n, c, inner, stream_);
  }
  void batchnorm_forward_eval(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                              const Tensor& running_mean, const Tensor& running_var, float eps,
                              Tensor& y) override {
    activate();
    auto [n, c, inner] = bn_dims(x);
    cuda::batchnorm_forward_eval(x.data<float>(), gamma.data<float>(), beta.data<float>(),
                                 running_mean.data<float>(), running_var.data<float>(), eps,
                                 y.data<float>(), n, c, inner, stream_);
  }
  void batchnorm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma,
                          const Tensor& save_mean, const Tensor& save_invstd, Tensor& dx,
                          Tensor& dgamma, Tensor& dbeta) override {
    activate();
    auto [n, c, inner] = bn_dims(x);
    cuda::batchnorm_backward(x.data<float>(), dy.data<float>(), gamma.data<float>(),
                             save_mean.data<float>(), save_invstd.data<float>(), dx.data<float>(),
                             dgamma.data<float>(), dbeta.data<float>(), n, c, inner, stream_);
  }

  // ---- loss and metrics. A label outside [0, C) is recorded on the device and reported by the
  // next call that waits for the stream anyway (synchronize, count_correct, sum_squares, a copy
  // to the host): checking here would cost a stream synchronisation per step.
  void softmax_xent_forward(const Tensor& logits, const Tensor& labels, Tensor& probs,
                            Tensor& loss) override {
    activate();
    std::int64_t rows = logits.dim(0), classes = logits.dim(1);
    Tensor row_loss = Tensor::empty({rows}, DType::F32, device_);
    label_classes_ = classes;
    note_label_op("softmax_xent_forward");
    cuda::softmax_xent_forward(logits.data<float>(), labels.data<std::int32_t>(),
                               probs.data<float>(), row_loss.data<float>(), loss.data<float>(),
                               rows, classes, &results()->bad_label, stream_);
  }
  void softmax_xent_backward(const Tensor& probs, const Tensor& labels, float scale,
                             Tensor& dlogits) override {
    activate();
    label_classes_ = probs.dim(1);
    note_label_op("softmax_xent_backward");
    cuda::softmax_xent_backward(probs.data<float>(), labels.data<std::int32_t>(), scale,
                                dlogits.data<float>(), probs.dim(0), probs.dim(1),
                                &results()->bad_label, stream_);
  }
  std::int64_t count_correct(const Tensor& logits, const Tensor& labels) override {
    activate();
    cuda::count_correct(logits.data<float>(), labels.data<std::int32_t>(), logits.dim(0),
                        logits.dim(1), &results()->correct, stream_);
    return static_cast<std::int64_t>(read_results().correct);
  }

  double sum_squares(const Tensor& x) override {
    activate();
    cuda::sum_squares(x.data<float>(), x.numel(), partials_.data<double>(), &results()->sum,
                      stream_);
    return read_results().sum;
  }
  bool all_finite(const Tensor& x) override {
    activate();
    find_nonfinite(x.data<float>(), x.numel(), &results()->nonfinite, stream_);
    return read_results().nonfinite == 0;
  }

  // ---- optimizers
  void sgd_update(Tensor& param, const Tensor& grad, Tensor& momentum_buf,
                  const SgdParams& p) override {
    activate();
    SgdArgs a{p.lr, p.momentum, p.dampening, p.weight_decay, p.nesterov, p.first_step};
    float* buf = momentum_buf.defined() ? momentum_buf.data<float>() : nullptr;
    cuda::sgd_update(param.data<float>(), grad.data<float>(), buf, param.numel(), a, stream_);
  }
  void adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                    const AdamWParams& p) override {
    activate();
    cuda::adamw_update(param.data<float>(), grad.data<float>(), m.data<float>(), v.data<float>(),
                       param.numel(), adamw_args(p), stream_);
  }

  // ---- fused ops over flat buffers (flat.cpp)
  std::shared_ptr<const FlatPlan> make_flat_plan(std::vector<FlatSegment> segments,
                                                 std::int64_t numel) override {
    activate();
    return cuda::make_flat_plan(device_, std::move(segments), numel, stream_);
  }
  void flat_sgd_update(const FlatPlan& plan, FlatRange range, Tensor& param, const Tensor& grad,
                       Tensor& momentum_buf, std::int64_t state_origin,
                       const SgdParams& p) override {
    activate();
    cuda::flat_sgd_update(plan, range, param, grad, momentum_buf, state_origin, p, stream_);
  }
  void flat_adamw_update(const FlatPlan& plan, FlatRange range, Tensor& param, const Tensor& grad,
                         Tensor& m, Tensor& v, std::int64_t state_origin,
                         const AdamWParams& p) override {
    activate();
    cuda::flat_adamw_update(plan, range, param, grad, m, v, state_origin, p, stream_);
  }
  void flat_sum_squares(const FlatPlan& plan, FlatRange range, const Tensor& x, Tensor& sums,
                        FlatSums what) override {
    activate();
    cuda::flat_sum_squares(plan, range, x, sums, what == FlatSums::Squares, stream_);
  }

  // ---- precision
  void check_precision(Precision p) override {
    if (p == Precision::FP32) return;
    int major = 0;
    LOCKSTEP_CHECK_CUDA(
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_.index));
    LOCKSTEP_CHECK_HINT(major >= 8, "set train.precision = fp32 on this GPU",
                        "train.precision = ", precision_name(p),
                        " needs tensor cores of compute capability 8.0 or "
                        "later (Ampere), but ",
                        device_description(device_.index), " has ", major, ".x");
  }
  std::string precision_info(Precision p) override {
    const std::string gpu = " on " + device_description(device_.index);
    switch (p) {
      case Precision::FP32:
        return "fp32: cublasSgemm and FMA-only cuDNN convolutions" + gpu;
      case Precision::TF32:
        return "tf32: cublasGemmEx with CUBLAS_COMPUTE_32F_FAST_TF32 and tensor-core cuDNN "
               "convolutions" +
               gpu;
      case Precision::BF16:
        return "bf16: cuBLASLt with CUBLAS_COMPUTE_32F (f32 output) and cuDNN bf16 convolutions" +
               gpu;
    }
    return "?";
  }
  void cast(const Tensor& src, Tensor& dst) override {
    activate();
    if (src.dtype() == DType::F32)
      f32_to_bf16(src.data<float>(), bf16_data(dst), src.numel(), stream_);
    else
      bf16_to_f32(bf16_data(src), dst.data<float>(), src.numel(), stream_);
  }

  // ---- transformer (GPT) ops: transformer.cu. Workspaces come from the caching allocator per
  // call (the stream orders their reuse).
  void embedding_forward(const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                         Tensor& y) override {
    activate();
    token_positions_ = tokens.dim(1);
    token_vocab_ = wte.dim(0);
    cuda::embedding_forward(tokens.data<std::int32_t>(), wte.data<float>(), wpe.data<float>(),
                            y.data<float>(), tokens.dim(0), tokens.dim(1), wte.dim(1), wte.dim(0),
                            &results()->bad_token, stream_);
  }
  void embedding_backward(const Tensor& tokens, const Tensor& dy, Tensor& dwte,
                          Tensor& dwpe) override {
    activate();
    const std::int64_t n = tokens.numel();
    const std::size_t bytes = embedding_backward_workspace(n, dwte.dim(0));
    Tensor ws = Tensor::empty({static_cast<std::int64_t>(bytes)}, DType::U8, device_);
    cuda::embedding_backward(tokens.data<std::int32_t>(), dy.data<float>(), dwte.data<float>(),
                             dwpe.data<float>(), tokens.dim(0), tokens.dim(1), dwte.dim(1),
                             dwte.dim(0), ws.raw_data(), bytes, stream_);
  }
  void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                         Tensor& y, Tensor& mean, Tensor& rstd) override {
    activate();
    const std::int64_t c = x.dim(-1), rows = c ? x.numel() / c : 0;
    cuda::layernorm_forward(x.data<float>(), weight.data<float>(), bias.data<float>(), eps,
                            y.data<float>(), mean.data<float>(), rstd.data<float>(), rows, c,
                            stream_);
  }
  void layernorm_backward(const Tensor& x, const Tensor& dy, const Tensor& weight,
                          const Tensor& mean, const Tensor& rstd, const Tensor& dresidual,
                          Tensor& dx, Tensor& dweight, Tensor& dbias) override {
    activate();
    const std::int64_t c = x.dim(-1), rows = c ? x.numel() / c : 0;
    Tensor ws = Tensor::empty({std::max<std::int64_t>(layernorm_backward_workspace(rows, c), 1)},
                              DType::F32, device_);
    cuda::layernorm_backward(x.data<float>(), dy.data<float>(), weight.data<float>(),
                             mean.data<float>(), rstd.data<float>(),
                             dresidual.defined() ? dresidual.data<float>() : nullptr,
                             dx.data<float>(), dweight.data<float>(), dbias.data<float>(), rows, c,
                             ws.data<float>(), stream_);
  }
  void gelu_tanh_forward(const Tensor& x, Tensor& y) override {
    activate();
    cuda::gelu_tanh_forward(x.data<float>(), y.data<float>(), x.numel(), stream_);
  }
  void gelu_tanh_backward(const Tensor& x, const Tensor& dy, Tensor& dx) override {
    activate();
    cuda::gelu_tanh_backward(x.data<float>(), dy.data<float>(), dx.data<float>(), x.numel(),
                             stream_);
  }
  // Head widths the flash kernels do not cover fall back to the naive path.
  void attention_forward(const Tensor& qkv, int heads, Tensor& out, Tensor& lse,
                         AttentionKernel kernel) override {
    activate();
    const std::int64_t b = qkv.dim(0), t = qkv.dim(1), c = qkv.dim(2) / 3;
    if (kernel == AttentionKernel::Auto && flash_attention_supported(c / heads)) {
      flash_attention_forward(qkv.data<float>(), out.data<float>(), lse.data<float>(), b, t, c,
                              heads, stream_);
      return;
    }
    Tensor ws =
        Tensor::empty({std::max<std::int64_t>(naive_attention_workspace(b, t, heads, false), 1)},
                      DType::F32, device_);
    naive_attention_forward(qkv.data<float>(), out.data<float>(), lse.data<float>(),
                            ws.data<float>(), b, t, c, heads, stream_);
  }
  void attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& dout,
                          const Tensor& lse, int heads, Tensor& dqkv,
                          AttentionKernel kernel) override {
    activate();
    const std::int64_t b = qkv.dim(0), t = qkv.dim(1), c = qkv.dim(2) / 3;
    if (kernel == AttentionKernel::Auto && flash_attention_supported(c / heads)) {
      Tensor delta = Tensor::empty({std::max<std::int64_t>(b * heads * t, 1)}, DType::F32, device_);
      flash_attention_backward(qkv.data<float>(), out.data<float>(), dout.data<float>(),
                               lse.data<float>(), dqkv.data<float>(), delta.data<float>(), b, t, c,
                               heads, stream_);
      return;
    }
    Tensor ws =
        Tensor::empty({std::max<std::int64_t>(naive_attention_workspace(b, t, heads, true), 1)},
                      DType::F32, device_);
    naive_attention_backward(qkv.data<float>(), out.data<float>(), dout.data<float>(),
                             lse.data<float>(), dqkv.data<float>(), ws.data<float>(), b, t, c,
                             heads, stream_);
  }

 private:
  void activate() { activate_device(device_.index); }

  // The conversion CastCache runs for operands that are not bf16 yet.
  struct ToBf16 {
    cudaStream_t stream;
    void operator()(const Tensor& src, Tensor& dst) const {
      f32_to_bf16(src.data<float>(), bf16_data(dst), src.numel(), stream);
    }
  };
  ToBf16 to_bf16() const { return {stream_}; }

  // cuDNN only for contexts that convolve: creating its handle costs time and memory (and loads
  // the library) that a GPT's context would spend for nothing.
  ConvPlans& conv() {
    if (!conv_) conv_ = std::make_unique<ConvPlans>(device_, stream_);
    return *conv_;
  }

  DeviceResults* results() { return static_cast<DeviceResults*>(results_.raw_data()); }

  // bad_label and bad_token, adjacent: reset and read back together.
  static constexpr std::size_t kBadWordsBytes = 2 * sizeof(unsigned long long);
  static_assert(offsetof(DeviceResults, bad_token) ==
                offsetof(DeviceResults, bad_label) + sizeof(unsigned long long));

  // Sets bad_label and bad_token to ~0: none seen.
  void reset_bad_words() {
    LOCKSTEP_CHECK_CUDA(cudaMemsetAsync(&results()->bad_label, 0xFF, kBadWordsBytes, stream_));
    label_op_ = nullptr;
  }

  // The op that may have recorded a bad label: the first label-reading op since the last reset.
  void note_label_op(const char* op) {
    if (!label_op_) label_op_ = op;
  }

  // Raises a recorded bad token or bad label (a token first: the embedding runs before the loss)
  // with the CPU backend's words (ops/bad_input.hpp) and the device. The stream has finished.
  void raise_bad_input(unsigned long long bad_label, unsigned long long bad_token) {
    if (bad_token != ~0ull) {
      reset_bad_words();
      const auto pos = static_cast<std::int64_t>(bad_token >> 32);
      const auto token = static_cast<std::int32_t>(static_cast<std::uint32_t>(bad_token));
      LOCKSTEP_FAIL_HINT(
          kBadTokenHint,
          bad_token_message(str("embedding_forward on ", device_.str()), token, pos,
                            std::max<std::int64_t>(token_positions_, 1), token_vocab_));
    }
    if (bad_label != ~0ull) {
      const char* op = label_op_ ? label_op_ : "softmax_xent_forward";
      reset_bad_words();
      const auto row = static_cast<std::int64_t>(bad_label >> 32);
      const auto label = static_cast<std::int32_t>(static_cast<std::uint32_t>(bad_label));
      LOCKSTEP_FAIL_HINT(kBadLabelHint, bad_label_message(str(op, " on ", device_.str()), label,
                                                          row, label_classes_));
    }
  }

  // Copies the result words to pinned host memory in one copy, waits for this stream only (one
  // host sync), and raises a recorded bad token or bad label.
  DeviceResults read_results() {
    LOCKSTEP_CHECK_CUDA(cudaMemcpyAsync(host_results_, results(), sizeof(DeviceResults),
                                        cudaMemcpyDeviceToHost, stream_));
    LOCKSTEP_CHECK_CUDA(cudaStreamSynchronize(stream_));
    note_host_sync();
    DeviceResults r = *host_results_;
    raise_bad_input(r.bad_label, r.bad_token);
    return r;
  }

  static PoolShape pool_shape(const Shape& in, const Shape& out, const Pool2dParams& p) {
    return PoolShape{in[0] * in[1], in[2],      in[3],      out[2],  out[3], p.kernel_h,
                     p.kernel_w,    p.stride_h, p.stride_w, p.pad_h, p.pad_w};
  }

  struct BnDims {
    std::int64_t n, c, inner;
  };
  static BnDims bn_dims(const Tensor& x) {
    std::int64_t n = x.dim(0), c = x.dim(1);
    return {n, c, n * c > 0 ? x.numel() / (n * c) : 1};
  }

  Context& ctx_;
  Device device_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<DeviceRuntime> runtime_;
  cublasHandle_t cublas_ = nullptr;
  std::unique_ptr<ConvPlans> conv_;        // and the cuDNN handle: made by the first convolution
  std::unique_ptr<LtGemm> lt_;             // bf16 GEMMs, created by the first one
  CastCache casts_;                        // bf16 copies of GEMM and convolution operands
  Tensor results_;                         // DeviceResults on the device
  Tensor partials_;                        // f64[kReducePartials] for sum_squares
  Tensor scale_shift_;                     // normalize_input's per-channel scales and shifts
  std::vector<float> scale_shift_host_;    // what scale_shift_ holds
  DeviceResults* host_results_ = nullptr;  // pinned
  std::int64_t label_classes_ = 0;
  const char* label_op_ = nullptr;  // see note_label_op
  std::int64_t token_positions_ = 0, token_vocab_ = 0;
};

}  // namespace

cudaStream_t compute_stream(Context& ctx) {
  auto* backend = dynamic_cast<CudaBackend*>(&ctx.backend());
  LOCKSTEP_CHECK(backend != nullptr, "a CUDA stream was asked of a context on ", ctx.device().str(),
                 ", which has no CUDA backend");
  return backend->stream();
}

}  // namespace cuda

std::unique_ptr<Backend> make_cuda_backend(Context& ctx) {
  Device device = ctx.device();
  int count = cuda::visible_device_count();
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  LOCKSTEP_CHECK_HINT(count > 0, "run on a node with a GPU, or set device = cpu", "device ",
                      device.str(),
                      " requested but no GPU is visible to this process (CUDA_VISIBLE_DEVICES=",
                      visible ? visible : "unset", ")");
  LOCKSTEP_CHECK_HINT(device.index < count, "use cuda:0 .. cuda:" + std::to_string(count - 1),
                      "device ", device.str(), " requested but only ", count,
                      " GPU(s) are visible (CUDA_VISIBLE_DEVICES=", visible ? visible : "unset",
                      ")");
  cuda::register_memory_hooks();
  return std::make_unique<cuda::CudaBackend>(ctx);
}

}  // namespace lockstep::ops
