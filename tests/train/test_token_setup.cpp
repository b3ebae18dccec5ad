// The trainer's setup on token shards (train/token_data.hpp), in process with one rank: token
// shards are recognised by the data layer and become windows of T tokens (T from the spec's ctx or
// data.context) for a GPT whose classes are the vocabulary; the checkpoint records what
// lockstep-generate needs; mistakes are errors naming the key; image shards are unaffected.
#include <gtest/gtest.h>

#include <cmath>

#include "lockstep/data/token_shard.hpp"
#include "lockstep/train/evaluate.hpp"
#include "lockstep/train/loop.hpp"
#include "lockstep/train/token_data.hpp"
#include "support/tiny_run.hpp"

using namespace lockstep;
using namespace lockstep::train;

namespace {

// 2000 byte tokens of a repeating pattern in 2 shards, DIR/NAME-*-of-00002.h5; returns DIR/NAME.
std::string write_tokens(const std::string& dir, const std::string& name) {
  std::vector<std::int32_t> tokens(2000);
  for (std::size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = static_cast<std::int32_t>('a' + (i * 7 + i / 13) % 26);
  data::TokenShardMeta meta;
  meta.tokenizer = "bytes";
  meta.vocab_size = 256;
  meta.eot_token = 0;
  data::write_token_set(tokens, dir, name, 2, meta);
  return dir + "/" + name;
}

Config token_config(const std::string& train, const std::string& test) {
  Config c = test::tiny_config(train, test);
  c.model_spec = "gpt(layers=1,heads=2,dim=16,ctx=16)";
  c.optim_name = "adamw";
  c.optim_lr = 0.01;
  c.train_max_steps = 6;
  return c;
}

}  // namespace

TEST(TokenSetup, TokenShardsBecomeWindowsOfTheSpecsContextForAGptOverTheVocabulary) {
  test::TempDir dir;
  const Config c = token_config(write_tokens(dir.path(), "train"), write_tokens(dir.path(), "val"));
  EXPECT_TRUE(uses_token_data(c));
  auto comm = comm::make_single_rank_communicator();
  auto run = setup_run(c, *comm);
  ASSERT_TRUE(run->train_tokens && run->test_tokens);
  EXPECT_FALSE(run->train_set);
  EXPECT_EQ(run->train_tokens->context(), 16);
  EXPECT_EQ(run->train_data()->size(), (2000 - 1) / 16);
  EXPECT_EQ(run->model->sample_shape(), (Shape{16}));
  EXPECT_EQ(run->model->num_classes(), 256);
  EXPECT_GT(run->unigram_nats, 0.0);
  Tensor x, y;
  const std::vector<std::int64_t> windows = {0, 3};
  run->train_data()->gather(windows, x, y);
  EXPECT_EQ(x.dtype(), DType::I32);
  EXPECT_EQ(x.shape(), (Shape{2, 16}));
  // A fresh model predicts about uniformly: per-token loss near ln(256), as evaluation reports it.
  EvalResult before = evaluate(*run, *run->test_data());
  EXPECT_NEAR(before.loss, std::log(256.0), 0.3);
  train_loop(*run);
  EvalResult after = evaluate(*run, *run->test_data());
  EXPECT_LT(after.loss, before.loss - 0.5) << "6 AdamW steps on a repeating pattern";
  const CheckpointState saved = run->state->to_checkpoint();
  EXPECT_EQ(saved.attrs.at("tokenizer"), "bytes");
  EXPECT_EQ(saved.attrs.at("context"), "16");
  EXPECT_EQ(saved.attrs.at("vocab_size"), "256");
}

TEST(TokenSetup, DataContextOverridesTheSpecsCtxAndMayNotExceedIt) {
  test::TempDir dir;
  Config c = token_config(write_tokens(dir.path(), "train"), "");
  c.data_context = 8;
  auto comm = comm::make_single_rank_communicator();
  EXPECT_EQ(setup_run(c, *comm)->train_tokens->context(), 8);
  c.data_context = 32;
  EXPECT_NE(test::setup_error(c).find("ctx = 16"), std::string::npos);
}

TEST(TokenSetup, AContextNoKeyStatesIsAnErrorNamingDataContext) {
  test::TempDir dir;
  Config c = token_config(write_tokens(dir.path(), "train"), "");
  c.model_spec = "gpt(layers=1,heads=2,dim=16)";
  EXPECT_NE(test::setup_error(c).find("data.context"), std::string::npos);
}

TEST(TokenSetup, ThreadedDataParallelIsRefusedForTokenData) {
  test::TempDir dir;
  Config c = token_config(write_tokens(dir.path(), "train"), "");
  c.train_parallel = "dp";
  EXPECT_NE(test::setup_error(c).find("train.parallel = dp"), std::string::npos);
}

// Evaluation keeps no gradients, so image batches grow to 256 samples; token windows stay at the
// training micro-batch, since their activations and logits grow with context x vocabulary (256
// windows of gpt2-124m would be 52 GB of logits).
TEST(TokenSetup, TokenWindowsAreEvaluatedInTrainingsMicroBatchesAndImagesInAtLeast256) {
  test::TempDir dir;
  Config c = token_config(write_tokens(dir.path(), "train"), write_tokens(dir.path(), "val"));
  c.train_global_batch = 8;
  c.train_accumulation = 2;
  auto comm = comm::make_single_rank_communicator();
  auto run = setup_run(c, *comm);
  EXPECT_EQ(run->eval_batch(), 4);
  EXPECT_NEAR(evaluate(*run, *run->test_data()).loss, std::log(256.0), 0.3);
  const Config images = test::tiny_config(test::write_tiny_set(dir.path(), "images"));
  EXPECT_EQ(setup_run(images, *comm)->eval_batch(), 256);
}

TEST(TokenSetup, ImageShardsAreNotTokenData) {
  test::TempDir dir;
  const Config c = test::tiny_config(test::write_tiny_set(dir.path(), "train"));
  EXPECT_FALSE(uses_token_data(c));
  auto comm = comm::make_single_rank_communicator();
  auto run = setup_run(c, *comm);
  EXPECT_TRUE(run->train_set);
  EXPECT_FALSE(run->train_tokens);
}

// train.attention (ops::choose_attention): cudnn needs a CUDA GPU, so on the CPU and on the
// emulated GPU it is an error naming the key, the device and why, before any work; auto there is
// lockstep's own kernels, bit for bit the training of reference, and the choice is what the run
// reports.
std::vector<std::string> devices_without_cudnn() {
  std::vector<std::string> d{"cpu"};
  if (emu_available()) d.push_back("emu");
  return d;
}

TEST(TokenSetup, AttentionCudnnWithoutACudaGpuIsAnErrorNamingTheKeyAndWhy) {
  test::TempDir dir;
  Config c = token_config(write_tokens(dir.path(), "train"), "");
  c.train_attention = "cudnn";
  for (const std::string& device : devices_without_cudnn()) {
    SCOPED_TRACE(device);
    c.train_device = device;
    const std::string e = test::setup_error(c);
    EXPECT_NE(e.find("train.attention = cudnn: cuDNN's fused attention cannot run on " + device),
              std::string::npos)
        << e;
    EXPECT_NE(e.find("CUDA GPUs only"), std::string::npos) << e;
    EXPECT_NE(e.find("train.attention = auto"), std::string::npos) << "the hint: " << e;
  }
}

TEST(TokenSetup, AttentionAutoWithoutACudaGpuTrainsBitwiseAsReference) {
  test::TempDir dir;
  const std::string train = write_tokens(dir.path(), "train");
  for (const std::string& device : devices_without_cudnn()) {
    SCOPED_TRACE(device);
    std::vector<std::vector<float>> params[2];
    int i = 0;
    for (const char* attention : {"auto", "reference"}) {
      Config c = token_config(train, "");
      c.train_device = device;
      c.train_attention = attention;
      auto comm = comm::make_single_rank_communicator();
      auto run = setup_run(c, *comm);
      EXPECT_EQ(run->attention_kernel, "reference");
      EXPECT_EQ(
          run->attention.rfind(std::string("reference (") +
                                   (i == 0 ? "auto: cuDNN runs on CUDA GPUs only" : "lockstep"),
                               0),
          0u)
          << run->attention;
      train_loop(*run);
      for (nn::Parameter* p : run->model->parameters())
        params[i].push_back(p->value.to(Device::cpu()).to_vector<float>());
      ++i;
    }
    ASSERT_EQ(params[0].size(), params[1].size());
    for (std::size_t k = 0; k < params[0].size(); ++k)
      EXPECT_EQ(params[0][k], params[1][k]) << "parameter " << k;
  }
}
