// The configs shipped in configs/ are read as lockstep-train reads them (--config FILE
// --print-config): every key real, every value in range, and what --print-config prints reads
// back the same. The data they name need not exist (only a run opens it); the ResNet recipes'
// models are built at their data's sample shape.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "lockstep/nn/model.hpp"
#include "lockstep/nn/residual.hpp"
#include "lockstep/train/config.hpp"

using namespace lockstep;
using namespace lockstep::train;

namespace {

// ctest sets LOCKSTEP_SOURCE_DIR (tests/CMakeLists.txt); run by hand, the binary needs it too.
std::filesystem::path configs_dir() {
  const char* source = std::getenv("LOCKSTEP_SOURCE_DIR");
  if (!source) ADD_FAILURE() << "set LOCKSTEP_SOURCE_DIR to the lockstep checkout";
  return std::filesystem::path(source ? source : ".") / "configs";
}

Config read_like_lockstep_train(const std::filesystem::path& file) {
  const std::string path = file.string();
  std::vector<const char*> argv = {"lockstep-train", "--config", path.c_str(), "--print-config"};
  ParsedArgs args = parse_args(static_cast<int>(argv.size()), argv.data());
  EXPECT_TRUE(args.print_config);
  return args.config;
}

}  // namespace

TEST(ShippedConfigs, EveryConfigParsesAndItsPrintedFormReadsBack) {
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(configs_dir())) {
    if (entry.path().extension() != ".ini") continue;
    SCOPED_TRACE(entry.path().string());
    ++count;
    Config c;
    ASSERT_NO_THROW(c = read_like_lockstep_train(entry.path()));
    Config back = parse_config_text(to_ini(c), {}, "printed.ini");
    back.config_file = c.config_file;  // to_ini's header names the file
    EXPECT_EQ(to_ini(back), to_ini(c));
  }
  EXPECT_GE(count, 7) << "configs/ holds fewer .ini files than it did";
}

TEST(ShippedConfigs, Cifar10ResNetIsTheCifarRecipe) {
  Config c = read_like_lockstep_train(configs_dir() / "cifar10_resnet.ini");
  EXPECT_EQ(c.data_pad_crop, 4);
  EXPECT_TRUE(c.data_flip);
  EXPECT_TRUE(c.optim_nesterov);
  EXPECT_DOUBLE_EQ(c.optim_momentum, 0.9);
  EXPECT_DOUBLE_EQ(c.optim_weight_decay, 5e-4);
  EXPECT_EQ(c.optim_decay, "matrices");
  EXPECT_EQ(c.optim_schedule, "cosine");
  EXPECT_GT(c.optim_warmup_steps, 0);
  nn::Model m = nn::Model::build(c.model_spec, {3, 32, 32}, 10, 1);
  EXPECT_EQ(m.num_parameters(), 272474);  // ResNet-20 (He et al.: 0.27M)
}

TEST(ShippedConfigs, ImageNetResNet50IsTheNinetyEpochRecipe) {
  Config c = read_like_lockstep_train(configs_dir() / "imagenet_resnet50.ini");
  EXPECT_EQ(c.model_spec, "resnet50");
  EXPECT_TRUE(c.model_zero_init_residual);
  EXPECT_EQ(c.train_epochs, 90);
  EXPECT_EQ(c.train_global_batch, 256);
  EXPECT_DOUBLE_EQ(c.optim_lr, 0.1 * c.train_global_batch / 256);
  EXPECT_TRUE(c.optim_nesterov);
  EXPECT_DOUBLE_EQ(c.optim_weight_decay, 1e-4);
  EXPECT_EQ(c.optim_decay, "matrices");
  EXPECT_EQ(c.optim_schedule, "cosine");
  EXPECT_EQ(c.optim_warmup_steps, 5 * ((1281167 + 255) / 256));  // 5 epochs of ImageNet-1k
  EXPECT_DOUBLE_EQ(c.train_label_smoothing, 0.1);
  EXPECT_TRUE(c.data_random_resized_crop);
  EXPECT_TRUE(c.data_flip);
  nn::Model m = nn::Model::build(c.model_spec, {3, 224, 224}, 1000, 1);
  EXPECT_EQ(nn::zero_init_residual(m), 3 + 4 + 6 + 3);
}

TEST(ShippedConfigs, LabelSmoothingAndZeroInitKeysAreCheckedAndDefaultOff) {
  Config defaults = parse_config_text("");
  EXPECT_EQ(defaults.train_label_smoothing, 0.0);
  EXPECT_FALSE(defaults.model_zero_init_residual);
  EXPECT_THROW(parse_config_text("[train]\nlabel_smoothing = 1\n"), Error);
  EXPECT_THROW(parse_config_text("[train]\nlabel_smoothing = -0.1\n"), Error);
  EXPECT_THROW(parse_config_text("[model]\nzero_init_residual = maybe\n"), Error);
}
