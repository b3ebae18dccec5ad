// SGD with momentum, dampening, Nesterov momentum and (coupled, L2) weight decay, exactly as
// torch.optim.SGD (the momentum buffer starts as the first gradient). Kernel:
// ops::flat_sgd_update, bit for bit ops::sgd_update on each parameter.
#pragma once

#include "lockstep/optim/optimizer.hpp"

namespace lockstep::optim {

struct SgdOptions {
  float lr = 0.01f;
  float momentum = 0.0f;
  float dampening = 0.0f;
  float weight_decay = 0.0f;
  bool nesterov = false;
  DecayScope decay = DecayScope::All;  // which parameters weight_decay applies to
};

class Sgd final : public Optimizer {
 public:
  // `shard`: ZeRO-1, state for that shard only (optimizer.hpp).
  Sgd(std::shared_ptr<FlatParams> flat, const SgdOptions& options, FlatShard shard = {});
  // Lays the parameters out in a FlatParams of its own (one bucket).
  Sgd(std::vector<nn::Parameter*> params, const SgdOptions& options);

  std::string type() const override { return "sgd"; }
  // "momentum_buffer" when momentum != 0, else nothing.
  std::vector<std::pair<std::string, Tensor>> state_buffers() override;
  const SgdOptions& options() const { return options_; }

 private:
  void update(ops::Context& ctx, std::span<const ops::FlatRange> ranges) override;

  SgdOptions options_;
  Tensor momentum_;  // shard().numel elements, undefined when momentum == 0
};

}  // namespace lockstep::optim
