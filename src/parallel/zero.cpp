#include "lockstep/parallel/zero.hpp"

#include "lockstep/core/error.hpp"

namespace lockstep::parallel {

std::vector<optim::StateTensor> gather_optimizer_state(comm::Communicator& comm,
                                                       optim::Optimizer& optimizer) {
  const optim::FlatShard& shard = optimizer.shard();
  if (!shard.sharded()) return optimizer.state();
  LOCKSTEP_CHECK(shard.count == comm.size() && shard.rank == comm.rank(),
                 "gather optimizer state: the optimizer holds shard ", shard.rank, " of ",
                 shard.count, " but this is rank ", comm.rank(), " of ", comm.size());
  const optim::FlatParams& flat = *optimizer.flat_params();
  const auto& buckets = flat.layout().buckets();
  std::vector<std::pair<std::string, Tensor>> whole;
  std::vector<comm::WorkPtr> work;
  for (const auto& [kind, buffer] : optimizer.state_buffers()) {
    Tensor full = flat.zeros();
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      const std::int64_t len = shard.ranges[b].end - shard.ranges[b].begin;
      work.push_back(comm.allgather_async(buffer.sub(shard.offsets[b], {len}),
                                          full.sub(buckets[b].begin, {buckets[b].numel()})));
    }
    whole.emplace_back(kind, full);
  }
  for (auto& w : work)
    w->wait();
  std::vector<optim::StateTensor> out;
  const auto& params = flat.parameters();
  for (std::size_t k = 0; k < params.size(); ++k)
    for (const auto& [kind, full] : whole)
      out.push_back({params[k]->name + "." + kind, nn::unpadded(*params[k], flat.view(full, k))});
  return out;
}

}  // namespace lockstep::parallel
