#include "lockstep/optim/adamw.hpp"

#include "lockstep/ops/ops.hpp"

namespace lockstep::optim {

AdamW::AdamW(std::shared_ptr<FlatParams> flat, const AdamWOptions& options, FlatShard shard)
    : Optimizer(std::move(flat), std::move(shard)), options_(options) {
  LOCKSTEP_CHECK(options.lr >= 0.0f && options.eps > 0.0f && options.weight_decay >= 0.0f,
                 "adamw: lr and weight_decay must be non-negative and eps positive");
  LOCKSTEP_CHECK(options.beta1 >= 0.0f && options.beta1 < 1.0f && options.beta2 >= 0.0f &&
                     options.beta2 < 1.0f,
                 "adamw: betas must be in [0, 1), got ", options.beta1, ", ", options.beta2);
  lr_ = options.lr;
  m_ = flat_->zeros(shard_.numel);
  v_ = flat_->zeros(shard_.numel);
}

AdamW::AdamW(std::vector<nn::Parameter*> params, const AdamWOptions& options)
    : AdamW(std::make_shared<FlatParams>(std::move(params)), options) {}

void AdamW::update(ops::Context& ctx, std::span<const ops::FlatRange> ranges) {
  ops::AdamWParams ap;
  ap.lr = lr_;
  ap.beta1 = options_.beta1;
  ap.beta2 = options_.beta2;
  ap.eps = options_.eps;
  ap.weight_decay = options_.weight_decay;
  ap.step = steps_ + 1;
  ap.verdict = verdict_;
  const ops::FlatPlan& p = plan(ctx, options_.decay);
  for (const ops::FlatRange& range : ranges)
    ops::flat_adamw_update(ctx, p, range, flat_->values(), flat_->grads(), m_, v_,
                           shard_.state_origin(range), ap);
}

std::vector<std::pair<std::string, Tensor>> AdamW::state_buffers() {
  return {{"exp_avg", m_}, {"exp_avg_sq", v_}};
}

}  // namespace lockstep::optim
