// The DataParallel baseline computes the same step as one replica on the whole batch.
// Tolerance: as in tests/parallel/mpi/test_ddp.cpp, the only difference is the order in which the
// per-sample gradient terms are summed (per replica, then replicas onto the master): ~B * eps32
// relative to the mean gradient, ~1e-6 on the parameters after a few steps; 2e-5 has headroom,
// while a wrong slice or a missed replica gradient moves parameters by > 1e-3.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <thread>

#include "custom_model/custom_network.hpp"
#include "lockstep/ops/backend.hpp"
#include "lockstep/ops/device_runtime.hpp"
#include "lockstep/ops/ops.hpp"
#include "lockstep/parallel/data_parallel.hpp"
#include "support/device_test_support.hpp"
#include "support/training.hpp"

namespace lockstep::test {
namespace {
std::vector<std::vector<float>> train_dp(const ProblemSpec& p, int replicas, int accumulation = 1) {
  ops::Context ctx(Device::cpu(), 1);
  nn::Model master = make_model(p, p.seed);
  parallel::DataParallelOptions options;
  options.replicas = replicas;
  parallel::DataParallelEngine engine(ctx, master, options);
  optim::SgdOptions so;
  so.lr = p.lr;
  so.momentum = p.momentum;
  optim::Sgd sgd(engine.flat_params(), so);  // the engine laid the parameters out flat
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

TEST(DataParallel, ReplicasClonedFromAModelComposedInCppMatchSingleReplica) {
  // examples/custom_model's network: its GatedLinearUnit is replicated by its clone_structure.
  ProblemSpec p;
  p.sample = {1, 8, 8};
  p.classes = 4;
  p.network = [] { return custom_model::custom_network(8, 4, 6, 4); };
  EXPECT_LE(max_abs_difference(train_single_process(p), train_dp(p, 2)), 2e-5);
}

TEST(DataParallel, TooSmallABatchForTheReplicasIsAnError) {
  ProblemSpec p;
  p.global_batch = 2;
  EXPECT_THROW(train_dp(p, 3), Error);
}

// Replicas on a device run on their own streams, while the master copies its weights to them on
// its stream. The master's stream is held (a host function waits for a timer thread) while the
// copies of freshly changed weights are queued behind it: a replica not ordered after those copies
// would compute its half of the loss with the old weights every time, not by chance. Its loss must
// equal the loss of the same step repeated once everything has settled. On every device kind: the
// emulated GPU everywhere, CUDA where a GPU answers.
using DataParallelOnDevice = testing::OnDevice;
LOCKSTEP_ON_DEVICES(DataParallelOnDevice);

TEST_P(DataParallelOnDevice, ReplicasOnOtherStreamsComputeWithTheMastersFreshWeights) {
  ProblemSpec p;
  const Device gpu = device();
  ops::Context ctx(gpu, 1);
  nn::Model master = nn::Model::build(p.model, p.sample, p.classes, p.seed, gpu);
  parallel::DataParallelOptions options;
  options.replicas = 2;
  // Two emulated devices: a replica on the master's own device would be ordered after the held
  // stream by the device-wide wait of its input's copy (Tensor::to), which would hide a missing
  // order. One GPU is what a CUDA machine surely has.
  options.devices = {gpu, gpu.is_emu() ? Device::emu(1) : gpu};
  parallel::DataParallelEngine engine(ctx, master, options);
  SyntheticBatch b = synthetic_batch(p.global_batch, p.sample, p.classes, 0);
  const float scale = 1.0f / static_cast<float>(p.global_batch);

  for (nn::Parameter* param : master.parameters())
    ops::scale(ctx, param->value, 3.0f);  // new weights, not yet on the replica
  std::atomic<bool> released{false};
  ops::DeviceRuntime& rt = *ctx.backend().runtime();
  rt.host_func(rt.compute_stream(), [&released] {
    while (!released.load())
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  std::thread timer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    released = true;
  });
  engine.begin_step();  // queues the copies behind the hold
  const float first = engine.forward_backward(b.x, b.y, scale, true).item();
  timer.join();
  engine.finish_gradients();
  ctx.synchronize();

  engine.begin_step();
  const float settled = engine.forward_backward(b.x, b.y, scale, true).item();
  EXPECT_LE(std::fabs(first - settled), 1e-6f * std::fabs(settled))
      << "the replica computed with stale weights: loss " << first << " vs " << settled;
}

}  // namespace lockstep::test
