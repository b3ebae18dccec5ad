// A short training-like sequence on a device (the emulated GPU everywhere, CUDA where a GPU
// answers) against the same sequence on the CPU, and the memory promise a training loop relies on:
// no device allocation in the steady state.
#include "ops_mlp.hpp"
#include "support/device_test_support.hpp"

namespace lockstep::testing {
namespace {

using DeviceTraining = OnDevice;
LOCKSTEP_ON_DEVICES(DeviceTraining);

TEST_P(DeviceTraining, ShortMlpTrainingMatchesCpu) {
  const std::int64_t batch = 32, in = 64, hidden = 48, classes = 10;
  const int steps = 24;
  OpsMlp on_cpu(cpu(), in, hidden, classes), on_gpu(dev(), in, hidden, classes);
  std::vector<float> losses;
  for (int s = 0; s < steps; ++s) {
    // The same 4 batches over and over: the loss must fall, on both devices alike.
    Tensor x = random_tensor({batch, in}, 1000 + s % 4);
    Tensor labels = random_labels(batch, static_cast<int>(classes), 2000 + s % 4);
    float lc = on_cpu.step(x, labels, s), lg = on_gpu.step(x, labels, s);
    // Float rounding differences (~1e-7) compound through the updates; 1e-3 relative is still
    // far below the loss change of a single step (~5e-2 here).
    EXPECT_NEAR(lg, lc, 1e-3f * std::fabs(lc)) << "step " << s;
    if (device().is_emu()) {
      EXPECT_EQ(lg, lc) << "step " << s << ": the CPU's kernels, other bits";
    }
    losses.push_back(lc);
  }
  // Measured on the CPU: the mean over the last 4 steps is ~0.43 of the first 4.
  float first = (losses[0] + losses[1] + losses[2] + losses[3]) / 4;
  float last = (losses[steps - 4] + losses[steps - 3] + losses[steps - 2] + losses[steps - 1]) / 4;
  EXPECT_LT(last, 0.75f * first) << "the sequence should learn, or it tests little";
  EXPECT_CLOSE(on_gpu.w1, on_cpu.w1, 1e-3);
  EXPECT_CLOSE(on_gpu.w2, on_cpu.w2, 1e-3);
  EXPECT_CLOSE(on_gpu.b2, on_cpu.b2, 1e-3);
}

TEST_P(DeviceTraining, SteadyStateStepNeverAllocatesDeviceMemory) {
  OpsMlp mlp(dev(), 64, 48, 10);
  Tensor x = random_tensor({32, 64}, 5);
  Tensor labels = random_labels(32, 10, 6);
  mlp.step(x, labels, 0);  // warm-up: the cache fills, cuBLAS sets up its workspace
  mlp.step(x, labels, 1);
  const std::uint64_t before = counters().device_mallocs;
  for (int s = 2; s < 6; ++s)
    mlp.step(x, labels, s);
  EXPECT_EQ(counters().device_mallocs, before);
}

}  // namespace
}  // namespace lockstep::testing
