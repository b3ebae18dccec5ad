// The files a run reads and writes: no output may name an input (the checkpoint being resumed or
// evaluated, a data shard or folder), refused before any output is opened; the metrics of a
// resumed run continue the file instead of erasing it; and one run at a time owns a
// checkpoint.dir, so a second job sharing it stops at once naming the holder.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "lockstep/comm/local.hpp"
#include "lockstep/train/checkpoint_lock.hpp"
#include "lockstep/train/loop.hpp"
#include "lockstep/train/setup.hpp"
#include "lockstep/train/trainer.hpp"
#include "support/tiny_run.hpp"

using namespace lockstep;
using namespace lockstep::train;
namespace fs = std::filesystem;

namespace {

// A whole run as lockstep-train does it (start and final metrics records included).
TrainResult train_run(const Config& c) {
  auto comm = comm::make_single_rank_communicator();
  return run_training(c, *comm);
}

using test::file_bytes;

std::vector<std::string> lines_of(const std::string& path) {
  std::vector<std::string> lines;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);)
    lines.push_back(line);
  return lines;
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// A run of 4 steps that leaves DIR/ckpt/ckpt-00000004.h5, with a test set for --eval-only.
struct Trained {
  test::TempDir dir;
  Config config;
  std::string ckpt4, shard0;
  Trained() {
    config = test::tiny_config(test::write_tiny_set(dir.path(), "train"),
                               test::write_tiny_set(dir.path(), "test"));
    config.train_eval = false;
    config.checkpoint_dir = dir / "ckpt";
    Config first = config;
    first.train_max_steps = 4;
    EXPECT_EQ(train_run(first).steps, 4);
    ckpt4 = checkpoint_path(config.checkpoint_dir, 4);
    shard0 = dir / "train-00000-of-00002.h5";
    EXPECT_TRUE(fs::exists(ckpt4) && fs::exists(shard0));
  }
};

}  // namespace

TEST(RunFiles, ExportOntoTheCheckpointBeingEvaluatedIsRefusedAndTheCheckpointKept) {
  Trained t;
  const std::string before = file_bytes(t.ckpt4);
  Config c = t.config;
  c.train_resume = t.ckpt4;
  c.checkpoint_export = t.ckpt4;
  SetupOptions eval;
  eval.eval_only = true;
  std::string e = test::setup_error(c, eval);
  EXPECT_TRUE(has(e, "checkpoint.export") && has(e, "train.resume") && has(e, t.ckpt4)) << e;
  // The same file under another name (a hard link) is the same file.
  const std::string link = t.dir / "link.h5";
  fs::create_hard_link(t.ckpt4, link);
  c.checkpoint_export = link;
  e = test::setup_error(c, eval);
  EXPECT_TRUE(has(e, "checkpoint.export") && has(e, "train.resume") && has(e, link)) << e;
  EXPECT_TRUE(file_bytes(t.ckpt4) == before) << t.ckpt4 << " changed";
}

TEST(RunFiles, ExportOntoACheckpointOfTheFolderAutoReadsIsRefused) {
  Trained t;
  const std::string before = file_bytes(t.ckpt4);
  Config c = t.config;
  c.train_resume = "auto";
  c.checkpoint_export = t.ckpt4;
  SetupOptions eval;
  eval.eval_only = true;
  const std::string e = test::setup_error(c, eval);
  EXPECT_TRUE(has(e, "checkpoint.export") && has(e, "checkpoint.dir") && has(e, t.ckpt4)) << e;
  EXPECT_TRUE(file_bytes(t.ckpt4) == before) << t.ckpt4 << " changed";
}

TEST(RunFiles, MetricsOntoTheResumedCheckpointIsRefusedBeforeItIsOpened) {
  Trained t;
  const std::string before = file_bytes(t.ckpt4);
  Config c = t.config;
  c.checkpoint_dir = t.dir / "elsewhere";
  c.train_resume = t.ckpt4;
  c.log_metrics = t.ckpt4;
  const std::string e = test::setup_error(c);
  EXPECT_TRUE(has(e, "log.metrics") && has(e, "train.resume") && has(e, t.ckpt4)) << e;
  EXPECT_TRUE(file_bytes(t.ckpt4) == before)
      << t.ckpt4 << " changed";  // not truncated by opening the metrics file
}

TEST(RunFiles, AnOutputOntoADataShardOrFolderIsRefused) {
  Trained t;
  const std::string before = file_bytes(t.shard0);
  Config c = t.config;
  c.checkpoint_dir = "";
  c.log_metrics = t.shard0;
  std::string e = test::setup_error(c);
  EXPECT_TRUE(has(e, "log.metrics") && has(e, "data.train") && has(e, t.shard0)) << e;
  EXPECT_TRUE(file_bytes(t.shard0) == before) << t.shard0 << " changed";
  c.log_metrics = "";
  c.checkpoint_dir = t.dir.path();  // the folder the shards are in
  e = test::setup_error(c);
  EXPECT_TRUE(has(e, "checkpoint.dir") && has(e, "data.train")) << e;
}

TEST(RunFiles, AResumedRunAppendsItsMetricsAfterARestartRecord) {
  Trained t;
  Config c = t.config;
  c.checkpoint_dir = t.dir / "ck-metrics";
  c.log_metrics = t.dir / "metrics.jsonl";
  c.log_every = 1;
  c.checkpoint_every_steps = 2;
  c.train_max_steps = 3;
  EXPECT_EQ(train_run(c).steps, 3);
  const std::vector<std::string> first = lines_of(c.log_metrics);
  ASSERT_FALSE(first.empty());
  c.train_resume = "auto";
  c.train_max_steps = 5;
  EXPECT_EQ(train_run(c).steps, 5);
  const std::vector<std::string> all = lines_of(c.log_metrics);
  ASSERT_GT(all.size(), first.size());
  // The first run's records are kept as they were; the resumed run's follow a restart record.
  EXPECT_EQ(std::vector<std::string>(all.begin(), all.begin() + first.size()), first);
  EXPECT_TRUE(has(all[first.size()], "\"event\": \"restart\"")) << all[first.size()];
  EXPECT_TRUE(has(all[first.size()], "\"step\": 3")) << all[first.size()];
  EXPECT_TRUE(has(all.back(), "\"event\": \"final\"")) << all.back();

  // A fresh start (train.resume = fresh) begins a new file, as before.
  c.train_resume = "fresh";
  c.train_max_steps = 2;
  EXPECT_EQ(train_run(c).steps, 2);
  const std::vector<std::string> fresh = lines_of(c.log_metrics);
  ASSERT_FALSE(fresh.empty());
  EXPECT_TRUE(has(fresh.front(), "\"event\": \"start\"")) << fresh.front();
  for (const std::string& line : fresh)
    EXPECT_FALSE(has(line, "restart")) << line;
}

TEST(RunFiles, ASecondRunOnTheSameCheckpointFolderStopsNamingTheHolder) {
  Trained t;
  Config c = t.config;
  c.train_resume = "auto";
  auto comm = comm::make_single_rank_communicator();
  auto holder = setup_run(c, *comm);  // holds checkpoint.dir until destroyed
  const std::string e = test::setup_error(c);
  EXPECT_TRUE(has(e, "checkpoint.dir = " + c.checkpoint_dir)) << e;
  EXPECT_TRUE(has(e, "pid " + std::to_string(::getpid()))) << e;
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  EXPECT_TRUE(has(e, host)) << e;
  holder.reset();
  auto next = setup_run(c, *comm);  // released with the run
  EXPECT_EQ(next->state->step, 4);
}

TEST(CheckpointLock, TheErrorNamesTheHoldersHostPidAndSlurmJob) {
  test::TempDir dir;
  ::setenv("SLURM_JOB_ID", "4242", 1);
  CheckpointLock first(dir.path(), nullptr);
  ::unsetenv("SLURM_JOB_ID");
  try {
    CheckpointLock second(dir.path(), nullptr);
    ADD_FAILURE() << "a second lock was granted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_TRUE(has(m, "is in use by another run")) << m;
    EXPECT_TRUE(has(m, "pid " + std::to_string(::getpid()) + ", Slurm job 4242")) << m;
    EXPECT_TRUE(has(m, dir / ".lock")) << m;
  }
}

TEST(CheckpointLock, ALockLeftByAKilledProcessIsTakenOverWithANoteNamingIt) {
  test::TempDir dir;
  const std::string file = dir / ".lock";
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    CheckpointLock held(dir.path(), nullptr);
    ::kill(::getpid(), SIGKILL);  // dies holding it: no destructor runs
    ::_exit(1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  ASSERT_TRUE(has(file_bytes(file), "pid=" + std::to_string(child) + "\n")) << file_bytes(file);

  std::vector<std::string> notes;
  {
    CheckpointLock lock(dir.path(), [&](const std::string& n) { notes.push_back(n); });
    ASSERT_EQ(notes.size(), 1u);
    EXPECT_TRUE(has(notes[0], "pid " + std::to_string(child)) &&
                has(notes[0], "no longer holds it"))
        << notes[0];
    EXPECT_TRUE(has(file_bytes(file), "pid=" + std::to_string(::getpid()) + "\n"));
  }
  // A run that ends releases it and leaves the file empty: the next one has nothing to report.
  EXPECT_EQ(file_bytes(file), "");
  notes.clear();
  CheckpointLock again(dir.path(), [&](const std::string& n) { notes.push_back(n); });
  EXPECT_TRUE(notes.empty()) << notes[0];
}
