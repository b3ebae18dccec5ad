// Setup's arithmetic and its refusals: how the batch divides and how long a run is, with every
// overflow named, and the errors that name what the user must change before any work is done.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <limits>

#include "lockstep/comm/local.hpp"
#include "lockstep/data/importers.hpp"
#include "lockstep/nn/model.hpp"
#include "lockstep/train/loop.hpp"
#include "lockstep/train/setup.hpp"
#include "support/tiny_run.hpp"

using namespace lockstep;
using namespace lockstep::train;

TEST(StepPlan, GlobalBatchDividesIntoRanksAccumulationAndLocalBatch) {
  Config c;
  c.train_global_batch = 96;
  c.train_accumulation = 3;
  c.train_epochs = 2;
  const StepPlan p = plan_steps(c, /*world=*/4, /*samples_per_rank=*/250, 1000);
  EXPECT_EQ(p.local_batch, 8);
  EXPECT_EQ(p.steps_per_epoch, 250 / 8 / 3);
  EXPECT_EQ(p.total_steps, 2 * (250 / 8 / 3));
  c.train_global_batch = 100;
  EXPECT_THROW(plan_steps(c, 4, 250, 1000), Error);
}

TEST(StepPlan, EpochsTimesStepsBeyondInt64IsAnErrorUnlessMaxStepsEndsTheRun) {
  Config c;
  c.train_global_batch = 8;
  c.train_epochs = std::numeric_limits<std::int64_t>::max();
  try {
    plan_steps(c, 1, 64, 64);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("train.epochs = 9223372036854775807 x 8 steps per epoch"),
              std::string::npos)
        << e.what();
    EXPECT_NE(e.hint().find("train.max_steps"), std::string::npos);
  }
  c.train_max_steps = 10;
  EXPECT_EQ(plan_steps(c, 1, 64, 64).total_steps, 10);
}

TEST(Setup, EvalOnlyWithoutACheckpointIsAnError) {
  test::TempDir dir;
  Config c = test::tiny_config(test::write_tiny_set(dir.path(), "train"),
                               test::write_tiny_set(dir.path(), "test"));
  SetupOptions eval_only;
  eval_only.eval_only = true;
  std::string e = test::setup_error(c, eval_only);  // train.resume empty
  EXPECT_NE(e.find("--eval-only needs a checkpoint, but train.resume is empty"), std::string::npos)
      << e;
  c.train_resume = "auto";
  c.checkpoint_dir = dir / "none-yet";
  e = test::setup_error(c, eval_only);
  EXPECT_NE(e.find("--eval-only found no checkpoint to evaluate in checkpoint.dir"),
            std::string::npos)
      << e;
}

TEST(Setup, ResumingWithAnotherOptimizerNamesTheCheckpointAndBothOptimizers) {
  test::TempDir dir;
  Config c = test::tiny_config(test::write_tiny_set(dir.path(), "train"));
  c.checkpoint_dir = dir / "ckpt";
  c.train_max_steps = 2;
  auto comm = comm::make_single_rank_communicator();
  const std::string saved = train_loop(*setup_run(c, *comm)).checkpoint;
  ASSERT_FALSE(saved.empty());
  Config other = c;
  other.optim_name = "adamw";
  other.train_resume = saved;
  other.checkpoint_dir = dir / "ckpt2";
  std::string e = test::setup_error(other);
  EXPECT_NE(e.find("checkpoint " + saved +
                   " was written by optimizer 'sgd' but this run uses "
                   "optim.name = adamw"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("--optim.name=sgd"), std::string::npos) << e;
  // Checkpoints from before the "optimizer" attribute: the recorded config says which.
  CheckpointState old = read_checkpoint(saved);
  old.attrs.erase("optimizer");
  write_checkpoint(dir / "old.h5", old);
  other.train_resume = dir / "old.h5";
  e = test::setup_error(other);
  EXPECT_NE(e.find("was written by optimizer 'sgd'"), std::string::npos) << e;
}

TEST(Setup, AnUnwritableMetricsPathNamesTheKey) {
  test::TempDir dir;
  Config c = test::tiny_config(test::write_tiny_set(dir.path(), "train"));
  std::ofstream(dir / "a-file") << "x";
  c.log_metrics = dir / "a-file/metrics.jsonl";
  const std::string e = test::setup_error(c);
  EXPECT_NE(e.find("log.metrics = " + c.log_metrics + ": metrics file"), std::string::npos) << e;
  EXPECT_NE(e.find("Not a directory"), std::string::npos) << e;
}

TEST(Setup, OutOfMemoryNamesTheLayerTheSizeAskedAndWhatWasFree) {
  test::TempDir dir;
  Config c = test::tiny_config(test::write_tiny_set(dir.path(), "train"));
  // Layer 1 asks 2^31 x 2^24 floats (512 PiB): beyond any machine, and beyond what is even asked
  // of the allocator, so sanitizer builds behave the same. (model.spec numbers are at most
  // 2^31 - 1; layer 0 is a modest 256 MiB.)
  c.model_spec = "linear(16777216)-linear(2147483647)";
  const std::string e = test::setup_error(c);
  EXPECT_NE(e.find("model.spec layer 1 'linear(2147483647)'"), std::string::npos) << e;
  EXPECT_NE(e.find("a f32 tensor [2147483647, 16777216] on cpu"), std::string::npos) << e;
  EXPECT_NE(e.find("out of host memory: cannot allocate "), std::string::npos) << e;
  EXPECT_NE(e.find("(available "), std::string::npos) << e;
  EXPECT_NE(e.find("held by this process's tensors"), std::string::npos) << e;
}

TEST(Setup, AnUnwritableExportFailsAtSetupNotAfterTraining) {
  test::TempDir dir;
  Config c = test::tiny_config(test::write_tiny_set(dir.path(), "train"));
  std::ofstream(dir / "a-file") << "x";
  c.checkpoint_export = dir / "a-file/params.h5";
  const std::string e = test::setup_error(c);
  EXPECT_NE(e.find("checkpoint.export = " + c.checkpoint_export + ": cannot create the folder"),
            std::string::npos)
      << e;
}

// train.label_smoothing reaches the loss of both engines: the first micro-batch's loss is the
// smoothed one, and 0 (the default) leaves it as it was.
TEST(Setup, LabelSmoothingReachesTheLossOfEitherEngine) {
  test::TempDir dir;
  const std::string data = test::write_tiny_set(dir.path(), "train");
  Tensor x = Tensor::empty({8, 4});
  Philox(5, 6).fill_uniform(x.data<float>(), x.numel(), -1.0f, 1.0f);
  Tensor y = Tensor::from_vector<std::int32_t>({0, 1, 2, 0, 1, 2, 2, 1}, {8});
  for (const char* parallel : {"none", "dp"}) {
    SCOPED_TRACE(parallel);
    auto first_loss = [&](double eps) {
      Config c = test::tiny_config(data);
      c.train_parallel = parallel;
      c.train_label_smoothing = eps;
      auto comm = comm::make_single_rank_communicator();
      auto run = setup_run(c, *comm);
      return run->engine->forward_backward(x, y, 1.0f / 8, true).to(Device::cpu()).item();
    };
    const float plain = first_loss(0.0), smoothed = first_loss(0.3);
    EXPECT_EQ(first_loss(0.0), plain);
    EXPECT_NE(smoothed, plain);
  }
}

TEST(Setup, ZeroInitResidualOnAModelWithoutResidualBlocksIsAnError) {
  test::TempDir dir;
  Config c = test::tiny_config(test::write_tiny_set(dir.path(), "train"));
  c.model_zero_init_residual = true;
  const std::string e = test::setup_error(c);
  EXPECT_NE(e.find("model.zero_init_residual = true but model.spec = mlp:8 has no residual"),
            std::string::npos)
      << e;
}

// model.channels_last = on asks for NHWC activations: a model with no layer that can run them
// (here an MLP) is an error naming the key; auto leaves such a model as it is.
TEST(Setup, ChannelsLastOnAModelWithoutImageLayersIsAnError) {
  test::TempDir dir;
  Config c = test::tiny_config(test::write_tiny_set(dir.path(), "train"));
  c.model_channels_last = "on";
  const std::string e = test::setup_error(c);
  EXPECT_NE(e.find("model.channels_last = on but model.spec = mlp:8 has no layer that can run "
                   "channels-last"),
            std::string::npos)
      << e;
  c.model_channels_last = "auto";
  auto comm = comm::make_single_rank_communicator();
  EXPECT_FALSE(setup_run(c, *comm)->model->channels_last());
}

TEST(Setup, RecomputeOnAModelWithoutTransformerBlocksIsAnError) {
  test::TempDir dir;
  Config c = test::tiny_config(test::write_tiny_set(dir.path(), "train"));
  c.train_recompute = "block";
  const std::string e = test::setup_error(c);
  EXPECT_NE(e.find("train.recompute = block but model.spec = mlp:8 has no transformer block"),
            std::string::npos)
      << e;
}

TEST(Setup, AttentionCudnnOnAModelWithoutAttentionIsAnError) {
  test::TempDir dir;
  Config c = test::tiny_config(test::write_tiny_set(dir.path(), "train"));
  c.train_attention = "cudnn";
  const std::string e = test::setup_error(c);
  EXPECT_NE(e.find("train.attention = cudnn but model.spec = mlp:8 has no attention layer"),
            std::string::npos)
      << e;
  c.train_attention = "reference";  // nothing to set, nothing refused
  auto comm = comm::make_single_rank_communicator();
  EXPECT_EQ(setup_run(c, *comm)->attention, "");
}

TEST(Setup, ZeroInitResidualZeroesEveryBlocksLastBatchNormScale) {
  test::TempDir dir;
  data::LabeledArray images;
  images.x = Tensor::empty({16, 3, 8, 8});
  Philox(8, 9).fill_uniform(images.x.data<float>(), images.x.numel(), 0.0f, 1.0f);
  for (int i = 0; i < 16; ++i)
    images.y.push_back(i % 3);
  images.num_classes = 3;
  data::write_shard_set(images, dir.path(), "train", 2, {}, {});
  for (bool zero : {false, true}) {
    Config c = test::tiny_config(dir.path() + "/train");
    c.model_spec = "resnet:1";
    c.model_zero_init_residual = zero;
    auto comm = comm::make_single_rank_communicator();
    auto run = setup_run(c, *comm);
    int blocks = 0;
    for (nn::Parameter* p : run->model->parameters()) {
      if (p->name.find("bn2.weight") == std::string::npos) continue;
      ++blocks;
      for (float g : p->value.to_vector<float>())
        EXPECT_EQ(g, zero ? 0.0f : 1.0f) << p->name;
    }
    EXPECT_EQ(blocks, 3);
  }
}
