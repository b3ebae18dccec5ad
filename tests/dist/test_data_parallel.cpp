// The DataParallel baseline computes the same step as one replica on the whole batch.
// Tolerance: as in tests/dist/mpi/test_ddp.cpp, the only difference is the order in which the
// per-sample gradient terms are summed (per replica, then replicas onto the master): ~B * eps32
// relative to the mean gradient, ~1e-6 on the parameters after a few steps; 2e-5 has headroom,
// while a wrong slice or a missed replica gradient moves parameters by > 1e-3.
#include <gtest/gtest.h>

#include "lockstep/dist/data_parallel.hpp"
#include "support/training.hpp"

namespace lockstep::test {
namespace {
std::vector<std::vector<float>> train_dp(const ProblemSpec& p, int replicas, int accumulation = 1) {
  ops::Context ctx(Device::cpu(), 1);
  nn::Model master = nn::Model::build(p.model, p.sample, p.classes, p.seed);
  dist::DataParallelOptions options;
  options.replicas = replicas;
  dist::DataParallelEngine engine(ctx, master, p.model, p.sample, p.classes, options);
  optim::SgdOptions so;
  so.lr = p.lr;
  so.momentum = p.momentum;
  optim::Sgd sgd(master.parameters(), so);
  const std::int64_t micro = p.global_batch / accumulation;
  for (int step = 0; step < p.steps; ++step) {
    SyntheticBatch b = synthetic_batch(p.global_batch, p.sample, p.classes, step);
    engine.begin_step();
    for (int m = 0; m < accumulation; ++m)
      engine.forward_backward(b.x.slice(m * micro, (m + 1) * micro),
                              b.y.slice(m * micro, (m + 1) * micro),
                              1.0f / static_cast<float>(p.global_batch), m + 1 == accumulation);
    engine.finish_gradients();
    sgd.step(ctx);
  }
  return parameter_values(master);
}
}  // namespace

TEST(DataParallel, MatchesSingleReplicaWithTheSameGlobalBatch) {
  ProblemSpec p;
  auto reference = train_single_process(p);
  for (int replicas : {1, 2, 3, 4}) {
    auto dp = train_dp(p, replicas);
    EXPECT_LE(max_abs_difference(reference, dp), 2e-5) << replicas << " replicas";
  }
  EXPECT_EQ(train_dp(p, 1), reference) << "one replica is the reference loop itself";
}

TEST(DataParallel, AccumulationMatchesOneLargeBatch) {
  ProblemSpec p;
  EXPECT_LE(max_abs_difference(train_single_process(p), train_dp(p, 2, /*accumulation=*/2)), 2e-5);
}

TEST(DataParallel, ConvNetReplicasMatchSingleReplica) {
  ProblemSpec p;
  p.model = "conv(4,3,pad=1)-relu-maxpool(2)-flatten-linear(5)";
  EXPECT_LE(max_abs_difference(train_single_process(p), train_dp(p, 2)), 2e-5);
}

TEST(DataParallel, TooSmallABatchForTheReplicasIsAnError) {
  ProblemSpec p;
  p.global_batch = 2;
  EXPECT_THROW(train_dp(p, 3), Error);
}

}  // namespace lockstep::test
