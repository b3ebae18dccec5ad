#include "lockstep/optim/optimizer.hpp"

namespace lockstep::optim {

DecayScope parse_decay_scope(const std::string& name) {
  if (name == "all") return DecayScope::All;
  if (name == "matrices") return DecayScope::Matrices;
  LOCKSTEP_FAIL_HINT("use all or matrices", "optim.decay = '", name, "' is not a decay scope");
}

const char* decay_scope_name(DecayScope scope) {
  return scope == DecayScope::All ? "all" : "matrices";
}

Optimizer::Optimizer(std::shared_ptr<FlatParams> flat) : flat_(std::move(flat)) {
  LOCKSTEP_CHECK(flat_ != nullptr, "optimizer: no parameters (null FlatParams)");
}

void Optimizer::step(ops::Context& ctx) {
  const ops::FlatRange all{0, flat_->layout().numel()};
  step(ctx, std::span<const ops::FlatRange>(&all, 1));
}

void Optimizer::step(ops::Context& ctx, std::span<const ops::FlatRange> ranges) {
  update(ctx, ranges);
  ++steps_;
}

const ops::FlatPlan& Optimizer::plan(ops::Context& ctx, DecayScope scope) {
  if (!plan_ || plan_->device() != ctx.device()) {
    std::vector<bool> decay;
    for (const nn::Parameter* p : flat_->parameters())
      decay.push_back(scope == DecayScope::All || p->value.ndim() >= 2);
    plan_ = flat_->make_plan(ctx, decay);
  }
  return *plan_;
}

}  // namespace lockstep::optim
