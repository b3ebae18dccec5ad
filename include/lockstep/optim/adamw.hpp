// AdamW (decoupled weight decay, Loshchilov & Hutter 2019) exactly as torch.optim.AdamW with
// amsgrad off. Kernel: ops::flat_adamw_update, bit for bit ops::adamw_update on each parameter;
// bias correction uses the 1-based step count.
#pragma once

#include "lockstep/optim/optimizer.hpp"

namespace lockstep::optim {

struct AdamWOptions {
  float lr = 1e-3f;
  float beta1 = 0.9f, beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 1e-2f;
  DecayScope decay = DecayScope::All;  // which parameters weight_decay applies to
};

class AdamW final : public Optimizer {
 public:
  // `shard`: ZeRO-1, state for that shard only (optimizer.hpp).
  AdamW(std::shared_ptr<FlatParams> flat, const AdamWOptions& options, FlatShard shard = {});
  // Lays the parameters out in a FlatParams of its own (one bucket).
  AdamW(std::vector<nn::Parameter*> params, const AdamWOptions& options);

  std::string type() const override { return "adamw"; }
  // "exp_avg" and "exp_avg_sq" (PyTorch's names).
  std::vector<std::pair<std::string, Tensor>> state_buffers() override;
  const AdamWOptions& options() const { return options_; }

 private:
  void update(ops::Context& ctx, std::span<const ops::FlatRange> ranges) override;

  AdamWOptions options_;
  Tensor m_, v_;  // shard().numel elements each
};

}  // namespace lockstep::optim
