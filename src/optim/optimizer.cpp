#include "lockstep/optim/optimizer.hpp"

#include "lockstep/ops/ops.hpp"

namespace lockstep::optim {

DecayScope parse_decay_scope(const std::string& name) {
  if (name == "all") return DecayScope::All;
  if (name == "matrices") return DecayScope::Matrices;
  LOCKSTEP_FAIL_HINT("use all or matrices", "optim.decay = '", name, "' is not a decay scope");
}

const char* decay_scope_name(DecayScope scope) {
  return scope == DecayScope::All ? "all" : "matrices";
}

Optimizer::Optimizer(std::shared_ptr<FlatParams> flat, FlatShard shard)
    : flat_(std::move(flat)), shard_(std::move(shard)) {
  LOCKSTEP_CHECK(flat_ != nullptr, "optimizer: no parameters (null FlatParams)");
  if (shard_.ranges.empty()) shard_ = flat_->shard(0, 1);
  LOCKSTEP_CHECK(shard_.ranges.size() == flat_->layout().buckets().size(), "optimizer: a shard of ",
                 shard_.ranges.size(), " buckets for a layout of ",
                 flat_->layout().buckets().size());
}

void Optimizer::step(ops::Context& ctx) {
  if (shard_.sharded()) return step(ctx, shard_.ranges);
  const ops::FlatRange all{0, flat_->layout().numel()};
  step(ctx, std::span<const ops::FlatRange>(&all, 1));
}

std::vector<StateTensor> Optimizer::state() {
  LOCKSTEP_CHECK_HINT(!shard_.sharded(),
                      "gather it over the ranks first (parallel::gather_optimizer_state)",
                      "optimizer: rank ", shard_.rank, " holds only its shard of the state (ZeRO-1",
                      " over ", shard_.count, " ranks), not whole tensors");
  std::vector<StateTensor> out;
  const std::vector<std::pair<std::string, Tensor>> buffers = state_buffers();
  const auto& params = flat_->parameters();
  for (std::size_t k = 0; k < params.size(); ++k)
    for (const auto& [kind, buffer] : buffers)
      out.push_back(
          {params[k]->name + "." + kind, nn::unpadded(*params[k], flat_->view(buffer, k))});
  return out;
}

void Optimizer::load_state(ops::Context& ctx,
                           const std::function<Tensor(const std::string&)>& whole) {
  const auto& params = flat_->parameters();
  for (auto& [kind, buffer] : state_buffers()) {
    // Whole tensors into a buffer of the layout, then the shard's ranges out of it.
    Tensor full = shard_.sharded() ? flat_->zeros() : buffer;
    for (std::size_t k = 0; k < params.size(); ++k) {
      Tensor view = nn::unpadded(*params[k], flat_->view(full, k));
      ops::copy(ctx, whole(params[k]->name + "." + kind), view);
    }
    if (!shard_.sharded()) continue;
    for (std::size_t i = 0; i < shard_.ranges.size(); ++i) {
      const ops::FlatRange& r = shard_.ranges[i];
      Tensor to = buffer.sub(shard_.offsets[i], {r.end - r.begin});
      ops::copy(ctx, full.sub(r.begin, {r.end - r.begin}), to);
    }
  }
}

std::int64_t Optimizer::state_bytes() {
  std::int64_t bytes = 0;
  for (const auto& [kind, buffer] : state_buffers())
    bytes += static_cast<std::int64_t>(buffer.nbytes());
  return bytes;
}

void Optimizer::step(ops::Context& ctx, std::span<const ops::FlatRange> ranges) {
  flat_->settle(ctx);  // a step after zero_grad without backward reads zeros
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
