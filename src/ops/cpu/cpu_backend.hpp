// CpuBackend: the CPU kernels behind ops.hpp. GEMM is oneDNN's or OpenBLAS's sgemm (cpu_sgemm.hpp;
// single-threaded calls split over the Context's pool), convolution is oneDNN primitives cached per
// shape, everything else (pooling included) is own loops. One instance per Context; a Context is
// used from one thread at a time, so the caches and scratch buffers below need no lock. See
// cpu_backend.cpp for the threading model.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "lockstep/ops/backend.hpp"
#include "ops/cast_cache.hpp"

namespace lockstep::ops::cpu {

// Work smaller than this many elements runs on the calling thread: waking a sleeping pool
// worker costs a few microseconds, which is what ~64K simple float operations take.
inline constexpr std::int64_t kParallelGrain = 1 << 16;
// Fixed block size for reductions (sum_squares, loss): partial sums are taken per block and
// added in block order, so the result does not depend on how many threads ran the blocks.
inline constexpr std::int64_t kReduceBlock = 1 << 14;

struct DnnlState;         // oneDNN engine, stream and primitive caches (cpu_conv.cpp)
struct Bf16Gemm;          // oneDNN bf16 matmul primitives (cpu_precision.cpp)
struct Bf16GemmDeleter {  // in cpu_precision.cpp, where Bf16Gemm is complete
  void operator()(Bf16Gemm* g) const;
};

// Sets OpenBLAS to one thread, once per process (cpu_backend.cpp).
void init_openblas_once();

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(Context& ctx);
  ~CpuBackend() override;

  void fill(Tensor& t, float value) override;
  void copy(const Tensor& src, Tensor& dst) override;
  void batch_transpose(const Tensor& x, Tensor& y) override;

  void gemm(bool trans_a, bool trans_b, float alpha, const Tensor& a, const Tensor& b, float beta,
            Tensor& c) override;
  void gemm_leading(std::int64_t k, float alpha, const Tensor& a, const Tensor& b, float beta,
                    Tensor& c) override;
  void add_row_bias(Tensor& y, const Tensor& bias) override;
  void sum_rows(const Tensor& dy, Tensor& db) override;

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

  void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y,
                      const Conv2dParams& p) override;
  void conv2d_backward_data(const Tensor& dy, const Tensor& w, Tensor& dx,
                            const Conv2dParams& p) override;
  void conv2d_backward_weights(const Tensor& x, const Tensor& dy, Tensor& dw, Tensor& db,
                               const Conv2dParams& p) override;
  void pool2d_forward(PoolKind kind, const Tensor& x, Tensor& y, Tensor& workspace,
                      const Pool2dParams& p) override;
  void pool2d_backward(PoolKind kind, const Tensor& dy, const Tensor& workspace, Tensor& dx,
                       const Pool2dParams& p) override;

  bool bf16_conv_bn_activations() const override { return true; }
  void relu_backward_add(const Tensor& y, const Tensor& dy, const Tensor& a, Tensor& dx) override;
  void batchnorm_forward_train(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& y,
                               Tensor& save_mean, Tensor& save_invstd, Tensor& running_mean,
                               Tensor& running_var, float momentum, float eps) override;
  void batchnorm_forward_eval(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                              const Tensor& running_mean, const Tensor& running_var, float eps,
                              Tensor& y) override;
  void batchnorm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma,
                          const Tensor& save_mean, const Tensor& save_invstd, Tensor& dx,
                          Tensor& dgamma, Tensor& dbeta) override;
  void batchnorm_act_forward_train(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                   const BatchNormEpilogue& epilogue, Tensor& y, Tensor& save_mean,
                                   Tensor& save_invstd, Tensor& running_mean, Tensor& running_var,
                                   float momentum, float eps) override;
  void batchnorm_act_forward_eval(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                  const Tensor& running_mean, const Tensor& running_var, float eps,
                                  const BatchNormEpilogue& epilogue, Tensor& y) override;
  void batchnorm_relu_backward(const Tensor& x, const Tensor& y, const Tensor& dy,
                               const Tensor& gamma, const Tensor& save_mean,
                               const Tensor& save_invstd, Tensor& dx, Tensor& dgamma,
                               Tensor& dbeta) override;

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

  void sgd_update(Tensor& param, const Tensor& grad, Tensor& momentum_buf,
                  const SgdParams& p) override;
  void adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                    const AdamWParams& p) override;

  // cpu_flat.cpp
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
  void check_precision(Precision p) override;
  std::string precision_info(Precision p) override;
  void cast(const Tensor& src, Tensor& dst) override;

  // ---- transformer (GPT) ops: cpu_transformer.cpp
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

  // ---- fused layer ops: the compositions (backend.cpp), except a bf16 linear output, which
  // oneDNN's matmul writes with its bias (cpu_precision.cpp)
  void linear_forward(const Tensor& x, const Tensor& w, const Tensor& b, Activation act, Tensor& y,
                      Tensor& pre_act) override;

 private:
  // c = alpha op(a) op(b) + beta c over the first k of the inner dimension (gemm: all of it;
  // gemm_leading: fewer, a and b not transposed, a read with its own row length).
  void gemm_k(bool trans_a, bool trans_b, std::int64_t k, float alpha, const Tensor& a,
              const Tensor& b, float beta, Tensor& c);
  // c f32, or bf16 with beta 0; bias [c.dim(1)] f32 added before c is written, or undefined.
  void gemm_bf16(bool trans_a, bool trans_b, std::int64_t k, float alpha, const Tensor& a,
                 const Tensor& b, float beta, Tensor& c, const Tensor& bias = Tensor());

  // batchnorm_backward, or through the ReLU whose output is relu_y (batchnorm_relu_backward).
  void batchnorm_backward_impl(const Tensor& x, const Tensor& dy, const Tensor& relu_y,
                               const Tensor& gamma, const Tensor& save_mean,
                               const Tensor& save_invstd, Tensor& dx, Tensor& dgamma,
                               Tensor& dbeta);
  // The BatchNorm kernels over x's elements px, f32 or bf16 (cpu_batchnorm.cpp).
  template <class X>
  void bn_forward_train(const X* px, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                        const BatchNormEpilogue& epilogue, Tensor& y, Tensor& save_mean,
                        Tensor& save_invstd, Tensor& running_mean, Tensor& running_var,
                        float momentum, float eps);
  template <class X>
  void bn_backward(const X* px, const Tensor& x, const Tensor& dy, const Tensor& relu_y,
                   const Tensor& gamma, const Tensor& save_mean, const Tensor& save_invstd,
                   Tensor& dx, Tensor& dgamma, Tensor& dbeta);

  // Scratch that grows to the largest request and is then reused (no allocation per call).
  double* scratch_doubles(std::size_t n);

  // Float scratch for the transformer kernels (per-thread attention tiles, LayerNorm partial
  // sums): grown on the calling thread before a parallel region, then reused.
  float* scratch_floats(std::size_t n);
  std::vector<float> float_scratch_;

  Context& ctx_;
  std::vector<double> scratch_;
  std::unique_ptr<DnnlState> dnnl_;
  std::unique_ptr<Bf16Gemm, Bf16GemmDeleter> bf16_;  // created by the first bf16 GEMM
  CastCache casts_;                                  // bf16 copies of GEMM operands
};

// Whether the BatchNorm row sums take their AVX-512 path (cpu_batchnorm.cpp): on wherever the CPU
// has AVX-512F. Sets it (never on where the CPU lacks it) and returns the previous setting, so
// tests can run the generic loops on an AVX-512 machine and compare bits.
bool use_bn_avx512(bool on);

}  // namespace lockstep::ops::cpu
