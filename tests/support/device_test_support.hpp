// Device-parameterised tests: a test of device-generic code (anything that orders work on streams,
// stages inputs, counts syncs, or runs the engines on an accelerator) runs on every device kind
// this build has: the emulated GPU (emu:0) on every machine, and CUDA (cuda:0) where a GPU
// answers; a kind that cannot run here skips and says why. Instantiate with
//   LOCKSTEP_ON_DEVICES(SuiteName);
// and use GetParam()-free helpers: device(), dev() (the device's context), cpu(), to_dev(host).
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "lockstep/core/device.hpp"
#include "lockstep/ops/context.hpp"
#include "lockstep/ops/device_runtime.hpp"
#include "support/cuda_test_support.hpp"

namespace lockstep::testing {

// Why `kind` cannot run here, or "" when it can.
inline std::string device_skip_reason(const std::string& kind) {
  if (kind == "cuda" && !cuda_available()) return no_gpu_reason();
  if (kind == "emu" && !emu_available())
    return "this build has no emulated device (configured with -DLOCKSTEP_EMU=OFF)";
  return "";
}

class OnDevice : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string why = device_skip_reason(GetParam());
    if (!why.empty()) GTEST_SKIP() << why;
    device_ = GetParam() == "cuda" ? Device::cuda(0) : Device::emu(0);
    dev_ = std::make_unique<ops::Context>(device_);
  }
  Device device() const { return device_; }
  ops::Context& dev() { return *dev_; }
  ops::Context& cpu() { return cpu_; }
  Tensor to_dev(const Tensor& host) const { return host.to(device_); }
  ops::DeviceCounters counters() const { return ops::device_counters(device_); }

 private:
  Device device_;
  ops::Context cpu_;
  std::unique_ptr<ops::Context> dev_;
};

#define LOCKSTEP_ON_DEVICES(suite)                                           \
  INSTANTIATE_TEST_SUITE_P(Devices, suite, ::testing::Values("emu", "cuda"), \
                           [](const ::testing::TestParamInfo<std::string>& i) { return i.param; })

}  // namespace lockstep::testing
