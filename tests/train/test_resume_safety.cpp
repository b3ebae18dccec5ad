// Resuming never destroys work: which checkpoint a run starts from, and what happens to the
// checkpoints already in checkpoint.dir, must be the user's explicit choice; a folder holding only
// unreadable checkpoints is an error naming each file, never a silent fresh start that overwrites
// and prunes them; an unwritable folder fails at setup, not at the first save hours later.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "lockstep/comm/local.hpp"
#include "lockstep/train/loop.hpp"
#include "lockstep/train/setup.hpp"
#include "support/tiny_run.hpp"

using namespace lockstep;
using namespace lockstep::train;
namespace fs = std::filesystem;

namespace {

TrainResult train_run(const Config& c) {
  auto comm = comm::make_single_rank_communicator();
  auto run = setup_run(c, *comm);
  return train_loop(*run);
}

// The text of the Error setup_run throws, or "" (and a test failure) when it succeeds.

std::string bytes_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A run that leaves ckpt-2 and ckpt-4 in DIR/ckpt.
struct Fixture {
  test::TempDir dir;
  Config config;
  std::string ckpt2, ckpt4;
  Fixture() {
    config = test::tiny_config(test::write_tiny_set(dir.path(), "train"));
    config.checkpoint_dir = dir / "ckpt";
    config.checkpoint_every_steps = 2;
    Config first = config;
    first.train_max_steps = 4;
    EXPECT_EQ(train_run(first).steps, 4);
    ckpt2 = checkpoint_path(config.checkpoint_dir, 2);
    ckpt4 = checkpoint_path(config.checkpoint_dir, 4);
    EXPECT_TRUE(fs::exists(ckpt2) && fs::exists(ckpt4));
  }
};

}  // namespace

TEST(ResumeSafety, AutoOverOnlyUnreadableCheckpointsIsAnErrorNamingEachFileAndWhy) {
  Fixture f;
  fs::resize_file(f.ckpt4, 600);  // truncated
  {
    std::fstream io(f.ckpt2, std::ios::binary | std::ios::in | std::ios::out);
    io.seekp(static_cast<std::streamoff>(fs::file_size(f.ckpt2) / 2));
    io.put('\x5a');  // one byte of damage
  }
  const std::string damaged2 = bytes_of(f.ckpt2), damaged4 = bytes_of(f.ckpt4);
  Config c = f.config;
  c.train_resume = "auto";
  const std::string error = test::setup_error(c);
  EXPECT_NE(error.find("none of the 2 checkpoint(s)"), std::string::npos) << error;
  EXPECT_NE(error.find(f.ckpt4 + ": truncated"), std::string::npos) << error;
  EXPECT_NE(error.find(f.ckpt2 + ": checksum mismatch"), std::string::npos) << error;
  // The damaged files are evidence and maybe recoverable: untouched.
  EXPECT_EQ(bytes_of(f.ckpt2), damaged2);
  EXPECT_EQ(bytes_of(f.ckpt4), damaged4);
}

TEST(ResumeSafety, AutoSkipsAnUnreadableNewestCheckpointForTheNewestReadableOne) {
  Fixture f;
  fs::resize_file(f.ckpt4, 600);
  Config c = f.config;
  c.train_resume = "auto";
  auto comm = comm::make_single_rank_communicator();
  auto run = setup_run(c, *comm);
  EXPECT_EQ(run->resumed_from, f.ckpt2);
  EXPECT_EQ(run->state->step, 2);
}

TEST(ResumeSafety, FreshStartOverExistingCheckpointsNeedsAnExplicitChoice) {
  Fixture f;
  const std::string before = bytes_of(f.ckpt4);
  Config c = f.config;  // train.resume empty
  const std::string error = test::setup_error(c);
  EXPECT_NE(error.find("already holds 2 checkpoint(s)"), std::string::npos) << error;
  EXPECT_NE(error.find("--train.resume=auto"), std::string::npos) << error;
  EXPECT_NE(error.find("--train.resume=fresh"), std::string::npos) << error;
  EXPECT_EQ(bytes_of(f.ckpt4), before);
}

TEST(ResumeSafety, ResumeFreshMovesTheOldCheckpointsAsideAndStartsFromStepZero) {
  Fixture f;
  const std::string old4 = bytes_of(f.ckpt4);
  Config c = f.config;
  c.train_resume = "fresh";
  c.train_max_steps = 3;
  c.checkpoint_every_steps = 0;
  const TrainResult result = train_run(c);
  EXPECT_EQ(result.steps, 3);  // from step 0, not from 4
  EXPECT_EQ(result.checkpoint, checkpoint_path(c.checkpoint_dir, 3));
  EXPECT_FALSE(fs::exists(f.ckpt4));
  std::vector<fs::path> aside;
  for (const auto& e : fs::directory_iterator(c.checkpoint_dir))
    if (e.is_directory() && e.path().filename().string().rfind("replaced-", 0) == 0)
      aside.push_back(e.path());
  ASSERT_EQ(aside.size(), 1u);
  EXPECT_EQ(bytes_of((aside[0] / "ckpt-00000004.h5").string()), old4);
  EXPECT_TRUE(fs::exists(aside[0] / "ckpt-00000002.h5"));
}

TEST(ResumeSafety, ResumingFromAnOlderCheckpointIntoAFolderWithNewerOnesIsRefused) {
  Fixture f;
  Config c = f.config;
  c.train_resume = f.ckpt2;
  const std::string error = test::setup_error(c);
  EXPECT_NE(error.find("holds newer checkpoints (ckpt-00000004.h5)"), std::string::npos) << error;
  // The newest one is fine, and so is an older one written elsewhere.
  c.train_resume = f.ckpt4;
  auto comm = comm::make_single_rank_communicator();
  EXPECT_EQ(setup_run(c, *comm)->state->step, 4);
}

TEST(ResumeSafety, AnUnwritableCheckpointFolderFailsAtSetupNotAtTheFirstSave) {
  test::TempDir dir;
  Config c = test::tiny_config(test::write_tiny_set(dir.path(), "train"));
  std::ofstream(dir / "a-file") << "x";
  c.checkpoint_dir = dir / "a-file/ckpt";  // a folder under a regular file cannot exist
  c.checkpoint_every_steps = 1000;         // the first save would come after the whole run
  const std::string error = test::setup_error(c);
  EXPECT_NE(error.find("checkpoint.dir = " + c.checkpoint_dir), std::string::npos) << error;
}
