// Backend: the kernels behind ops.hpp for one device kind. ops::X validates its arguments and
// calls backend().X with the same arguments, so a backend may assume shapes, dtypes and devices
// are already consistent. Implementations: src/ops/cpu (OpenBLAS, oneDNN, own loops) and
// src/ops/cuda (cuBLAS, cuDNN, own kernels).
#pragma once

#include <memory>
#include <string>

#include "lockstep/ops/ops.hpp"

namespace lockstep::ops {

class DeviceRuntime;

class Backend {
 public:
  virtual ~Backend() = default;
  virtual void synchronize() {}
  // Streams, events and pinned memory of an accelerator (ops/device_runtime.hpp); nullptr on
  // the CPU, whose ops are done when they return.
  virtual DeviceRuntime* runtime() { return nullptr; }

  virtual void fill(Tensor& t, float value) = 0;
  virtual void copy(const Tensor& src, Tensor& dst) = 0;
  virtual void batch_transpose(const Tensor& x, Tensor& y) = 0;

  virtual void gemm(bool trans_a, bool trans_b, float alpha, const Tensor& a, const Tensor& b,
                    float beta, Tensor& c) = 0;
  virtual void gemm_leading(std::int64_t k, float alpha, const Tensor& a, const Tensor& b,
                            float beta, Tensor& c) = 0;
  virtual void add_row_bias(Tensor& y, const Tensor& bias) = 0;
  virtual void sum_rows(const Tensor& dy, Tensor& db) = 0;

  virtual void relu_forward(const Tensor& x, Tensor& y) = 0;
  virtual void relu_backward(const Tensor& y, const Tensor& dy, Tensor& dx) = 0;
  virtual void gelu_forward(const Tensor& x, Tensor& y) = 0;
  virtual void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) = 0;
  virtual void add(const Tensor& a, const Tensor& b, Tensor& out) = 0;
  virtual void axpy(float alpha, const Tensor& x, Tensor& y) = 0;
  virtual void scale(Tensor& x, float alpha) = 0;
  virtual void dropout_forward(const Tensor& x, Tensor& y, Tensor& mask, float p,
                               std::uint64_t seed, std::uint64_t stream) = 0;
  virtual void dropout_backward(const Tensor& dy, const Tensor& mask, float p, Tensor& dx) = 0;
  virtual void normalize_input(const Tensor& x, const std::vector<float>& mean,
                               const std::vector<float>& stddev, Tensor& y) = 0;

  virtual void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y,
                              const Conv2dParams& p) = 0;
  virtual void conv2d_backward_data(const Tensor& dy, const Tensor& w, Tensor& dx,
                                    const Conv2dParams& p) = 0;
  virtual void conv2d_backward_weights(const Tensor& x, const Tensor& dy, Tensor& dw, Tensor& db,
                                       const Conv2dParams& p) = 0;
  virtual void pool2d_forward(PoolKind kind, const Tensor& x, Tensor& y, Tensor& workspace,
                              const Pool2dParams& p) = 0;
  virtual void pool2d_backward(PoolKind kind, const Tensor& dy, const Tensor& workspace, Tensor& dx,
                               const Pool2dParams& p) = 0;

  // Whether conv2d_forward takes a bf16 y and the batchnorm ops a bf16 x (ops.hpp:
  // bf16_conv_bn_activations); where not, ops.cpp rounds an f32 y and widens x around the call.
  virtual bool bf16_conv_bn_activations() const { return false; }
  virtual void batchnorm_forward_train(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                       Tensor& y, Tensor& save_mean, Tensor& save_invstd,
                                       Tensor& running_mean, Tensor& running_var, float momentum,
                                       float eps) = 0;
  virtual void batchnorm_forward_eval(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                      const Tensor& running_mean, const Tensor& running_var,
                                      float eps, Tensor& y) = 0;
  virtual void batchnorm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma,
                                  const Tensor& save_mean, const Tensor& save_invstd, Tensor& dx,
                                  Tensor& dgamma, Tensor& dbeta) = 0;

  virtual void softmax_xent_forward(const Tensor& logits, const Tensor& labels, Tensor& probs,
                                    Tensor& loss, float label_smoothing) = 0;
  virtual void softmax_xent_backward(const Tensor& probs, const Tensor& labels, float scale,
                                     Tensor& dlogits, float label_smoothing) = 0;
  virtual std::int64_t count_correct(const Tensor& logits, const Tensor& labels) = 0;
  virtual void softmax_xent_chunk(Tensor& logits, const Tensor& labels, std::int64_t first_row,
                                  std::int64_t classes, float scale, Tensor& row_loss,
                                  float label_smoothing) = 0;
  virtual void mean_row_loss(const Tensor& row_loss, Tensor& loss) = 0;

  virtual double sum_squares(const Tensor& x) = 0;
  virtual bool all_finite(const Tensor& x) = 0;

  virtual void sgd_update(Tensor& param, const Tensor& grad, Tensor& momentum_buf,
                          const SgdParams& p) = 0;
  virtual void adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                            const AdamWParams& p) = 0;

  // Fused ops over flat buffers; the plan passed in is always one this backend made.
  virtual std::shared_ptr<const FlatPlan> make_flat_plan(std::vector<FlatSegment> segments,
                                                         std::int64_t numel) = 0;
  virtual void flat_sgd_update(const FlatPlan& plan, FlatRange range, Tensor& param,
                               const Tensor& grad, Tensor& momentum_buf, std::int64_t state_origin,
                               const SgdParams& p) = 0;
  virtual void flat_adamw_update(const FlatPlan& plan, FlatRange range, Tensor& param,
                                 const Tensor& grad, Tensor& m, Tensor& v,
                                 std::int64_t state_origin, const AdamWParams& p) = 0;
  virtual void flat_sum_squares(const FlatPlan& plan, FlatRange range, const Tensor& x,
                                Tensor& sums, FlatSums what) = 0;
  virtual void verdict_add(const Tensor& total, Tensor& verdict, bool first) = 0;
  virtual void verdict_close(Tensor& verdict, std::int64_t taken) = 0;
  virtual void clip_by_verdict(Tensor& x, const Tensor& verdict, double max_norm) = 0;
  // ---- precision (ops/precision.hpp). The policy lives in the Context, which the backend reads
  // at every GEMM and convolution; check_precision throws when this device cannot compute in p.
  virtual void check_precision(Precision p) = 0;
  virtual std::string precision_info(Precision p) = 0;
  virtual void cast(const Tensor& src, Tensor& dst) = 0;  // f32 <-> bf16

  // ---- transformer (GPT) ops
  virtual void embedding_forward(const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                                 Tensor& y) = 0;
  virtual void embedding_backward(const Tensor& tokens, const Tensor& dy, Tensor& dwte,
                                  Tensor& dwpe) = 0;
  virtual void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                 float eps, Tensor& y, Tensor& mean, Tensor& rstd) = 0;
  virtual void layernorm_backward(const Tensor& x, const Tensor& dy, const Tensor& weight,
                                  const Tensor& mean, const Tensor& rstd, const Tensor& dresidual,
                                  Tensor& dx, Tensor& dweight, Tensor& dbias) = 0;
  virtual void gelu_tanh_forward(const Tensor& x, Tensor& y) = 0;
  virtual void gelu_tanh_backward(const Tensor& x, const Tensor& dy, Tensor& dx) = 0;
  virtual void attention_forward(const Tensor& qkv, int heads, Tensor& out, Tensor& lse,
                                 AttentionKernel kernel) = 0;
  virtual void attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& dout,
                                  const Tensor& lse, int heads, Tensor& dqkv,
                                  AttentionKernel kernel) = 0;
  // Whether cuDNN's fused attention serves qkv [b, t, 3 heads head_dim] in precision p here:
  // {Cudnn, what runs} or {Reference, why it cannot} (ops::choose_attention words the error). The
  // kernel argument of the attention ops is never Auto: ops.cpp resolves it first.
  virtual AttentionChoice cudnn_attention(Precision p, std::int64_t b, std::int64_t t, int heads,
                                          std::int64_t head_dim) {
    (void)p, (void)b, (void)t, (void)heads, (void)head_dim;
    return {AttentionKernel::Reference, "cuDNN runs on CUDA GPUs only"};
  }

  // ---- fused layer ops (ops.hpp). These defaults are the compositions ops.hpp names, run through
  // this backend's own ops, so a backend that fuses nothing inherits them and gives their bits; a
  // backend that fuses overrides and calls the compose_* pieces for whatever it could not fold.
  virtual void residual_layernorm_forward(const Tensor& x, const Tensor& a, const Tensor& weight,
                                          const Tensor& bias, float eps, Tensor& s, Tensor& y,
                                          Tensor& mean, Tensor& rstd);
  virtual void linear_forward(const Tensor& x, const Tensor& w, const Tensor& b, Activation act,
                              Tensor& y, Tensor& pre_act);
  virtual void linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy,
                               const Tensor& dy16, Tensor& dw, Tensor& db, Tensor& dx,
                               const LinearBackward& p);
  virtual void linear_recompute_activation(const Tensor& x, const Tensor& w, const Tensor& b,
                                           Activation act, Tensor& pre_act, Tensor& y);
  virtual void batchnorm_act_forward_train(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                           const BatchNormEpilogue& epilogue, Tensor& y,
                                           Tensor& save_mean, Tensor& save_invstd,
                                           Tensor& running_mean, Tensor& running_var,
                                           float momentum, float eps);
  virtual void batchnorm_act_forward_eval(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                          const Tensor& running_mean, const Tensor& running_var,
                                          float eps, const BatchNormEpilogue& epilogue, Tensor& y);
  virtual void batchnorm_relu_backward(const Tensor& x, const Tensor& y, const Tensor& dy,
                                       const Tensor& gamma, const Tensor& save_mean,
                                       const Tensor& save_invstd, Tensor& dx, Tensor& dgamma,
                                       Tensor& dbeta);
  virtual void relu_backward_add(const Tensor& y, const Tensor& dy, const Tensor& a, Tensor& dx);

 protected:
  // batchnorm_act_forward_*'s epilogue over z, an f32 BatchNorm output: + residual, ReLU, in place
  // (elementwise, each element read before it is written: exact on every backend), then into y.
  void compose_bn_epilogue(Tensor& z, const BatchNormEpilogue& epilogue, Tensor& y);
  // The three parts of linear_backward's composition: dw (+)= dy^T x; db (+)= column sums of dy
  // (zeros first when overwriting); dx = dy w, then the input activation's backward in place.
  void compose_linear_dw(const Tensor& x, const Tensor& dy_operand, Tensor& dw, bool overwrite);
  void compose_linear_db(const Tensor& dy, Tensor& db, bool overwrite);
  void compose_linear_dx(const Tensor& w, const Tensor& dy_operand, Tensor& dx,
                         const LinearBackward& p);
};

std::unique_ptr<Backend> make_cpu_backend(Context& ctx);
#ifdef LOCKSTEP_HAVE_CUDA
std::unique_ptr<Backend> make_cuda_backend(Context& ctx);
#endif
#ifdef LOCKSTEP_HAVE_EMU
std::unique_ptr<Backend> make_emu_backend(Context& ctx);
#endif

}  // namespace lockstep::ops
