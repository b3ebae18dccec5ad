// What the CUDA build promises on any machine, GPU or not: it reports honestly whether a GPU
// answers, asking for one that is not there is a lockstep::Error (not a crash), and the dropout
// kernels' Philox is the CPU's Philox bit for bit. These run in CI, where there is no GPU.
#include <gtest/gtest.h>

#include <string>

#include "lockstep/core/device.hpp"
#include "lockstep/core/error.hpp"
#include "lockstep/core/rng.hpp"
#include "lockstep/ops/context.hpp"
#include "ops/cuda/philox.hpp"

using namespace lockstep;

TEST(CudaBuild, CudaAvailableMeansAtLeastOneGpuAnswers) {
  int count = cuda_device_count();
  EXPECT_GE(count, 0);
  EXPECT_EQ(cuda_available(), count > 0);
#ifndef LOCKSTEP_HAVE_CUDA
  EXPECT_EQ(count, 0) << "a build without the CUDA backend cannot see GPUs";
#endif
}

TEST(CudaBuild, ContextOnAMissingGpuIsAnErrorNamingTheDevice) {
  // The first index that is not there: cuda:0 on a machine without GPUs.
  int missing = cuda_device_count();
  std::string device = "cuda:" + std::to_string(missing);
  try {
    ops::Context ctx(parse_device(device));
    FAIL() << "creating a context on " << device << " should fail with " << missing
           << " visible GPU(s)";
  } catch (const Error& e) {
    std::string what = e.what();
    EXPECT_NE(what.find(device), std::string::npos) << what;
    EXPECT_FALSE(e.hint().empty()) << "the error should say how to fix it: " << what;
#ifdef LOCKSTEP_HAVE_CUDA
    if (missing == 0)
      EXPECT_NE(what.find("no GPU"), std::string::npos) << what;
    else
      EXPECT_NE(what.find(std::to_string(missing) + " GPU"), std::string::npos) << what;
#endif
  }
}

TEST(CudaBuild, DevicePhiloxEqualsCorePhiloxBitForBit) {
  // Seeds and streams that exercise both 32-bit halves; counters across the 2^32 boundary.
  const std::uint64_t seeds[] = {0, 1, 0x243F6A8885A308D3ull, ~0ull};
  const std::uint64_t streams[] = {0, 7, 0x13198A2E03707344ull};
  const std::uint64_t counters[] = {0, 1, 2, 1000003, 0xFFFFFFFFull, 0x100000000ull};
  for (auto seed : seeds)
    for (auto stream : streams)
      for (auto counter : counters) {
        auto want = Philox(seed, stream).block(counter);
        auto got = ops::cuda::philox_block(seed, stream, counter);
        for (int j = 0; j < 4; ++j)
          ASSERT_EQ(got.v[j], want[j])
              << "seed " << seed << " stream " << stream << " counter " << counter << " word " << j;
      }
}

TEST(CudaBuild, DropoutUniformMappingEqualsCoreUniform) {
  // The kernels map element i to word i % 4 of block i / 4, as Philox::u32/uniform do.
  Philox rng(42, 9);
  for (std::uint64_t i = 0; i < 4096; ++i) {
    auto block = ops::cuda::philox_block(42, 9, i / 4);
    ASSERT_EQ(ops::cuda::philox_uniform(block.v[i % 4]), rng.uniform(i)) << "element " << i;
  }
}
