// SectionTimer (ops/device_runtime.hpp), on every device kind: device time of sections of the
// compute stream, read back without waiting for the device.
#include "support/device_test_support.hpp"

namespace lockstep::testing {
namespace {

using SectionTiming = OnDevice;
LOCKSTEP_ON_DEVICES(SectionTiming);

TEST_P(SectionTiming, ReportsAFinishedStepsDeviceTimeWithoutWaitingForTheDevice) {
  Tensor a = to_dev(random_tensor({1024, 1024}, 3));
  Tensor c = Tensor::empty({1024, 1024}, DType::F32, device());
  ops::gemm(dev(), false, false, 1.0f, a, a, 0.0f, c);  // warm-up: cuBLAS's own set-up
  dev().synchronize();
  ops::SectionTimer timer(dev(), 2);
  const std::uint64_t syncs_before = counters().host_syncs;
  timer.begin(0);
  for (int i = 0; i < 20; ++i)
    ops::gemm(dev(), false, false, 1.0f, a, a, 0.0f, c);
  timer.end(0);
  timer.begin(1);  // an empty section: nothing between its events
  timer.end(1);
  std::vector<double> early = timer.collect();  // may find the step unfinished: then 0, later
  EXPECT_EQ(counters().host_syncs, syncs_before) << "collect() must not wait";
  ASSERT_EQ(early.size(), 2u);
  dev().synchronize();
  std::vector<double> late = timer.collect();
  const double compute = early[0] + late[0];
  // 20 GEMMs of 2 GFLOP each: well above 0.1 ms on any GPU (and on the CPU behind the emulated
  // device), and not hours.
  EXPECT_GT(compute, 1e-4);
  EXPECT_LT(compute, 60.0);
  EXPECT_LT(early[1] + late[1], 0.1 * compute);
  // Reported once only.
  std::vector<double> again = timer.collect();
  EXPECT_EQ(again[0], 0.0);
}

}  // namespace
}  // namespace lockstep::testing
