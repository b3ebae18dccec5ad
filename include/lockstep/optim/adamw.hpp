// AdamW (decoupled weight decay, Loshchilov & Hutter 2019) exactly as torch.optim.AdamW with
// amsgrad off. Kernel: ops::adamw_update; bias correction uses the 1-based step count.
#pragma once

#include "lockstep/optim/optimizer.hpp"

namespace lockstep::optim {

struct AdamWOptions {
  float lr = 1e-3f;
  float beta1 = 0.9f, beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 1e-2f;
};

class AdamW final : public Optimizer {
 public:
  AdamW(std::vector<nn::Parameter*> params, const AdamWOptions& options);

  std::string type() const override { return "adamw"; }
  void step(ops::Context& ctx) override;
  // "<param>.exp_avg" and "<param>.exp_avg_sq" per parameter (PyTorch's names).
  std::vector<StateTensor> state() override;
  const AdamWOptions& options() const { return options_; }

 private:
  AdamWOptions options_;
  std::vector<Tensor> m_, v_;
};

}  // namespace lockstep::optim
