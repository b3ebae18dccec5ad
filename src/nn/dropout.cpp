#include "lockstep/nn/dropout.hpp"

#include "buffers.hpp"
#include "lockstep/core/rng.hpp"
#include "lockstep/ops/ops.hpp"

namespace lockstep::nn {

Dropout::Dropout(float p) : p_(p) {
  LOCKSTEP_CHECK(p >= 0.0f && p < 1.0f, "dropout probability must be in [0, 1), got ", p);
}

std::string Dropout::describe() const {
  return str("dropout(", p_, ")");
}

void Dropout::reset_parameters(std::uint64_t seed, const std::string& prefix) {
  seed_ = seed;
  name_hash_ = hash_string(prefix + "dropout");
  calls_ = 0;
}

Tensor Dropout::forward(ops::Context& ctx, const Tensor& x) {
  have_forward_ = true;
  active_ = training_ && p_ > 0.0f;
  if (!active_) return x;
  Tensor& y = detail::reuse_buffer(y_, x.shape(), x.device());
  Tensor& mask = detail::reuse_buffer(mask_, x.shape(), x.device(), DType::U8);
  ops::dropout_forward(ctx, x, y, mask, p_, seed_, hash_combine(name_hash_, calls_));
  ++calls_;
  return y;
}

Tensor Dropout::backward(ops::Context& ctx, const Tensor& dy) {
  LOCKSTEP_CHECK(have_forward_, "dropout: backward without forward");
  have_forward_ = false;
  if (!input_grad_) return Tensor();
  if (!active_) return dy;
  Tensor& dx = detail::reuse_buffer(dx_, dy.shape(), dy.device());
  ops::dropout_backward(ctx, dy, mask_, p_, dx);
  return dx;
}

std::unique_ptr<Module> Dropout::clone_structure(Device) const {
  auto copy = std::make_unique<Dropout>(p_);
  copy->seed_ = seed_;
  copy->name_hash_ = name_hash_;
  copy->calls_ = calls_;
  return copy;
}

}  // namespace lockstep::nn
