#include "lockstep/comm/local.hpp"

#include "lockstep/core/allocator.hpp"
#include "lockstep/core/error.hpp"

namespace lockstep::comm {
namespace {

class DoneWork final : public Work {
 public:
  void wait() override {}
  bool test() override { return true; }
};

WorkPtr done() {
  return std::make_shared<DoneWork>();
}

class SingleRankCommunicator final : public Communicator {
 public:
  using Communicator::allreduce;

  int rank() const override { return 0; }
  int size() const override { return 1; }
  int local_rank() const override { return 0; }
  int local_size() const override { return 1; }
  std::string backend() const override { return "local"; }

  WorkPtr allreduce_async(Tensor, ReduceOp) override { return done(); }
  WorkPtr broadcast_async(Tensor, int root) override {
    LOCKSTEP_CHECK(root == 0, "broadcast from root ", root, " in a 1-rank communicator");
    return done();
  }
  WorkPtr allgather_async(Tensor in, Tensor out) override {
    LOCKSTEP_CHECK(in.numel() == out.numel() && in.dtype() == out.dtype(),
                   "allgather over 1 rank: output ", out.describe(), " must match input ",
                   in.describe());
    if (in.raw_data() != out.raw_data())
      copy_bytes(out.device(), out.raw_data(), in.device(), in.raw_data(), in.nbytes());
    return done();
  }
  WorkPtr reduce_scatter_async(Tensor in, Tensor out, ReduceOp) override {
    return allgather_async(in, out);  // one block: the reduction over one rank is a copy
  }
  WorkPtr barrier_async() override { return done(); }

  void allreduce(std::vector<double>&, ReduceOp) override {}
  void allreduce(std::vector<std::int64_t>&, ReduceOp) override {}
  std::string broadcast(const std::string& value, int) override { return value; }
  std::vector<std::string> allgather(const std::string& value) override { return {value}; }
  std::vector<std::string> gather(const std::string& value, int root) override {
    LOCKSTEP_CHECK(root == 0, "gather: root ", root, " is not a rank of a 1-rank communicator");
    return {value};
  }
};

}  // namespace

std::unique_ptr<Communicator> make_single_rank_communicator() {
  return std::make_unique<SingleRankCommunicator>();
}

}  // namespace lockstep::comm
