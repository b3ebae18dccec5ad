// The training loop in-process (single-rank communicator, no MPI) on a tiny synthetic shard set:
// it must do exactly what a plain SGD loop over the sampler's batches does, and a run stopped and
// resumed from its checkpoint must end bitwise equal to an uninterrupted one.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
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
  // The tiny set with NaN in one feature of global sample 40 (shard 1 holds 32..63) and Inf in
  // sample 41.
  test::write_spoiled_tiny_set(dir.path(), "dirty",
                               {{40, 2, std::numeric_limits<float>::quiet_NaN()},
                                {41, 0, std::numeric_limits<float>::infinity()}});
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

// The step reads nothing back for the loss: the losses of a log interval are read once, at the
// log step (on a GPU every read waits for the device, and with DDP for the allreduce). Counted
// with Tensor::host_reads over two runs that differ only in their length: 16 steps more, one log
// record more. What a step may read is the gradient check's one readback (finiteness and norm,
// optim/clip.hpp): 16 + 1 reads more. (When every micro-step read its loss: 16 + 16 + 1.)
TEST(TrainLoop, ReadsTheLossOncePerLogIntervalNotOncePerStep) {
  test::TempDir dir;
  Config c = test::tiny_config(test::write_tiny_set(dir.path(), "train"));
  c.log_every = 16;
  auto reads_in_epochs = [&](std::int64_t epochs) {
    c.train_epochs = epochs;  // 8 steps each
    auto comm = comm::make_single_rank_communicator();
    auto run = setup_run(c, *comm);
    const std::uint64_t before = Tensor::host_reads();
    const TrainResult r = train_loop(*run);
    EXPECT_EQ(r.steps, 8 * epochs);
    EXPECT_TRUE(std::isfinite(r.final_train_loss));
    return Tensor::host_reads() - before;
  };
  const std::uint64_t steps16 = reads_in_epochs(2), steps32 = reads_in_epochs(4);
  EXPECT_EQ(steps32 - steps16, 16u + 1u)
      << "host reads in 16 steps: " << steps16 << ", in 32: " << steps32;

  // The log records say so too: one read per step (the gradient check), no cudaMalloc.
  c.log_every = 4;
  c.log_metrics = dir.path() + "/metrics.jsonl";
  reads_in_epochs(2);
  std::ifstream in(c.log_metrics);
  int records = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.find("\"samples_per_s\"") == std::string::npos ||
        line.find("\"event\"") != std::string::npos)
      continue;
    ++records;
    EXPECT_NE(line.find("\"host_reads_per_step\": 1,"), std::string::npos) << line;
    EXPECT_NE(line.find("\"host_syncs_per_step\": 0"), std::string::npos) << line;
    EXPECT_NE(line.find("\"device_mallocs_per_step\": 0"), std::string::npos) << line;
    EXPECT_NE(line.find("\"pageable_copies_per_step\": 0"), std::string::npos) << line;
  }
  EXPECT_EQ(records, 4);
}

// The loss logged is the mean over the interval's steps of each step's mean over its micro-steps,
// whatever the accumulation: with 2 micro-steps of half the batch the logged losses stay those of
// plain SGD on the whole batch, to float rounding of the two halves' sums.
TEST(TrainLoop, LoggedLossWithAccumulationMatchesTheWholeBatch) {
  test::TempDir dir;
  Config c = test::tiny_config(test::write_tiny_set(dir.path(), "train"));
  c.log_every = 3;
  auto final_loss = [&](std::int64_t accumulation) {
    c.train_accumulation = accumulation;
    auto comm = comm::make_single_rank_communicator();
    return train_loop(*setup_run(c, *comm)).final_train_loss;
  };
  const double whole = final_loss(1), halves = final_loss(2);
  EXPECT_TRUE(std::isfinite(whole));
  EXPECT_NEAR(halves, whole, 1e-5 * std::fabs(whole));
}
