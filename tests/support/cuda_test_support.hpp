// Shared by the GPU tests: the skip rule, random inputs and the error measure.
// Every GPU test compares the CUDA backend with the CPU backend (the independent reference) on
// fresh random inputs and skips, saying why, when no GPU answers.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/core/device.hpp"
#include "lockstep/core/rng.hpp"
#include "lockstep/core/tensor.hpp"
#include "lockstep/ops/context.hpp"
#include "lockstep/ops/ops.hpp"
#include "support/random_tensor.hpp"

namespace lockstep::testing {

inline const char* no_gpu_reason() {
#ifdef LOCKSTEP_HAVE_CUDA
  return "no GPU answers on this machine (cudaGetDeviceCount found none): the CUDA backend is "
         "compiled but cannot run here; bench/gpu-check.sh runs these on a GPU machine";
#else
  return "this build has no CUDA backend (configured with -DLOCKSTEP_CUDA=OFF or no toolkit)";
#endif
}

#define LOCKSTEP_SKIP_WITHOUT_GPU() \
  if (!::lockstep::cuda_available()) GTEST_SKIP() << ::lockstep::testing::no_gpu_reason()

inline Tensor random_labels(std::int64_t n, int classes, std::uint64_t stream) {
  Philox rng(77, stream);
  std::vector<std::int32_t> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    v[static_cast<std::size_t>(i)] =
        static_cast<std::int32_t>(rng.u32(static_cast<std::uint64_t>(i)) % classes);
  return Tensor::from_vector(v, {n});
}

// max_i |got_i - want_i| / max(max_i |want_i|, 1e-30): the error relative to the reference's
// scale, so a bound reads as "agrees to this many digits of the largest value".
inline double scaled_error(const Tensor& got, const Tensor& want) {
  std::vector<float> g = got.to_vector<float>(), w = want.to_vector<float>();
  EXPECT_EQ(g.size(), w.size());
  double diff = 0.0, scale = 1e-30;
  for (std::size_t i = 0; i < std::min(g.size(), w.size()); ++i) {
    if (std::isnan(g[i]) != std::isnan(w[i])) return INFINITY;
    diff = std::max(diff, std::fabs(static_cast<double>(g[i]) - w[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(w[i])));
  }
  return diff / scale;
}

#define EXPECT_CLOSE(got, want, bound) \
  EXPECT_LE(::lockstep::testing::scaled_error(got, want), bound) << #got " vs " #want

// A CPU context and a GPU context side by side; gpu() is created only when a GPU answers.
class CudaVsCpu : public ::testing::Test {
 protected:
  void SetUp() override {
    LOCKSTEP_SKIP_WITHOUT_GPU();
    gpu_ = std::make_unique<ops::Context>(Device::cuda(0));
  }
  ops::Context& cpu() { return cpu_; }
  ops::Context& gpu() { return *gpu_; }
  static Tensor dev(const Tensor& host) { return host.to(Device::cuda(0)); }
  static Tensor host(const Tensor& t) { return t.to(Device::cpu()); }

 private:
  ops::Context cpu_;
  std::unique_ptr<ops::Context> gpu_;
};

}  // namespace lockstep::testing
