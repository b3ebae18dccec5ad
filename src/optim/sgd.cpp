#include "lockstep/optim/sgd.hpp"

#include "lockstep/ops/ops.hpp"

namespace lockstep::optim {

Sgd::Sgd(std::vector<nn::Parameter*> params, const SgdOptions& options)
    : Optimizer(std::move(params)), options_(options) {
  LOCKSTEP_CHECK(options.lr >= 0.0f && options.momentum >= 0.0f && options.weight_decay >= 0.0f,
                 "sgd: lr, momentum and weight_decay must be non-negative");
  LOCKSTEP_CHECK_HINT(!options.nesterov || (options.momentum > 0.0f && options.dampening == 0.0f),
                      "set momentum > 0 and dampening = 0, or turn nesterov off",
                      "sgd: nesterov momentum requires momentum > 0 and zero dampening");
  lr_ = options.lr;
  for (const nn::Parameter* p : params_) {
    momentum_.push_back(options.momentum != 0.0f ? zeros_like(*p) : Tensor());
  }
}

void Sgd::step(ops::Context& ctx) {
  ops::SgdParams sp;
  sp.lr = lr_;
  sp.momentum = options_.momentum;
  sp.dampening = options_.dampening;
  sp.weight_decay = options_.weight_decay;
  sp.nesterov = options_.nesterov;
  sp.first_step = steps_ == 0;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    ops::sgd_update(ctx, params_[i]->value, params_[i]->grad, momentum_[i], sp);
  }
  ++steps_;
}

std::vector<StateTensor> Sgd::state() {
  std::vector<StateTensor> out;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (momentum_[i].defined())
      out.push_back({params_[i]->name + ".momentum_buffer", momentum_[i]});
  }
  return out;
}

}  // namespace lockstep::optim
