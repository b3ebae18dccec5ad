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

#include "custom_model/custom_network.hpp"
#include "lockstep/core/error.hpp"
#include "lockstep/parallel/data_parallel.hpp"
#include "lockstep/parallel/ddp.hpp"
#include "lockstep/train/config.hpp"
#include "lockstep/train/trainer.hpp"
#include "support/mpi_env.hpp"
#include "support/precision_reference.hpp"
#include "support/training.hpp"

namespace lockstep::test {
namespace {

constexpr double kTolerance = 2e-5;

struct DdpRun {
  parallel::ReducerOptions buckets;
  int accumulation = 1;
  bool sync = true;
};

std::vector<std::vector<float>> train_ddp(const ProblemSpec& p, const DdpRun& run) {
  comm::Communicator& comm = world();
  const int rank = comm.rank(), n = comm.size();
  ops::Context ctx(Device::cpu(), 1);
  // A different seed per rank: the broadcast from rank 0 must make the replicas identical.
  nn::Model model = make_model(p, p.seed + static_cast<std::uint64_t>(rank));
  parallel::DdpOptions options;
  options.reducer = run.buckets;
  options.sync = run.sync;
  parallel::DdpEngine engine(ctx, model, comm, options);
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

// dist.grad_dtype = bf16 trains the same model up to the rounding of the averaged gradients:
// each step's gradient is off by at most ~2 u of its scale (u = 2^-8: the inputs' rounding, then
// the sums', see the reducer test below), so the parameters end within ~2 u of how far training
// moved them (0.196 here; measured: 1.3e-4 at 2 ranks, 4.8e-4 at 4, against the bound 1.5e-3).
// They must differ from f32's (the rounding is real), and a broken average is far outside the
// bound (without any, 0.06-0.18 from the reference).
TEST(Ddp, Bf16GradientsTrainLikeF32UpToTheirRounding) {
  ProblemSpec p;
  auto reference = train_single_process(p);
  ProblemSpec untrained = p;
  untrained.steps = 0;
  const double moved = max_abs_difference(reference, train_single_process(untrained));
  parallel::ReducerOptions bf16;
  bf16.grad_dtype = DType::BF16;
  auto ddp = train_ddp(p, DdpRun{bf16});
  const double diff = max_abs_difference(reference, ddp);
  EXPECT_LE(diff, 2 * ops::kBf16UnitRoundoff * moved) << "world size " << world().size();
  if (world().size() > 1) {
    EXPECT_GT(diff, 0.0) << "bf16 gradients should not be exact";
  }
  EXPECT_EQ(ddp, train_ddp(p, DdpRun{bf16})) << "bf16 runs must repeat bit for bit";
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
  parallel::ReducerOptions per_param{0, 0};                 // every parameter its own bucket
  parallel::ReducerOptions one_bucket{1u << 30, 1u << 30};  // everything in one bucket
  parallel::ReducerOptions small{1024, 256};                // a few mixed buckets
  auto a = train_ddp(p, DdpRun{per_param});
  auto b = train_ddp(p, DdpRun{one_bucket});
  auto c = train_ddp(p, DdpRun{small});
  auto d = train_ddp(p, {});
  EXPECT_LE(max_abs_difference(reference, a), kTolerance);
  EXPECT_LE(max_abs_difference(reference, b), kTolerance);
  EXPECT_LE(max_abs_difference(reference, c), kTolerance);
  EXPECT_LE(max_abs_difference(reference, d), kTolerance);
}

TEST(Ddp, ExampleCustomModelMatchesSingleProcess) {
  // examples/custom_model's network, composed in C++ around a layer the example writes itself
  // (GatedLinearUnit): N ranks train it as one process on the whole batch does.
  ProblemSpec p;
  p.sample = {1, 8, 8};
  p.classes = 4;
  p.network = [] { return custom_model::custom_network(8, 4, 6, 4); };
  EXPECT_LE(max_abs_difference(train_single_process(p), train_ddp(p, {})), kTolerance);
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
  nn::Model master = make_model(p, p.seed);
  parallel::DataParallelOptions dp;
  dp.replicas = world().size();
  parallel::DataParallelEngine engine(ctx, master, dp);
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
    parallel::Reducer reducer(ctx, comm, {&a, &b}, parallel::ReducerOptions{1024, 512});
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

// dist.grad_dtype = bf16: each bucket is rounded to bf16 (round to nearest even), summed by the
// communicator in f32 with a rounding to bf16 per combination, widened back and divided by the
// world size in f32. With two ranks that is one combination per element, predicted bit for bit
// by the test's own rounding (tests/support/precision_reference.hpp); with four, the order is
// MPI's: within the roundings' bound of the f32 mean (W input roundings of u |g_r| each and
// W - 1 sums' of u * sum |g_r|, u = 2^-8, then / W). Plain and ZeRO-1 (reduce-scattered, only
// this rank's shard averaged) alike.
namespace {

float bf16_grad_input(int rank, std::int64_t i) {
  return std::sin(0.37f * static_cast<float>(i) + 1.3f * static_cast<float>(rank)) *
         (1.0f + 0.1f * static_cast<float>(rank));
}

}  // namespace

TEST(Ddp, ReducerSendsBf16GradientsRoundedOncePerCombination) {
  comm::Communicator& comm = world();
  const int W = comm.size();
  ops::Context ctx(Device::cpu(), 1);
  for (bool zero : {false, true}) {
    nn::Parameter a{"a", Tensor::zeros({300}), Tensor::zeros({300})};
    nn::Parameter b{"b", Tensor::zeros({7, 5}), Tensor::zeros({7, 5})};
    std::vector<nn::Parameter*> params = {&a, &b};
    auto flat =
        std::make_shared<optim::FlatParams>(params, optim::BucketLimits{256, 64, zero ? W : 1});
    const optim::FlatShard shard = flat->shard(zero ? comm.rank() : 0, zero ? W : 1);
    parallel::Reducer reducer(ctx, comm, flat, shard, DType::BF16);
    ASSERT_GE(reducer.num_buckets(), 2u);  // more than one collective in flight
    reducer.prepare_for_backward(/*communicate=*/true);
    for (std::size_t k = params.size(); k-- > 0;) {  // backward order
      nn::Parameter* p = params[k];
      std::vector<float> g(static_cast<std::size_t>(p->grad.numel()));
      for (std::size_t i = 0; i < g.size(); ++i)
        g[i] = bf16_grad_input(comm.rank(), static_cast<std::int64_t>(i) + 1000 * k);
      Tensor src = Tensor::from_vector(g, p->grad.shape());
      ops::copy(ctx, src, p->grad);
      reducer.on_grad_ready(*p);
    }
    reducer.finish();
    const std::vector<float> grads = flat->grads().to_vector<float>();
    std::int64_t checked = 0, bad = 0, rounded = 0;
    for (std::size_t k = 0; k < params.size(); ++k) {
      const std::int64_t offset = flat->layout().segments()[k].offset;
      for (std::int64_t i = 0; i < params[k]->grad.numel(); ++i) {
        const std::int64_t at = offset + i;
        bool in_shard = false;
        for (const ops::FlatRange& r : shard.ranges)
          in_shard = in_shard || (at >= r.begin && at < r.end);
        if (!in_shard) continue;
        double exact = 0, abs_sum = 0;
        float f32_mean = 0;
        for (int q = 0; q < W; ++q) {
          const float v = bf16_grad_input(q, i + 1000 * static_cast<std::int64_t>(k));
          exact += v;
          abs_sum += std::fabs(v);
          f32_mean += v;
        }
        f32_mean *= 1.0f / static_cast<float>(W);
        const float got = grads[static_cast<std::size_t>(at)];
        bool ok;
        if (W == 2) {
          const float sum = testing::reference_bf16(
              testing::reference_bf16(bf16_grad_input(0, i + 1000 * static_cast<std::int64_t>(k))) +
              testing::reference_bf16(bf16_grad_input(1, i + 1000 * static_cast<std::int64_t>(k))));
          ok = got == sum * 0.5f;
        } else {
          ok = std::fabs(got - exact / W) <= (2 * W - 1) * ops::kBf16UnitRoundoff * abs_sum / W;
        }
        bad += ok ? 0 : 1;
        rounded += got != f32_mean ? 1 : 0;
        ++checked;
      }
    }
    EXPECT_EQ(bad, 0) << "zero=" << zero << ", world " << W;
    // The shards partition the 335 elements (a rank's shard may hold only padding).
    std::vector<std::int64_t> totals = {checked, rounded};
    comm.allreduce(totals, comm::ReduceOp::Sum);
    EXPECT_EQ(totals[0], zero ? 335 : 335 * W) << "zero=" << zero;
    EXPECT_GT(totals[1], totals[0] / 2) << "bf16 rounding should show (zero=" << zero << ")";
  }
}

}  // namespace lockstep::test
