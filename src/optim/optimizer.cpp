#include "lockstep/optim/optimizer.hpp"

namespace lockstep::optim {

Optimizer::Optimizer(std::vector<nn::Parameter*> params) : params_(std::move(params)) {
  for (const nn::Parameter* p : params_) {
    LOCKSTEP_CHECK(p != nullptr && p->value.defined() && p->grad.defined() &&
                       p->value.shape() == p->grad.shape(),
                   "optimizer: parameter ", p ? p->name : "(null)",
                   " needs a value and a gradient of the same shape");
  }
}

Tensor Optimizer::zeros_like(const nn::Parameter& p) {
  Tensor host = Tensor::zeros(p.value.shape());
  return p.value.device().is_cpu() ? host : host.to(p.value.device());
}

}  // namespace lockstep::optim
