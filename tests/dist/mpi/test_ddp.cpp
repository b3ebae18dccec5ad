// DDP's correctness contract, checked under mpirun with 2 and 4 ranks:
//   N ranks with local batch b  ==  1 process with batch N*b   (to float rounding)
// and the same config and world size give bitwise-identical runs.
//
// Tolerance: every gradient element is a sum of B = 16 per-sample terms of magnitude <= ~1 (the
// softmax gradient is bounded by 1, activations and inputs by a few units here). Splitting the
// sum into N partial sums and adding them in another order changes it by at most ~B * eps32 *
// max|term| ~ 16 * 6e-8 ~ 1e-6 (relative to the batch mean: the 1/B scale cancels); over 6 SGD
// steps with lr 0.1 and momentum 0.9 the parameter error stays within ~steps * lr * 1e-6 * 10
// ~ 1e-6. 2e-5 leaves an order of magnitude of headroom while a real bug (a missing or double
// average, a wrong slice, a stale bucket) moves parameters by > 1e-3.
#include <gtest/gtest.h>

#include "lockstep/core/error.hpp"
#include "lockstep/dist/data_parallel.hpp"
#include "lockstep/dist/ddp.hpp"
#include "lockstep/train/config.hpp"
#include "lockstep/train/trainer.hpp"
#include "support/mpi_env.hpp"
#include "support/training.hpp"

namespace lockstep::test {
namespace {

constexpr double kTolerance = 2e-5;

struct DdpRun {
  dist::ReducerOptions buckets;
  int accumulation = 1;
  bool sync = true;
};

std::vector<std::vector<float>> train_ddp(const ProblemSpec& p, const DdpRun& run) {
  comm::Communicator& comm = world();
  const int rank = comm.rank(), n = comm.size();
  ops::Context ctx(Device::cpu(), 1);
  // A different seed per rank: the broadcast from rank 0 must make the replicas identical.
  nn::Model model =
      nn::Model::build(p.model, p.sample, p.classes, p.seed + static_cast<std::uint64_t>(rank));
  dist::DdpOptions options;
  options.reducer = run.buckets;
  options.sync = run.sync;
  dist::DdpEngine engine(ctx, model, comm, options);
  optim::SgdOptions so;
  so.lr = p.lr;
  so.momentum = p.momentum;
  optim::Sgd sgd(engine.flat_params(), so);  // the engine laid the parameters out flat
  const std::int64_t local = p.global_batch / n;
  const std::int64_t micro = local / run.accumulation;
  for (int step = 0; step < p.steps; ++step) {
    SyntheticBatch b = synthetic_batch(p.global_batch, p.sample, p.classes, step);
    engine.begin_step();
    for (int m = 0; m < run.accumulation; ++m) {
      std::int64_t begin = rank * local + m * micro;
      engine.forward_backward(b.x.slice(begin, begin + micro), b.y.slice(begin, begin + micro),
                              1.0f / static_cast<float>(local), m + 1 == run.accumulation);
    }
    engine.finish_gradients();
    sgd.step(ctx);
  }
  return parameter_values(model);
}

ProblemSpec with_seed_of_rank0(ProblemSpec p) {
  return p;
}

}  // namespace

TEST(Ddp, MatchesSingleProcessLargeBatch) {
  ProblemSpec p;
  auto reference = train_single_process(with_seed_of_rank0(p));
  auto ddp = train_ddp(p, {});
  EXPECT_LE(max_abs_difference(reference, ddp), kTolerance) << "world size " << world().size();
  // And the test can fail: without gradient averaging the result is a different model.
  auto unsynced = train_ddp(p, DdpRun{{}, 1, /*sync=*/false});
  if (world().size() > 1) {
    EXPECT_GT(max_abs_difference(reference, unsynced), 1e-3);
  }
}

TEST(Ddp, AccumulationMicroStepsMatchOneLargeBatch) {
  ProblemSpec p;
  auto reference = train_single_process(p);
  auto accumulated = train_ddp(p, DdpRun{{}, /*accumulation=*/2});
  EXPECT_LE(max_abs_difference(reference, accumulated), kTolerance);
}

TEST(Ddp, TwoIdenticalRunsAreBitwiseIdentical) {
  ProblemSpec p;
  auto a = train_ddp(p, {});
  auto b = train_ddp(p, {});
  EXPECT_EQ(a, b);
}

TEST(Ddp, BucketSizesDoNotChangeTheResult) {
  ProblemSpec p;
  p.model = "mlp:32,24,16";
  auto reference = train_single_process(p);
  dist::ReducerOptions per_param{0, 0};                 // every parameter its own bucket
  dist::ReducerOptions one_bucket{1u << 30, 1u << 30};  // everything in one bucket
  dist::ReducerOptions small{1024, 256};                // a few mixed buckets
  auto a = train_ddp(p, DdpRun{per_param});
  auto b = train_ddp(p, DdpRun{one_bucket});
  auto c = train_ddp(p, DdpRun{small});
  auto d = train_ddp(p, {});
  EXPECT_LE(max_abs_difference(reference, a), kTolerance);
  EXPECT_LE(max_abs_difference(reference, b), kTolerance);
  EXPECT_LE(max_abs_difference(reference, c), kTolerance);
  EXPECT_LE(max_abs_difference(reference, d), kTolerance);
}

TEST(Ddp, ConvNetWithBatchNormMatchesSingleProcess) {
  // BatchNorm makes each rank's statistics local (as in PyTorch DDP without SyncBatchNorm), so
  // only the one-rank case is an exact reference; with N ranks we check the replicas agree.
  ProblemSpec p;
  p.model = "conv(4,3,pad=1)-bn-relu-maxpool(2)-flatten-linear(5)";
  auto ddp = train_ddp(p, {});
  if (world().size() == 1) {
    EXPECT_LE(max_abs_difference(train_single_process(p), ddp), kTolerance);
  }
  // Every rank ends with the same parameters: gather rank 0's and compare.
  std::string mine;
  for (const auto& v : ddp)
    mine.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
  std::string root = world().broadcast(mine, 0);
  EXPECT_EQ(mine, root) << "replicas diverged on rank " << world().rank();
}

TEST(Ddp, DataParallelAndDdpAgreeOnTheSameGlobalBatch) {
  ProblemSpec p;
  auto ddp = train_ddp(p, {});
  // The DataParallel baseline in this process with as many replicas as there are ranks.
  ops::Context ctx(Device::cpu(), 1);
  nn::Model master = nn::Model::build(p.model, p.sample, p.classes, p.seed);
  dist::DataParallelOptions dp;
  dp.replicas = world().size();
  dist::DataParallelEngine engine(ctx, master, p.model, p.sample, p.classes, dp);
  optim::SgdOptions so;
  so.lr = p.lr;
  so.momentum = p.momentum;
  optim::Sgd sgd(engine.flat_params(), so);  // the engine laid the parameters out flat
  for (int step = 0; step < p.steps; ++step) {
    SyntheticBatch b = synthetic_batch(p.global_batch, p.sample, p.classes, step);
    engine.begin_step();
    engine.forward_backward(b.x, b.y, 1.0f / static_cast<float>(p.global_batch), true);
    engine.finish_gradients();
    sgd.step(ctx);
  }
  EXPECT_LE(max_abs_difference(parameter_values(master), ddp), kTolerance);
}

TEST(Ddp, ConfigMismatchBetweenRanksNamesTheKey) {
  std::vector<std::string> overrides;
  if (world().rank() == world().size() - 1) overrides.push_back("optim.lr=0.2");
  train::Config c = train::parse_config_text("[optim]\nlr = 0.1\n", overrides);
  try {
    train::check_config_agrees(world(), c);
    ADD_FAILURE() << "no error on rank " << world().rank();
  } catch (const Error& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("optim.lr"), std::string::npos) << what;
    EXPECT_NE(what.find("rank " + std::to_string(world().size() - 1)), std::string::npos) << what;
  }
  // Agreeing configs pass.
  EXPECT_NO_THROW(train::check_config_agrees(world(), train::parse_config_text("")));
}

}  // namespace lockstep::test

namespace lockstep::test {

TEST(Ddp, ReducerAveragesUnlessTheGradientsArrivePrescaled) {
  // Rank r's gradients hold r + 1 everywhere: the mean is (W + 1) / 2 and the sum W (W + 1) / 2.
  comm::Communicator& comm = world();
  const int W = comm.size();
  ops::Context ctx(Device::cpu(), 1);
  for (bool prescaled : {false, true}) {
    nn::Parameter a{"a", Tensor::zeros({300}), Tensor::zeros({300})};
    nn::Parameter b{"b", Tensor::zeros({7, 5}), Tensor::zeros({7, 5})};
    dist::Reducer reducer(ctx, comm, {&a, &b}, dist::ReducerOptions{1024, 512});
    reducer.set_prescaled(prescaled);
    reducer.prepare_for_backward(/*communicate=*/true);
    for (nn::Parameter* p : {&b, &a}) {
      ops::fill(ctx, p->grad, static_cast<float>(comm.rank() + 1));
      reducer.on_grad_ready(*p);
    }
    reducer.finish();
    const float want =
        prescaled ? 0.5f * static_cast<float>(W * (W + 1)) : 0.5f * static_cast<float>(W + 1);
    for (nn::Parameter* p : {&a, &b}) {
      for (float v : p->grad.to_vector<float>())
        ASSERT_EQ(v, want) << p->name << " prescaled=" << prescaled << " world " << W;
    }
  }
}

}  // namespace lockstep::test
