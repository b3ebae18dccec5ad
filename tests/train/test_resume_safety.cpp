// Resuming never destroys work: which checkpoint a run starts from, and what happens to the
// checkpoints already in checkpoint.dir, must be the user's explicit choice; a folder holding only
// unreadable checkpoints is an error naming each file, never a silent fresh start that overwrites
// and prunes them; an unwritable folder fails at setup, not at the first save hours later.
#include <gtest/gtest.h>

#include <ctime>
#include <filesystem>
#include <fstream>
#include <vector>

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

using test::file_bytes;

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

TEST(ResumeSafety, AutoOverOnlyUnreadableCheckpointsIsAnErrorNamingTheNewestAndWhy) {
  Fixture f;
  fs::resize_file(f.ckpt4, 600);  // truncated
  {
    std::fstream io(f.ckpt2, std::ios::binary | std::ios::in | std::ios::out);
    io.seekp(static_cast<std::streamoff>(fs::file_size(f.ckpt2) / 2));
    io.put('\x5a');  // one byte of damage
  }
  const std::string damaged2 = file_bytes(f.ckpt2), damaged4 = file_bytes(f.ckpt4);
  Config c = f.config;
  c.train_resume = "auto";
  const std::string error = test::setup_error(c);
  EXPECT_NE(error.find(f.ckpt4 + ": truncated"), std::string::npos) << error;
  // The damaged files are evidence and maybe recoverable: untouched.
  EXPECT_TRUE(file_bytes(f.ckpt2) == damaged2) << f.ckpt2 << " changed";
  EXPECT_TRUE(file_bytes(f.ckpt4) == damaged4) << f.ckpt4 << " changed";
}

// A newest checkpoint auto cannot read (here: of a newer format version) is not skipped: a run
// resumed below it would write its own file of that name over it and prune the rest.
TEST(ResumeSafety, AutoStopsAtAnUnreadableNewestCheckpointInsteadOfResumingBelowIt) {
  Fixture f;
  {
    std::fstream io(f.ckpt4, std::ios::binary | std::ios::in | std::ios::out);
    io.seekp(static_cast<std::streamoff>(std::string("LOCKSTEP-CHECKPOINT ").size()));
    io.put('2');  // "LOCKSTEP-CHECKPOINT 2": the header is outside the file checksum
  }
  const std::string newer = file_bytes(f.ckpt4), older = file_bytes(f.ckpt2);
  Config c = f.config;
  c.train_resume = "auto";
  c.train_max_steps = 6;
  const std::string error = test::setup_error(c);
  EXPECT_NE(error.find(f.ckpt4 + ": checkpoint format version 2"), std::string::npos) << error;
  EXPECT_NE(error.find("ckpt-00000002.h5"), std::string::npos) << error;  // the way out
  EXPECT_TRUE(file_bytes(f.ckpt4) == newer) << f.ckpt4 << " changed";
  EXPECT_TRUE(file_bytes(f.ckpt2) == older) << f.ckpt2 << " changed";
}

TEST(ResumeSafety, FreshStartOverExistingCheckpointsNeedsAnExplicitChoice) {
  Fixture f;
  const std::string before = file_bytes(f.ckpt4);
  Config c = f.config;  // train.resume empty
  const std::string error = test::setup_error(c);
  EXPECT_NE(error.find("already holds 2 checkpoint(s)"), std::string::npos) << error;
  EXPECT_NE(error.find("--train.resume=auto"), std::string::npos) << error;
  EXPECT_NE(error.find("--train.resume=fresh"), std::string::npos) << error;
  EXPECT_TRUE(file_bytes(f.ckpt4) == before) << f.ckpt4 << " changed";
}

TEST(ResumeSafety, ResumeFreshMovesTheOldCheckpointsAsideAndStartsFromStepZero) {
  Fixture f;
  const std::string old4 = file_bytes(f.ckpt4);
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
  EXPECT_TRUE(file_bytes((aside[0] / "ckpt-00000004.h5").string()) == old4)
      << (aside[0] / "ckpt-00000004.h5").string() << " changed";
  EXPECT_TRUE(fs::exists(aside[0] / "ckpt-00000002.h5"));
}

// Two fresh starts within one second would both pick replaced-<that second>/: the second must
// not move its checkpoints over the first's.
TEST(ResumeSafety, ResumeFreshNeverOverwritesAnEarlierReplacedFolder) {
  Fixture f;
  const std::string old2 = file_bytes(f.ckpt2), old4 = file_bytes(f.ckpt4);
  // Folders of the seconds the run may start in, each holding an earlier run's checkpoints.
  std::vector<fs::path> earlier;
  const std::time_t now = std::time(nullptr);
  for (std::time_t t = now - 1; t <= now + 5; ++t) {
    char stamp[32];
    std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::gmtime(&t));
    earlier.push_back(fs::path(f.config.checkpoint_dir) / (std::string("replaced-") + stamp));
    fs::create_directories(earlier.back());
    for (const char* name : {"ckpt-00000002.h5", "ckpt-00000004.h5"})
      std::ofstream(earlier.back() / name) << "earlier run " << stamp;
  }
  Config c = f.config;
  c.train_resume = "fresh";
  c.train_max_steps = 1;
  c.checkpoint_every_steps = 0;
  EXPECT_EQ(train_run(c).steps, 1);
  for (const fs::path& folder : earlier)
    for (const char* name : {"ckpt-00000002.h5", "ckpt-00000004.h5"})
      EXPECT_EQ(file_bytes((folder / name).string()),
                "earlier run " + folder.filename().string().substr(9))
          << folder / name << " was overwritten";
  // This run's old checkpoints are in a folder of their own.
  std::vector<fs::path> holding;
  for (const auto& e : fs::directory_iterator(c.checkpoint_dir))
    if (e.is_directory() && file_bytes((e.path() / "ckpt-00000004.h5").string()) == old4)
      holding.push_back(e.path());
  ASSERT_EQ(holding.size(), 1u);
  EXPECT_EQ(holding[0].filename().string().rfind("replaced-", 0), 0u) << holding[0];
  EXPECT_TRUE(file_bytes((holding[0] / "ckpt-00000002.h5").string()) == old2)
      << (holding[0] / "ckpt-00000002.h5").string() << " changed";
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
