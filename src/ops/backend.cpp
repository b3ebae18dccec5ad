// The Backend's fused layer ops as the compositions ops.hpp names: what the CPU and the emulated
// GPU run, and what CUDA falls back to where cuBLASLt has no epilogue for a shape. Each calls this
// backend's own virtual ops in the order the layers called them before the ops were fused, so the
// bits are those of the separate ops.
#include "lockstep/ops/backend.hpp"

namespace lockstep::ops {

void Backend::residual_layernorm_forward(const Tensor& x, const Tensor& a, const Tensor& weight,
                                         const Tensor& bias, float eps, Tensor& s, Tensor& y,
                                         Tensor& mean, Tensor& rstd) {
  add(x, a, s);
  layernorm_forward(s, weight, bias, eps, y, mean, rstd);
}

// A bf16 z (y, or pre_act) is the f32 product plus the bias rounded once, as a GEMM with a bias
// epilogue and a bf16 output writes it: made in an f32 temporary, then cast.
void Backend::linear_forward(const Tensor& x, const Tensor& w, const Tensor& b, Activation act,
                             Tensor& y, Tensor& pre_act) {
  Tensor& z = act == Activation::None ? y : pre_act;
  if (z.dtype() == DType::BF16 && b.defined()) {
    Tensor wide = Tensor::empty(z.shape(), DType::F32, z.device());
    gemm(false, true, 1.0f, x, w, 0.0f, wide);
    add_row_bias(wide, b);
    cast(wide, z);
  } else {
    gemm(false, true, 1.0f, x, w, 0.0f, z);
    if (b.defined()) add_row_bias(z, b);
  }
  if (act == Activation::GeluTanh) gelu_tanh_forward(z, y);
}

void Backend::linear_recompute_activation(const Tensor& x, const Tensor& w, const Tensor& b,
                                          Activation act, Tensor& pre_act, Tensor& y) {
  (void)x;
  (void)w;
  (void)b;
  if (act == Activation::GeluTanh) gelu_tanh_forward(pre_act, y);
}

void Backend::linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy,
                              const Tensor& dy16, Tensor& dw, Tensor& db, Tensor& dx,
                              const LinearBackward& p) {
  const Tensor& dy_operand = dy16.defined() ? dy16 : dy;
  compose_linear_dw(x, dy_operand, dw, p.overwrite_dw);
  if (db.defined()) compose_linear_db(dy, db, p.overwrite_db);
  if (dx.defined()) compose_linear_dx(w, dy_operand, dx, p);
}

void Backend::compose_linear_dw(const Tensor& x, const Tensor& dy_operand, Tensor& dw,
                                bool overwrite) {
  // beta = 0 never reads the old dw, which may hold anything when it is stale.
  gemm(true, false, 1.0f, dy_operand, x, overwrite ? 0.0f : 1.0f, dw);
}

void Backend::compose_linear_db(const Tensor& dy, Tensor& db, bool overwrite) {
  if (overwrite) fill(db, 0.0f);
  sum_rows(dy, db);
}

void Backend::compose_linear_dx(const Tensor& w, const Tensor& dy_operand, Tensor& dx,
                                const LinearBackward& p) {
  gemm(false, false, 1.0f, dy_operand, w, 0.0f, dx);
  // Elementwise, each element read before it is written: in place is exact on every backend.
  if (p.input_act == Activation::GeluTanh) gelu_tanh_backward(p.input_pre_act, dx, dx);
}

// ---- fused BatchNorm epilogues

namespace {
// Where an epilogue's f32 z lives: y itself when it is f32, else a temporary cast into y.
Tensor f32_like(const Tensor& y) {
  return y.dtype() == DType::F32 ? y : Tensor::empty(y.shape(), DType::F32, y.device());
}
}  // namespace

void Backend::compose_bn_epilogue(Tensor& z, const BatchNormEpilogue& epilogue, Tensor& y) {
  if (epilogue.residual.defined()) add(z, epilogue.residual, z);
  if (epilogue.relu) relu_forward(z, z);
  if (!z.shares_storage(y)) cast(z, y);
}

void Backend::batchnorm_act_forward_train(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                          const BatchNormEpilogue& epilogue, Tensor& y,
                                          Tensor& save_mean, Tensor& save_invstd,
                                          Tensor& running_mean, Tensor& running_var, float momentum,
                                          float eps) {
  Tensor z = f32_like(y);
  batchnorm_forward_train(x, gamma, beta, z, save_mean, save_invstd, running_mean, running_var,
                          momentum, eps);
  compose_bn_epilogue(z, epilogue, y);
}

void Backend::batchnorm_act_forward_eval(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                         const Tensor& running_mean, const Tensor& running_var,
                                         float eps, const BatchNormEpilogue& epilogue, Tensor& y) {
  Tensor z = f32_like(y);
  batchnorm_forward_eval(x, gamma, beta, running_mean, running_var, eps, z);
  compose_bn_epilogue(z, epilogue, y);
}

void Backend::batchnorm_relu_backward(const Tensor& x, const Tensor& y, const Tensor& dy,
                                      const Tensor& gamma, const Tensor& save_mean,
                                      const Tensor& save_invstd, Tensor& dx, Tensor& dgamma,
                                      Tensor& dbeta) {
  Tensor y32 = y;
  if (y.dtype() != DType::F32) {
    y32 = Tensor::empty(y.shape(), DType::F32, y.device());
    cast(y, y32);
  }
  Tensor dz = Tensor::empty(dy.shape(), DType::F32, dy.device());
  relu_backward(y32, dy, dz);
  batchnorm_backward(x, dz, gamma, save_mean, save_invstd, dx, dgamma, dbeta);
}

void Backend::relu_backward_add(const Tensor& y, const Tensor& dy, const Tensor& a, Tensor& dx) {
  relu_backward(y, dy, dx);
  add(a, dx, dx);  // elementwise, each element read before it is written
}

}  // namespace lockstep::ops
