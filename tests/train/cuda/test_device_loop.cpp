// The training loop on a device (the emulated GPU everywhere, CUDA where a GPU answers) never
// waits for its gradient check (train/loop.cpp, Note [Deferred gradient check]): a steady step
// makes no host sync, and what the check decides (skip a non-finite step, clip, count the
// optimizer's steps) happens on the device exactly as the CPU decides it on the host: on the
// emulated GPU the parameters are the CPU's bit for bit, skipped steps included.
//
// Needs the train layer, which the GPU-check build (LOCKSTEP_GPU_CHECK_ONLY) does not have: there
// the file compiles to nothing.
#include "support/device_test_support.hpp"

#if __has_include("lockstep/train/loop.hpp")
#include <cmath>
#include <fstream>
#include <limits>

#include "lockstep/comm/local.hpp"
#include "lockstep/core/error.hpp"
#include "lockstep/train/loop.hpp"
#include "lockstep/train/setup.hpp"
#include "support/tiny_run.hpp"
#include "support/training.hpp"

namespace lockstep::testing {
namespace {

using DeviceLoop = OnDevice;
LOCKSTEP_ON_DEVICES(DeviceLoop);

// train.device names the kind; a rank takes its local device of it (device 0 here).
std::string kind_of(Device d) {
  return d.is_emu() ? "emu" : "cuda";
}

struct Trained {
  train::TrainResult result;
  std::vector<std::vector<float>> params;
  std::int64_t optimizer_steps = 0;
};

Trained train_on(train::Config c, const std::string& device) {
  c.train_device = device;
  auto comm = comm::make_single_rank_communicator();
  auto run = train::setup_run(c, *comm);
  Trained t;
  t.result = train::train_loop(*run);
  t.params = test::parameter_values(*run->model);
  t.optimizer_steps = run->optimizer->steps();
  return t;
}

// The tiny set with NaN in one feature of global sample 40 and Inf in sample 41 (both in shard 1,
// its samples 8 and 9): the steps that draw them have non-finite gradients.
std::string write_dirty_set(const test::TempDir& dir) {
  return test::write_spoiled_tiny_set(dir.path(), "dirty",
                                      {{40, 2, std::numeric_limits<float>::quiet_NaN()},
                                       {41, 0, std::numeric_limits<float>::infinity()}});
}

void expect_same_parameters(const Trained& on_device, const Trained& on_cpu, bool bitwise) {
  ASSERT_EQ(on_device.params.size(), on_cpu.params.size());
  for (std::size_t k = 0; k < on_cpu.params.size(); ++k) {
    ASSERT_EQ(on_device.params[k].size(), on_cpu.params[k].size());
    for (std::size_t i = 0; i < on_cpu.params[k].size(); ++i) {
      if (bitwise)
        ASSERT_EQ(on_device.params[k][i], on_cpu.params[k][i])
            << "parameter " << k << "[" << i << "]";
      else
        ASSERT_NEAR(on_device.params[k][i], on_cpu.params[k][i], 1e-4) << "parameter " << k;
    }
  }
}

// Skipped on the device (the update kernels read the verdict), the steps the CPU skips on the host:
// the same skipped count, the same optimizer step count (AdamW's bias correction depends on it,
// so a step counted wrongly changes every later update) and, on the emulated GPU, the same bits.
// Clipping scales by the verdict's norm on the device, as the CPU does with the norm read back.
TEST_P(DeviceLoop, SkipsNonFiniteStepsAndClipsOnTheDeviceAsTheCpuDoesOnTheHost) {
  test::TempDir dir;
  train::Config c = test::tiny_config(write_dirty_set(dir));
  c.train_nan_policy = "skip";
  c.optim_name = "adamw";
  c.optim_lr = 0.01;
  c.optim_clip_norm = 0.05;  // below the early norms: the clip acts
  c.train_epochs = 3;
  c.log_every = 4;
  const Trained cpu = train_on(c, "cpu");
  ASSERT_GE(cpu.result.skipped_steps, 3) << "the dirty samples should spoil one step per epoch";
  EXPECT_EQ(cpu.optimizer_steps, cpu.result.steps - cpu.result.skipped_steps);
  const Trained dev = train_on(c, kind_of(device()));
  EXPECT_EQ(dev.result.steps, cpu.result.steps);
  EXPECT_EQ(dev.result.skipped_steps, cpu.result.skipped_steps);
  EXPECT_EQ(dev.optimizer_steps, cpu.optimizer_steps);
  EXPECT_TRUE(std::isfinite(dev.result.final_train_loss));
  expect_same_parameters(dev, cpu, device().is_emu());
  if (device().is_emu()) {
    EXPECT_EQ(dev.result.final_train_loss, cpu.result.final_train_loss);
  }
}

// SGD with momentum (the tiny config's) across skipped steps: its first-step rule counts the
// updates applied, not the steps issued (StepVerdict.* check that rule on its own, including a
// first step skipped).
TEST_P(DeviceLoop, SgdMomentumAcrossSkippedStepsMatchesTheCpu) {
  test::TempDir dir;
  train::Config c = test::tiny_config(write_dirty_set(dir));
  c.train_nan_policy = "skip";
  c.train_epochs = 4;
  c.log_every = 3;
  const Trained cpu = train_on(c, "cpu");
  const Trained dev = train_on(c, kind_of(device()));
  EXPECT_EQ(dev.result.skipped_steps, cpu.result.skipped_steps);
  EXPECT_EQ(dev.optimizer_steps, cpu.optimizer_steps);
  expect_same_parameters(dev, cpu, device().is_emu());
}

// With the default policy a non-finite step is still an error naming the step and its samples,
// raised when the check is read (by the next log step), and saying so.
TEST_P(DeviceLoop, ANonFiniteStepIsStillBadDataNamingTheStepAndTheSamples) {
  test::TempDir dir;
  train::Config c = test::tiny_config(write_dirty_set(dir));
  c.train_device = kind_of(device());
  c.train_epochs = 3;
  c.log_every = 8;
  auto comm = comm::make_single_rank_communicator();
  try {
    train::train_loop(*train::setup_run(c, *comm));
    ADD_FAILURE() << "trained over NaN input";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("bad data at step"), std::string::npos) << what;
    EXPECT_NE(what.find("dirty-00001-of-00002.h5 (shard 1 of 2): "), std::string::npos) << what;
    EXPECT_NE(what.find("found at step 8"), std::string::npos) << what;
    EXPECT_NE(what.find("log.every"), std::string::npos) << what;
    EXPECT_EQ(e.hint().find("optim.lr"), std::string::npos) << e.hint();
  }
}

// The promise itself: every log record after the first says 0 host syncs, 0 allocations and 0
// pageable copies per step (the record's own reads come after its counters are taken), with
// clipping and AdamW on; and a checkpoint written mid-interval holds the settled step count.
TEST_P(DeviceLoop, ASteadyStepWaitsForNothing) {
  test::TempDir dir;
  train::Config c = test::tiny_config(test::write_tiny_set(dir.path(), "train"));
  c.train_device = kind_of(device());
  c.optim_name = "adamw";
  c.optim_lr = 0.01;
  c.optim_clip_norm = 1.0;
  c.train_epochs = 4;
  c.log_every = 4;
  c.log_metrics = dir.path() + "/metrics.jsonl";
  auto comm = comm::make_single_rank_communicator();
  auto run = train::setup_run(c, *comm);
  const train::TrainResult r = train::train_loop(*run);
  EXPECT_EQ(r.steps, 32);
  EXPECT_EQ(run->optimizer->steps(), 32);
  std::ifstream in(c.log_metrics);
  int records = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.find("\"samples_per_s\"") == std::string::npos ||
        line.find("\"event\"") != std::string::npos)
      continue;
    if (++records == 1) continue;  // the first interval fills the caches
    EXPECT_NE(line.find("\"host_syncs_per_step\": 0,"), std::string::npos) << line;
    EXPECT_NE(line.find("\"device_mallocs_per_step\": 0,"), std::string::npos) << line;
    EXPECT_NE(line.find("\"pageable_copies_per_step\": 0"), std::string::npos) << line;
    EXPECT_NE(line.find("\"grad_norm\""), std::string::npos) << line;
  }
  EXPECT_EQ(records, 8);
}

}  // namespace
}  // namespace lockstep::testing

#endif  // __has_include("lockstep/train/loop.hpp")
