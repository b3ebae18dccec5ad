// The CUDA backend's private header. First what the rest of the CUDA code (memory.cpp, comm/cuda)
// needs from the backend without seeing its class: the compute stream of a context, and the
// process-wide memory hooks. Then CudaBackend, declared once with its state, as cpu/cpu_backend.hpp
// declares CpuBackend; its methods are defined per op family (ggml's layout, one file each):
//   cuda_backend.cpp      construction, synchronize, fill, copy, the result words
//   cuda_elementwise.cu   elementwise ops, biases, dropout, input normalisation
//   cuda_gemm.cpp         gemm: cuBLAS, cuBLASLt for bf16 (LtGemm, gemm_lt.hpp); the fused
//                         linear ops' cuBLASLt epilogues
//   cuda_conv.cpp         cuDNN convolutions (ConvPlans, conv.hpp)
//   cuda_pool.cu          max and average pooling
//   cuda_batchnorm.cu     batch normalisation
//   cuda_loss_optim.cu    softmax cross-entropy, accuracy, reductions, SGD and AdamW
//   cuda_flat.cu          the fused flat-buffer optimizer steps and sums of squares
//   cuda_precision.cu     bf16 casts, precision checks and descriptions
//   cuda_transformer.cu   embedding, LayerNorm, GELU (tanh), attention (lockstep's kernels, and
//                         the casts around cuDNN's in cuda_attention_cudnn.cpp)
//   cuda_layout.cu        batch_transpose: NCHW <-> NHWC, channels-last filters
// Each .cu holds its family's kernels, their launchers (plain pointers and sizes, one stream each;
// each checks its launch, none synchronises) and the methods that unpack Tensors for them; the
// launch helpers are common.cuh's. The launchers one family borrows from another are declared here.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>
#include "lockstep/core/allocator.hpp"

#include "lockstep/ops/backend.hpp"
#include "lockstep/ops/context.hpp"
#include "lockstep/ops/device_runtime.hpp"
#include "ops/cast_cache.hpp"

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

// ---- shared by several families

using i64 = std::int64_t;

// bf16 tensors travel as their 16-bit patterns.
inline std::uint16_t* bf16_data(const Tensor& t) {
  return static_cast<std::uint16_t*>(t.raw_data());
}

// cuda_elementwise.cu
void fill_u32(std::uint32_t* p, i64 n, std::uint32_t bits, cudaStream_t s);
// y[n, c, k] += b[c] for y of shape [n, channels, inner]
void add_channel_bias(float* y, const float* b, i64 n, i64 channels, i64 inner, cudaStream_t s);
// db[c] += sum_{n,k} dy[n, c, k]
void sum_channels_acc(const float* dy, float* db, i64 n, i64 channels, i64 inner, cudaStream_t s);
void scale(float* x, float alpha, i64 n, cudaStream_t s);

// cuda_precision.cu. The rounding is the CPU backend's, bit for bit: round to nearest even, NaN
// stays NaN, f32 subnormals flush to signed zero.
void f32_to_bf16(const float* src, std::uint16_t* dst, std::int64_t n, cudaStream_t s);
void bf16_to_f32(const std::uint16_t* src, float* dst, std::int64_t n, cudaStream_t s);
// dst[i] += float(src[i]): a bf16 parameter gradient accumulated into the f32 one.
void add_bf16_to_f32(const std::uint16_t* src, float* dst, std::int64_t n, cudaStream_t s);

// cuda_layout.cu: y[b, j, i] = x[b, i, j] for x [batch, m, k] (f32, or bf16 as 16-bit patterns);
// with accumulate, y[b, j, i] += x[b, i, j] instead.
void batch_transpose(const float* x, float* y, i64 batch, i64 m, i64 k, bool accumulate,
                     cudaStream_t s);
void batch_transpose(const std::uint16_t* x, std::uint16_t* y, i64 batch, i64 m, i64 k,
                     cudaStream_t s);

// cuda_loss_optim.cu: the optimizer steps' arguments, shared with cuda_flat.cu.
struct SgdArgs {
  float lr, momentum, dampening, weight_decay;
  bool nesterov, first_step;
  // The fused update's step verdict (ops/step_verdict.hpp), or null: skip the update when the
  // step is not finite, and take first_step as (step - the updates skipped) == 1.
  const double* verdict = nullptr;
  long long step = 1;
};
struct AdamWArgs {
  float beta1, beta2, eps;
  float decay;         // 1 - lr * weight_decay
  float step_size;     // lr / (1 - beta1^t), computed on the host in double
  float inv_sqrt_bc2;  // 1 / sqrt(1 - beta2^t), likewise
  // As SgdArgs': with a verdict that counts skipped updates, the kernel recomputes the two bias
  // corrections for step - skipped from lr, in double on the device (within an ulp of the host's).
  const double* verdict = nullptr;
  long long step = 1;
  float lr = 0.0f;
};
// AdamW's per-step constants, the bias corrections computed on the host in double as the CPU does.
AdamWArgs adamw_args(const AdamWParams& p);

// Deterministic sum of squares in double: fixed grid, partials[kReducePartials], then one block.
inline constexpr int kReducePartials = 256;

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

class ConvPlans;       // conv.hpp
class CudnnAttention;  // cuda_attention_cudnn.hpp
class LtGemm;          // gemm_lt.hpp

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(Context& ctx);
  ~CudaBackend() override;

  cudaStream_t stream() const { return stream_; }
  DeviceRuntime* runtime() override { return runtime_.get(); }
  void synchronize() override;

  // ---- memory: cuda_backend.cpp
  void fill(Tensor& t, float value) override;
  void copy(const Tensor& src, Tensor& dst) override;
  void batch_transpose(const Tensor& x, Tensor& y) override;  // cuda_layout.cu

  // ---- dense linear algebra: cuda_gemm.cpp (gemm), cuda_elementwise.cu (bias)
  void gemm(bool trans_a, bool trans_b, float alpha, const Tensor& a, const Tensor& b, float beta,
            Tensor& c) override;
  void gemm_leading(std::int64_t k, float alpha, const Tensor& a, const Tensor& b, float beta,
                    Tensor& c) override;
  void add_row_bias(Tensor& y, const Tensor& bias) override;
  void sum_rows(const Tensor& dy, Tensor& db) override;

  // ---- elementwise and input normalisation: cuda_elementwise.cu
  void relu_forward(const Tensor& x, Tensor& y) override;
  void relu_backward(const Tensor& y, const Tensor& dy, Tensor& dx) override;
  void gelu_forward(const Tensor& x, Tensor& y) override;
  void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) override;
  void add(const Tensor& a, const Tensor& b, Tensor& out) override;
  void axpy(float alpha, const Tensor& x, Tensor& y) override;
  void scale(Tensor& x, float alpha) override;
  void dropout_forward(const Tensor& x, Tensor& y, Tensor& mask, float p, std::uint64_t seed,
                       std::uint64_t stream) override;
  void dropout_backward(const Tensor& dy, const Tensor& mask, float p, Tensor& dx) override;
  void normalize_input(const Tensor& x, const std::vector<float>& mean,
                       const std::vector<float>& stddev, Tensor& y) override;

  // ---- convolution: cuda_conv.cpp
  void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y,
                      const Conv2dParams& p) override;
  void conv2d_backward_data(const Tensor& dy, const Tensor& w, Tensor& dx,
                            const Conv2dParams& p) override;
  void conv2d_backward_weights(const Tensor& x, const Tensor& dy, Tensor& dw, Tensor& db,
                               const Conv2dParams& p) override;

  // ---- pooling: cuda_pool.cu
  void pool2d_forward(PoolKind kind, const Tensor& x, Tensor& y, Tensor& workspace,
                      const Pool2dParams& p) override;
  void pool2d_backward(PoolKind kind, const Tensor& dy, const Tensor& workspace, Tensor& dx,
                       const Pool2dParams& p) override;

  // ---- batch normalisation: cuda_batchnorm.cu
  void batchnorm_forward_train(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& y,
                               Tensor& save_mean, Tensor& save_invstd, Tensor& running_mean,
                               Tensor& running_var, float momentum, float eps) override;
  void batchnorm_forward_eval(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                              const Tensor& running_mean, const Tensor& running_var, float eps,
                              Tensor& y) override;
  void batchnorm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma,
                          const Tensor& save_mean, const Tensor& save_invstd, Tensor& dx,
                          Tensor& dgamma, Tensor& dbeta) override;

  // ---- loss, metrics and reductions: cuda_loss_optim.cu
  void softmax_xent_forward(const Tensor& logits, const Tensor& labels, Tensor& probs, Tensor& loss,
                            float label_smoothing) override;
  void softmax_xent_backward(const Tensor& probs, const Tensor& labels, float scale,
                             Tensor& dlogits, float label_smoothing) override;
  std::int64_t count_correct(const Tensor& logits, const Tensor& labels) override;
  void softmax_xent_chunk(Tensor& logits, const Tensor& labels, std::int64_t first_row,
                          std::int64_t classes, float scale, Tensor& row_loss,
                          float label_smoothing) override;
  void mean_row_loss(const Tensor& row_loss, Tensor& loss) override;
  double sum_squares(const Tensor& x) override;
  bool all_finite(const Tensor& x) override;

  // ---- optimizers: cuda_loss_optim.cu
  void sgd_update(Tensor& param, const Tensor& grad, Tensor& momentum_buf,
                  const SgdParams& p) override;
  void adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                    const AdamWParams& p) override;

  // ---- fused ops over flat buffers: cuda_flat.cu
  std::shared_ptr<const FlatPlan> make_flat_plan(std::vector<FlatSegment> segments,
                                                 std::int64_t numel) override;
  void flat_sgd_update(const FlatPlan& plan, FlatRange range, Tensor& param, const Tensor& grad,
                       Tensor& momentum_buf, std::int64_t state_origin,
                       const SgdParams& p) override;
  void flat_adamw_update(const FlatPlan& plan, FlatRange range, Tensor& param, const Tensor& grad,
                         Tensor& m, Tensor& v, std::int64_t state_origin,
                         const AdamWParams& p) override;
  void flat_sum_squares(const FlatPlan& plan, FlatRange range, const Tensor& x, Tensor& sums,
                        FlatSums what) override;
  void verdict_add(const Tensor& total, Tensor& verdict, bool first) override;
  void verdict_close(Tensor& verdict, std::int64_t taken) override;
  void clip_by_verdict(Tensor& x, const Tensor& verdict, double max_norm) override;

  // ---- precision checks and casts: cuda_precision.cu
  void check_precision(Precision p) override;
  std::string precision_info(Precision p) override;
  void cast(const Tensor& src, Tensor& dst) override;

  // ---- transformer (GPT) ops: cuda_transformer.cu
  void embedding_forward(const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                         Tensor& y) override;
  void embedding_backward(const Tensor& tokens, const Tensor& dy, Tensor& dwte,
                          Tensor& dwpe) override;
  void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                         Tensor& y, Tensor& mean, Tensor& rstd) override;
  void layernorm_backward(const Tensor& x, const Tensor& dy, const Tensor& weight,
                          const Tensor& mean, const Tensor& rstd, const Tensor& dresidual,
                          Tensor& dx, Tensor& dweight, Tensor& dbias) override;
  void residual_layernorm_forward(const Tensor& x, const Tensor& a, const Tensor& weight,
                                  const Tensor& bias, float eps, Tensor& s, Tensor& y, Tensor& mean,
                                  Tensor& rstd) override;
  void gelu_tanh_forward(const Tensor& x, Tensor& y) override;
  void gelu_tanh_backward(const Tensor& x, const Tensor& dy, Tensor& dx) override;
  void attention_forward(const Tensor& qkv, int heads, Tensor& out, Tensor& lse,
                         AttentionKernel kernel) override;
  void attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& dout,
                          const Tensor& lse, int heads, Tensor& dqkv,
                          AttentionKernel kernel) override;
  AttentionChoice cudnn_attention(Precision p, std::int64_t b, std::int64_t t, int heads,
                                  std::int64_t head_dim) override;

  // ---- fused linear ops, cuBLASLt epilogues under bf16: cuda_gemm.cpp
  void linear_forward(const Tensor& x, const Tensor& w, const Tensor& b, Activation act, Tensor& y,
                      Tensor& pre_act) override;
  void linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& dy16,
                       Tensor& dw, Tensor& db, Tensor& dx, const LinearBackward& p) override;
  void linear_recompute_activation(const Tensor& x, const Tensor& w, const Tensor& b,
                                   Activation act, Tensor& pre_act, Tensor& y) override;

 private:
  void activate() { activate_device(device_.index); }
  LtGemm& lt();  // made by the first bf16 GEMM
  // linear_forward's product with its bias and activation in one cuBLASLt epilogue; false, having
  // queued nothing, where cuBLASLt has none for it (the caller composes).
  bool linear_forward_epilogue(const Tensor& x, const Tensor& w, const Tensor& b, Activation act,
                               Tensor& y, Tensor& pre_act);

  // The conversion CastCache runs for operands that are not bf16 yet.
  struct ToBf16 {
    cudaStream_t stream;
    void operator()(const Tensor& src, Tensor& dst) const {
      f32_to_bf16(src.data<float>(), bf16_data(dst), src.numel(), stream);
    }
  };
  ToBf16 to_bf16() const { return {stream_}; }

  // cuDNN only for contexts that convolve: creating its handle costs time and memory (and loads
  // the library) that a GPT's context would spend for nothing. (cuda_conv.cpp)
  ConvPlans& conv();
  // cuDNN's fused attention, likewise made by the first attention that asks for it
  // (cuda_attention_cudnn.cpp).
  CudnnAttention& fused_attention();
  // The filter as the convolution plan for p takes it (bf16, channels-last), and f32 scratch for
  // a channels-last filter or filter gradient (cuda_conv.cpp).
  Tensor conv_filter(const Tensor& w, const Conv2dParams& p);
  Tensor conv_filter_scratch(const Shape& shape);

  DeviceResults* results() { return static_cast<DeviceResults*>(results_.raw_data()); }

  // bad_label and bad_token, adjacent: reset and read back together.
  static constexpr std::size_t kBadWordsBytes = 2 * sizeof(unsigned long long);
  static_assert(offsetof(DeviceResults, bad_token) ==
                offsetof(DeviceResults, bad_label) + sizeof(unsigned long long));

  // Sets bad_label and bad_token to ~0: none seen.
  void reset_bad_words();

  // The op that may have recorded a bad label: the first label-reading op since the last reset.
  void note_label_op(const char* op) {
    if (!label_op_) label_op_ = op;
  }

  // Raises a recorded bad token or bad label (a token first: the embedding runs before the loss)
  // with the CPU backend's words (ops/bad_input.hpp) and the device. The stream has finished.
  void raise_bad_input(unsigned long long bad_label, unsigned long long bad_token);

  // Copies the result words to pinned host memory in one copy, waits for this stream only (one
  // host sync), and raises a recorded bad token or bad label.
  DeviceResults read_results();

  Context& ctx_;
  Device device_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<DeviceRuntime> runtime_;
  cublasHandle_t cublas_ = nullptr;
  std::unique_ptr<ConvPlans> conv_;        // and the cuDNN handle: made by the first convolution
  std::unique_ptr<LtGemm> lt_;             // bf16 GEMMs, created by the first one
  CastCache casts_;                        // bf16 copies of GEMM and convolution operands
  Tensor filter_scratch_;                  // f32 channels-last filters (conv_filter_scratch)
  Tensor results_;                         // DeviceResults on the device
  Tensor partials_;                        // f64[kReducePartials] for sum_squares
  Tensor scale_shift_;                     // normalize_input's per-channel scales and shifts
  std::vector<float> scale_shift_host_;    // what scale_shift_ holds
  DeviceResults* host_results_ = nullptr;  // pinned
  std::int64_t label_classes_ = 0;
  const char* label_op_ = nullptr;  // see note_label_op
  std::int64_t token_positions_ = 0, token_vocab_ = 0;
  // cuDNN's attention graphs and its own handle: made by the first attention that asks for cuDNN
  std::unique_ptr<CudnnAttention> fused_attention_;
};

}  // namespace lockstep::ops::cuda
