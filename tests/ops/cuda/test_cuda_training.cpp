// CUDA's own memory promises: pinned buffers that feed the compute stream, and tensors that stay on
// their device whatever the thread's current GPU. (The device-generic training tests are in
// test_device_training.cpp.)
#include <cstring>

#include "ops_mlp.hpp"
#include "support/cuda_test_support.hpp"
#ifdef LOCKSTEP_HAVE_CUDA
#include <cuda_runtime.h>

#include "lockstep/ops/cuda.hpp"
#endif

namespace lockstep::testing {
namespace {

using Training = CudaVsCpu;

#ifdef LOCKSTEP_HAVE_CUDA
TEST_F(Training, PinnedBufferFeedsTheComputeStream) {
  ops::cuda::PinnedBuffer buffer(1000 * sizeof(float));
  Tensor dst = Tensor::empty({1000}, DType::F32, Device::cuda(0));
  for (int round = 0; round < 3; ++round) {
    buffer.wait();  // the previous copy has read the buffer: safe to refill
    for (int i = 0; i < 1000; ++i)
      buffer.as<float>()[i] = static_cast<float>(round * 1000 + i);
    ops::cuda::copy_to_device_async(gpu(), buffer, dst);
    Tensor twice = Tensor::empty({1000}, DType::F32, Device::cuda(0));
    ops::add(gpu(), dst, dst, twice);  // queued after the copy on the same stream
    auto got = twice.to_vector<float>();
    for (int i = 0; i < 1000; ++i)
      ASSERT_EQ(got[i], 2.0f * static_cast<float>(round * 1000 + i)) << "round " << round;
  }
  {  // moving hands the pages over
    ops::cuda::PinnedBuffer moved = std::move(buffer);
    EXPECT_EQ(buffer.data(), nullptr);
    EXPECT_EQ(moved.bytes(), 1000 * sizeof(float));
  }
}

TEST_F(Training, TensorLivesOnItsDeviceWhateverTheThreadsCurrentGpu) {
  if (cuda_device_count() < 2)
    GTEST_SKIP() << "needs two GPUs; this machine has " << cuda_device_count();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  Tensor t = Tensor::empty({1024}, DType::F32, Device::cuda(1));
  cudaPointerAttributes attributes{};
  ASSERT_EQ(cudaPointerGetAttributes(&attributes, t.raw_data()), cudaSuccess);
  EXPECT_EQ(attributes.device, 1);
  int current = -1;
  ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
  EXPECT_EQ(current, 0) << "allocating must not change the thread's current device";
}
#endif

}  // namespace
}  // namespace lockstep::testing
