// SGD with momentum, dampening, Nesterov momentum and (coupled, L2) weight decay, exactly as
// torch.optim.SGD (the momentum buffer starts as the first gradient). Kernel: ops::sgd_update.
#pragma once

#include "lockstep/optim/optimizer.hpp"

namespace lockstep::optim {

struct SgdOptions {
  float lr = 0.01f;
  float momentum = 0.0f;
  float dampening = 0.0f;
  float weight_decay = 0.0f;
  bool nesterov = false;
};

class Sgd final : public Optimizer {
 public:
  Sgd(std::vector<nn::Parameter*> params, const SgdOptions& options);

  std::string type() const override { return "sgd"; }
  void step(ops::Context& ctx) override;
  // "<param>.momentum_buffer" per parameter when momentum != 0, else nothing.
  std::vector<StateTensor> state() override;
  const SgdOptions& options() const { return options_; }

 private:
  SgdOptions options_;
  std::vector<Tensor> momentum_;  // empty tensors when momentum == 0
};

}  // namespace lockstep::optim
