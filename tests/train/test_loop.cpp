// The training loop in-process (single-rank communicator, no MPI) on a tiny synthetic shard set:
// it must do exactly what a plain SGD loop over the sampler's batches does, and a run stopped and
// resumed from its checkpoint must end bitwise equal to an uninterrupted one.
#include <gtest/gtest.h>

#include <numeric>

#include "lockstep/comm/local.hpp"
#include "lockstep/data/sampler.hpp"
#include "lockstep/nn/loss.hpp"
#include "lockstep/optim/sgd.hpp"
#include "lockstep/train/evaluate.hpp"
#include "lockstep/train/loop.hpp"
#include "lockstep/train/setup.hpp"
#include "support/tiny_run.hpp"
#include "support/training.hpp"

using namespace lockstep;
using namespace lockstep::train;

namespace {

struct Trained {
  TrainResult result;
  std::vector<std::vector<float>> params;
};

Trained train_in_process(const Config& c) {
  auto comm = comm::make_single_rank_communicator();
  auto run = setup_run(c, *comm);
  Trained t;
  t.result = train_loop(*run);
  t.params = test::parameter_values(*run->model);
  return t;
}

}  // namespace

TEST(TrainLoop, MatchesAPlainSgdLoopOverTheSamplersBatches) {
  test::TempDir dir;
  const Config c = test::tiny_config(test::write_tiny_set(dir.path(), "train"));
  const Trained got = train_in_process(c);
  EXPECT_EQ(got.result.steps, 16);  // 2 epochs x 64 / 8
  EXPECT_EQ(got.result.epochs, 2);

  // The reference: one model, SGD, the sampler's order, mean loss over the batch.
  ops::Context ctx(Device::cpu(), 1);
  auto set = data::ShardedDataset::open(c.data_train);
  nn::Model model = nn::Model::build(c.model_spec, set->sample_shape(), set->num_classes(),
                                     static_cast<std::uint64_t>(c.train_seed));
  optim::SgdOptions so;
  so.lr = static_cast<float>(c.optim_lr);
  so.momentum = static_cast<float>(c.optim_momentum);
  optim::Sgd sgd(model.parameters(), so);
  nn::SoftmaxCrossEntropy loss;
  data::DistributedSampler sampler(set->size(), 1, 0, true,
                                   static_cast<std::uint64_t>(c.train_seed), false);
  for (std::int64_t epoch = 0; epoch < c.train_epochs; ++epoch) {
    sampler.set_epoch(epoch);
    const auto order = sampler.indices();
    for (std::size_t b = 0; b + 8 <= order.size(); b += 8) {
      Tensor x, y;
      set->gather(std::span<const std::int64_t>(order.data() + b, 8), x, y);
      model.zero_grad(ctx);
      Tensor logits = model.forward(ctx, x);
      loss.forward(ctx, logits, y);
      model.backward(ctx, loss.backward(ctx, 1.0f / 8.0f));
      sgd.step(ctx);
    }
  }
  EXPECT_EQ(test::max_abs_difference(got.params, test::parameter_values(model)), 0.0);
}

TEST(TrainLoop, StoppedAndResumedRunEndsBitwiseEqualToAnUninterruptedOne) {
  test::TempDir dir;
  Config c = test::tiny_config(test::write_tiny_set(dir.path(), "train"));
  c.optim_name = "adamw";  // state beyond the parameters: two moments and a step count
  c.optim_lr = 0.01;
  const Trained whole = train_in_process(c);

  Config first = c;
  first.checkpoint_dir = dir / "ckpt";
  first.train_max_steps = 5;  // stops mid-epoch; a constant schedule does not depend on it
  const Trained part = train_in_process(first);
  EXPECT_EQ(part.result.steps, 5);
  EXPECT_EQ(part.result.checkpoint, checkpoint_path(dir / "ckpt", 5));

  Config rest = c;
  rest.checkpoint_dir = dir / "ckpt";
  rest.train_resume = "auto";
  const Trained resumed = train_in_process(rest);
  EXPECT_EQ(resumed.result.steps, whole.result.steps);
  EXPECT_EQ(test::max_abs_difference(resumed.params, whole.params), 0.0);
}

TEST(TrainLoop, EvaluationCountsEveryTestSampleOnceAndLearns) {
  test::TempDir dir;
  test::TinySet test_spec;
  test_spec.samples = 37;       // not a multiple of any batch
  test_spec.sample_stream = 9;  // other samples, the same labelling map
  Config c = test::tiny_config(test::write_tiny_set(dir.path(), "train"),
                               test::write_tiny_set(dir.path(), "test", test_spec));
  c.train_epochs = 6;
  auto comm = comm::make_single_rank_communicator();
  auto run = setup_run(c, *comm);
  const EvalResult before = evaluate(*run, *run->test_set);
  EXPECT_EQ(before.samples, 37);
  const TrainResult result = train_loop(*run);
  const EvalResult after = evaluate(*run, *run->test_set);
  EXPECT_EQ(after.samples, 37);
  EXPECT_DOUBLE_EQ(result.test_accuracy, after.accuracy);  // the loop's last evaluation
  EXPECT_LT(after.loss, before.loss);
}

TEST(TrainLoop, NonFiniteInputIsBadDataNamingTheShardAndSampleNotALearningRateProblem) {
  test::TempDir dir;
  test::write_tiny_set(dir.path(), "clean");
  // The same set with NaN in one feature of global sample 40 (shard 1 holds 32..63) and Inf in
  // sample 41.
  auto clean = data::ShardedDataset::open(dir / "clean");
  data::LabeledArray a;
  std::vector<std::int64_t> all(static_cast<std::size_t>(clean->size()));
  std::iota(all.begin(), all.end(), 0);
  Tensor y;
  clean->gather(all, a.x, y);
  a.y = y.to_vector<std::int32_t>();
  a.num_classes = clean->num_classes();
  a.x.data<float>()[40 * 4 + 2] = std::numeric_limits<float>::quiet_NaN();
  a.x.data<float>()[41 * 4 + 0] = std::numeric_limits<float>::infinity();
  data::write_shard_set(a, dir.path(), "dirty", 2, {}, {});

  Config c = test::tiny_config(dir / "dirty");
  auto comm = comm::make_single_rank_communicator();
  try {
    train_loop(*setup_run(c, *comm));
    ADD_FAILURE() << "trained over NaN input";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("bad data at step"), std::string::npos) << what;
    EXPECT_NE(what.find("dirty-00001-of-00002.h5 (shard 1 of 2): "), std::string::npos) << what;
    // 40 and 41 are shard 1's samples 8 and 9; the step holds one or both of them.
    EXPECT_TRUE(what.find("1 sample, index 8") != std::string::npos ||
                what.find("1 sample, index 9") != std::string::npos ||
                what.find("2 samples in [8, 9]") != std::string::npos)
        << what;
    EXPECT_EQ(e.hint().find("optim.lr"), std::string::npos) << e.hint();
  }
  // With train.nan_policy = skip, the steps holding them are skipped and the rest trains.
  c.train_nan_policy = "skip";
  const TrainResult r = train_loop(*setup_run(c, *comm));
  EXPECT_EQ(r.steps, 16);
  EXPECT_GE(r.skipped_steps, 2);  // once per epoch at least
  EXPECT_LE(r.skipped_steps, 4);
}
