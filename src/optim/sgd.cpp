#include "lockstep/optim/sgd.hpp"

#include "lockstep/ops/ops.hpp"

namespace lockstep::optim {

Sgd::Sgd(std::shared_ptr<FlatParams> flat, const SgdOptions& options, FlatShard shard)
    : Optimizer(std::move(flat), std::move(shard)), options_(options) {
  LOCKSTEP_CHECK(options.lr >= 0.0f && options.momentum >= 0.0f && options.weight_decay >= 0.0f,
                 "sgd: lr, momentum and weight_decay must be non-negative");
  LOCKSTEP_CHECK_HINT(!options.nesterov || (options.momentum > 0.0f && options.dampening == 0.0f),
                      "set momentum > 0 and dampening = 0, or turn nesterov off",
                      "sgd: nesterov momentum requires momentum > 0 and zero dampening");
  lr_ = options.lr;
  if (options.momentum != 0.0f) momentum_ = flat_->zeros(shard_.numel);
}

Sgd::Sgd(std::vector<nn::Parameter*> params, const SgdOptions& options)
    : Sgd(std::make_shared<FlatParams>(std::move(params)), options) {}

void Sgd::update(ops::Context& ctx, std::span<const ops::FlatRange> ranges) {
  ops::SgdParams sp;
  sp.lr = lr_;
  sp.momentum = options_.momentum;
  sp.dampening = options_.dampening;
  sp.weight_decay = options_.weight_decay;
  sp.nesterov = options_.nesterov;
  sp.first_step = steps_ == 0;
  sp.verdict = verdict_;
  sp.step = steps_ + 1;
  const ops::FlatPlan& p = plan(ctx, options_.decay);
  for (const ops::FlatRange& range : ranges)
    ops::flat_sgd_update(ctx, p, range, flat_->values(), flat_->grads(), momentum_,
                         shard_.state_origin(range), sp);
}

std::vector<std::pair<std::string, Tensor>> Sgd::state_buffers() {
  if (!momentum_.defined()) return {};
  return {{"momentum_buffer", momentum_}};
}

}  // namespace lockstep::optim
