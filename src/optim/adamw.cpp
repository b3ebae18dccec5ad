#include "lockstep/optim/adamw.hpp"

#include "lockstep/ops/ops.hpp"

namespace lockstep::optim {

AdamW::AdamW(std::vector<nn::Parameter*> params, const AdamWOptions& options)
    : Optimizer(std::move(params)), options_(options) {
  LOCKSTEP_CHECK(options.lr >= 0.0f && options.eps > 0.0f && options.weight_decay >= 0.0f,
                 "adamw: lr and weight_decay must be non-negative and eps positive");
  LOCKSTEP_CHECK(options.beta1 >= 0.0f && options.beta1 < 1.0f && options.beta2 >= 0.0f &&
                     options.beta2 < 1.0f,
                 "adamw: betas must be in [0, 1), got ", options.beta1, ", ", options.beta2);
  lr_ = options.lr;
  for (const nn::Parameter* p : params_) {
    m_.push_back(zeros_like(*p));
    v_.push_back(zeros_like(*p));
  }
}

void AdamW::step(ops::Context& ctx) {
  ops::AdamWParams ap;
  ap.lr = lr_;
  ap.beta1 = options_.beta1;
  ap.beta2 = options_.beta2;
  ap.eps = options_.eps;
  ap.weight_decay = options_.weight_decay;
  ap.step = steps_ + 1;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    ops::adamw_update(ctx, params_[i]->value, params_[i]->grad, m_[i], v_[i], ap);
  }
  ++steps_;
}

std::vector<StateTensor> AdamW::state() {
  std::vector<StateTensor> out;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    out.push_back({params_[i]->name + ".exp_avg", m_[i]});
    out.push_back({params_[i]->name + ".exp_avg_sq", v_[i]});
  }
  return out;
}

}  // namespace lockstep::optim
