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

}  // namespace lockstep::ops
