#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "lockstep/core/error.hpp"
#include "lockstep/train/config.hpp"

using namespace lockstep;
using namespace lockstep::train;

namespace {
std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(Config, FileValuesThenCommandLineOverrides) {
  Config c = parse_config_text("[train]\nepochs = 3\nglobal_batch=64\n[optim]\nlr = 0.05\n",
                               {"train.epochs=5", "optim.nesterov=true"});
  EXPECT_EQ(c.train_epochs, 5);
  EXPECT_EQ(c.train_global_batch, 64);
  EXPECT_DOUBLE_EQ(c.optim_lr, 0.05);
  EXPECT_TRUE(c.optim_nesterov);
  EXPECT_EQ(c.optim_name, "sgd");  // default untouched
}

TEST(Config, UnknownKeyIsAnErrorNamingKeyFileAndSuggestion) {
  std::string e = error_of([] { parse_config_text("[train]\nepoch = 3\n", {}, "x.ini"); });
  EXPECT_NE(e.find("train.epoch"), std::string::npos) << e;
  EXPECT_NE(e.find("x.ini"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean train.epochs"), std::string::npos) << e;
  e = error_of([] { parse_config_text("", {"optim.lrr=1"}); });
  EXPECT_NE(e.find("optim.lrr"), std::string::npos) << e;
}

TEST(Config, BadValuesNameTheKey) {
  std::string e = error_of([] { parse_config_text("[train]\nepochs = three\n", {}, "y.ini"); });
  EXPECT_NE(e.find("train.epochs"), std::string::npos) << e;
  EXPECT_NE(e.find("'three' is not an integer"), std::string::npos) << e;
  e = error_of([] { parse_config_text("[train]\nparallel = mpi\n"); });
  EXPECT_NE(e.find("not one of auto, ddp, dp, none"), std::string::npos) << e;
  e = error_of([] { parse_config_text("[train]\nglobal_batch = 0\n"); });
  EXPECT_NE(e.find("train.global_batch"), std::string::npos) << e;
  e = error_of([] { parse_config_text("[optim]\nlr = nan\n"); });
  EXPECT_NE(e.find("optim.lr"), std::string::npos) << e;
  e = error_of([] { parse_config_text("[log]\nrank_prefix = maybe\n"); });
  EXPECT_NE(e.find("log.rank_prefix"), std::string::npos) << e;
}

TEST(Config, PrintedConfigParsesBackToTheSameConfig) {
  Config c =
      parse_config_text("[model]\nspec = conv(8,3)-relu-flatten-linear(10)\n[optim]\nlr=0.0123\n",
                        {"dist.bucket_mb=0.5"});
  std::string ini = to_ini(c);
  Config back = parse_config_text(ini);
  EXPECT_EQ(rank_invariant_settings(back), rank_invariant_settings(c));
  EXPECT_EQ(to_ini(back), ini);
}

TEST(Config, ParseArgsReadsFileAndRejectsMissingFile) {
  auto path = std::filesystem::temp_directory_path() / "lockstep_cfg_test.ini";
  { std::ofstream(path) << "[train]\nepochs = 7\n"; }
  std::string p = path.string();
  const char* argv[] = {"lockstep-train", "--config", p.c_str(), "--train.seed=9"};
  ParsedArgs a = parse_args(4, argv);
  EXPECT_EQ(a.config.train_epochs, 7);
  EXPECT_EQ(a.config.train_seed, 9);
  std::filesystem::remove(path);
  std::string e = error_of([&] { parse_args(4, argv); });
  EXPECT_NE(e.find(p), std::string::npos) << e;
  const char* bad[] = {"lockstep-train", "--train.epoch=3"};
  e = error_of([&] { parse_args(2, bad); });
  EXPECT_NE(e.find("train.epoch"), std::string::npos) << e;
}

TEST(Config, HelpListsEveryKeyWithDefault) {
  std::string h = help_text();
  for (const auto& [key, value] : rank_invariant_settings(Config{}))
    EXPECT_NE(h.find(key), std::string::npos) << key;
  EXPECT_NE(h.find("log.metrics"), std::string::npos);
}
